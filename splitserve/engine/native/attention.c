/* Decode attention for the JAX engine, called through XLA's FFI.

   For each live row r < n and KV head h, the G query heads that share h attend to the first
   lengths[r] positions of that row's cache:

     q        float32 [n, KV, G, D]   (already scaled by 1/sqrt(D))
     cache_k  float32 [R, KV, D, C]   keys transposed: each of the D rows runs along positions
     cache_v  float32 [R, KV, C, D]
     lengths  int32 [n]               1 <= lengths[r] <= C
     out      float32 [n, KV, G, D]   softmax(q . K) . V

   Why a kernel of our own: XLA reads the whole capacity C of every row (a step's program is
   compiled per capacity bucket, so the positions past a sequence's end are read and masked),
   and lowers the step's attention to a dozen loops per layer; here each row reads only the
   positions it has, in one pass per operand, and the G query heads share every load.

   Scores: 16 positions at a time, a key row of the transposed cache at a time (no horizontal
   sums). Softmax in float32 with the row maximum subtracted, as XLA's; exp is a polynomial
   (Cephes' expf, within 2 ulp). Each row's result depends only on that row: the same whatever
   else is in the batch or how the work is split. AVX-512 when the CPU has it and D is a
   multiple of 16, AVX2 when it has that and D is a multiple of 8, else portable C. Against
   XLA's attention the decode step is faster at every batch measured and a decode program
   compiles faster; on an AVX2-only host the AVX2 path keeps its accumulators in registers,
   where a first draft that kept them in memory was barely faster than portable C (measured in
   lab/benchmarks.md). */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

/* The cache row query row r reads, and how many of its positions. */
static inline int64_t cache_of(const AttnJob* j, int64_t r) { return r / j->per_cache; }
static inline int64_t length_of(const AttnJob* j, int64_t r) {
  return j->lengths ? j->lengths[r] : r % j->per_cache + 1;
}

/* ---- one (row, KV head) item, portable ----------------------------------------------------- */

static void item_scalar(const AttnJob* j, int64_t r, int64_t h, float* s /* [G, C] */) {
  const int64_t G = j->G, D = j->D, C = j->C, L = length_of(j, r);
  const float* q = j->q + (r * j->KV + h) * G * D;
  const float* kt = j->ck + (cache_of(j, r) * j->KV + h) * D * C;
  const float* v = j->cv + (cache_of(j, r) * j->KV + h) * C * D;
  float* o = j->out + (r * j->KV + h) * G * D;
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * C;
    for (int64_t c = 0; c < L; ++c) sg[c] = 0.0f;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t c = 0; c < L; ++c) sg[c] += q[g * D + d] * kt[d * C + c];
    float top = sg[0], total = 0.0f;
    for (int64_t c = 1; c < L; ++c) top = sg[c] > top ? sg[c] : top;
    for (int64_t c = 0; c < L; ++c) {
      sg[c] = expf(sg[c] - top);
      total += sg[c];
    }
    for (int64_t d = 0; d < D; ++d) o[g * D + d] = 0.0f;
    for (int64_t c = 0; c < L; ++c)
      for (int64_t d = 0; d < D; ++d) o[g * D + d] += sg[c] * v[c * D + d];
    for (int64_t d = 0; d < D; ++d) o[g * D + d] /= total;
  }
}

#ifdef SPLITSERVE_X86

/* ---- AVX-512 ------------------------------------------------------------------------------- */

/* e^x for x <= 0 (Cephes expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n). */
TARGET_AVX512 static inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

/* sg[0, L) <- exp(sg - max), in place; returns their sum (the softmax's denominator). */
TARGET_AVX512 static inline float softmax_avx512(float* sg, int64_t L) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  int64_t c = 0;
  for (; c + 16 <= L; c += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(sg + c));
  float t = _mm512_reduce_max_ps(top);
  for (; c < L; ++c) t = sg[c] > t ? sg[c] : t;
  const __m512 tv = _mm512_set1_ps(t);
  __m512 sum = _mm512_setzero_ps();
  for (c = 0; c < L; c += 16) {
    const __mmask16 m = L - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (L - c)) - 1);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + c), tv));
    _mm512_mask_storeu_ps(sg + c, m, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  return _mm512_reduce_add_ps(sum);
}

/* item_avx512's register blocks, each of compile-time size (GN query heads, DN 16-lane pieces
   of a head: each `const int` is a constant where the function is inlined), so that the
   accumulators stay in registers. With the sizes taken from the data the compiler kept them
   in memory and copied them with memmove, and attention took a much larger share of a
   many-row decode step (perf samples of lab/engine/engine_steps.py). The operations and their
   order are the same either way, so are the bits. Four pieces of positions a pass (each
   broadcast query value feeding four multiply-adds) measured no better: the caches' reads set
   the pace. */

/* s[g * C + c0 ..] for GN (<= 4) query heads at the 16 positions from c0 (lanes of mask m). */
TARGET_AVX512 INLINE void scores_avx512(const float* q, const float* kt, int64_t D, int64_t C,
                                        int64_t c0, __mmask16 m, float* s, const int GN) {
  __m512 acc[4];
  for (int g = 0; g < GN; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 k = _mm512_maskz_loadu_ps(m, kt + d * C + c0);
    for (int g = 0; g < GN; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * D + d]), k, acc[g]);
  }
  for (int g = 0; g < GN; ++g) _mm512_mask_storeu_ps(s + g * C + c0, m, acc[g]);
}

/* o[g * D + d0 ..] = sum_c p[g, c] v[c, d0 ..] / total[g] for GN (<= 4) query heads and DN
   (<= 4) 16-lane pieces from d0. */
TARGET_AVX512 INLINE void values_avx512(const float* p, int64_t C, const float* v, int64_t D,
                                        int64_t L, const float* total, float* o, const int GN,
                                        const int DN) {
  __m512 acc[4][4];
  for (int g = 0; g < GN; ++g)
    for (int i = 0; i < DN; ++i) acc[g][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < L; ++c) {
    const float* vc = v + c * D;
    __m512 vv[4];
    for (int i = 0; i < DN; ++i) vv[i] = _mm512_loadu_ps(vc + 16 * i);
    for (int g = 0; g < GN; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * C + c]);
      for (int i = 0; i < DN; ++i) acc[g][i] = _mm512_fmadd_ps(pg, vv[i], acc[g][i]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    const __m512 inv = _mm512_set1_ps(1.0f / total[g]);
    for (int i = 0; i < DN; ++i)
      _mm512_storeu_ps(o + g * D + 16 * i, _mm512_mul_ps(acc[g][i], inv));
  }
}

#define VALUES_DN(GN)                                                                   \
  switch (dn) {                                                                         \
    case 1: values_avx512(p, C, vd, D, L, tg, og, GN, 1); break;                        \
    case 2: values_avx512(p, C, vd, D, L, tg, og, GN, 2); break;                        \
    case 3: values_avx512(p, C, vd, D, L, tg, og, GN, 3); break;                        \
    default: values_avx512(p, C, vd, D, L, tg, og, GN, 4); break;                       \
  }

TARGET_AVX512 static void item_avx512(const AttnJob* j, int64_t r, int64_t h, float* s) {
  const int64_t G = j->G, D = j->D, C = j->C, L = length_of(j, r);
  const float* q = j->q + (r * j->KV + h) * G * D;
  const float* kt = j->ck + (cache_of(j, r) * j->KV + h) * D * C;
  const float* v = j->cv + (cache_of(j, r) * j->KV + h) * C * D;
  float* o = j->out + (r * j->KV + h) * G * D;
  /* scores s[g, c], 16 positions at a time; the tail chunk is masked */
  for (int64_t c0 = 0; c0 < L; c0 += 16) {
    const __mmask16 m = L - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (L - c0)) - 1);
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const float* qg = q + g0 * D;
      float* sg = s + g0 * C;
      switch (G - g0 < 4 ? G - g0 : 4) {
        case 1: scores_avx512(qg, kt, D, C, c0, m, sg, 1); break;
        case 2: scores_avx512(qg, kt, D, C, c0, m, sg, 2); break;
        case 3: scores_avx512(qg, kt, D, C, c0, m, sg, 3); break;
        default: scores_avx512(qg, kt, D, C, c0, m, sg, 4); break;
      }
    }
  }
  /* softmax per query head */
  float total[MAX_G];
  for (int64_t g = 0; g < G; ++g) total[g] = softmax_avx512(s + g * C, L);
  /* out[g] = sum_c p[g, c] v[c] / total[g], 64 dims and up to 4 heads at a time */
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int64_t dn = D - d0 < 64 ? (D - d0 + 15) / 16 : 4;
    const float* vd = v + d0;
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const float* p = s + g0 * C;
      const float* tg = total + g0;
      float* og = o + g0 * D + d0;
      switch (G - g0 < 4 ? G - g0 : 4) {
        case 1: VALUES_DN(1) break;
        case 2: VALUES_DN(2) break;
        case 3: VALUES_DN(3) break;
        default: VALUES_DN(4) break;
      }
    }
  }
}

#undef VALUES_DN

/* ---- AVX2 ----------------------------------------------------------------------------------- */

/* exp_avx512's Cephes polynomial in 8 lanes (AVX2 has no scalef): 2^n is built in the exponent
   bits, which stay in range since x >= -87 gives n >= -126. */
TARGET_AVX2 static inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Lanes [0, left) of an 8-lane vector (left >= 8: all; left <= 0: none). */
TARGET_AVX2 static inline __m256i lanes_avx2(int64_t left) {
  const __m256i iota = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
  const int n = left >= 8 ? 8 : (left <= 0 ? 0 : (int)left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), iota);
}

/* The AVX2 passes work on register blocks of compile-time size (each `const int` below is a
   constant where the function is inlined), so the accumulators stay in registers: with the
   sizes taken from the data (as item_avx512 once had them) the compiler kept them in memory,
   and a layer's attention took about three times as long. */

/* Scores of GN (<= 3) query heads at positions [c0, c0 + 24): s[g * S + c] = q[g] . K[:, c].
   Nine independent chains of D multiply-adds; lanes at or past L are neither read nor used
   (their stores land in the scratch's padding). FULL: all 24 positions are below L. */
TARGET_AVX2 INLINE void scores_avx2(const float* q, const float* kt, int64_t D, int64_t C,
                                    int64_t L, int64_t c0, float* s, int64_t S, const int GN,
                                    const int FULL) {
  const __m256i m0 = lanes_avx2(L - c0), m1 = lanes_avx2(L - c0 - 8), m2 = lanes_avx2(L - c0 - 16);
  __m256 a[3][3];
  for (int g = 0; g < 3; ++g) a[g][0] = a[g][1] = a[g][2] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const float* k = kt + d * C + c0;
    /* the keys two blocks ahead: D rows C floats apart are more streams than the hardware
       prefetcher follows (no clear gain measured on a noisy host, no loss either) */
    _mm_prefetch((const char*)(k + 48), _MM_HINT_T0);
    _mm_prefetch((const char*)(k + 64), _MM_HINT_T0);
    const __m256 k0 = FULL ? _mm256_loadu_ps(k) : _mm256_maskload_ps(k, m0);
    const __m256 k1 = FULL ? _mm256_loadu_ps(k + 8) : _mm256_maskload_ps(k + 8, m1);
    const __m256 k2 = FULL ? _mm256_loadu_ps(k + 16) : _mm256_maskload_ps(k + 16, m2);
    for (int g = 0; g < GN; ++g) {
      const __m256 qg = _mm256_broadcast_ss(q + g * D + d);
      a[g][0] = _mm256_fmadd_ps(qg, k0, a[g][0]);
      a[g][1] = _mm256_fmadd_ps(qg, k1, a[g][1]);
      a[g][2] = _mm256_fmadd_ps(qg, k2, a[g][2]);
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int i = 0; i < 3; ++i) _mm256_storeu_ps(s + g * S + c0 + 8 * i, a[g][i]);
}

/* out[g, d0 .. d0 + 8 DV) = sum_c p[g, c] v[c, d0 ..] / total[g] for GN (<= 3) heads:
   3 x 4 accumulators at most, one pass over the value rows' slice. */
TARGET_AVX2 INLINE void values_avx2(const float* p, int64_t S, const float* v, int64_t D,
                                    int64_t L, int64_t d0, const float* total, float* o,
                                    const int GN, const int DV) {
  __m256 a[3][4];
  for (int g = 0; g < 3; ++g)
    for (int i = 0; i < 4; ++i) a[g][i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < L; ++c) {
    const float* vc = v + c * D + d0;
    __m256 vv[4];
    for (int i = 0; i < DV; ++i) vv[i] = _mm256_loadu_ps(vc + 8 * i);
    for (int g = 0; g < GN; ++g) {
      const __m256 pg = _mm256_broadcast_ss(p + g * S + c);
      for (int i = 0; i < DV; ++i) a[g][i] = _mm256_fmadd_ps(pg, vv[i], a[g][i]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    const __m256 inv = _mm256_set1_ps(1.0f / total[g]);
    for (int i = 0; i < DV; ++i) _mm256_storeu_ps(o + g * D + d0 + 8 * i, _mm256_mul_ps(a[g][i], inv));
  }
}

#define VALUES_DV(GN)                                                                    \
  switch (dv) {                                                                          \
    case 1: values_avx2(p, S, v, D, L, d0, total, o, GN, 1); break;                     \
    case 2: values_avx2(p, S, v, D, L, d0, total, o, GN, 2); break;                     \
    case 3: values_avx2(p, S, v, D, L, d0, total, o, GN, 3); break;                     \
    default: values_avx2(p, S, v, D, L, d0, total, o, GN, 4); break;                    \
  }

/* One (row, KV head) item in 8 lanes; s is the scratch [G, S] (S = scores_stride). */
TARGET_AVX2 static void item_avx2(const AttnJob* j, int64_t r, int64_t h, float* s) {
  const int64_t G = j->G, D = j->D, C = j->C, L = length_of(j, r), S = scores_stride(j);
  const float* q = j->q + (r * j->KV + h) * G * D;
  const float* kt = j->ck + (cache_of(j, r) * j->KV + h) * D * C;
  const float* v = j->cv + (cache_of(j, r) * j->KV + h) * C * D;
  float* out = j->out + (r * j->KV + h) * G * D;
  /* scores, three query heads and 24 positions a block */
  for (int64_t g0 = 0; g0 < G; g0 += 3) {
    const int64_t gn = G - g0 < 3 ? G - g0 : 3;
    const float* qg = q + g0 * D;
    float* sg = s + g0 * S;
    for (int64_t c0 = 0; c0 < L; c0 += 24) {
      const int full = c0 + 24 <= L;
      if (gn == 3) {
        if (full) scores_avx2(qg, kt, D, C, L, c0, sg, S, 3, 1);
        else scores_avx2(qg, kt, D, C, L, c0, sg, S, 3, 0);
      } else if (gn == 2) {
        if (full) scores_avx2(qg, kt, D, C, L, c0, sg, S, 2, 1);
        else scores_avx2(qg, kt, D, C, L, c0, sg, S, 2, 0);
      } else {
        if (full) scores_avx2(qg, kt, D, C, L, c0, sg, S, 1, 1);
        else scores_avx2(qg, kt, D, C, L, c0, sg, S, 1, 0);
      }
    }
  }
  /* softmax per query head: p = exp(s - max) in place, total = sum p (lanes past L count 0) */
  float total[MAX_G];
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * S;
    __m256 top = _mm256_set1_ps(-INFINITY);
    for (int64_t c = 0; c < L; c += 8) {
      const __m256 m = _mm256_castsi256_ps(lanes_avx2(L - c));
      top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(sg + c), m));
    }
    __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
    const __m256 tv = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(t4, _mm_movehdup_ps(t4))));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t c = 0; c < L; c += 8) {
      const __m256 m = _mm256_castsi256_ps(lanes_avx2(L - c));
      const __m256 e = _mm256_and_ps(exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(sg + c), tv)), m);
      _mm256_storeu_ps(sg + c, e);
      sum = _mm256_add_ps(sum, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    total[g] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
  }
  /* p . V, three query heads and 32 dimensions a block */
  for (int64_t g0 = 0; g0 < G; g0 += 3) {
    const int64_t gn = G - g0 < 3 ? G - g0 : 3;
    const float* p = s + g0 * S;
    float* o = out + g0 * D;
    const float* tg = total + g0;
    for (int64_t d0 = 0; d0 < D; d0 += 32) {
      const int64_t dv = (D - d0) / 8 < 4 ? (D - d0) / 8 : 4;
      const float* total = tg;
      if (gn == 3) {
        VALUES_DV(3)
      } else if (gn == 2) {
        VALUES_DV(2)
      } else {
        VALUES_DV(1)
      }
    }
  }
}

#undef VALUES_DV

/* ---- a prompt pass's attention, AVX-512, D = 64 ----------------------------------------------- */

/* Positions per block: their G query heads share every key load (PQ * G <= 16 accumulators). */
#define PQ 4
#define PD 64

/* Positions [t0, t0 + PQ) of sequence n, KV head h, G query heads each (GN: G, a constant where
   inlined, so the accumulators stay in registers). s: scratch [PQ * GN, T + 16]. Each score is
   the same sum in the same order as item_avx512's, and so are the softmax and the weighted sum
   of values: a position's result does not depend on the block it falls in. */
TARGET_AVX512 INLINE void prompt_block_avx512(const AttnJob* j, int64_t n, int64_t h,
                                              int64_t t0, float* s, const int GN) {
  const int64_t T = j->C, KV = j->KV, S = T + 16, np = T - t0 < PQ ? T - t0 : PQ, L = t0 + np;
  const float* kt = j->ck + (n * KV + h) * PD * T;
  const float* v = j->cv + (n * KV + h) * T * PD;
  const float* qp[PQ];
  float* op[PQ];
  for (int p = 0; p < PQ; ++p) { /* past the last position: the last one again, not stored */
    const int64_t t = t0 + (p < np ? p : np - 1);
    qp[p] = j->q + ((n * T + t) * KV + h) * GN * PD;
    op[p] = j->out + ((n * T + t) * KV + h) * GN * PD;
  }
  for (int64_t c0 = 0; c0 < L; c0 += 16) {
    const __mmask16 m = L - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (L - c0)) - 1);
    __m512 acc[PQ * GN];
    for (int r = 0; r < PQ * GN; ++r) acc[r] = _mm512_setzero_ps();
    for (int d = 0; d < PD; ++d) {
      const __m512 k = _mm512_maskz_loadu_ps(m, kt + d * T + c0);
      for (int p = 0; p < PQ; ++p)
        for (int g = 0; g < GN; ++g)
          acc[p * GN + g] = _mm512_fmadd_ps(_mm512_set1_ps(qp[p][g * PD + d]), k, acc[p * GN + g]);
    }
    for (int r = 0; r < PQ * GN; ++r) _mm512_mask_storeu_ps(s + r * S + c0, m, acc[r]);
  }
  for (int p = 0; p < np; ++p) {
    const int64_t Lp = t0 + p + 1; /* causal: this position reads keys 0..t0 + p */
    float total[GN];
    for (int g = 0; g < GN; ++g) total[g] = softmax_avx512(s + (p * GN + g) * S, Lp);
    __m512 acc[GN][4];
    for (int g = 0; g < GN; ++g)
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < Lp; ++c) {
      const float* vc = v + c * PD;
      const __m512 v0 = _mm512_loadu_ps(vc), v1 = _mm512_loadu_ps(vc + 16),
                   v2 = _mm512_loadu_ps(vc + 32), v3 = _mm512_loadu_ps(vc + 48);
      for (int g = 0; g < GN; ++g) {
        const __m512 pg = _mm512_set1_ps(s[(p * GN + g) * S + c]);
        acc[g][0] = _mm512_fmadd_ps(pg, v0, acc[g][0]);
        acc[g][1] = _mm512_fmadd_ps(pg, v1, acc[g][1]);
        acc[g][2] = _mm512_fmadd_ps(pg, v2, acc[g][2]);
        acc[g][3] = _mm512_fmadd_ps(pg, v3, acc[g][3]);
      }
    }
    for (int g = 0; g < GN; ++g) {
      const __m512 inv = _mm512_set1_ps(1.0f / total[g]);
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(op[p] + g * PD + 16 * i, _mm512_mul_ps(acc[g][i], inv));
    }
  }
}

/* Blocks [b0, b1) of (sequence, KV head, PQ positions), positions fastest. */
TARGET_AVX512 static void prompt_blocks_avx512(const void* job, int64_t b0, int64_t b1) {
  const AttnJob* j = (const AttnJob*)job;
  const int64_t T = j->C, per_seq = (T + PQ - 1) / PQ;
  float* s = (float*)malloc(sizeof(float) * (size_t)(PQ * j->G * (T + 16)));
  if (!s) return; /* checked by the caller's size limits; nothing sensible to do here */
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t nh = b / per_seq, t0 = b % per_seq * PQ, n = nh / j->KV, h = nh % j->KV;
    switch (j->G) {
      case 1: prompt_block_avx512(j, n, h, t0, s, 1); break;
      case 2: prompt_block_avx512(j, n, h, t0, s, 2); break;
      case 3: prompt_block_avx512(j, n, h, t0, s, 3); break;
      default: prompt_block_avx512(j, n, h, t0, s, 4); break;
    }
  }
  free(s);
}

#endif /* SPLITSERVE_X86 */

/* ---- the handler ------------------------------------------------------------------------------ */

AttnItemFn* attention_item_fn(int64_t D) {
#ifdef SPLITSERVE_X86
  /* the vector paths take D in whole vectors */
  if (current_isa() == ISA_AVX512 && D % 16 == 0) return item_avx512;
  if (current_isa() == ISA_AVX2 && D % 8 == 0) return item_avx2;
#endif
  (void)D;
  return item_scalar;
}

static void items(const void* job, int64_t i0, int64_t i1) {
  const AttnJob* j = (const AttnJob*)job;
  AttnItemFn* fn = attention_item_fn(j->D);
  float* s = (float*)malloc(sizeof(float) * (size_t)(j->G * scores_stride(j)));
  if (!s) return; /* checked by the caller's size limits; nothing sensible to do here */
  for (int64_t i = i0; i < i1; ++i) fn(j, i / j->KV, i % j->KV, s);
  free(s);
}

EXPORT XLA_FFI_Error* splitserve_attention(XLA_FFI_CallFrame* cf) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  XLA_FFI_Buffer *q = ffi_arg(cf, 0), *ck = ffi_arg(cf, 1), *cv = ffi_arg(cf, 2);
  XLA_FFI_Buffer *len = ffi_arg(cf, 3), *out = ffi_ret(cf);
  if (cf->args.size != 4 || !q || !ck || !cv || !len || !out || q->rank != 4 || ck->rank != 4 ||
      cv->rank != 4 || len->rank != 1 || q->dtype != XLA_FFI_DataType_F32 ||
      ck->dtype != XLA_FFI_DataType_F32 || cv->dtype != XLA_FFI_DataType_F32 ||
      out->dtype != XLA_FFI_DataType_F32 || len->dtype != XLA_FFI_DataType_S32)
    return ffi_error(api, "attention: q, caches, out float32 rank 4; lengths int32 [n]");
  AttnJob j;
  j.n = q->dims[0];
  j.KV = q->dims[1];
  j.G = q->dims[2];
  j.D = q->dims[3];
  j.C = ck->dims[3];
  if (ck->dims[0] < j.n || ck->dims[1] != j.KV || ck->dims[2] != j.D || cv->dims[0] != ck->dims[0]
      || cv->dims[1] != j.KV || cv->dims[2] != j.C || cv->dims[3] != j.D || len->dims[0] != j.n ||
      j.G > MAX_G)
    return ffi_error(api, "attention: shapes do not agree (or more than 16 query heads per KV)");
  j.q = (const float*)q->data;
  j.ck = (const float*)ck->data;
  j.cv = (const float*)cv->data;
  j.lengths = (const int32_t*)len->data;
  j.per_cache = 1;
  j.out = (float*)out->data;
  for (int64_t r = 0; r < j.n; ++r)
    if (j.lengths[r] < 1 || j.lengths[r] > j.C)
      return ffi_error(api, "attention: lengths must be in 1..C");
  /* Shared out however little work it is, unlike the products (qmatmul.c).
     A step's attention sits between its QKV and output products; at one live row it is too
     short to share for its own sake but long enough for the pool's other threads to fall
     asleep, and the output product then ran on the calling thread alone while they woke, about
     twice as long a layer. Handed out, the heads wake them while the caller works: the whole
     step at one live row is shorter, in float32 and more so in the GGUF's blocks
     (lab/benchmarks.md). */
  parallel_for(api, cf->ctx, j.n * j.KV, SHARE_ALWAYS, items, &j, sizeof j);
  return NULL;
}

#ifdef SPLITSERVE_X86
static int prompt_fast_path(const AttnJob* j) {
  return current_isa() == ISA_AVX512 && j->D == PD && j->G <= 4;
}
#endif

/* Whether a prompt pass's attention takes the blocked path (prompt_blocks_avx512): elsewhere
   it runs position by position (items), which XLA's batched products beat (llama_model.py
   then keeps XLA's). */
EXPORT int splitserve_prompt_attention_fast(int64_t D, int64_t G) {
#ifdef SPLITSERVE_X86
  AttnJob j;
  j.D = D;
  j.G = G;
  return prompt_fast_path(&j);
#else
  (void)D;
  (void)G;
  return 0;
#endif
}

/* A prompt pass's causal attention, T positions of N sequences:

     q     float32 [N, T, KV, G, D]   (already scaled by 1/sqrt(D))
     kt    float32 [N, KV, D, T]      keys transposed, as the decode cache
     v     float32 [N, KV, T, D]
     out   float32 [N, T, KV, G, D]   position t attends to positions 0..t of its sequence

   Each position is a decode item (above) whose cache is its sequence's keys and whose length is
   t + 1, so q and out keep the layout the QKV product gives and the output product takes: XLA
   transposed the query heads to the front and back around two batched products, and that,
   with the masked softmax between them, took a large share of a bfloat16 prompt's call
   (lab/benchmarks.md, "Prefill on the tiles"). */
EXPORT XLA_FFI_Error* splitserve_prompt_attention(XLA_FFI_CallFrame* cf) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  XLA_FFI_Buffer *q = ffi_arg(cf, 0), *kt = ffi_arg(cf, 1), *v = ffi_arg(cf, 2), *out = ffi_ret(cf);
  if (cf->args.size != 3 || !q || !kt || !v || !out || q->rank != 5 || kt->rank != 4 ||
      v->rank != 4 || out->rank != 5 || q->dtype != XLA_FFI_DataType_F32 ||
      kt->dtype != XLA_FFI_DataType_F32 || v->dtype != XLA_FFI_DataType_F32 ||
      out->dtype != XLA_FFI_DataType_F32)
    return ffi_error(api, "prompt_attention: q, out float32 rank 5; kt, v float32 rank 4");
  AttnJob j;
  const int64_t N = q->dims[0], T = q->dims[1];
  j.KV = q->dims[2];
  j.G = q->dims[3];
  j.D = q->dims[4];
  j.C = T;
  j.n = N * T;
  j.per_cache = T;
  for (int i = 0; i < 5; ++i)
    if (out->dims[i] != q->dims[i]) return ffi_error(api, "prompt_attention: out must be q's shape");
  if (kt->dims[0] != N || kt->dims[1] != j.KV || kt->dims[2] != j.D || kt->dims[3] != T ||
      v->dims[0] != N || v->dims[1] != j.KV || v->dims[2] != T || v->dims[3] != j.D ||
      j.G > MAX_G || T < 1)
    return ffi_error(api, "prompt_attention: shapes do not agree (or more than 16 query heads per KV)");
  if (j.n == 0) return NULL;
  j.q = (const float*)q->data;
  j.ck = (const float*)kt->data;
  j.cv = (const float*)v->data;
  j.lengths = NULL;
  j.out = (float*)out->data;
  const int64_t work = j.n * j.KV * T * j.G * j.D; /* twice the multiply-adds: causal */
#ifdef SPLITSERVE_X86
  if (prompt_fast_path(&j)) {
    parallel_for(api, cf->ctx, N * j.KV * ((T + PQ - 1) / PQ), work, prompt_blocks_avx512, &j,
                 sizeof j);
    return NULL;
  }
#endif
  parallel_for(api, cf->ctx, j.n * j.KV, work, items, &j, sizeof j);
  return NULL;
}
