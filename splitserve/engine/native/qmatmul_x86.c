/* The AVX-512 and AVX2 paths of qmatmul.c's matrix products (each compiled for its instruction
   set by a target attribute; qmatmul.c picks one at run time). Same sums in the same order per
   row whatever the batch (see qmatmul.c on exactness). */

#include <stdlib.h>

#include "qmatmul.h"

#ifdef SPLITSERVE_X86

/* ---- AVX-512: 16 lanes, two accumulators per batch row (low and high half of a block) ----- */

TARGET_AVX512 static void scales_avx512(const uint16_t* h, int64_t nb, float* out) {
  int64_t i = 0;
  for (; i + 16 <= nb; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(h + i))));
  for (; i < nb; ++i) out[i] = _cvtsh_ss(h[i]);
}

/* One weight row against batch rows b0 .. b0 + cb - 1. `lo`, `hi`: the block's 32 weights. */
#define AVX512_ACCUMULATE(lo, hi)                                            \
  for (int b = 0; b < cb; ++b) {                                             \
    const float* xb = x + (b0 + b) * K + blk * BLOCK;                        \
    acc_lo[b] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc_lo[b]);         \
    acc_hi[b] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc_hi[b]);    \
  }

#define AVX512_STORE()                                                                   \
  for (int b = 0; b < cb; ++b)                                                           \
    j->y[(b0 + b) * j->N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc_lo[b], acc_hi[b]));

TARGET_AVX512 INLINE void q8_0_avx512_cb(const Job* j, int64_t n, int64_t b0, const int cb,
                                         const float* ds) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const int8_t* q = (const int8_t*)j->w + n * K;
  __m512 acc_lo[MAX_CB], acc_hi[MAX_CB];
  for (int b = 0; b < cb; ++b) acc_lo[b] = acc_hi[b] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m512 d = _mm512_set1_ps(ds[blk]);
    const int8_t* qb = q + blk * BLOCK;
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)qb)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(qb + 16))));
    lo = _mm512_mul_ps(lo, d);
    hi = _mm512_mul_ps(hi, d);
    AVX512_ACCUMULATE(lo, hi)
  }
  AVX512_STORE()
}

TARGET_AVX512 INLINE void q4_1_avx512_cb(const Job* j, int64_t n, int64_t b0, const int cb,
                                         const float* ds, const float* ms) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const uint8_t* q = (const uint8_t*)j->w + n * (K / 2);
  /* The block's 16 possible weights d * q + m (one rounding each, as gguf's dequantizer) in a
     register, looked up by nibble (vpermps reads an index's low 4 bits only): 7 vector
     operations per 32 weights instead of 9 with two conversions and two more multiply-adds. */
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 acc_lo[MAX_CB], acc_hi[MAX_CB];
  for (int b = 0; b < cb; ++b) acc_lo[b] = acc_hi[b] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds[blk]), _mm512_set1_ps(ms[blk]));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + blk * 16)));
    const __m512 lo = _mm512_permutexvar_ps(v, table);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    AVX512_ACCUMULATE(lo, hi)
  }
  AVX512_STORE()
}

/* Two weight rows (n, n + 1) against batch rows b0 .. b0 + cb - 1, so that each x load feeds two
   multiply-adds: with one weight row a pass, x (16 rows of K floats: more than L1 holds) was
   read once per weight row and the loads, not the arithmetic, set the pace. Per (weight row,
   batch row) the operations and their order are q4_1_avx512_cb's, so the sums are bit-identical
   whichever path computes them. On the default model's layer shapes it is clearly faster at
   16 batch rows than one weight row a pass, a little at 4, the same at 1 and 8. Six batch
   rows: 24 accumulators, 4 weight registers, 2 of x. */
#define PAIR_CB 6

/* The pair passes' accumulators (a0: row n, a1: row n + 1; lo, hi: a block's halves), their
   multiply-adds with the block's weights lo0, hi0, lo1, hi1 for every batch row of the pass,
   and the stores of the sums: shared by the q4_1 and q8_0 pairs, which differ only in how
   they widen a block. */
#define PAIR_ZERO()                                                           \
  __m512 a0lo[MAX_CB], a0hi[MAX_CB], a1lo[MAX_CB], a1hi[MAX_CB]; /* cb <= PAIR_CB */ \
  for (int b = 0; b < cb; ++b) a0lo[b] = a0hi[b] = a1lo[b] = a1hi[b] = _mm512_setzero_ps();

#define PAIR_ACCUMULATE()                                                     \
  for (int b = 0; b < cb; ++b) {                                              \
    const float* xb = x + (b0 + b) * K + blk * BLOCK;                         \
    const __m512 xl = _mm512_loadu_ps(xb), xh = _mm512_loadu_ps(xb + 16);     \
    a0lo[b] = _mm512_fmadd_ps(lo0, xl, a0lo[b]);                              \
    a1lo[b] = _mm512_fmadd_ps(lo1, xl, a1lo[b]);                              \
    a0hi[b] = _mm512_fmadd_ps(hi0, xh, a0hi[b]);                              \
    a1hi[b] = _mm512_fmadd_ps(hi1, xh, a1hi[b]);                              \
  }

#define PAIR_STORE()                                                          \
  for (int b = 0; b < cb; ++b) {                                              \
    float* yb = j->y + (b0 + b) * j->N + n;                                   \
    yb[0] = _mm512_reduce_add_ps(_mm512_add_ps(a0lo[b], a0hi[b]));            \
    yb[1] = _mm512_reduce_add_ps(_mm512_add_ps(a1lo[b], a1hi[b]));            \
  }

TARGET_AVX512 INLINE void q4_1_avx512_pair(const Job* j, int64_t n, int64_t b0, const int cb,
                                           const float* ds0, const float* ms0, const float* ds1,
                                           const float* ms1) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const uint8_t* q0 = (const uint8_t*)j->w + n * (K / 2);
  const uint8_t* q1 = q0 + K / 2;
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  PAIR_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m512 t0 = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds0[blk]), _mm512_set1_ps(ms0[blk]));
    const __m512 t1 = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds1[blk]), _mm512_set1_ps(ms1[blk]));
    const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q0 + blk * 16)));
    const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q1 + blk * 16)));
    const __m512 lo0 = _mm512_permutexvar_ps(v0, t0);
    const __m512 hi0 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), t0);
    const __m512 lo1 = _mm512_permutexvar_ps(v1, t1);
    const __m512 hi1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), t1);
    PAIR_ACCUMULATE()
  }
  PAIR_STORE()
}

/* q8_0's pair: two weight rows against batch rows b0 .. b0 + cb - 1 (cb <= PAIR_CB), each x
   load feeding both, as q4_1_avx512_pair; per (weight row, batch row) the operations and their
   order are q8_0_avx512_cb's, so the bits are the same whichever path computes them. One row
   at a time, eight batch rows a pass, 16 batch rows (two passes) read 36 KB of x per weight
   row at the default model's K of 576: more than L1 holds, and the loads set the pace. On the
   default model's output head this path is faster from 16 batch rows on, even at 12 and 14,
   and slower below (there x fits L1 and one row at a time wins). */
#define Q8_PAIR_MIN_B 16

TARGET_AVX512 INLINE __m512 q8_0_half(const int8_t* p, const __m512 d) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

TARGET_AVX512 INLINE void q8_0_avx512_pair(const Job* j, int64_t n, int64_t b0, const int cb,
                                           const float* ds0, const float* ds1) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const int8_t* q0 = (const int8_t*)j->w + n * K;
  const int8_t* q1 = q0 + K;
  PAIR_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m512 d0 = _mm512_set1_ps(ds0[blk]), d1 = _mm512_set1_ps(ds1[blk]);
    const int8_t* p0 = q0 + blk * BLOCK;
    const int8_t* p1 = q1 + blk * BLOCK;
    const __m512 lo0 = q8_0_half(p0, d0), hi0 = q8_0_half(p0 + 16, d0);
    const __m512 lo1 = q8_0_half(p1, d1), hi1 = q8_0_half(p1 + 16, d1);
    PAIR_ACCUMULATE()
  }
  PAIR_STORE()
}

TARGET_AVX512 INLINE void bf16_avx512_cb(const Job* j, int64_t n, int64_t b0, const int cb) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const uint16_t* q = (const uint16_t*)j->w + n * K;
  __m512 acc_lo[MAX_CB], acc_hi[MAX_CB];
  for (int b = 0; b < cb; ++b) acc_lo[b] = acc_hi[b] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint16_t* qb = q + blk * BLOCK;
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)qb)), 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(qb + 16))), 16));
    AVX512_ACCUMULATE(lo, hi)
  }
  AVX512_STORE()
}

/* float32 rows: the weights are the multiply-adds' operands as they are. Nothing is widened,
   so the work per weight is one load and one multiply-add per batch row, and at 16 batch rows
   the loads of x set the pace: a tile of F32_ROWS weight rows beside F32_CB batch rows reuses
   each x load four times and each weight load six. One accumulator per (weight row, batch
   row), summed over the row's 16-lane pieces in order and reduced at the end: that order
   depends on neither the batch nor the tile (a lone batch row, or the last rows of a chunk,
   take the same path with smaller counts), so each row's sums are the same whatever the batch.
   24 accumulators, 4 weight registers, 1 of x. */
#define F32_ROWS 4
#define F32_CB 6

TARGET_AVX512 INLINE void f32_avx512_tile(const Job* j, int64_t n, const int nr, int64_t b0,
                                          const int cb) {
  const int64_t K = j->K;
  const float* x = j->x + b0 * K;
  const float* q = (const float*)j->w + n * K;
  __m512 acc[F32_ROWS][F32_CB];
  for (int r = 0; r < nr; ++r)
    for (int b = 0; b < cb; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 w[F32_ROWS];
    for (int r = 0; r < nr; ++r) w[r] = _mm512_loadu_ps(q + r * K + k);
    for (int b = 0; b < cb; ++b) {
      const __m512 xb = _mm512_loadu_ps(x + b * K + k);
      for (int r = 0; r < nr; ++r) acc[r][b] = _mm512_fmadd_ps(w[r], xb, acc[r][b]);
    }
  }
  for (int b = 0; b < cb; ++b)
    for (int r = 0; r < nr; ++r) j->y[(b0 + b) * j->N + n + r] = _mm512_reduce_add_ps(acc[r][b]);
}

/* Weight rows n .. n + nr - 1 (nr <= F32_ROWS) against every batch row, F32_CB at a time. */
#define F32_TILE(nr)                                                      \
  for (int64_t b0 = 0; b0 < j->B; b0 += F32_CB) {                         \
    switch (j->B - b0 < F32_CB ? j->B - b0 : F32_CB) {                    \
      case 1: f32_avx512_tile(j, n, nr, b0, 1); break;                    \
      case 2: f32_avx512_tile(j, n, nr, b0, 2); break;                    \
      case 3: f32_avx512_tile(j, n, nr, b0, 3); break;                    \
      case 4: f32_avx512_tile(j, n, nr, b0, 4); break;                    \
      case 5: f32_avx512_tile(j, n, nr, b0, 5); break;                    \
      default: f32_avx512_tile(j, n, nr, b0, 6); break;                   \
    }                                                                     \
  }

/* Up to this many batch rows, weight rows are taken one at a time (one sequential stream
   through memory), beyond it in tiles of F32_ROWS (x loads shared). Measured with 60 float32
   matrices of 576 x 3072 (425 MB), 2 threads, the weights' read rate: one at a time 29-32 GB/s
   at 1 and 2 batch rows (the tiles' four interleaved streams: 16-23) and 22 against 16 at 4
   rows; the tiles win from 8 rows (13 against 10 GB/s) and at 16 (10 against 7.5). The sums
   are the same either way. */
#define F32_STREAM_MAX_B 4

TARGET_AVX512 static void f32_avx512_rows(const Job* j, int64_t n0, int64_t n1) {
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  if (j->B <= F32_STREAM_MAX_B) {
    for (int64_t n = n0; n < n1; ++n) {
      if (n + ahead < n1) prefetch_row(j, n + ahead);
      F32_TILE(1)
    }
    return;
  }
  for (int64_t n = n0; n < n1; n += F32_ROWS) {
    for (int64_t r = 0; r < F32_ROWS && n + r + ahead < n1; ++r) prefetch_row(j, n + r + ahead);
    switch (n1 - n < F32_ROWS ? n1 - n : F32_ROWS) {
      case 1: F32_TILE(1) break;
      case 2: F32_TILE(2) break;
      case 3: F32_TILE(3) break;
      default: F32_TILE(4) break;
    }
  }
}

/* The batch loop: chunks of `most` rows (MAX_CB, or PAIR_CB beside two weight rows), each
   specialised on its size so the accumulators stay in registers. */
#define DISPATCH_CB(call, most)                                     \
  for (int64_t b0 = 0; b0 < j->B; b0 += (most)) {                   \
    const int64_t left = j->B - b0;                                 \
    switch (left < (most) ? left : (most)) {                        \
      case 1: call(1); break;                                       \
      case 2: call(2); break;                                       \
      case 3: call(3); break;                                       \
      case 4: call(4); break;                                       \
      case 5: call(5); break;                                       \
      case 6: call(6); break;                                       \
      case 7: call(7); break;                                       \
      default: call(8); break;                                      \
    }                                                               \
  }

TARGET_AVX512 void rows_avx512(const Job* j, int64_t n0, int64_t n1) {
  if (j->fmt == FMT_F32) {
    f32_avx512_rows(j, n0, n1);
    return;
  }
  const int64_t nb = j->K / BLOCK;
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  float ds[MAX_BLOCKS], ms[MAX_BLOCKS], ds1[MAX_BLOCKS], ms1[MAX_BLOCKS];
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < n1) prefetch_row(j, n + ahead);
    if (j->fmt == FMT_Q8_0) {
      scales_avx512(j->d + n * nb, nb, ds);
      if (j->B >= Q8_PAIR_MIN_B && n + 1 < n1) { /* rows n and n + 1 together */
        if (n + 1 + ahead < n1) prefetch_row(j, n + 1 + ahead);
        scales_avx512(j->d + (n + 1) * nb, nb, ds1);
#define CALL(cb) q8_0_avx512_pair(j, n, b0, cb, ds, ds1)
        DISPATCH_CB(CALL, PAIR_CB)
#undef CALL
        ++n;
        continue;
      }
#define CALL(cb) q8_0_avx512_cb(j, n, b0, cb, ds)
      DISPATCH_CB(CALL, MAX_CB)
#undef CALL
    } else if (j->fmt == FMT_Q4_1) {
      scales_avx512(j->d + n * nb, nb, ds);
      scales_avx512(j->m + n * nb, nb, ms);
      if (j->B > 1 && n + 1 < n1) { /* rows n and n + 1 together (one batch row: no x to share) */
        if (n + 1 + ahead < n1) prefetch_row(j, n + 1 + ahead);
        scales_avx512(j->d + (n + 1) * nb, nb, ds1);
        scales_avx512(j->m + (n + 1) * nb, nb, ms1);
#define CALL(cb) q4_1_avx512_pair(j, n, b0, cb, ds, ms, ds1, ms1)
        DISPATCH_CB(CALL, PAIR_CB)
#undef CALL
        ++n;
        continue;
      }
#define CALL(cb) q4_1_avx512_cb(j, n, b0, cb, ds, ms)
      DISPATCH_CB(CALL, MAX_CB)
#undef CALL
    } else {
#define CALL(cb) bf16_avx512_cb(j, n, b0, cb)
      DISPATCH_CB(CALL, MAX_CB)
#undef CALL
    }
  }
}

/* ---- AVX2: 8 lanes, four accumulators per batch row (the block's four quarters) ------------ */

/* AVX2 has 16 registers: two batch rows per pass (8 accumulators, 4 weights, 2 scales). */
#define AVX2_CB 2

TARGET_AVX2 static void scales_avx2(const uint16_t* h, int64_t nb, float* out) {
  int64_t i = 0;
  for (; i + 8 <= nb; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))));
  for (; i < nb; ++i) out[i] = _cvtsh_ss(h[i]);
}

TARGET_AVX2 static inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define AVX2_ACCUMULATE(w)                                                  \
  for (int b = 0; b < cb; ++b) {                                            \
    const float* xb = x + (b0 + b) * K + blk * BLOCK;                       \
    for (int i = 0; i < 4; ++i)                                             \
      acc[b][i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xb + 8 * i), acc[b][i]); \
  }

#define AVX2_STORE()                                                                  \
  for (int b = 0; b < cb; ++b)                                                        \
    j->y[(b0 + b) * j->N + n] = hsum_avx2(_mm256_add_ps(                              \
        _mm256_add_ps(acc[b][0], acc[b][1]), _mm256_add_ps(acc[b][2], acc[b][3])));

#define AVX2_ZERO() \
  for (int b = 0; b < cb; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm256_setzero_ps();

TARGET_AVX2 static inline __m256 avx2_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

TARGET_AVX2 static inline __m256 avx2_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

/* Block blk of weight row n as four 8-lane pieces w[0..3] (elements 0-7, 8-15, 16-23, 24-31),
   in the format `fmt` (a constant where it is inlined): the one place the AVX2 paths widen a
   weight, so the one-row passes and the tiles' buffered rows (dequantize_row_avx2) have the
   same bits. ds, ms: the row's scales. */
TARGET_AVX2 INLINE void block_avx2(const Job* j, const int fmt, int64_t n, int64_t blk,
                                   const float* ds, const float* ms, __m256* w) {
  const int64_t K = j->K;
  if (fmt == FMT_Q8_0) {
    const __m256 d = _mm256_set1_ps(ds[blk]);
    const int8_t* qb = (const int8_t*)j->w + n * K + blk * BLOCK;
    for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(avx2_i8(qb + 8 * i), d);
  } else if (fmt == FMT_Q4_1) {
    /* GGUF's nibble order: byte i of a block holds element i low and i + 16 high */
    const __m256 d = _mm256_set1_ps(ds[blk]), m = _mm256_set1_ps(ms[blk]);
    const __m256i low4 = _mm256_set1_epi32(0xf);
    const uint8_t* qb = (const uint8_t*)j->w + n * (K / 2) + blk * 16;
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)qb));
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qb + 8)));
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, low4)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, low4)), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), d, m);
  } else if (fmt == FMT_BF16) {
    const uint16_t* qb = (const uint16_t*)j->w + n * K + blk * BLOCK;
    for (int i = 0; i < 4; ++i) w[i] = avx2_bf16(qb + 8 * i);
  } else {
    const float* qb = (const float*)j->w + n * K + blk * BLOCK;
    for (int i = 0; i < 4; ++i) w[i] = _mm256_loadu_ps(qb + 8 * i);
  }
}

/* Weight row n against batch rows b0 .. b0 + cb - 1 (cb <= AVX2_CB), format `fmt`. */
TARGET_AVX2 INLINE void row_avx2_cb(const Job* j, const int fmt, int64_t n, int64_t b0,
                                    const int cb, const float* ds, const float* ms) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  __m256 acc[AVX2_CB][4], w[4];
  AVX2_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    block_avx2(j, fmt, n, blk, ds, ms, w);
    AVX2_ACCUMULATE(w)
  }
  AVX2_STORE()
}

/* Weight row n widened into out[K] (block_avx2's weights), for tiles_avx2. */
TARGET_AVX2 INLINE void dequantize_row_fmt(const Job* j, const int fmt, int64_t n,
                                           const float* ds, const float* ms, float* out) {
  __m256 w[4];
  for (int64_t blk = 0; blk < j->K / BLOCK; ++blk) {
    block_avx2(j, fmt, n, blk, ds, ms, w);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + blk * BLOCK + 8 * i, w[i]);
  }
}

TARGET_AVX2 static void dequantize_row_avx2(const Job* j, int64_t n, const float* ds,
                                            const float* ms, float* out) {
  switch (j->fmt) {
    case FMT_Q8_0: dequantize_row_fmt(j, FMT_Q8_0, n, ds, ms, out); break;
    case FMT_Q4_1: dequantize_row_fmt(j, FMT_Q4_1, n, ds, ms, out); break;
    case FMT_BF16: dequantize_row_fmt(j, FMT_BF16, n, ds, ms, out); break;
    default: dequantize_row_fmt(j, FMT_F32, n, ds, ms, out); break;
  }
}

#define DISPATCH_CB2(call)                                          \
  for (int64_t b0 = 0; b0 < j->B; b0 += AVX2_CB) {                  \
    if (j->B - b0 >= 2) call(2); else call(1);                      \
  }

/* Many batch rows: tiles of up to TILE_R weight rows, each widened (or, float32, copied) once
   into a buffer (dequantize_row_avx2), x TILE_C batch rows. The four 8-lane pieces of a block
   go in four passes over the buffered rows, one accumulator per (weight row, batch row) in
   each: every accumulator sees the same products in the same order as in the one-row
   functions above (piece i of block 0, 1, 2, ...), and the four are summed as AVX2_STORE sums
   them, so the bits are theirs whatever the tile. Per piece and block a tile loads R + C
   vectors for R x C multiply-adds where a pass of one weight row and two batch rows loaded 3
   for 2, and each row is dequantized once instead of once per pair of batch rows: at 16 batch
   rows the loads and the repeated dequantizing, not the multiply-adds, had set the pace. On
   the default model's layer shapes the tiles beat the pair passes at 4, 8 and 16 batch rows
   for q4_1 and q8_0 (most at 16). float32 rows, whose pair passes widen nothing, take tiles
   above F32_TILE_MIN_B batch rows only: faster at 16, no better at 4 and 8. */
#define TILE_R 3
#define TILE_C 4
#define F32_TILE_MIN_B 8

TARGET_AVX2 INLINE void tile_avx2(const Job* j, const float* const* w, int64_t n, int64_t b0,
                                  const int R, const int C) {
  const int64_t K = j->K, nb = K / BLOCK;
  __m256 part[TILE_R][TILE_C][4];
  for (int i = 0; i < 4; ++i) {
    __m256 acc[TILE_R][TILE_C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int64_t at = blk * BLOCK + 8 * i;
      __m256 wv[TILE_R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + at);
      for (int c = 0; c < C; ++c) {
        const __m256 xv = _mm256_loadu_ps(j->x + (b0 + c) * K + at);
        for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c][i] = acc[r][c];
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      j->y[(b0 + c) * j->N + n + r] = hsum_avx2(_mm256_add_ps(
          _mm256_add_ps(part[r][c][0], part[r][c][1]), _mm256_add_ps(part[r][c][2], part[r][c][3])));
}

#define TILE_COLS(R)                                   \
  switch (cols) {                                      \
    case 1: tile_avx2(j, w, n, b0, R, 1); break;       \
    case 2: tile_avx2(j, w, n, b0, R, 2); break;       \
    case 3: tile_avx2(j, w, n, b0, R, 3); break;       \
    default: tile_avx2(j, w, n, b0, R, 4); break;      \
  }

/* Rows [n0, n1) against every batch row, in tiles; 0 (nothing done) where the buffer cannot
   be had. */
TARGET_AVX2 static int tiles_avx2(const Job* j, int64_t n0, int64_t n1) {
  const int64_t nb = j->K / BLOCK;
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  float ds[MAX_BLOCKS], ms[MAX_BLOCKS];
  float* wide = (float*)malloc(sizeof(float) * TILE_R * j->K);
  if (!wide) return 0; /* K <= 32768: 384 KiB at most */
  for (int64_t n = n0; n < n1; n += TILE_R) {
    const int64_t rows = n1 - n < TILE_R ? n1 - n : TILE_R;
    const float* w[TILE_R];
    for (int64_t r = 0; r < rows; ++r) {
      if (n + r + ahead < n1) prefetch_row(j, n + r + ahead);
      if (j->fmt == FMT_Q8_0 || j->fmt == FMT_Q4_1) scales_avx2(j->d + (n + r) * nb, nb, ds);
      if (j->fmt == FMT_Q4_1) scales_avx2(j->m + (n + r) * nb, nb, ms);
      dequantize_row_avx2(j, n + r, ds, ms, wide + r * j->K);
      w[r] = wide + r * j->K;
    }
    for (int64_t b0 = 0; b0 < j->B; b0 += TILE_C) {
      const int64_t cols = j->B - b0 < TILE_C ? j->B - b0 : TILE_C;
      if (rows == 3) {
        TILE_COLS(3)
      } else if (rows == 2) {
        TILE_COLS(2)
      } else {
        TILE_COLS(1)
      }
    }
  }
  free(wide);
  return 1;
}

#undef TILE_COLS

TARGET_AVX2 void rows_avx2(const Job* j, int64_t n0, int64_t n1) {
  if (j->B > (j->fmt == FMT_F32 ? F32_TILE_MIN_B : AVX2_CB) && tiles_avx2(j, n0, n1)) return;
  const int64_t nb = j->K / BLOCK;
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  float ds[MAX_BLOCKS], ms[MAX_BLOCKS];
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < n1) prefetch_row(j, n + ahead);
    if (j->fmt == FMT_Q8_0) {
      scales_avx2(j->d + n * nb, nb, ds);
#define CALL(cb) row_avx2_cb(j, FMT_Q8_0, n, b0, cb, ds, ms)
      DISPATCH_CB2(CALL)
#undef CALL
    } else if (j->fmt == FMT_Q4_1) {
      scales_avx2(j->d + n * nb, nb, ds);
      scales_avx2(j->m + n * nb, nb, ms);
#define CALL(cb) row_avx2_cb(j, FMT_Q4_1, n, b0, cb, ds, ms)
      DISPATCH_CB2(CALL)
#undef CALL
    } else if (j->fmt == FMT_BF16) {
#define CALL(cb) row_avx2_cb(j, FMT_BF16, n, b0, cb, ds, ms)
      DISPATCH_CB2(CALL)
#undef CALL
    } else {
#define CALL(cb) row_avx2_cb(j, FMT_F32, n, b0, cb, ds, ms)
      DISPATCH_CB2(CALL)
#undef CALL
    }
  }
}

#endif /* SPLITSERVE_X86 */
