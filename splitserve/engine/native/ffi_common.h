/* What the native kernels share: XLA FFI plumbing (errors, the API-version handshake, buffer
   arguments), the instruction set chosen at run time, and a parallel loop over XLA's intra-op
   thread pool. */

#ifndef SPLITSERVE_FFI_COMMON_H_
#define SPLITSERVE_FFI_COMMON_H_

#include <stdint.h>

#include "xla/ffi/api/c_api.h" /* from jaxlib: jax.ffi.include_dir() */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPLITSERVE_X86 1
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define TARGET_AVX2 __attribute__((target("avx2,f16c,fma")))
#endif

#define EXPORT __attribute__((visibility("default")))
#define INLINE static inline __attribute__((always_inline))

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* The instruction set in use (the best the CPU has unless a test lowered it). */
int current_isa(void);

/* A handler's first lines: answer XLA's metadata query (returns 1 and sets *out), or skip a
   stage other than execution. */
int ffi_preamble(XLA_FFI_CallFrame* cf, XLA_FFI_Error** out);

XLA_FFI_Error* ffi_error(const XLA_FFI_Api* api, const char* msg);

/* Argument i as a buffer (NULL when it is not one); the only result as a buffer. */
XLA_FFI_Buffer* ffi_arg(XLA_FFI_CallFrame* cf, int i);
XLA_FFI_Buffer* ffi_ret(XLA_FFI_CallFrame* cf);

/* The work estimate of a call that shares out however small it is: one whose own gain is nil
   but which keeps the pool's threads awake for the large call after it (attention.c). */
#define SHARE_ALWAYS INT64_MAX

/* fn(job, i0, i1) over items [0, n) in chunks, on the calling thread and on XLA's pool when the
   work (an estimate in multiply-adds) is worth a hand-off. `job` is copied (job_size bytes), so
   a pool task that starts after the call returned reads nothing freed; such a task finds no
   chunk left and just returns. Chunks partition [0, n) the same way whatever the thread count,
   so results never depend on it. */
typedef void ChunkFn(const void* job, int64_t i0, int64_t i1);
void parallel_for(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx, int64_t n, int64_t work,
                  ChunkFn* fn, const void* job, int job_size);

#endif
