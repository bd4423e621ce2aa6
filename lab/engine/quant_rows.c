/* The native kernel's quantized products at a decode step's batch sizes, outside XLA
   (lab/benchmarks.md, "The decode step at sixteen rows: the head and the attention").

     layers: the default model's 30 layers of q4_1 products (QKV 960 x 576, output 576 x 576,
             gate and up 3072 x 576, down 576 x 1536; 66 MB, random blocks), one after another;
     head:   its output head, 49152 x 576 q8_0 (28 MB).

   One thread (rows_avx512, the AVX-512 row code the engine calls), the best of --passes
   passes, for each batch size given; each size's outputs are first checked bit for bit
   against every batch row's product alone (the kernel's promise: a row's sums do not depend
   on the batch). Compare builds of two checkouts by their ratios in one sitting.

   Build and run from the repository root, into build/ (git ignores it; mkdir -p build):

     gcc -O3 -std=gnu11 -I splitserve/engine/native \
         -I "$(.venv/bin/python -c 'from jax import ffi; print(ffi.include_dir())')" \
         lab/engine/quant_rows.c splitserve/engine/native/qmatmul_x86.c \
         splitserve/engine/native/ffi_common.c -lm -o build/quant_rows
     build/quant_rows head 1 4 8 16 32 64
     build/quant_rows layers 1 4 16 */

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qmatmul.h"

#define PASSES 7

typedef struct {
  int fmt;
  int64_t N, K;
  void* w;
  uint16_t *d, *m;
} Matrix;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("f16c"))) static uint16_t half(float f) { return _cvtss_sh(f, 0); }

/* 64-byte aligned, as XLA's buffers are: an unaligned x splits loads across cache lines. */
static void* aligned(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

static Matrix random_matrix(int fmt, int64_t N, int64_t K) {
  const int64_t nb = K / BLOCK, bytes = fmt == FMT_Q4_1 ? N * K / 2 : N * K;
  Matrix a = {fmt, N, K, aligned(bytes), malloc(2 * N * nb), NULL};
  for (int64_t i = 0; i < bytes; ++i) ((uint8_t*)a.w)[i] = (uint8_t)rand();
  for (int64_t i = 0; i < N * nb; ++i) a.d[i] = half(0.001f + 0.01f * (rand() % 100) / 100.0f);
  if (fmt == FMT_Q4_1) {
    a.m = malloc(2 * N * nb);
    for (int64_t i = 0; i < N * nb; ++i) a.m[i] = half(-0.05f * (rand() % 100) / 100.0f);
  }
  return a;
}

static void product(const Matrix* a, int64_t B, const float* x, float* y) {
  const Job j = {rows_avx512, a->fmt, B, a->K, a->N, x, a->w, a->d, a->m, y};
  rows_avx512(&j, 0, a->N);
}

/* Every batch row of a B-row product equals that row's product alone. */
static int batch_invariant(const Matrix* a, int64_t B, const float* x) {
  float* y = malloc(sizeof(float) * B * a->N);
  float* alone = malloc(sizeof(float) * a->N);
  int same = 1;
  product(a, B, x, y);
  for (int64_t b = 0; b < B && same; ++b) {
    product(a, 1, x + b * a->K, alone);
    same = !memcmp(y + b * a->N, alone, sizeof(float) * a->N);
  }
  free(y);
  free(alone);
  return same;
}

int main(int argc, char** argv) {
  if (argc < 3 || (strcmp(argv[1], "layers") && strcmp(argv[1], "head"))) {
    fprintf(stderr, "usage: %s layers|head BATCH...\n", argv[0]);
    return 2;
  }
  if (current_isa() != ISA_AVX512) {
    fprintf(stderr, "this host has no AVX-512: the row code timed here does not run\n");
    return 2;
  }
  srand(1);
  const int head = !strcmp(argv[1], "head");
  const int64_t layer_shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  const int count = head ? 1 : 4 * 30;
  Matrix* mats = malloc(sizeof(Matrix) * count);
  for (int i = 0; i < count; ++i)
    mats[i] = head ? random_matrix(FMT_Q8_0, 49152, 576)
                   : random_matrix(FMT_Q4_1, layer_shapes[i % 4][0], layer_shapes[i % 4][1]);
  for (int arg = 2; arg < argc; ++arg) {
    const int64_t B = atoll(argv[arg]);
    if (B < 1 || B > 256) {
      fprintf(stderr, "batch %s: 1 to 256\n", argv[arg]);
      return 2;
    }
    float* x = aligned(sizeof(float) * B * 3072);
    float* y = aligned(sizeof(float) * B * 49152);
    for (int64_t i = 0; i < B * 3072; ++i) x[i] = (rand() % 2001 - 1000) / 1000.0f;
    int same = 1;
    for (int i = 0; i < (head ? 1 : 4); ++i) same &= batch_invariant(&mats[i], B, x);
    double best = 1e30, flops = 0;
    for (int p = 0; p < PASSES; ++p) {
      const double t = now();
      for (int i = 0; i < count; ++i) product(&mats[i], B, x, y);
      const double took = now() - t;
      best = took < best ? took : best;
    }
    for (int i = 0; i < count; ++i) flops += 2.0 * B * mats[i].N * mats[i].K;
    printf("%s B=%-3lld %8.2f ms  %6.1f GFLOP/s  rows %s\n", argv[1], (long long)B, best * 1e3,
           flops / best * 1e-9, same ? "bit-identical to alone" : "DIFFER from alone");
    free(x);
    free(y);
    if (!same) return 1;
  }
  return 0;
}
