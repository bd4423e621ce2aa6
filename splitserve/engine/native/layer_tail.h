/* A decode layer's tail (its output product, residual, feed-forward norm, SwiGLU and second
   residual) run by one team of threads: what layer_tail.c's handler and decode_layer.c (the
   whole layer in one call) share. */

#ifndef SPLITSERVE_LAYER_TAIL_H_
#define SPLITSERVE_LAYER_TAIL_H_

#include <stdatomic.h>

#include "qmatmul.h"

#define CHUNKS 8 /* per product; whoever is free takes the next */

/* A phase's chunks: the next to take and how many are done. */
typedef struct {
  atomic_llong next, done;
} Phase;

typedef struct {
  Job o, gate_up, down;   /* x and y point into the buffers below */
  const float* x;         /* [B, H] the residual stream */
  const float* norm;      /* [H] */
  float eps;
  int64_t B, H, I;        /* live rows, hidden, intermediate */
  float *x1, *normed, *gu, *act; /* [B, H], [B, H], [B, 2I], [B, I] */
  float* y;               /* [B, H] */
  Phase phase[4];         /* the output product, gate/up, SwiGLU, down */
  atomic_int normed_ready;
} Tail;

static inline void spin(void) {
#ifdef SPLITSERVE_X86
  _mm_pause(); /* as parallel_for waits: the phases are short, a sleep would cost more */
#endif
}

/* Item i of a phase, for the team's shared state ctx. */
typedef void PhaseItemFn(void* ctx, int64_t i);

/* Take items of phase p, fn(ctx, i) each, until none of its `total` is left; true for the
   thread that finished the last of them (it may then do what must follow the phase alone). */
int phase_run(Phase* p, int64_t total, PhaseItemFn* fn, void* ctx);

/* Wait until every item of phase p is done (whoever took the last one is running it). */
static inline void phase_wait(Phase* p, int64_t total) {
  while (atomic_load(&p->done) < total) spin();
}

/* Chunk c of CHUNKS of N output rows: [*n0, *n1), empty past the end. */
static inline void chunk_rows(int64_t N, int64_t c, int64_t* n0, int64_t* n1) {
  const int64_t chunk = (N + CHUNKS - 1) / CHUNKS;
  *n0 = c * chunk;
  *n1 = *n0 + chunk < N ? *n0 + chunk : N;
}

/* out[b] = x[b] / sqrt(mean(x[b]^2) + eps) * norm for rows [0, B); the mean of squares summed
   in 16 lanes (XLA's order differs: the same values to float32 rounding). */
void rms_normalize(const float* x, const float* norm, float eps, int64_t B, int64_t H,
                   float* out);

/* Floats of work per batch row the tail needs: x1, normed, gate/up, act. */
static inline int64_t tail_work_floats(int64_t H, int64_t I) { return 2 * H + 3 * I; }

/* Point t's three products at the weights in argument buffers first, ... of cf (format fmt;
   wo [H, A], w_gate_up [2I, H], w_down [H, I]) and set t->H, t->I; NULL or what is wrong. */
const char* tail_weights(Tail* t, int fmt, XLA_FFI_CallFrame* cf, int first, int64_t H,
                         int64_t A);

/* The rows: live of them computed, x [.., H] the residual stream, attn [live, A] the attention
   output, y [.., H] the result, work at least live * tail_work_floats floats. Leaves rows after
   live alone (the caller sees to them). */
void tail_buffers(Tail* t, int64_t live, const float* x, const float* attn, const float* norm,
                  float eps, float* y, float* work);

/* One member of the team: takes chunks of each phase in turn and returns when all are done.
   Any number of threads may call it, at any time until the last phase is done; a thread that
   never comes leaves its chunks to the others. */
void tail_member(Tail* t);

/* A float32 vector of n elements. */
static inline int vector_f32(const XLA_FFI_Buffer* b, int64_t n) {
  return b && b->dtype == XLA_FFI_DataType_F32 && b->rank == 1 && b->dims[0] == n;
}

#endif /* SPLITSERVE_LAYER_TAIL_H_ */
