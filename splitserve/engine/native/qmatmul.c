/* Weight-only quantized matrix products for the JAX engine, called through XLA's FFI.

   y[b, n] = sum_k x[b, k] * w[n, k], with x float32 [B, K] and w stored quantized, one row per
   output n (GGUF's own orientation), in blocks of 32 along k:

     q8_0  qs int8 [N, K],      d f16 [N, K/32]               w = d * q
     q4_1  qs uint8 [N, K/2],   d, m f16 [N, K/32]            w = d * q + m, q in 0..15
           (GGUF's nibble order: byte j of a block holds element j low, element j + 16 high)
     bf16  w uint16 [N, K]                                    w = the bfloat16 bits << 16
     f32   w float32 [N, K]                                   w itself

   Why a kernel of our own: XLA on CPU widens a narrow weight to float32 in memory before its
   matmul, so int8 or bfloat16 weights ran several times slower than float32 ones; here each
   weight is widened in registers and used at once, so a step reads 1.06 (q8_0), 0.625 (q4_1)
   or 2 (bf16) bytes per weight instead of 4. float32 rows are here too, for decode steps of
   few rows, where the default model's whole step is shorter than with XLA's matmul
   (lab/benchmarks.md, "Weight formats"), mostly from one sequential stream per thread
   (qmatmul_x86.c, F32_STREAM_MAX_B) and the output head as one call instead of XLA's column
   blocks.

   Exactness: every weight is dequantized exactly as gguf's reference dequantizer does it (the
   products d * q are exact in float32, and d * q + m is one rounding either way), so against
   float32 weights dequantized from the same file only the order of the sums differs. That order
   depends on the row and the instruction set only, never on B or on the other rows: a request
   gets bit-identical logits whatever batch it runs in.

   Threads: rows are split into chunks shared by the calling thread and XLA's intra-op pool
   (parallel_for, ffi_common.h).

   Plain C11 against XLA's C API header (vendored: no C++ compiler and no jaxlib needed to
   build); AVX-512 and AVX2 paths (qmatmul_x86.c) chosen at run time, with a portable fallback. */

#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"

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
      } else if (j->fmt == FMT_BF16) {
        const uint16_t* q = (const uint16_t*)j->w + n * K + blk * BLOCK;
        for (int i = 0; i < BLOCK; ++i) wrow[i] = bf16_to_float(q[i]);
      } else {
        memcpy(wrow, (const float*)j->w + n * K + blk * BLOCK, sizeof wrow);
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

RowsFn* rows_fn(void) {
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

int weight_buffers(int fmt) { return fmt == FMT_Q4_1 ? 3 : (fmt == FMT_Q8_0 ? 2 : 1); }

const char* set_weights(Job* j, int fmt, XLA_FFI_CallFrame* cf, int first) {
  XLA_FFI_Buffer* w = ffi_arg(cf, first);
  if (!w || w->rank != 2) return "qmatmul: the weights must be a matrix";
  if (j->K % BLOCK || j->K / BLOCK > MAX_BLOCKS)
    return "qmatmul: K must be a multiple of 32, at most 32768";
  const int64_t nb = j->K / BLOCK;
  j->fmt = fmt;
  j->N = w->dims[0];
  j->w = w->data;
  j->d = j->m = NULL;
  j->rows = rows_fn();
  if (fmt == FMT_BF16) {
    if (!matrix(w, j->N, j->K) || !is_16bit(w->dtype)) return "bf16: w [N, K] 16-bit";
  } else if (fmt == FMT_F32) {
    if (!matrix(w, j->N, j->K) || w->dtype != XLA_FFI_DataType_F32) return "f32: w [N, K] float32";
  } else {
    XLA_FFI_Buffer* d = ffi_arg(cf, first + 1);
    int q_ok = fmt == FMT_Q8_0 ? matrix(w, j->N, j->K) : matrix(w, j->N, j->K / 2);
    if (!q_ok || !matrix(d, j->N, nb) || !is_16bit(d->dtype))
      return "qmatmul: qs [N, K or K/2] and d [N, K/32] f16 expected";
    j->d = (const uint16_t*)d->data;
    if (fmt == FMT_Q4_1) {
      XLA_FFI_Buffer* m = ffi_arg(cf, first + 2);
      if (!matrix(m, j->N, nb) || !is_16bit(m->dtype)) return "q4_1: m [N, K/32] f16";
      j->m = (const uint16_t*)m->data;
    }
  }
  return NULL;
}

/* with_rows: a last operand, int32 [1], says how many leading rows of x to compute (the live
   rows of a decode batch, packed at its front): the rest of y is zero, so a step costs its live
   rows, not its batch bucket. Outside 1..B it means all of them. Each row's sums are the same
   either way (see the top of this file). */
static XLA_FFI_Error* handle(XLA_FFI_CallFrame* cf, int fmt, int with_rows) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  const int nw = 1 + weight_buffers(fmt); /* x and the weight arrays */
  const int nargs = nw + (with_rows ? 1 : 0);
  if (cf->args.size != nargs || cf->rets.size != 1) return ffi_error(api, "qmatmul: wrong arity");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *w = ffi_arg(cf, 1), *y = ffi_ret(cf);
  if (!x || !w || !y || x->dtype != XLA_FFI_DataType_F32 || y->dtype != XLA_FFI_DataType_F32 ||
      x->rank < 1 || w->rank != 2)
    return ffi_error(api, "qmatmul: x and y must be float32, w a matrix");
  Job j;
  j.K = x->dims[x->rank - 1];
  j.N = w->dims[0];
  j.B = 1;
  for (int64_t i = 0; i + 1 < x->rank; ++i) j.B *= x->dims[i];
  int64_t yb = 1;
  for (int64_t i = 0; i + 1 < y->rank; ++i) yb *= y->dims[i];
  if (y->rank < 1 || y->dims[y->rank - 1] != j.N || yb != j.B)
    return ffi_error(api, "qmatmul: y must be [..., N] with x's leading dims");
  j.x = (const float*)x->data;
  j.y = (float*)y->data;
  const char* bad = set_weights(&j, fmt, cf, 1);
  if (bad) return ffi_error(api, bad);
  if (with_rows) {
    XLA_FFI_Buffer* r = ffi_arg(cf, nw);
    if (!r || r->dtype != XLA_FFI_DataType_S32 || r->rank != 1 || r->dims[0] != 1)
      return ffi_error(api, "qmatmul: rows must be int32 [1]");
    const int64_t live = *(const int32_t*)r->data;
    if (live >= 1 && live < j.B) {
      memset(j.y + live * j.N, 0, sizeof(float) * (size_t)((j.B - live) * j.N));
      j.B = live;
    }
  }
  parallel_for(api, cf->ctx, j.N, j.B * j.K * j.N, rows_chunk, &j, sizeof j);
  return NULL;
}

EXPORT XLA_FFI_Error* splitserve_q8_0(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_Q8_0, 0); }
EXPORT XLA_FFI_Error* splitserve_q4_1(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_Q4_1, 0); }
EXPORT XLA_FFI_Error* splitserve_bf16(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_BF16, 0); }
EXPORT XLA_FFI_Error* splitserve_f32(XLA_FFI_CallFrame* cf) { return handle(cf, FMT_F32, 0); }
EXPORT XLA_FFI_Error* splitserve_q8_0_rows(XLA_FFI_CallFrame* cf) {
  return handle(cf, FMT_Q8_0, 1);
}
EXPORT XLA_FFI_Error* splitserve_q4_1_rows(XLA_FFI_CallFrame* cf) {
  return handle(cf, FMT_Q4_1, 1);
}
EXPORT XLA_FFI_Error* splitserve_bf16_rows(XLA_FFI_CallFrame* cf) {
  return handle(cf, FMT_BF16, 1);
}
EXPORT XLA_FFI_Error* splitserve_f32_rows(XLA_FFI_CallFrame* cf) {
  return handle(cf, FMT_F32, 1);
}
