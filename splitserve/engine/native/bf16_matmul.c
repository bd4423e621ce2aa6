/* The prompt pass's packed bfloat16 products (bf16_matmul.h), called through XLA's FFI:

     splitserve_bf16_packed(x bf16 [..., K], w uint16 [N/16, K/32, 16, 32]) -> y f32 [..., N]

   1. Check the shapes (K and N multiples of 32, w packed for them).
   2. Pick the unit: the AMX tiles where this process may use them, else AVX512-BF16's dot
      products, else an error (the engine then keeps XLA's products: qkernel.bf16_packed_unit).
   3. For the tiles, copy x's last M % 32 rows into 32 zero-padded ones, so no tile reads past x.
   4. Share the 32-column blocks out over the calling thread and XLA's pool (parallel_for). */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_matmul.h"

enum { UNIT_NONE = 0, UNIT_DOT = 1, UNIT_TILES = 2 };

static atomic_int g_unit = -1; /* -1: the best this process has */

static int best_unit(void) {
  if (amx_tiles_ready()) return UNIT_TILES;
  return bf16_dot_ready() ? UNIT_DOT : UNIT_NONE;
}

/* The unit in use: 0 none, 1 AVX512-BF16 dot products, 2 AMX tiles. */
EXPORT int splitserve_bf16_unit(void) {
  const int unit = atomic_load(&g_unit);
  return unit < 0 ? best_unit() : unit;
}

/* Use `unit` if this process has it, else the best below it (a tile host also has the dot
   products); -1 the best. Returns the one now in use. Tests run both units this way. */
EXPORT int splitserve_bf16_set_unit(int unit) {
  const int best = best_unit();
  int chosen = unit < 0 || unit > best ? best : unit;
  if (chosen == UNIT_DOT && !bf16_dot_ready()) chosen = UNIT_NONE;
  atomic_store(&g_unit, unit < 0 ? -1 : chosen);
  return splitserve_bf16_unit();
}

EXPORT XLA_FFI_Error* splitserve_bf16_packed(XLA_FFI_CallFrame* cf) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  if (cf->args.size != 2 || cf->rets.size != 1) return ffi_error(api, "bf16_packed: wrong arity");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *w = ffi_arg(cf, 1), *y = ffi_ret(cf);
  if (!x || !w || !y || x->dtype != XLA_FFI_DataType_BF16 || y->dtype != XLA_FFI_DataType_F32 ||
      x->rank < 1 || y->rank != x->rank || w->rank != 4 ||
      (w->dtype != XLA_FFI_DataType_U16 && w->dtype != XLA_FFI_DataType_BF16))
    return ffi_error(api, "bf16_packed: x bfloat16 [..., K], w [N/16, K/32, 16, 32], y float32");
  Bf16Job j;
  j.K = x->dims[x->rank - 1];
  j.N = y->dims[y->rank - 1];
  j.M = 1;
  for (int64_t i = 0; i + 1 < x->rank; ++i) {
    if (x->dims[i] != y->dims[i])
      return ffi_error(api, "bf16_packed: y must have x's leading dims");
    j.M *= x->dims[i];
  }
  if (j.K % 32 || j.N % 32 || w->dims[0] != j.N / 16 || w->dims[1] != j.K / 32 ||
      w->dims[2] != 16 || w->dims[3] != 32)
    return ffi_error(api, "bf16_packed: K and N multiples of 32, w [N/16, K/32, 16, 32]");
  const int unit = splitserve_bf16_unit();
  if (unit == UNIT_NONE)
    return ffi_error(api, "bf16_packed: neither AMX tiles nor AVX512-BF16 for this process");
  j.x = (const uint16_t*)x->data;
  j.w = (const uint16_t*)w->data;
  j.y = (float*)y->data;
  j.tail = NULL;
  if (j.M == 0) return NULL;
  const int64_t full = j.M / 32 * 32;
  uint16_t* tail = NULL;
  if (unit == UNIT_TILES && j.M > full) {
    tail = (uint16_t*)calloc(32 * (size_t)j.K, sizeof(uint16_t));
    if (!tail) return ffi_error(api, "bf16_packed: out of memory");
    memcpy(tail, j.x + full * j.K, (size_t)((j.M - full) * j.K) * sizeof(uint16_t));
  }
  j.tail = tail;
  /* parallel_for returns once every chunk is done; a pool task that starts later finds none
     and never reads `tail` */
  parallel_for(api, cf->ctx, j.N / 32, j.M * j.K * j.N / 8,
               unit == UNIT_TILES ? amx_columns : bf16_dot_columns, &j, sizeof j);
  free(tail);
  return NULL;
}
