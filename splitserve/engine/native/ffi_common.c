/* See ffi_common.h. */

#include "ffi_common.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- instruction set and thread settings ---------------------------------------------------- */

static int best_isa(void) {
#ifdef SPLITSERVE_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma"))
    return ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
  return ISA_SCALAR;
}

static atomic_int g_isa = -1;    /* -1: not chosen yet */
static atomic_int g_threads = 0; /* 0: as many as XLA's intra-op pool has */

int current_isa(void) {
  int isa = atomic_load(&g_isa);
  if (isa < 0) {
    isa = best_isa();
    atomic_store(&g_isa, isa);
  }
  return isa;
}

/* The instruction set in use (0 portable, 1 AVX2, 2 AVX-512). */
EXPORT int splitserve_qkernel_isa(void) { return current_isa(); }

/* Use `isa` if this CPU has it, else the best below it; returns the one now in use. Tests run
   every path the machine supports this way. */
EXPORT int splitserve_qkernel_set_isa(int isa) {
  int best = best_isa();
  atomic_store(&g_isa, isa < 0 || isa > best ? best : isa);
  return atomic_load(&g_isa);
}

/* At most this many threads per call (0: the pool's size, 1: the calling thread alone). */
EXPORT void splitserve_qkernel_set_threads(int n) { atomic_store(&g_threads, n < 0 ? 0 : n); }

/* Cores shared with other processes of the host (splitserve/core_share.py): while any of the
   g_busy_n bytes at g_busy is nonzero (another engine is computing), a call takes at most
   g_busy_threads threads. The bytes live in a file those processes map and write; each call
   reads them afresh, so a call that starts after a mark is set or cleared follows it. */
static _Atomic(const volatile unsigned char*) g_busy = NULL;
static atomic_int g_busy_n = 0, g_busy_threads = 1;
static atomic_llong g_busy_calls = 0; /* calls that found a mark set */

EXPORT void splitserve_qkernel_share_cores(const unsigned char* flags, int n, int threads) {
  atomic_store(&g_busy, NULL); /* off while the settings change */
  atomic_store(&g_busy_n, n < 0 ? 0 : n);
  atomic_store(&g_busy_threads, threads < 1 ? 1 : threads);
  atomic_store(&g_busy, (const volatile unsigned char*)flags);
}

EXPORT long long splitserve_qkernel_shared_calls(void) { return atomic_load(&g_busy_calls); }

/* The thread cap for this call (0: none): g_threads, lowered while a mark is set. */
static int64_t thread_cap(void) {
  int64_t cap = atomic_load(&g_threads);
  const volatile unsigned char* busy = atomic_load(&g_busy);
  if (busy) {
    const int n = atomic_load(&g_busy_n);
    for (int i = 0; i < n; ++i) {
      if (busy[i]) {
        const int64_t shared = atomic_load(&g_busy_threads);
        if (cap == 0 || shared < cap) cap = shared;
        atomic_fetch_add(&g_busy_calls, 1);
        break;
      }
    }
  }
  return cap;
}

/* ---- FFI plumbing ---------------------------------------------------------------------------- */

XLA_FFI_Error* ffi_error(const XLA_FFI_Api* api, const char* msg) {
  XLA_FFI_Error_Create_Args a = {XLA_FFI_Error_Create_Args_STRUCT_SIZE, NULL, msg,
                                 XLA_FFI_Error_Code_INVALID_ARGUMENT};
  return api->XLA_FFI_Error_Create(&a);
}

int ffi_preamble(XLA_FFI_CallFrame* cf, XLA_FFI_Error** out) {
  *out = NULL;
  if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata) {
    /* XLA first asks which API version the handler was built against. */
    XLA_FFI_Metadata_Extension* ext = (XLA_FFI_Metadata_Extension*)cf->extension_start;
    ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    ext->metadata->api_version.extension_start = NULL;
    ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    ext->metadata->traits = 0;
    return 1;
  }
  return cf->stage != XLA_FFI_ExecutionStage_EXECUTE;
}

XLA_FFI_Buffer* ffi_arg(XLA_FFI_CallFrame* cf, int i) {
  if (i >= cf->args.size || cf->args.types[i] != XLA_FFI_ArgType_BUFFER) return NULL;
  return (XLA_FFI_Buffer*)cf->args.args[i];
}

XLA_FFI_Buffer* ffi_ret(XLA_FFI_CallFrame* cf) {
  if (cf->rets.size != 1 || cf->rets.types[0] != XLA_FFI_RetType_BUFFER) return NULL;
  return (XLA_FFI_Buffer*)cf->rets.rets[0];
}

/* ---- work sharing ---------------------------------------------------------------------------- */

/* Below this many multiply-adds a call runs on the calling thread alone: handing work to another
   thread costs microseconds. */
#define MIN_PARALLEL_WORK (1 << 18)

typedef struct {
  ChunkFn* fn;
  int64_t n, chunk, nchunks;
  atomic_llong next; /* next chunk to take */
  atomic_llong done; /* chunks finished */
  atomic_int refs;   /* the caller and every scheduled task; the last one frees */
  _Alignas(64) unsigned char job[];
} Shared;

static void run_chunks(Shared* s) {
  for (;;) {
    long long c = atomic_fetch_add(&s->next, 1);
    if (c >= s->nchunks) return;
    int64_t i0 = c * s->chunk, i1 = i0 + s->chunk;
    s->fn(s->job, i0, i1 < s->n ? i1 : s->n);
    atomic_fetch_add(&s->done, 1);
  }
}

static void release(Shared* s) {
  if (atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

static void pool_task(void* data) {
  Shared* s = (Shared*)data;
  run_chunks(s);
  release(s);
}

static void destroy_error(const XLA_FFI_Api* api, XLA_FFI_Error* e) {
  XLA_FFI_Error_Destroy_Args a = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, NULL, e};
  api->XLA_FFI_Error_Destroy(&a);
}

static int64_t pool_threads(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx) {
  int64_t n = 0;
  XLA_FFI_ThreadPool_NumThreads_Args a = {XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE, NULL,
                                          ctx, &n};
  XLA_FFI_Error* e = api->XLA_FFI_ThreadPool_NumThreads(&a);
  if (e) {
    destroy_error(api, e);
    return 0;
  }
  return n;
}

void parallel_for(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx, int64_t n, int64_t work,
                  ChunkFn* fn, const void* job, int job_size) {
  /* The calling thread works too, so a pool of T threads gets T - 1 helpers: XLA's own ops use
     about as many threads as its pool has (cpu_threads), and so do these kernels. */
  int64_t want = thread_cap(), helpers = 0;
  if (want != 1 && work >= MIN_PARALLEL_WORK && n > 1) {
    helpers = pool_threads(api, ctx) - 1;
    if (want > 1 && helpers > want - 1) helpers = want - 1;
  }
  Shared* s = helpers > 0 ? (Shared*)malloc(sizeof(Shared) + (size_t)job_size) : NULL;
  if (!s) {
    fn(job, 0, n);
    return;
  }
  memcpy(s->job, job, (size_t)job_size);
  s->fn = fn;
  s->n = n;
  /* a few chunks per thread, so one that starts late still finds work */
  int64_t nchunks = (helpers + 1) * 4;
  s->chunk = (n + nchunks - 1) / nchunks;
  s->nchunks = (n + s->chunk - 1) / s->chunk;
  atomic_init(&s->next, 0);
  atomic_init(&s->done, 0);
  atomic_init(&s->refs, 1);
  for (int64_t t = 0; t < helpers; ++t) {
    atomic_fetch_add(&s->refs, 1);
    XLA_FFI_ThreadPool_Schedule_Args a = {XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE, NULL, ctx,
                                          pool_task, s};
    XLA_FFI_Error* e = api->XLA_FFI_ThreadPool_Schedule(&a);
    if (e) {
      destroy_error(api, e);
      atomic_fetch_sub(&s->refs, 1);
      break;
    }
  }
  run_chunks(s);
  while (atomic_load(&s->done) < s->nchunks) {
#ifdef SPLITSERVE_X86
    _mm_pause();
#endif
  }
  release(s);
}
