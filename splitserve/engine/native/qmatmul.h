/* What the matrix-product kernels share (qmatmul.c: the portable path and the FFI handler;
   qmatmul_x86.c: the AVX-512 and AVX2 paths): the job, the block layout, the prefetch. */

#ifndef SPLITSERVE_QMATMUL_H_
#define SPLITSERVE_QMATMUL_H_

#include "ffi_common.h"

#define BLOCK 32
#define MAX_BLOCKS 1024 /* K <= 32768: the scales of one row fit on the stack */
#define MAX_CB 8        /* batch rows per pass over a weight row (accumulators in registers) */

enum { FMT_Q8_0 = 0, FMT_Q4_1 = 1, FMT_BF16 = 2, FMT_F32 = 3 };

typedef struct Job Job;
typedef void RowsFn(const Job* j, int64_t n0, int64_t n1);

struct Job {
  RowsFn* rows;
  int fmt;
  int64_t B, K, N;
  const float* x;     /* [B, K] */
  const void* w;      /* qs (int8 / uint8 nibbles), bf16 bits or float32 */
  const uint16_t* d;  /* [N, K/32] f16 */
  const uint16_t* m;  /* [N, K/32] f16 (q4_1) */
  float* y;           /* [B, N] */
};

/* A row's weights are read once, start to end, row after row: one long stream. One core keeps
   too few misses in flight to stream it at the memory's pace while it computes, so each row
   asks for the lines of the row PREFETCH_BYTES ahead. Measured on a cold 1536x576 matrix at one
   batch row (minimum of 20 passes over 200 matrices, 6 alternating runs): q4_1 0.089 -> 0.063
   ms, q8_0 0.146 -> 0.104 with 4 KiB ahead; no change at 16 rows (there it computes). */
#define PREFETCH_BYTES 4096

static inline int64_t row_bytes(const Job* j) {
  switch (j->fmt) {
    case FMT_Q8_0: return j->K;
    case FMT_Q4_1: return j->K / 2;
    case FMT_BF16: return 2 * j->K;
    default: return 4 * j->K;
  }
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

/* The FFI handlers splitserve_<fmt>_<name>, one per format, each handler(cf, FMT_<fmt>). */
#define EXPORT_PER_FORMAT(name, handler)                                                       \
  EXPORT XLA_FFI_Error* splitserve_q8_0_##name(XLA_FFI_CallFrame* cf) {                        \
    return handler(cf, FMT_Q8_0);                                                              \
  }                                                                                            \
  EXPORT XLA_FFI_Error* splitserve_q4_1_##name(XLA_FFI_CallFrame* cf) {                        \
    return handler(cf, FMT_Q4_1);                                                              \
  }                                                                                            \
  EXPORT XLA_FFI_Error* splitserve_bf16_##name(XLA_FFI_CallFrame* cf) {                        \
    return handler(cf, FMT_BF16);                                                              \
  }                                                                                            \
  EXPORT XLA_FFI_Error* splitserve_f32_##name(XLA_FFI_CallFrame* cf) {                         \
    return handler(cf, FMT_F32);                                                               \
  }

/* The row code for this CPU's instruction set (qmatmul.c). */
RowsFn* rows_fn(void);

/* How many buffers hold a matrix of this format: the values, then d and m (q8_0, q4_1). */
int weight_buffers(int fmt);

/* Point j at the matrix in argument buffers first, first + 1, ... of cf (format fmt; j->K set
   beforehand, N taken from the values' rows) and pick its row code; NULL when the buffers fit,
   else what is wrong with them. */
const char* set_weights(Job* j, int fmt, XLA_FFI_CallFrame* cf, int first);

#ifdef SPLITSERVE_X86
void rows_avx512(const Job* j, int64_t n0, int64_t n1); /* qmatmul_x86.c */
void rows_avx2(const Job* j, int64_t n0, int64_t n1);
#endif

#endif /* SPLITSERVE_QMATMUL_H_ */
