/* The most arithmetic this host's cores can do, outside any program (lab/benchmarks.md, "The
   first token of a burst against the host's arithmetic"): each thread runs independent
   multiply-adds on values held in registers, nothing read from memory, for about a second.

     float32: VFMADD231PS on 16 float32 lanes, 32 flops an instruction (a prompt pass in
              float32: XLA's products);
     bfloat16: VDPBF16PS, two bfloat16 products added into each of 16 float32 lanes, 64 flops
              an instruction (the kernel's packed bfloat16 products without AMX tiles).

   A prompt pass cannot beat these rates; what a burst of prompts needs of them is arithmetic
   (2 flops per weight per prompt token) over the time allowed.

   Build and run from the repository root, into build/ (git ignores it), one thread per core; a
   CPU without AVX512-BF16 runs the float32 line only:

     mkdir -p build && gcc -O2 -march=native -pthread lab/engine/peak_rate.c -o build/peak_rate
     build/peak_rate 2 */

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHAINS 12          /* independent accumulators: more than latency x issue width */
#define ROUNDS 20000000L   /* per thread: CHAINS x ROUNDS instructions */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile float g_sink; /* keeps the sums alive */

static void* fma_loop(void* unused) {
  (void)unused;
  __m512 acc[CHAINS];
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_ps((float)i);
  for (long r = 0; r < ROUNDS; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
  for (int i = 1; i < CHAINS; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  g_sink = _mm512_reduce_add_ps(acc[0]);
  return NULL;
}

#ifdef __AVX512BF16__
static void* bf16_loop(void* unused) {
  (void)unused;
  __m512 acc[CHAINS];
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_ps((float)i);
  for (long r = 0; r < ROUNDS; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  for (int i = 1; i < CHAINS; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  g_sink = _mm512_reduce_add_ps(acc[0]);
  return NULL;
}
#endif

/* `threads` threads of `loop` at once: flops a second, all threads together. */
static double rate(void* (*loop)(void*), int threads, double flops_per_instruction) {
  pthread_t t[64];
  const double start = now();
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, loop, NULL);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  return (double)CHAINS * ROUNDS * threads * flops_per_instruction / (now() - start);
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "usage: peak_rate [threads 1..64]\n");
    return 2;
  }
  for (int pass = 0; pass < 3; ++pass) {
    printf("pass %d, %d thread(s): float32 FMA %.1f GFLOP/s", pass + 1, threads,
           rate(fma_loop, threads, 32) / 1e9);
#ifdef __AVX512BF16__
    printf(", bfloat16 dot products %.1f GFLOP/s", rate(bf16_loop, threads, 64) / 1e9);
#endif
    printf("\n");
  }
  return 0;
}
