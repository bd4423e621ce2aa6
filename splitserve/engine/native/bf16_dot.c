/* The packed bfloat16 products (bf16_matmul.h) on AVX512-BF16's dot products, for CPUs without
   AMX tiles (AMD Zen 4, Intel Cooper Lake). VDPBF16PS adds two products of bfloat16 pairs into
   each of 16 float32 lanes: one instruction does twice the multiply-adds of a float32 FMA. A
   burst of prompts takes well under float32's time (as XLA's bfloat16 products do), and a lone
   prompt, where XLA packs the weights on every call, less than bfloat16-xla's, the more so the
   shorter the prompt (lab/benchmarks.md, "Prefill in bfloat16 without tiles").

   A block of the output, 12 rows by 32 columns, lives in 24 registers for the whole of K: per
   pair of inputs, two loads of packed weights (the two 16-column groups) and one broadcast of
   each row's pair feed 24 dot products. Rows are taken in panels of ROWS_PANEL so that the
   panel's x and one column block's weights stay in the core's L2 while the panel is swept.
   Each output's sums run over K in order, in pairs: the same whatever M or the thread. */

#include <string.h>

#include "bf16_matmul.h"

#define BLOCK_ROWS 12
#define ROWS_PANEL (BLOCK_ROWS * 10)

#if defined(SPLITSERVE_X86) && \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
#define SPLITSERVE_AVX512_BF16 1
#endif

#ifdef SPLITSERVE_AVX512_BF16

#define TARGET_BF16 __attribute__((target("avx512f,avx512bf16")))

/* y's rows [m, m + R) by columns [c * 32, c * 32 + 32); R <= BLOCK_ROWS, known where inlined. */
TARGET_BF16 INLINE void dot_block(const Bf16Job* j, int64_t m, int R, int64_t c) {
  const int64_t K = j->K, pairs = K / 2, group = (K / 32) * 512;
  const uint16_t* b0 = j->w + 2 * c * group;
  const uint16_t* b1 = b0 + group;
  const uint16_t* a = j->x + m * K;
  __m512 lo[BLOCK_ROWS], hi[BLOCK_ROWS];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      memcpy(&pair, a + r * K + 2 * p, sizeof pair);
      const __m512bh xr = (__m512bh)_mm512_set1_epi32(pair);
      lo[r] = _mm512_dpbf16_ps(lo[r], xr, w0);
      hi[r] = _mm512_dpbf16_ps(hi[r], xr, w1);
    }
  }
  float* out = j->y + m * j->N + c * 32;
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * j->N, lo[r]);
    _mm512_storeu_ps(out + r * j->N + 16, hi[r]);
  }
}

/* One block of R rows, R a constant in each case so that the compiler keeps the sums in
   registers. */
TARGET_BF16 static void dot_rows(const Bf16Job* j, int64_t m, int R, int64_t c) {
  switch (R) {
#define ROWS(n) \
  case n:       \
    dot_block(j, m, n, c); \
    break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11)
    ROWS(12)
#undef ROWS
  }
}

TARGET_BF16 void bf16_dot_columns(const void* job, int64_t c0, int64_t c1) {
  const Bf16Job* j = (const Bf16Job*)job;
  for (int64_t panel = 0; panel < j->M; panel += ROWS_PANEL) {
    const int64_t end = panel + ROWS_PANEL < j->M ? panel + ROWS_PANEL : j->M;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t m = panel; m < end; m += BLOCK_ROWS)
        dot_rows(j, m, (int)(end - m < BLOCK_ROWS ? end - m : BLOCK_ROWS), c);
  }
}

int bf16_dot_ready(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") != 0;
}

#else

void bf16_dot_columns(const void* job, int64_t c0, int64_t c1) {
  (void)job, (void)c0, (void)c1;
}

int bf16_dot_ready(void) { return 0; }

#endif
