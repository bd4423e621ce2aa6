/* What this host's memory gives a float32 decode step, outside XLA (lab/benchmarks.md).

     sizes: a buffer of each size read again and again by plain AVX-512 loads, the best of 10
            passes: where a size still fits the host's caches it reads faster;
     rows:  the default model's 121 float32 products of a one-row step (its shapes, random
            values, one huge-page buffer) read by the native kernel's own row code
            (rows_avx512), the threads splitting each matrix in halves and meeting at a barrier
            after it, as XLA's pool and the kernel's parallel_for do, but with OpenMP's
            spinning threads and no XLA between the products; and by a plain dot-product loop.

   Build and run from the repository root, into build/ (git ignores it; mkdir -p build), the
   threads by OMP_NUM_THREADS:

     gcc -O3 -std=gnu11 -fopenmp -mavx512f -mfma -I splitserve/engine/native \
         -I "$(.venv/bin/python -c 'from jax import ffi; print(ffi.include_dir())')" \
         lab/engine/read_rate.c splitserve/engine/native/qmatmul_x86.c \
         splitserve/engine/native/ffi_common.c -lm -o build/read_rate
     OMP_NUM_THREADS=2 build/read_rate sizes
     OMP_NUM_THREADS=2 build/read_rate rows

   Compare `rows` with lab/engine/float32_chain.py: the same products through XLA. */

#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "qmatmul.h"

#define HUGE (2u << 20)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float* huge_buffer(size_t bytes) {
  size_t rounded = (bytes + HUGE - 1) / HUGE * HUGE;
  float* p = aligned_alloc(HUGE, rounded);
  if (!p) {
    perror("aligned_alloc");
    exit(1);
  }
  madvise(p, rounded, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / 4; ++i) p[i] = 0.001f; /* touched: on pages before timing */
  return p;
}

/* The best of `passes` reads of [0, bytes) by every thread's share. */
static double read_pass(const float* a, size_t bytes, int passes) {
  double best = 1e9;
  volatile float sink = 0;
  for (int r = 0; r < passes; ++r) {
    double t = now();
    float s = 0;
#pragma omp parallel reduction(+ : s)
    {
      size_t per = bytes / 4 / omp_get_num_threads() / 32 * 32;
      const float* p = a + omp_get_thread_num() * per;
      __m512 u = _mm512_setzero_ps(), v = _mm512_setzero_ps();
      for (size_t i = 0; i < per; i += 32) {
        u = _mm512_add_ps(u, _mm512_load_ps(p + i));
        v = _mm512_add_ps(v, _mm512_load_ps(p + i + 16));
      }
      s += _mm512_reduce_add_ps(_mm512_add_ps(u, v));
    }
    sink += s;
    t = now() - t;
    if (t < best) best = t;
  }
  return best;
}

static void sizes(void) {
  const int mb[] = {16, 32, 64, 96, 128, 160, 192, 256, 400, 540};
  float* a = huge_buffer((size_t)540 << 20);
  for (size_t i = 0; i < sizeof mb / sizeof mb[0]; ++i) {
    size_t bytes = (size_t)mb[i] << 20;
    double t = read_pass(a, bytes, 10);
    printf("%4d MiB: %7.2f ms, %5.1f GB/s\n", mb[i], t * 1e3, bytes / t / 1e9);
  }
  free(a);
}

enum { LAYER_MATS = 4, LAYERS = 30, MATS = LAYER_MATS * LAYERS + 1 };

static void rows(void) {
  /* SmolLM2-135M: hidden 576, 9 query and 3 KV heads of 64, intermediate 1536, vocab 49152 */
  const int out[LAYER_MATS] = {960, 576, 3072, 576}, in[LAYER_MATS] = {576, 576, 576, 1536};
  int N[MATS], K[MATS];
  size_t off[MATS + 1];
  off[0] = 0;
  for (int m = 0; m < MATS; ++m) {
    N[m] = m < MATS - 1 ? out[m % LAYER_MATS] : 49152;
    K[m] = m < MATS - 1 ? in[m % LAYER_MATS] : 576;
    off[m + 1] = off[m] + (size_t)N[m] * K[m];
  }
  float* w = huge_buffer(off[MATS] * 4);
  float* x = huge_buffer(49152 * 4);
  float* y = huge_buffer(49152 * 4);
  for (int mode = 0; mode < 2; ++mode) {
    double best = 1e9;
    for (int pass = 0; pass < 15; ++pass) {
      double t = now();
#pragma omp parallel
      for (int m = 0; m < MATS; ++m) {
        int nt = omp_get_num_threads(), per = (N[m] + nt - 1) / nt;
        int n0 = omp_get_thread_num() * per, n1 = n0 + per < N[m] ? n0 + per : N[m];
        const float* wm = w + off[m];
        if (mode == 0) {
          Job j;
          memset(&j, 0, sizeof j);
          j.rows = rows_avx512;
          j.fmt = FMT_F32;
          j.B = 1;
          j.K = K[m];
          j.N = N[m];
          j.x = x;
          j.w = wm;
          j.y = y;
          rows_avx512(&j, n0, n1);
        } else {
          for (int n = n0; n < n1; ++n) {
            const float* q = wm + (size_t)n * K[m];
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < K[m]; k += 16)
              acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + k), _mm512_loadu_ps(x + k), acc);
            y[n] = _mm512_reduce_add_ps(acc);
          }
        }
#pragma omp barrier
      }
      t = now() - t;
      if (pass >= 3 && t < best) best = t;
    }
    printf("%s: %d products, %.0f MB, best %.2f ms, %.1f GB/s\n",
           mode == 0 ? "kernel rows (rows_avx512)" : "plain dot loop", MATS, off[MATS] * 4 / 1e6,
           best * 1e3, off[MATS] * 4 / best / 1e9);
  }
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "sizes") == 0) {
    sizes();
  } else if (argc == 2 && strcmp(argv[1], "rows") == 0) {
    rows();
  } else {
    fprintf(stderr, "usage: %s sizes|rows (OMP_NUM_THREADS sets the threads)\n", argv[0]);
    return 2;
  }
  return 0;
}
