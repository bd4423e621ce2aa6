/* A whole decode layer in one call, for the live rows of a decode batch (up to 16 rows:
   llama_model.FUSED_LAYER_MAX_BATCH):

     n      = rms_norm(x) * attn_norm
     q, k, v = n . wqkv, q and k rotated (RoPE) at each row's position, q scaled by 1/sqrt(D)
     cache_k[r, :, :, pos], cache_v[r, :, pos, :] = k, v      (in place: the caches are aliased)
     attn   = softmax(q . K) . V over each row's positions 0..pos      (attention.c's items)
     y      = the layer's tail (layer_tail.h): x + wo . attn, then its feed-forward block

   Why one call: as XLA's program a layer is a norm, a QKV product, the rotation and the cache
   writes (XLA's loops), the attention call and the tail call, and the threads of XLA's pool
   fall idle and wake again at each hand-off. Here the calling thread and the pool's threads
   form one team for the whole layer (layer_tail.c's way): the QKV product's rows are shared
   out in chunks; whoever finishes the last chunk rotates, scales and writes the caches while
   the others spin; then the (row, KV head) attention items are shared out, then the tail's
   phases. Against the tail alone in one call the default model's step is shorter at every
   batch measured, in float32 and in the GGUF's blocks (lab/benchmarks.md, "A whole layer in
   one call").

   Rows at or after `live` (int32 [1]; outside 1..B: all): y is x, their cache rows are left as
   they are. The same sums as the separate calls for every live row but the norms' (summed in
   16 lanes) and the rotation's (one multiply-add where XLA may round twice): the same values
   to float32 rounding, and nothing depends on the batch. */

#include <math.h>
#include <string.h>

#include "attention.h"
#include "layer_tail.h"

typedef struct {
  Job qkv;                 /* normed [live, H] -> qkv [live, (heads + 2 KV) D] */
  AttnJob attn;            /* q (rotated, scaled) [live, heads D] -> attn.out [live, heads D] */
  AttnItemFn* item;
  float* scratch;          /* [live KV, G * scores_stride] the attention items' scores */
  const float *cos, *sin;  /* [B, D/2] */
  float scale;
  Phase qkv_phase, attn_phase;
  atomic_int stored;       /* the rotation and the cache writes are done */
  Tail tail;
} Layer;

/* Rotate one head's D values at position angles (cos, sin [D/2]) into out, times scale. */
static void rotate(const float* in, const float* cos, const float* sin, int64_t D, float scale,
                   float* out) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = in[i], b = in[half + i];
    out[i] = (a * cos[i] - b * sin[i]) * scale;
    out[half + i] = (b * cos[i] + a * sin[i]) * scale;
  }
}

/* After the QKV product: each live row's query heads rotated and scaled into attn.q, its key
   heads rotated into the key cache's column at its position, its value heads into the value
   cache's row there. */
static void store(Layer* L) {
  const AttnJob* a = &L->attn;
  const int64_t KV = a->KV, D = a->D, C = a->C, heads = KV * a->G, half = D / 2;
  float key[2 * 256]; /* D <= 512, checked by the handler */
  for (int64_t r = 0; r < a->n; ++r) {
    const float* row = L->qkv.y + r * L->qkv.N;
    const float *cos = L->cos + r * half, *sin = L->sin + r * half;
    const int64_t pos = a->lengths[r] - 1;
    for (int64_t h = 0; h < heads; ++h)
      rotate(row + h * D, cos, sin, D, L->scale, (float*)a->q + (r * heads + h) * D);
    for (int64_t h = 0; h < KV; ++h) {
      rotate(row + (heads + h) * D, cos, sin, D, 1.0f, key);
      float* kt = (float*)a->ck + (r * KV + h) * D * C; /* [D, C]: keys transposed */
      for (int64_t d = 0; d < D; ++d) kt[d * C + pos] = key[d];
      memcpy((float*)a->cv + ((r * KV + h) * C + pos) * D, row + (heads + KV + h) * D,
             sizeof(float) * (size_t)D);
    }
  }
}

/* Chunk c of the QKV product's rows. */
static void qkv_chunk(void* ctx, int64_t c) {
  Layer* L = (Layer*)ctx;
  int64_t n0, n1;
  chunk_rows(L->qkv.N, c, &n0, &n1);
  if (n0 < n1) L->qkv.rows(&L->qkv, n0, n1);
}

/* Attention item i: row i / KV, KV head i % KV, with its own scores scratch. */
static void attention_item(void* ctx, int64_t i) {
  const Layer* L = (const Layer*)ctx;
  const AttnJob* a = &L->attn;
  L->item(a, i / a->KV, i % a->KV, L->scratch + i * a->G * scores_stride(a));
}

static void member(const void* job, int64_t i0, int64_t i1) {
  (void)i0;
  (void)i1;
  Layer* L = *(Layer* const*)job;
  if (phase_run(&L->qkv_phase, CHUNKS, qkv_chunk, L)) {
    store(L);
    atomic_store(&L->stored, 1);
  }
  while (!atomic_load(&L->stored)) spin();
  const int64_t items = L->attn.n * L->attn.KV;
  phase_run(&L->attn_phase, items, attention_item, L);
  phase_wait(&L->attn_phase, items);
  tail_member(&L->tail);
}

/* Floats of work per batch row: normed, qkv, q, attention out, the tail's, the scores. */
static int64_t work_floats(int64_t H, int64_t qkv, int64_t heads, int64_t D, int64_t I,
                           int64_t C) {
  return H + qkv + 2 * heads * D + tail_work_floats(H, I) + heads * (C + 24);
}

static int tensor_f32(const XLA_FFI_Buffer* b, int rank) {
  return b && b->dtype == XLA_FFI_DataType_F32 && b->rank == rank;
}

/* A buffer's data after making sure it holds arg's (XLA aliases the caches; if it ever did
   not, the result starts as a copy). */
static float* in_place(XLA_FFI_Buffer* ret, const XLA_FFI_Buffer* arg) {
  if (ret->data != arg->data) {
    size_t n = sizeof(float);
    for (int64_t i = 0; i < arg->rank; ++i) n *= (size_t)arg->dims[i];
    memcpy(ret->data, arg->data, n);
  }
  return (float*)ret->data;
}

/* splitserve_<fmt>_decode_layer(x [B, H], cache_k [R, KV, D, C], cache_v [R, KV, C, D],
   lengths int32 [B], cos, sin [B, D/2], attn_norm [H], ffn_norm [H], eps [1], rows int32 [1],
   wqkv [(heads + 2 KV) D, H], wo [H, heads D], w_gate_up [2I, H], w_down [H, I])
   -> y [B, H], cache_k, cache_v (the arguments' buffers), work [B, W] (work_floats). */
static XLA_FFI_Error* handle(XLA_FFI_CallFrame* cf, int fmt) {
  XLA_FFI_Error* early;
  if (ffi_preamble(cf, &early)) return early;
  const XLA_FFI_Api* api = cf->api;
  const int nw = weight_buffers(fmt);
  if (cf->args.size != 10 + 4 * nw || cf->rets.size != 4)
    return ffi_error(api, "decode_layer: wrong arity");
  for (int i = 0; i < 4; ++i)
    if (cf->rets.types[i] != XLA_FFI_RetType_BUFFER)
      return ffi_error(api, "decode_layer: the results must be buffers");
  XLA_FFI_Buffer *x = ffi_arg(cf, 0), *ck = ffi_arg(cf, 1), *cv = ffi_arg(cf, 2),
                 *lengths = ffi_arg(cf, 3), *cos = ffi_arg(cf, 4), *sin = ffi_arg(cf, 5),
                 *attn_norm = ffi_arg(cf, 6), *ffn_norm = ffi_arg(cf, 7), *eps = ffi_arg(cf, 8),
                 *rows = ffi_arg(cf, 9);
  XLA_FFI_Buffer** rets = (XLA_FFI_Buffer**)cf->rets.rets;
  XLA_FFI_Buffer *y = rets[0], *ck_out = rets[1], *cv_out = rets[2], *work = rets[3];
  if (!tensor_f32(x, 2) || !tensor_f32(ck, 4) || !tensor_f32(cv, 4) || !tensor_f32(y, 2) ||
      !tensor_f32(ck_out, 4) || !tensor_f32(cv_out, 4) || !tensor_f32(work, 2))
    return ffi_error(api, "decode_layer: x, y [B, H], caches rank 4, work rank 2, float32");
  const int64_t B = x->dims[0], H = x->dims[1], R = ck->dims[0], KV = ck->dims[1],
                D = ck->dims[2], C = ck->dims[3];
  for (int i = 0; i < 4; ++i)
    if (ck_out->dims[i] != ck->dims[i] || cv_out->dims[i] != cv->dims[i])
      return ffi_error(api, "decode_layer: the caches come back in their own shapes");
  if (R < B || cv->dims[0] != R || cv->dims[1] != KV || cv->dims[2] != C || cv->dims[3] != D ||
      D % 2 || D > 512 || C < 1 || y->dims[0] != B || y->dims[1] != H)
    return ffi_error(api, "decode_layer: cache_k [R, KV, D, C], cache_v [R, KV, C, D], R >= B, "
                          "D even and at most 512; y [B, H]");
  if (!tensor_f32(cos, 2) || !tensor_f32(sin, 2) || cos->dims[0] != B || cos->dims[1] != D / 2 ||
      sin->dims[0] != B || sin->dims[1] != D / 2)
    return ffi_error(api, "decode_layer: cos and sin float32 [B, D/2]");
  if (!vector_f32(attn_norm, H) || !vector_f32(ffn_norm, H) || !vector_f32(eps, 1))
    return ffi_error(api, "decode_layer: the norms float32 [H], eps [1]");
  if (!lengths || lengths->dtype != XLA_FFI_DataType_S32 || lengths->rank != 1 ||
      lengths->dims[0] != B || !rows || rows->dtype != XLA_FFI_DataType_S32 || rows->rank != 1 ||
      rows->dims[0] != 1)
    return ffi_error(api, "decode_layer: lengths int32 [B], rows int32 [1]");

  Layer L;
  memset(&L, 0, sizeof L);
  L.qkv.K = H;
  const char* bad = set_weights(&L.qkv, fmt, cf, 10);
  if (bad) return ffi_error(api, bad);
  const int64_t heads = L.qkv.N / D - 2 * KV;
  if (L.qkv.N % D || heads < KV || heads % KV || heads / KV > MAX_G)
    return ffi_error(api, "decode_layer: wqkv [(heads + 2 KV) D, H], heads a multiple of KV, "
                          "at most 16 per KV head");
  bad = tail_weights(&L.tail, fmt, cf, 10 + nw, H, heads * D);
  if (bad) return ffi_error(api, bad);
  const int64_t W = work_floats(H, L.qkv.N, heads, D, L.tail.I, C);
  if (work->dims[0] != B || work->dims[1] != W)
    return ffi_error(api, "decode_layer: the work result must be float32 "
                          "[B, H + QKV + 2 heads D + 2H + 3I + heads (C + 24)]");
  const int64_t asked = *(const int32_t*)rows->data, live = asked >= 1 && asked < B ? asked : B;
  const int32_t* len = (const int32_t*)lengths->data;
  for (int64_t r = 0; r < live; ++r)
    if (len[r] < 1 || len[r] > C) return ffi_error(api, "decode_layer: lengths must be in 1..C");

  /* the work rows, live rows packed: normed, qkv, q, attention out, the tail's, the scores */
  float* normed = (float*)work->data;
  float* qkv = normed + live * H;
  float* q = qkv + live * L.qkv.N;
  float* attn_out = q + live * heads * D;
  float* tail_work = attn_out + live * heads * D;
  L.scratch = tail_work + live * tail_work_floats(H, L.tail.I);
  const float* xs = (const float*)x->data;
  float* ys = (float*)y->data;
  rms_normalize(xs, (const float*)attn_norm->data, *(const float*)eps->data, live, H, normed);
  L.qkv.B = live;
  L.qkv.x = normed;
  L.qkv.y = qkv;
  L.attn = (AttnJob){.n = live, .KV = KV, .G = heads / KV, .D = D, .C = C, .per_cache = 1,
                     .q = q, .ck = in_place(ck_out, ck), .cv = in_place(cv_out, cv),
                     .lengths = len, .out = attn_out};
  L.item = attention_item_fn(D);
  L.cos = (const float*)cos->data;
  L.sin = (const float*)sin->data;
  L.scale = (float)(1.0 / sqrt((double)D));
  tail_buffers(&L.tail, live, xs, attn_out, (const float*)ffn_norm->data,
               *(const float*)eps->data, ys, tail_work);
  /* the rows after the live ones: x as it is */
  memcpy(ys + live * H, xs + live * H, sizeof(float) * (size_t)((B - live) * H));
  Layer* team = &L;
  /* more items than threads: each thread takes one and joins; later items find all done */
  parallel_for(api, cf->ctx, 64, SHARE_ALWAYS, member, &team, sizeof team);
  return NULL;
}

EXPORT_PER_FORMAT(decode_layer, handle)
