/* The packed bfloat16 products (bf16_matmul.h) on the CPU's AMX tiles.

   Why a kernel of our own: XLA hands bfloat16 products to YNNPACK, which runs them on the tiles
   but packs the right-hand matrix on every call, since to XLA the weights are arguments, not
   constants. Here the packing is done once, and a call only streams the packed tiles, which
   shortens a lone prompt's products (lab/benchmarks.md, "Prefill on the tiles").

   One 1 KiB block of the packed weights is one tile. Sums: float32, in pairs of inputs, in the
   tile unit's order. AMX flushes denormals.

   Threads: column blocks of 32 are shared out (parallel_for); each call of a chunk configures
   the tiles, and releases them before it returns, so XLA's pool threads carry no tile state. */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_matmul.h"

#if defined(SPLITSERVE_X86) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define SPLITSERVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl(2): ask the kernel for a dynamic state */
#define XFEATURE_XTILEDATA 18
#define ROWS_PANEL 128 /* rows of x per pass over a column block: 128 x K bf16 stays in L2 */

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
TARGET_AMX static void block(const Bf16Job* j, const uint16_t* a, int64_t lda, int64_t n,
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
TARGET_AMX void amx_columns(const void* job, int64_t c0, int64_t c1) {
  const Bf16Job* j = (const Bf16Job*)job;
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

int amx_tiles_ready(void) {
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

#ifndef SPLITSERVE_AMX
void amx_columns(const void* job, int64_t c0, int64_t c1) { (void)job, (void)c0, (void)c1; }
#endif
