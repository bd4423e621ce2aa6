/* A prompt pass's matrix products on the CPU's AMX tiles: y [M, N] float32 = x [M, K] bfloat16
   @ w, w bfloat16 packed once, when the weights are placed, in the order the tiles read it.

   Why a kernel of our own: XLA hands bfloat16 products to YNNPACK, which runs them on the tiles
   but packs the right-hand matrix on every call, since to XLA the weights are arguments, not
   constants. Here the packing is done once, and a call only streams the packed tiles: a lone
   140-token prompt of the default model spent 67 ms in YNNPACK's products and spends 47 ms
   here (one thread; docs/benchmarks.md, "Prefill on the tiles").

   Layout of the packed weights (quant.pack_amx): [N/16, K/32, 16, 32] uint16, one 1 KiB tile per
   (16 output columns, 32 inputs): tile row r holds, for each of the 16 columns c, the weights of
   inputs 2r and 2r + 1 next to each other (c * 2 + p), the pairs TDPBF16PS multiplies.

   Sums: float32, in pairs of inputs, in the tile unit's order; each output row's sums depend on
   that row and the weights only, never on M or on the other rows, nor on which thread computes
   which columns: a prompt gets the same values alone or in a batch. AMX flushes denormals.

   Threads: column blocks of 32 are shared out (parallel_for); each call of a chunk configures
   the tiles, and releases them before it returns, so XLA's pool threads carry no tile state. */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ffi_common.h"

#if defined(SPLITSERVE_X86) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define SPLITSERVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl(2): ask the kernel for a dynamic state */
#define XFEATURE_XTILEDATA 18
#define ROWS_PANEL 128 /* rows of x per pass over a column block: 128 x K bf16 stays in L2 */

typedef struct {
  int64_t M, K, N;
  const uint16_t* x; /* [M, K] bfloat16 bits */
  const uint16_t* tail; /* x's last M % 32 rows and zero rows after them: 32 rows, or NULL */
  const uint16_t* w; /* [N/16, K/32, 16, 32] */
  float* y;          /* [M, N] */
} AmxJob;

#ifdef SPLITSERVE_AMX

#define TARGET_AMX __attribute__((target("amx-tile,amx-bf16")))

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} TileConfig;

/* Tiles 0-3 the 2 x 2 blocks of y (16 x 16 float32 each), 4-5 two blocks of 16 rows of x
   (32 bf16 each), 6-7 two tiles of packed weights: every tile 16 rows of 64 bytes. */
TARGET_AMX static void configure(void) {
  TileConfig c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

/* y's 32 x 32 block at (m, n) from 32 rows of x starting at `a` (row stride lda elements). */
TARGET_AMX static void block(const AmxJob* j, const uint16_t* a, int64_t lda, int64_t n,
                             float* out, int64_t ldo) {
  const int64_t kb_count = j->K / 32;
  const uint16_t* b0 = j->w + (n / 16) * kb_count * 512;
  const uint16_t* b1 = b0 + kb_count * 512;
  const uint16_t* a1 = a + 16 * lda;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    _tile_loadd(4, a + kb * 32, lda * 2);
    _tile_loadd(5, a1 + kb * 32, lda * 2);
    _tile_loadd(6, b0 + kb * 512, 64);
    _tile_loadd(7, b1 + kb * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, ldo * 4);
  _tile_stored(1, out + 16, ldo * 4);
  _tile_stored(2, out + 16 * ldo, ldo * 4);
  _tile_stored(3, out + 16 * ldo + 16, ldo * 4);
}

/* Column blocks [c0, c1) (of 32 columns), every row. */
TARGET_AMX static void columns(const void* job, int64_t c0, int64_t c1) {
  const AmxJob* j = (const AmxJob*)job;
  const int64_t K = j->K, N = j->N, full = j->M / 32 * 32, tail = j->M - full;
  /* the last rows' results go through a 32 x 32 buffer, so no tile writes past y */
  float out[32 * 32];
  configure();
  for (int64_t panel = 0; panel < full; panel += ROWS_PANEL)
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t m = panel; m < full && m < panel + ROWS_PANEL; m += 32)
        block(j, j->x + m * K, K, c * 32, j->y + m * N + c * 32, N);
  if (tail) {
    for (int64_t c = c0; c < c1; ++c) {
      block(j, j->tail, K, c * 32, out, 32);
      for (int64_t r = 0; r < tail; ++r)
        memcpy(j->y + (full + r) * N + c * 32, out + r * 32, 32 * sizeof(float));
    }
  }
  _tile_release();
}

static int cpu_has_amx_bf16(void) {
  unsigned int a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a < 7) return 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  return (d >> 22 & 1) && (d >> 24 & 1); /* AMX-BF16, AMX-TILE */
}

static int amx_permitted(void) {
  /* Linux hands out the tiles' 8 KiB of state only to a process that asks (5.16+); the answer
     holds for all its threads */
  return cpu_has_amx_bf16() && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

#endif /* SPLITSERVE_AMX */

static atomic_int g_amx = -1; /* -1: not asked yet */

/* 1 when this CPU has AMX-BF16 tiles, the kernel was built with them and Linux lets this
   process use them; asks Linux the first time. */
EXPORT int splitserve_amx_ready(void) {
  int ready = atomic_load(&g_amx);
  if (ready < 0) {
#ifdef SPLITSERVE_AMX
    ready = amx_permitted();
#else
    ready = 0;
#endif
    atomic_store(&g_amx, ready);
  }
  return ready;
}

/* splitserve_amx_bf16(x bf16 [..., K], w uint16 [N/16, K/32, 16, 32]) -> y float32 [..., N];
   K and N multiples of 32. */
EXPORT XLA_FFI_Error* splitserve_amx_bf16(XLA_FFI_CallFrame* cf) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  if (cf->args.size != 2 || cf->rets.size != 1) return ffi_error(api, "amx_bf16: wrong arity");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *w = ffi_arg(cf, 1), *y = ffi_ret(cf);
  if (!x || !w || !y || x->dtype != XLA_FFI_DataType_BF16 || y->dtype != XLA_FFI_DataType_F32 ||
      x->rank < 1 || y->rank != x->rank || w->rank != 4 ||
      (w->dtype != XLA_FFI_DataType_U16 && w->dtype != XLA_FFI_DataType_BF16))
    return ffi_error(api, "amx_bf16: x bfloat16 [..., K], w [N/16, K/32, 16, 32], y float32");
  AmxJob j;
  j.K = x->dims[x->rank - 1];
  j.N = y->dims[y->rank - 1];
  j.M = 1;
  for (int64_t i = 0; i + 1 < x->rank; ++i) {
    if (x->dims[i] != y->dims[i]) return ffi_error(api, "amx_bf16: y must have x's leading dims");
    j.M *= x->dims[i];
  }
  if (j.K % 32 || j.N % 32 || w->dims[0] != j.N / 16 || w->dims[1] != j.K / 32 ||
      w->dims[2] != 16 || w->dims[3] != 32)
    return ffi_error(api, "amx_bf16: K and N multiples of 32, w [N/16, K/32, 16, 32]");
  if (!splitserve_amx_ready()) return ffi_error(api, "amx_bf16: no AMX tiles for this process");
  j.x = (const uint16_t*)x->data;
  j.w = (const uint16_t*)w->data;
  j.y = (float*)y->data;
  if (j.M == 0) return NULL;
  /* the last rows when M is not a multiple of 32, copied once into 32 zero-padded ones that
     every column block reads, so no tile reads past x */
  const int64_t full = j.M / 32 * 32;
  uint16_t* tail = NULL;
  if (j.M > full) {
    tail = (uint16_t*)calloc(32 * (size_t)j.K, sizeof(uint16_t));
    if (!tail) return ffi_error(api, "amx_bf16: out of memory");
    memcpy(tail, j.x + full * j.K, (size_t)((j.M - full) * j.K) * sizeof(uint16_t));
  }
  j.tail = tail;
#ifdef SPLITSERVE_AMX
  /* parallel_for returns once every chunk is done; a pool task that starts later finds none
     and never reads `tail` */
  parallel_for(api, cf->ctx, j.N / 32, j.M * j.K * j.N / 8, columns, &j, sizeof j);
#endif
  free(tail);
  return NULL;
}
