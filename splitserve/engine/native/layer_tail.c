/* The tail of a decode layer in one call: its output product, the residual add, the feed-forward
   norm, SwiGLU and the second residual add,

     x1 = x + wo . attn
     y  = x1 + down(silu(gate(n)) * up(n)),   n = x1 / sqrt(mean(x1^2) + eps) * norm

   for the live rows of a decode batch (rows [0, live); the rest of y is x itself, as the
   separate products' zero rows leave it).

   Why one call: as separate XLA operations the three products are three hand-offs to XLA's
   thread pool with XLA's own norm, SwiGLU and adds between them, and the memory idles at each.
   The default model's float32 products of a one-row step read faster with the threads kept
   together than as separate custom calls, and its whole one-row float32 step is shorter this
   way (lab/benchmarks.md, "Where a float32 step's time goes").
   Here the calling thread and the pool's threads form one team for the whole tail: each
   product's rows, and SwiGLU's columns, are shared out in chunks, and a thread that runs out of
   chunks spins until the phase is done (whoever finishes the output product's last chunk
   computes the norm meanwhile). A thread that never starts leaves its chunks to the others, so
   the call ends whatever the pool does. The rows between the products live in a second result,
   which XLA allocates.

   Sums: the products are the kernel's own row code (qmatmul.c), so each row's sums are those of
   the separate products; the norm's mean of squares is summed in 16 lanes here (XLA's order
   differs) and silu is g / (1 + e^-g) with e^x by a polynomial (within 2e-6 of float64's silu
   over gates from -30 to 30, tests/test_engine_layer_tail.py): the same values to float32
   rounding, not bit for bit. Nothing depends on the batch: a row gets the same result
   whatever rows run beside it. */

#include <math.h>
#include <string.h>

#include "layer_tail.h"

void rms_normalize(const float* x, const float* norm, float eps, int64_t B, int64_t H,
                   float* out) {
  for (int64_t b = 0; b < B; ++b) {
    const float* v = x + b * H;
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= H; i += 16)
      for (int l = 0; l < 16; ++l) lanes[l] += v[i + l] * v[i + l];
    float sum = 0.0f;
    for (int l = 0; l < 16; ++l) sum += lanes[l];
    for (; i < H; ++i) sum += v[i] * v[i];
    const float inv = 1.0f / sqrtf(sum / (float)H + eps);
    for (int64_t k = 0; k < H; ++k) out[b * H + k] = v[k] * inv * norm[k];
  }
}

#ifdef SPLITSERVE_X86
/* e^x in 16 lanes: x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its Taylor polynomial to r^7, times
   2^n; x is clamped to [-88, 88], where silu needs nothing wider. */
TARGET_AVX512 static __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* act = silu(gate) * up over [i0, i1), 16 at a time. */
TARGET_AVX512 static int64_t swiglu_avx512(const float* g, const float* u, float* act, int64_t i0,
                                           int64_t i1) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    _mm512_storeu_ps(act + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
  }
  return i;
}
#endif

/* Chunk c of SwiGLU: batch row c / CHUNKS, its c % CHUNKS-th share of the I columns. */
static void swiglu_chunk(Tail* t, int64_t c) {
  const int64_t b = c / CHUNKS, share = (t->I + CHUNKS - 1) / CHUNKS;
  const int64_t i0 = c % CHUNKS * share, i1 = i0 + share < t->I ? i0 + share : t->I;
  const float *g = t->gu + b * 2 * t->I, *u = g + t->I;
  float* act = t->act + b * t->I;
  int64_t i = i0;
#ifdef SPLITSERVE_X86
  if (current_isa() == ISA_AVX512) i = swiglu_avx512(g, u, act, i0, i1 < i0 ? i0 : i1);
#endif
  for (; i < i1; ++i) act[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Rows [n0, n1) of product p; the output product and the down product add their residual. */
static void product_rows(Tail* t, int p, int64_t n0, int64_t n1) {
  Job* j = p == 0 ? &t->o : (p == 1 ? &t->gate_up : &t->down);
  j->rows(j, n0, n1);
  if (p == 1) return;
  const float* base = p == 0 ? t->x : t->x1;
  for (int64_t b = 0; b < t->B; ++b)
    for (int64_t n = n0; n < n1; ++n) j->y[b * j->N + n] += base[b * t->H + n];
}

/* Chunks in phase p: each product's rows in CHUNKS, SwiGLU CHUNKS per batch row. */
static int64_t phase_chunks(const Tail* t, int p) { return p == 2 ? t->B * CHUNKS : CHUNKS; }

int phase_run(Phase* p, int64_t total, PhaseItemFn* fn, void* ctx) {
  int last = 0;
  for (;;) {
    const long long i = atomic_fetch_add(&p->next, 1);
    if (i >= total) return last;
    fn(ctx, i);
    last = atomic_fetch_add(&p->done, 1) + 1 == total;
  }
}

typedef struct {
  Tail* t;
  int p;
} TailPhase;

/* Chunk c of a tail phase: SwiGLU's, or a product's rows. */
static void tail_chunk(void* ctx, int64_t c) {
  const TailPhase* tp = (const TailPhase*)ctx;
  Tail* t = tp->t;
  if (tp->p == 2) {
    swiglu_chunk(t, c);
    return;
  }
  const int p = tp->p == 3 ? 2 : tp->p; /* the product: o, gate/up, down */
  int64_t n0, n1;
  chunk_rows((p == 0 ? &t->o : (p == 1 ? &t->gate_up : &t->down))->N, c, &n0, &n1);
  if (n0 < n1) product_rows(t, p, n0, n1);
}

static int run_phase(Tail* t, int p) {
  TailPhase tp = {t, p};
  return phase_run(&t->phase[p], phase_chunks(t, p), tail_chunk, &tp);
}

static void wait_phase(Tail* t, int p) { phase_wait(&t->phase[p], phase_chunks(t, p)); }

void tail_member(Tail* t) {
  if (run_phase(t, 0)) {
    rms_normalize(t->x1, t->norm, t->eps, t->B, t->H, t->normed);
    atomic_store(&t->normed_ready, 1);
  }
  while (!atomic_load(&t->normed_ready)) spin();
  run_phase(t, 1);
  wait_phase(t, 1);
  run_phase(t, 2);
  wait_phase(t, 2);
  run_phase(t, 3);
  wait_phase(t, 3);
}

const char* tail_weights(Tail* t, int fmt, XLA_FFI_CallFrame* cf, int first, int64_t H,
                         int64_t A) {
  const int nw = weight_buffers(fmt);
  t->H = H;
  t->o.K = A;
  t->gate_up.K = H;
  const char* bad = set_weights(&t->o, fmt, cf, first);
  if (!bad) bad = set_weights(&t->gate_up, fmt, cf, first + nw);
  if (!bad) {
    t->I = t->gate_up.N / 2;
    t->down.K = t->I;
    bad = set_weights(&t->down, fmt, cf, first + 2 * nw);
  }
  if (!bad && (t->o.N != H || t->gate_up.N != 2 * t->I || t->down.N != H))
    bad = "layer_tail: wo [H, A], w_gate_up [2I, H], w_down [H, I]";
  return bad;
}

void tail_buffers(Tail* t, int64_t live, const float* x, const float* attn, const float* norm,
                  float eps, float* y, float* work) {
  t->B = t->o.B = t->gate_up.B = t->down.B = live;
  t->x = x;
  t->norm = norm;
  t->eps = eps;
  t->y = y;
  t->x1 = work;
  t->normed = t->x1 + live * t->H;
  t->gu = t->normed + live * t->H;
  t->act = t->gu + live * 2 * t->I;
  t->o.x = attn;
  t->o.y = t->x1;
  t->gate_up.x = t->normed;
  t->gate_up.y = t->gu;
  t->down.x = t->act;
  t->down.y = t->y;
}

/* The team as parallel_for runs it: each item calls tail_member (the range is not used: a
   member that comes when all is done returns at once). */
static void member(const void* job, int64_t i0, int64_t i1) {
  (void)i0;
  (void)i1;
  tail_member(*(Tail* const*)job);
}

/* splitserve_<fmt>_layer_tail(x [B, H], attn [B, A], norm [H], eps [1], rows int32 [1],
   wo [H, A], w_gate_up [2I, H], w_down [H, I]) -> y [B, H], all float32 but the weights
   (each in its format's buffers: weight_buffers). */
static XLA_FFI_Error* handle(XLA_FFI_CallFrame* cf, int fmt) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  const int nw = weight_buffers(fmt);
  if (cf->args.size != 5 + 3 * nw || cf->rets.size != 2 ||
      cf->rets.types[0] != XLA_FFI_RetType_BUFFER || cf->rets.types[1] != XLA_FFI_RetType_BUFFER)
    return ffi_error(api, "layer_tail: wrong arity");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *attn = ffi_arg(cf, 1), *norm = ffi_arg(cf, 2),
                 *eps = ffi_arg(cf, 3), *rows = ffi_arg(cf, 4);
  XLA_FFI_Buffer *y = (XLA_FFI_Buffer*)cf->rets.rets[0], *work = (XLA_FFI_Buffer*)cf->rets.rets[1];
  if (!x || !attn || !y || x->rank != 2 || attn->rank != 2 || y->rank != 2 ||
      x->dtype != XLA_FFI_DataType_F32 || attn->dtype != XLA_FFI_DataType_F32 ||
      y->dtype != XLA_FFI_DataType_F32 || attn->dims[0] != x->dims[0] ||
      y->dims[0] != x->dims[0] || y->dims[1] != x->dims[1])
    return ffi_error(api, "layer_tail: x [B, H], attn [B, A] and y [B, H] float32");
  Tail t;
  memset(&t, 0, sizeof t);
  const int64_t B = x->dims[0], H = x->dims[1];
  if (!vector_f32(norm, H) || !vector_f32(eps, 1))
    return ffi_error(api, "layer_tail: norm [H] and eps [1] float32");
  if (!rows || rows->dtype != XLA_FFI_DataType_S32 || rows->rank != 1 || rows->dims[0] != 1)
    return ffi_error(api, "layer_tail: rows must be int32 [1]");
  const char* bad = tail_weights(&t, fmt, cf, 5, H, attn->dims[1]);
  if (bad) return ffi_error(api, bad);
  /* the intermediate rows live in a second result XLA allocates (and reuses): a fresh
     allocation of this size each call would be new pages, faulted in each time */
  if (work->dtype != XLA_FFI_DataType_F32 || work->rank != 2 || work->dims[0] != B ||
      work->dims[1] != tail_work_floats(H, t.I))
    return ffi_error(api, "layer_tail: the work result must be float32 [B, 2H + 3I]");
  const int64_t asked = *(const int32_t*)rows->data, live = asked >= 1 && asked < B ? asked : B;
  const float* xs = (const float*)x->data;
  float* ys = (float*)y->data;
  tail_buffers(&t, live, xs, (const float*)attn->data, (const float*)norm->data,
               *(const float*)eps->data, ys, (float*)work->data);
  /* the rows after the live ones: x as it is */
  memcpy(ys + live * H, xs + live * H, sizeof(float) * (size_t)((B - live) * H));
  Tail* team = &t;
  /* more items than threads: each thread takes one and joins; later items find all done */
  parallel_for(api, cf->ctx, 64, SHARE_ALWAYS, member, &team, sizeof team);
  return NULL;
}

EXPORT_PER_FORMAT(layer_tail, handle)
