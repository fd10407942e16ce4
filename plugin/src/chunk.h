/*
 * chunk.h -- answering tuner v6 getChunkSize from what NCCL actually passes, in its call order.
 *
 * NCCL (>= 2.30) calls getCollInfo once per aggregated task (tasks of one (collective, op,
 * datatype) within 4x of each other's size, byte count = the whole aggregate), and only after
 * ALL of a group's getCollInfo calls does it call getChunkSize, per task and per channel range,
 * with the bytes of one channel's slice (nChannels = 1) -- or the whole task, with the task's
 * channel count, for CollNet.  So getChunkSize cannot be matched to "the last getCollInfo".
 *
 * Instead every getCollInfo of a v6 communicator notes, for the current group, the
 * (collective, algorithm, protocol) it leaves NCCL to run, the size bucket of the aggregate
 * and the chunk the table asks for (0 = NCCL's own).  getChunkSize(coll, slice, algo, proto)
 * then looks at the aggregates of that group with the same (coll, algo, proto) whose bucket is
 * at least the slice's (a slice is never larger than its aggregate): if they all ask for the
 * same chunk, that is the answer; if they disagree, or some aggregate of the collective was
 * decided without a table in effect, or more than DYN_CHUNK_AGGS aggregates share the triple,
 * NCCL's chunk stands.  A group ends at the first getCollInfo after a getChunkSize: getCollInfo
 * only flags "a group is open" (one store); the first getChunkSize after it closes the group, and
 * later getCollInfo calls write under the next generation.
 *
 * Every input is rank-identical: the sequence of getCollInfo/getChunkSize calls and their
 * arguments is NCCL's deterministic planning of the same tasks on every rank (NCCL's own chunk
 * sizes depend on it), plus the agreed table.  Fixed-size state, no allocation, no lock.
 */
#ifndef DYN_CHUNK_H
#define DYN_CHUNK_H

#include "core.h"

#define DYN_CHUNK_AGGS 4 /* aggregates per (collective, algorithm, protocol) in one group */

typedef struct {
  uint32_t gen;                       /* group the entries belong to */
  uint8_t n;                          /* entries used; DYN_CHUNK_AGGS + 1 = overflowed */
  uint8_t bucket[DYN_CHUNK_AGGS];     /* size bucket of each aggregate */
  uint8_t chunk_log2[DYN_CHUNK_AGGS]; /* chunk the table asks for, 0 = NCCL's */
  uint8_t pad[3];
} dyn_chunk_memo_t;

typedef struct {
  uint32_t gen;                     /* generation getCollInfo notes are written under, starts at 1 */
  uint32_t look;                    /* generation getChunkSize answers from (the last closed group) */
  uint32_t open;                    /* 1: a getCollInfo since the last getChunkSize */
  uint32_t unknown_gen[DYN_N_FUNCS]; /* group in which an aggregate was decided without a table */
  dyn_chunk_memo_t memo[DYN_N_FUNCS][DYN_NUM_ALGOS][DYN_NUM_PROTOS];
} dyn_chunk_state_t;

/* Called at the top of every getCollInfo. */
static inline __attribute__((always_inline)) void dyn_chunk_begin(dyn_chunk_state_t* s) { s->open = 1; }

/* An aggregate of collective `coll` in size bucket `bucket` will run (algo, proto) with chunk
 * 2^chunk_log2 (0 = NCCL's). */
static inline void dyn_chunk_note(dyn_chunk_state_t* s, int coll, int bucket, int algo, int proto,
                                  uint32_t chunk_log2) {
  dyn_chunk_memo_t* m = &s->memo[coll][algo][proto];
  if (m->gen != s->gen) {
    m->gen = s->gen;
    m->n = 0;
  }
  if (m->n < DYN_CHUNK_AGGS) {
    m->bucket[m->n] = (uint8_t)bucket;
    m->chunk_log2[m->n] = (uint8_t)chunk_log2;
  }
  if (m->n <= DYN_CHUNK_AGGS) m->n++;
}

/* An aggregate of `coll` was decided while no table was in effect: its (algo, proto) is NCCL's
 * and unknown here, so no chunk of this collective is answered in this group. */
static inline __attribute__((always_inline)) void dyn_chunk_unknown(dyn_chunk_state_t* s, int coll) {
  s->unknown_gen[coll] = s->gen;
}

/* NCCL's pick from a cost table: the first smallest entry >= 0 (0 if none). */
static inline int dyn_nccl_pick(const float* cost, int numAlgo, int numProto, int* algo, int* proto) {
  float best = 0.0f;
  int found = 0;
  for (int a = 0; a < numAlgo && a < DYN_NUM_ALGOS; a++)
    for (int p = 0; p < numProto && p < DYN_NUM_PROTOS; p++) {
      float v = cost[a * numProto + p];
      if (v >= 0.0f && (!found || v < best)) {
        best = v;
        *algo = a;
        *proto = p;
        found = 1;
      }
    }
  return found;
}

/* getChunkSize: the chunk (log2) to answer for a slice of `nbytes`, 0 = leave NCCL's. */
static inline uint32_t dyn_chunk_lookup(dyn_chunk_state_t* s, int coll, uint64_t nbytes, int algo, int proto) {
  if (s->open) { /* the first getChunkSize after getCollInfo calls: that group is complete */
    s->open = 0;
    s->look = s->gen++;
  }
  if ((unsigned)coll >= DYN_N_FUNCS || (unsigned)algo >= DYN_NUM_ALGOS || (unsigned)proto >= DYN_NUM_PROTOS)
    return 0;
  if (s->unknown_gen[coll] == s->look) return 0;
  const dyn_chunk_memo_t* m = &s->memo[coll][algo][proto];
  if (m->gen != s->look || m->n > DYN_CHUNK_AGGS) return 0;
  int slice = dyn_size_bucket(nbytes), found = 0;
  uint32_t v = 0;
  for (int k = 0; k < m->n; k++) {
    if (m->bucket[k] < slice) continue; /* smaller than this slice: not its aggregate */
    if (found && m->chunk_log2[k] != v) return 0; /* ambiguous: NCCL's */
    v = m->chunk_log2[k];
    found = 1;
  }
  return v;
}

#endif
