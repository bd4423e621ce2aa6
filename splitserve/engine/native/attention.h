/* Decode attention's job and its per-(row, KV head) item, as attention.c's handlers and
   decode_layer.c (the whole layer in one call) use them. */

#ifndef SPLITSERVE_ATTENTION_H_
#define SPLITSERVE_ATTENTION_H_

#include "ffi_common.h"

#define MAX_G 16 /* query heads per KV head */

typedef struct {
  int64_t n, KV, G, D, C;
  int64_t per_cache; /* query rows per cache row: 1 in a decode step, T in a prompt pass */
  const float* q;
  const float* ck;
  const float* cv;
  const int32_t* lengths; /* NULL in a prompt pass: row r attends to r % T + 1 positions */
  float* out;
} AttnJob;

/* The scores scratch holds G rows of this many floats: the capacity and room for a last block
   of 24 positions written whole (item_avx2); the other paths use the first C of each row. */
static inline int64_t scores_stride(const AttnJob* j) { return j->C + 24; }

/* One (row r, KV head h) item: out[r, h] from q[r, h] and row r's cache (s: the scratch,
   G * scores_stride floats). */
typedef void AttnItemFn(const AttnJob* j, int64_t r, int64_t h, float* s);

/* The item code for this CPU and head size. */
AttnItemFn* attention_item_fn(int64_t D);

#endif /* SPLITSERVE_ATTENTION_H_ */
