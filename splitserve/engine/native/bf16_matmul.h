/* A prompt pass's matrix products in bfloat16 with float32 sums: y [M, N] float32 = x [M, K]
   bfloat16 @ w, w bfloat16 packed once, when the weights are placed (quant.pack_bf16), in the
   order both units read it:

     [N/16, K/32, 16, 32] uint16: per (16 output columns, 32 inputs) one 1 KiB block whose row r
     holds, for each of the 16 columns c, the weights of inputs 2r and 2r + 1 side by side
     (c * 2 + p): the pairs that AMX's TDPBF16PS and AVX512-BF16's VDPBF16PS both multiply.

   Two units compute it (bf16_matmul.c picks one at run time): the AMX tiles (bf16_amx.c) and,
   on CPUs without tiles, AVX512-BF16's dot products (bf16_dot.c). Both round nothing but the
   inputs (done by the caller), sum in float32 in pairs of inputs and flush denormals; they
   differ only in the order of the sums. Each output row's sums depend on that row and the
   weights only, never on M, the other rows or the threads: a prompt gets the same values alone
   or in a batch. */

#ifndef SPLITSERVE_BF16_MATMUL_H_
#define SPLITSERVE_BF16_MATMUL_H_

#include "ffi_common.h"

typedef struct {
  int64_t M, K, N;
  const uint16_t* x;    /* [M, K] bfloat16 bits */
  const uint16_t* tail; /* x's last M % 32 rows and zero rows after them, or NULL (tiles only) */
  const uint16_t* w;    /* [N/16, K/32, 16, 32] */
  float* y;             /* [M, N] */
} Bf16Job;

/* 1 when the CPU has AMX-BF16, the kernel was built with it and Linux lets this process use
   the tiles (asked once). */
int amx_tiles_ready(void);
/* Column blocks [c0, c1) (32 columns each) of every row on the tiles: a ChunkFn. */
void amx_columns(const void* job, int64_t c0, int64_t c1);

/* 1 when the CPU has AVX512-BF16 and the kernel was built with it. */
int bf16_dot_ready(void);
/* The same on AVX512-BF16's dot products: a ChunkFn. */
void bf16_dot_columns(const void* job, int64_t c0, int64_t c1);

#endif
