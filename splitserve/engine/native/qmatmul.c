/* Weight-only quantized matrix products for the JAX engine, called through XLA's FFI.

   y[b, n] = sum_k x[b, k] * w[n, k], with x float32 [B, K] and w stored quantized, one row per
   output n (GGUF's own orientation), in blocks of 32 along k:

     q8_0  qs int8 [N, K],      d f16 [N, K/32]               w = d * q
     q4_1  qs uint8 [N, K/2],   d, m f16 [N, K/32]            w = d * q + m, q in 0..15
           (GGUF's nibble order: byte j of a block holds element j low, element j + 16 high)
     bf16  w uint16 [N, K]                                    w = the bfloat16 bits << 16

   Why a kernel of our own: XLA on CPU widens a narrow weight to float32 in memory before its
   matmul, so int8 or bfloat16 weights ran 7-8x slower than float32 ones; here each weight is
   widened in registers and used at once, so a step reads 1.06 (q8_0), 0.625 (q4_1) or 2 (bf16)
   bytes per weight instead of 4.

   Exactness: every weight is dequantized exactly as gguf's reference dequantizer does it (the
   products d * q are exact in float32, and d * q + m is one rounding either way), so against
   float32 weights dequantized from the same file only the order of the sums differs. That order
   depends on the row and the instruction set only, never on B or on the other rows: a request
   gets bit-identical logits whatever batch it runs in.

   Threads: rows are split into chunks shared by the calling thread and XLA's intra-op pool
   (parallel_for, ffi_common.h).

   Plain C11 against XLA's C API header (vendored: no C++ compiler and no jaxlib needed to
   build); AVX-512 and AVX2 paths chosen at run time, with a portable fallback. */

#include <stdlib.h>
#include <string.h>

#include "ffi_common.h"

#define BLOCK 32
#define MAX_BLOCKS 1024 /* K <= 32768: the scales of one row fit on the stack */
#define MAX_CB 8        /* batch rows per pass over a weight row (accumulators in registers) */

enum { FMT_Q8_0 = 0, FMT_Q4_1 = 1, FMT_BF16 = 2 };

typedef struct Job Job;
typedef void RowsFn(const Job* j, int64_t n0, int64_t n1);

struct Job {
  RowsFn* rows;
  int fmt;
  int64_t B, K, N;
  const float* x;     /* [B, K] */
  const void* w;      /* qs (int8 / uint8 nibbles) or bf16 bits */
  const uint16_t* d;  /* [N, K/32] f16 */
  const uint16_t* m;  /* [N, K/32] f16 (q4_1) */
  float* y;           /* [B, N] */
};

/* ---- half precision, portable ------------------------------------------------------------ */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* ---- portable fallback --------------------------------------------------------------------- */

static void rows_scalar(const Job* j, int64_t n0, int64_t n1) {
  const int64_t K = j->K, nb = K / BLOCK;
  float wrow[BLOCK];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < j->B; ++b) j->y[b * j->N + n] = 0.0f;
    for (int64_t blk = 0; blk < nb; ++blk) {
      if (j->fmt == FMT_Q8_0) {
        const int8_t* q = (const int8_t*)j->w + n * K + blk * BLOCK;
        float d = half_to_float(j->d[n * nb + blk]);
        for (int i = 0; i < BLOCK; ++i) wrow[i] = d * (float)q[i];
      } else if (j->fmt == FMT_Q4_1) {
        const uint8_t* q = (const uint8_t*)j->w + n * (K / 2) + blk * (BLOCK / 2);
        float d = half_to_float(j->d[n * nb + blk]), m = half_to_float(j->m[n * nb + blk]);
        for (int i = 0; i < BLOCK / 2; ++i) {
          wrow[i] = d * (float)(q[i] & 0xf) + m;
          wrow[i + BLOCK / 2] = d * (float)(q[i] >> 4) + m;
        }
      } else {
        const uint16_t* q = (const uint16_t*)j->w + n * K + blk * BLOCK;
        for (int i = 0; i < BLOCK; ++i) wrow[i] = bf16_to_float(q[i]);
      }
      for (int64_t b = 0; b < j->B; ++b) {
        const float* x = j->x + b * K + blk * BLOCK;
        float s = 0.0f;
        for (int i = 0; i < BLOCK; ++i) s += wrow[i] * x[i];
        j->y[b * j->N + n] += s;
      }
    }
  }
}

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

/* The batch loop: chunks of MAX_CB, each specialised on its size so the accumulators stay in
   registers. */
#define DISPATCH_CB(call)                                           \
  for (int64_t b0 = 0; b0 < j->B; b0 += MAX_CB) {                   \
    const int64_t left = j->B - b0;                                 \
    switch (left < MAX_CB ? left : MAX_CB) {                        \
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

/* A row's weights are read once, start to end, row after row: one long stream. One core keeps
   too few misses in flight to stream it at the memory's pace while it computes, so each row
   asks for the lines of the row PREFETCH_BYTES ahead. Measured on a cold 1536x576 matrix at one
   batch row (minimum of 20 passes over 200 matrices, 6 alternating runs): q4_1 0.089 -> 0.063
   ms, q8_0 0.146 -> 0.104 with 4 KiB ahead; no change at 16 rows (there it computes). */
#define PREFETCH_BYTES 4096

static inline int64_t row_bytes(const Job* j) {
  return j->fmt == FMT_Q8_0 ? j->K : (j->fmt == FMT_Q4_1 ? j->K / 2 : 2 * j->K);
}

static inline void prefetch_row(const Job* j, int64_t n) {
#ifdef SPLITSERVE_X86
  const int64_t size = row_bytes(j), nb = j->K / BLOCK;
  const char* q = (const char*)j->w + n * size;
  for (int64_t i = 0; i < size; i += 64) _mm_prefetch(q + i, _MM_HINT_T0);
  if (j->d) _mm_prefetch((const char*)(j->d + n * nb), _MM_HINT_T0);
  if (j->m) _mm_prefetch((const char*)(j->m + n * nb), _MM_HINT_T0);
#else
  (void)j;
  (void)n;
#endif
}

TARGET_AVX512 static void rows_avx512(const Job* j, int64_t n0, int64_t n1) {
  const int64_t nb = j->K / BLOCK;
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  float ds[MAX_BLOCKS], ms[MAX_BLOCKS];
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < n1) prefetch_row(j, n + ahead);
    if (j->fmt == FMT_Q8_0) {
      scales_avx512(j->d + n * nb, nb, ds);
#define CALL(cb) q8_0_avx512_cb(j, n, b0, cb, ds)
      DISPATCH_CB(CALL)
#undef CALL
    } else if (j->fmt == FMT_Q4_1) {
      scales_avx512(j->d + n * nb, nb, ds);
      scales_avx512(j->m + n * nb, nb, ms);
#define CALL(cb) q4_1_avx512_cb(j, n, b0, cb, ds, ms)
      DISPATCH_CB(CALL)
#undef CALL
    } else {
#define CALL(cb) bf16_avx512_cb(j, n, b0, cb)
      DISPATCH_CB(CALL)
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

#define AVX2_ACCUMULATE(w0, w1, w2, w3)                                  \
  for (int b = 0; b < cb; ++b) {                                         \
    const float* xb = x + (b0 + b) * K + blk * BLOCK;                    \
    acc[b][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), acc[b][0]);     \
    acc[b][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), acc[b][1]); \
    acc[b][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), acc[b][2]);\
    acc[b][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), acc[b][3]);\
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

TARGET_AVX2 INLINE void q8_0_avx2_cb(const Job* j, int64_t n, int64_t b0, const int cb,
                                     const float* ds) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const int8_t* q = (const int8_t*)j->w + n * K;
  __m256 acc[AVX2_CB][4];
  AVX2_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m256 d = _mm256_set1_ps(ds[blk]);
    const int8_t* qb = q + blk * BLOCK;
    const __m256 w0 = _mm256_mul_ps(avx2_i8(qb), d), w1 = _mm256_mul_ps(avx2_i8(qb + 8), d);
    const __m256 w2 = _mm256_mul_ps(avx2_i8(qb + 16), d), w3 = _mm256_mul_ps(avx2_i8(qb + 24), d);
    AVX2_ACCUMULATE(w0, w1, w2, w3)
  }
  AVX2_STORE()
}

TARGET_AVX2 INLINE void q4_1_avx2_cb(const Job* j, int64_t n, int64_t b0, const int cb,
                                     const float* ds, const float* ms) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const uint8_t* q = (const uint8_t*)j->w + n * (K / 2);
  const __m256i low4 = _mm256_set1_epi32(0xf);
  __m256 acc[AVX2_CB][4];
  AVX2_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m256 d = _mm256_set1_ps(ds[blk]), m = _mm256_set1_ps(ms[blk]);
    const uint8_t* qb = q + blk * 16;
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)qb));
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qb + 8)));
    const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, low4)), d, m);
    const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, low4)), d, m);
    const __m256 w2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m);
    const __m256 w3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), d, m);
    AVX2_ACCUMULATE(w0, w1, w2, w3)
  }
  AVX2_STORE()
}

TARGET_AVX2 static inline __m256 avx2_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

TARGET_AVX2 INLINE void bf16_avx2_cb(const Job* j, int64_t n, int64_t b0, const int cb) {
  const int64_t K = j->K, nb = K / BLOCK;
  const float* x = j->x;
  const uint16_t* q = (const uint16_t*)j->w + n * K;
  __m256 acc[AVX2_CB][4];
  AVX2_ZERO()
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint16_t* qb = q + blk * BLOCK;
    const __m256 w0 = avx2_bf16(qb), w1 = avx2_bf16(qb + 8);
    const __m256 w2 = avx2_bf16(qb + 16), w3 = avx2_bf16(qb + 24);
    AVX2_ACCUMULATE(w0, w1, w2, w3)
  }
  AVX2_STORE()
}

#define DISPATCH_CB2(call)                                          \
  for (int64_t b0 = 0; b0 < j->B; b0 += AVX2_CB) {                  \
    if (j->B - b0 >= 2) call(2); else call(1);                      \
  }

TARGET_AVX2 static void rows_avx2(const Job* j, int64_t n0, int64_t n1) {
  const int64_t nb = j->K / BLOCK;
  const int64_t ahead = PREFETCH_BYTES / row_bytes(j) + 1;
  float ds[MAX_BLOCKS], ms[MAX_BLOCKS];
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < n1) prefetch_row(j, n + ahead);
    if (j->fmt == FMT_Q8_0) {
      scales_avx2(j->d + n * nb, nb, ds);
#define CALL(cb) q8_0_avx2_cb(j, n, b0, cb, ds)
      DISPATCH_CB2(CALL)
#undef CALL
    } else if (j->fmt == FMT_Q4_1) {
      scales_avx2(j->d + n * nb, nb, ds);
      scales_avx2(j->m + n * nb, nb, ms);
#define CALL(cb) q4_1_avx2_cb(j, n, b0, cb, ds, ms)
      DISPATCH_CB2(CALL)
#undef CALL
    } else {
#define CALL(cb) bf16_avx2_cb(j, n, b0, cb)
      DISPATCH_CB2(CALL)
#undef CALL
    }
  }
}

#endif /* SPLITSERVE_X86 */

static RowsFn* rows_fn(void) {
  switch (current_isa()) {
#ifdef SPLITSERVE_X86
    case ISA_AVX512: return rows_avx512;
    case ISA_AVX2: return rows_avx2;
#endif
    default: return rows_scalar;
  }
}

static void rows_chunk(const void* job, int64_t n0, int64_t n1) {
  const Job* j = (const Job*)job;
  j->rows(j, n0, n1);
}

/* ---- the FFI handlers ------------------------------------------------------------------------ */

static int is_16bit(XLA_FFI_DataType t) {
  return t == XLA_FFI_DataType_U16 || t == XLA_FFI_DataType_F16 || t == XLA_FFI_DataType_BF16 ||
         t == XLA_FFI_DataType_S16;
}

/* A [N, cols] buffer of the given element kind. */
static int matrix(const XLA_FFI_Buffer* b, int64_t n, int64_t cols) {
  return b && b->rank == 2 && b->dims[0] == n && b->dims[1] == cols;
}

static XLA_FFI_Error* handle(XLA_FFI_CallFrame* cf, int fmt) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  const int nargs = fmt == FMT_Q4_1 ? 4 : (fmt == FMT_Q8_0 ? 3 : 2);
  if (cf->args.size != nargs || cf->rets.size != 1) return ffi_error(api, "qmatmul: wrong arity");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *w = ffi_arg(cf, 1), *y = ffi_ret(cf);
  if (!x || !w || !y || x->dtype != XLA_FFI_DataType_F32 || y->dtype != XLA_FFI_DataType_F32 ||
      x->rank < 1 || w->rank != 2)
    return ffi_error(api, "qmatmul: x and y must be float32, w a matrix");
  Job j;
  j.fmt = fmt;
  j.K = x->dims[x->rank - 1];
  j.N = w->dims[0];
  j.B = 1;
  for (int64_t i = 0; i + 1 < x->rank; ++i) j.B *= x->dims[i];
  if (j.K % BLOCK || j.K / BLOCK > MAX_BLOCKS)
    return ffi_error(api, "qmatmul: K must be a multiple of 32, at most 32768");
  int64_t yb = 1;
  for (int64_t i = 0; i + 1 < y->rank; ++i) yb *= y->dims[i];
  if (y->rank < 1 || y->dims[y->rank - 1] != j.N || yb != j.B)
    return ffi_error(api, "qmatmul: y must be [..., N] with x's leading dims");
  const int64_t nb = j.K / BLOCK;
  j.x = (const float*)x->data;
  j.w = w->data;
  j.y = (float*)y->data;
  j.d = j.m = NULL;
  if (fmt == FMT_BF16) {
    if (!matrix(w, j.N, j.K) || !is_16bit(w->dtype)) return ffi_error(api, "bf16: w [N, K] 16-bit");
  } else {
    XLA_FFI_Buffer* d = ffi_arg(cf, 2);
    int q_ok = fmt == FMT_Q8_0 ? matrix(w, j.N, j.K) : matrix(w, j.N, j.K / 2);
    if (!q_ok || !matrix(d, j.N, nb) || !is_16bit(d->dtype))
      return ffi_error(api, "qmatmul: qs [N, K or K/2] and d [N, K/32] f16 expected");
    j.d = (const uint16_t*)d->data;
    if (fmt == FMT_Q4_1) {
      XLA_FFI_Buffer* m = ffi_arg(cf, 3);
      if (!matrix(m, j.N, nb) || !is_16bit(m->dtype)) return ffi_error(api, "q4_1: m [N, K/32] f16");
      j.m = (const uint16_t*)m->data;
    }
  }
  j.rows = rows_fn();
  parallel_for(api, cf->ctx, j.N, j.B * j.K * j.N, rows_chunk, &j, sizeof j);
  return NULL;
}

EXPORT XLA_FFI_Error* splitserve_q8_0(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_Q8_0); }
EXPORT XLA_FFI_Error* splitserve_q4_1(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_Q4_1); }
EXPORT XLA_FFI_Error* splitserve_bf16(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_BF16); }
