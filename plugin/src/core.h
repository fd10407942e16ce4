/*
 * core.h -- pure decision logic: size buckets, scale classes, the exploration hash,
 * table validation and forcing a choice into NCCL's cost table.  No I/O, no state.
 * Included by plugin.c (unity build: everything static), the C tests and the fuzzers.
 * dynamiccl/api/table.py implements the same functions; tests compare them.
 */
#ifndef DYN_CORE_H
#define DYN_CORE_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <pthread.h>
#include "../include/dyn_nccl_abi.h"
#include "../include/dyn_shm.h"

/* ---------- CRC-32 (zlib polynomial, same as Python's zlib.crc32) ---------- */
static uint32_t dyn_crc_table[8][256]; /* slicing-by-8 */
static void dyn_crc_init(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    dyn_crc_table[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++)
    for (int t = 1; t < 8; t++)
      dyn_crc_table[t][n] = (dyn_crc_table[t - 1][n] >> 8) ^ dyn_crc_table[0][dyn_crc_table[t - 1][n] & 0xFFu];
}
static pthread_once_t dyn_crc_once = PTHREAD_ONCE_INIT;
/* the checksum loop has no branches worth coverage feedback; keep fuzzers fast */
#if defined(__clang__)
#define DYN_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define DYN_NO_COVERAGE
#endif
DYN_NO_COVERAGE static uint32_t dyn_crc32(const void* data, size_t len) {
  pthread_once(&dyn_crc_once, dyn_crc_init);
  const uint8_t* p = (const uint8_t*)data;
  uint32_t c = 0xFFFFFFFFu;
  while (len >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = dyn_crc_table[7][lo & 0xFF] ^ dyn_crc_table[6][(lo >> 8) & 0xFF] ^ dyn_crc_table[5][(lo >> 16) & 0xFF] ^
        dyn_crc_table[4][lo >> 24] ^ dyn_crc_table[3][hi & 0xFF] ^ dyn_crc_table[2][(hi >> 8) & 0xFF] ^
        dyn_crc_table[1][(hi >> 16) & 0xFF] ^ dyn_crc_table[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) c = dyn_crc_table[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/* ---------- dimensions of the decision table ---------- */
static inline int dyn_size_bucket(uint64_t nbytes) {
  if (nbytes == 0) return 0;
  int b = 63 - __builtin_clzll(nbytes);
  return b < DYN_N_BUCKETS - 1 ? b : DYN_N_BUCKETS - 1;
}

static inline int dyn_ceil_log2(uint64_t n) { return n <= 1 ? 0 : 64 - __builtin_clzll(n - 1); }

/* scale class = node class * 8 + ranks-per-node class; 128 classes (DYN_N_SCALE_CLASSES).
 * node class: ceil(log2(nNodes)), 0..15 (14: 8 193-16 384 nodes; 15: more than 16 384);
 * ranks-per-node class: ceil(log2(nRanks / nNodes)), 0..7 (7: 65 and more, e.g. NVL72). */
#define DYN_NODE_CLASS_MAX 15
#define DYN_PPN_CLASS_MAX 7
static inline int dyn_scale_class(uint64_t nranks, uint64_t nnodes) {
  if (nnodes == 0) nnodes = 1;
  if (nranks == 0) nranks = 1;
  int nc = dyn_ceil_log2(nnodes);
  if (nc > DYN_NODE_CLASS_MAX) nc = DYN_NODE_CLASS_MAX;
  uint64_t ppn = nranks / nnodes;
  if (ppn == 0) ppn = 1;
  int pc = dyn_ceil_log2(ppn);
  if (pc > DYN_PPN_CLASS_MAX) pc = DYN_PPN_CLASS_MAX;
  return nc * (DYN_PPN_CLASS_MAX + 1) + pc;
}

/* ---------- deterministic exploration hash (splitmix64 finaliser chain) ---------- */
static inline uint64_t dyn_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
/* the part of the draw that is fixed per (communicator, table, cell): precomputed at adoption */
static inline uint64_t dyn_hash_prefix(uint64_t seed, uint64_t comm_id, uint64_t nranks, uint64_t nnodes,
                                       uint32_t coll, uint32_t bucket) {
  uint64_t h = dyn_mix(seed ^ 0x9E3779B97F4A7C15ULL);
  h = dyn_mix(h ^ comm_id);
  h = dyn_mix(h ^ ((nranks << 32) ^ (nnodes & 0xFFFFFFFFULL)));
  return dyn_mix(h ^ (((uint64_t)coll << 8) | bucket));
}
static inline uint64_t dyn_explore_hash(uint64_t seed, uint64_t comm_id, uint64_t nranks,
                                        uint64_t nnodes, uint32_t coll, uint32_t bucket,
                                        uint64_t j) {
  return dyn_mix(dyn_hash_prefix(seed, comm_id, nranks, nnodes, coll, bucket) ^ j);
}

/* explore probability (Q16) at the j-th call of a cell */
static inline uint32_t dyn_eps_at(uint32_t eps_q16, uint32_t half_life_log2, uint64_t j) {
  if (half_life_log2 >= 64) return eps_q16;
  uint64_t halvings = j >> half_life_log2;
  return halvings >= 16 ? 0u : (eps_q16 >> halvings);
}

/* ---------- validation of a table copy (fuzzed) ---------- */
static inline int dyn_choice_ok(const dyn_choice_t* c) {
  return c->algo < DYN_NUM_ALGOS && c->proto < DYN_NUM_PROTOS && c->chunk_log2 <= 31;
}

/* 0 if `t` is a complete, well-formed table for `epoch`; a negative reason code otherwise. */
static int dyn_table_validate(const dyn_table_t* t, uint32_t epoch) {
  if (t->state != DYN_TABLE_READY) return -1;
  if (t->magic != DYN_TABLE_MAGIC || t->format != DYN_TABLE_FORMAT) return -2;
  if (t->epoch != epoch) return -3;
  if (t->n_scales > DYN_MAX_SCALES) return -4;
  if (t->half_life_log2 > 63 && t->half_life_log2 != 255) return -5;
  for (uint32_t s = 0; s < DYN_MAX_SCALES; s++) {
    uint8_t id = t->scale_ids[s];
    if (s < t->n_scales) {
      if (id >= DYN_N_SCALE_CLASSES) return -7;
      for (uint32_t r = 0; r < s; r++)
        if (t->scale_ids[r] == id) return -8;
    } else if (id != DYN_NO_SCALE) {
      return -9;
    }
  }
  for (int s = 0; s < DYN_MAX_SCALES; s++)
    for (int f = 0; f < DYN_N_FUNCS; f++)
      for (int b = 0; b < DYN_N_BUCKETS; b++) {
        const dyn_cell_t* c = &t->cells[s][f][b];
        if (c->n_choices > DYN_MAX_CHOICES || c->n_cands > DYN_MAX_CANDS) return -10;
        for (int k = 0; k < c->n_choices; k++)
          if (!dyn_choice_ok(&c->choices[k])) return -11;
        for (int k = 0; k < c->n_cands; k++)
          if (!dyn_choice_ok(&c->cands[k])) return -12;
      }
  /* the checksum last: it is the expensive check */
  if (dyn_crc32((const uint8_t*)t + 8, DYN_TABLE_BYTES - 8) != t->crc) return -6;
  return 0;
}

static inline int dyn_table_scale_index(const dyn_table_t* t, int scale_class) {
  for (uint32_t s = 0; s < t->n_scales && s < DYN_MAX_SCALES; s++)
    if (t->scale_ids[s] == scale_class) return (int)s;
  return -1;
}

/* ---------- forcing a choice ---------- */
/* Set cost[algo][proto] to 0.0 if NCCL marked it available; never touch -1.0 (or NaN) entries. */
static inline int dyn_force(const dyn_choice_t* c, float* cost, int numAlgo, int numProto,
                            int* nChannels) {
  if (c->algo >= numAlgo || c->proto >= numProto) return 0;
  float* e = &cost[c->algo * numProto + c->proto];
  if (!(*e >= 0.0f)) return 0;
  *e = 0.0f;
  if (c->nchannels && nChannels) *nChannels = c->nchannels;
  return 1;
}

/* Apply one cell given its hash prefix: the exploration draw first, then the ranked choices.
 * Returns the choice applied or NULL (NCCL's own choice stands). */
static inline __attribute__((always_inline)) const dyn_choice_t* dyn_apply_cell_h(
    const dyn_cell_t* cell, uint64_t hprefix, uint32_t half_life_log2, uint64_t j, float* cost, int numAlgo,
    int numProto, int* nChannels) {
  uint32_t n_cands = cell->n_cands;
  if (n_cands && cell->eps_q16) {
    uint32_t eps = dyn_eps_at(cell->eps_q16, half_life_log2, j);
    uint64_t h = dyn_mix(hprefix ^ j);
    if ((h & 0xFFFFu) < eps) {
      uint32_t total = 0;
      for (uint32_t c = 0; c < n_cands && c < DYN_MAX_CANDS; c++) total += cell->weights[c];
      uint32_t r = (uint32_t)(((h >> 32) * (uint64_t)total) >> 32);
      for (uint32_t c = 0; c < n_cands && c < DYN_MAX_CANDS; c++) {
        if (r < cell->weights[c]) {
          if (dyn_force(&cell->cands[c], cost, numAlgo, numProto, nChannels)) return &cell->cands[c];
          break;
        }
        r -= cell->weights[c];
      }
    }
  }
  for (uint32_t c = 0; c < cell->n_choices && c < DYN_MAX_CHOICES; c++)
    if (dyn_force(&cell->choices[c], cost, numAlgo, numProto, nChannels)) return &cell->choices[c];
  return NULL;
}

typedef struct {
  uint64_t seed, comm_id, nranks, nnodes;
  uint32_t half_life_log2;
} dyn_explore_key_t;

static inline const dyn_choice_t* dyn_apply_cell(const dyn_cell_t* cell, const dyn_explore_key_t* k,
                                                 uint32_t coll, uint32_t bucket, uint64_t j,
                                                 float* cost, int numAlgo, int numProto,
                                                 int* nChannels) {
  uint64_t hp = dyn_hash_prefix(k->seed, k->comm_id, k->nranks, k->nnodes, coll, bucket);
  return dyn_apply_cell_h(cell, hp, k->half_life_log2, j, cost, numAlgo, numProto, nChannels);
}

/* ---------- tuner v2: availability NCCL 2.21 would allow ---------- */
/* v2 plugins return (algorithm, protocol) directly, and when both are set NCCL 2.21 runs them without
 * its own checks, so this must offer only what 2.21's rules allow (its src/graph/tuning.cc bandwidth
 * table and src/enqueue.cc topoGetAlgoInfo); NCCL 2.22+ loads our v3+ instead.  2.21's rules:
 *  - broadcast, reduce: ring only; all-gather, reduce-scatter: ring, NVLS (and CollNet direct);
 *    all-reduce: tree, ring, CollNet direct/chain, NVLS, NVLS tree;
 *  - NVLS, NVLS tree, CollNet: SIMPLE only; CollNet needs collNetSupport, NVLS/NVLS tree nvlsSupport;
 *  - NVLS on more than one node needs CollNet (collNetSupport); NVLS all-gather/reduce-scatter
 *    only on one node; NVLS tree only on more than one node; no PAT (it did not exist).
 * Not offered because v2 does not pass what 2.21 decides them on: CollNet direct (needs an NVSwitch
 * system, and for all-gather/reduce-scatter one NIC per GPU). LL128 is offered as 2.21 enables it on
 * NVLink systems of one compute capability (sm70/80/90); see docs/plugin.md. */
static void dyn_v2_cost_table(int coll, int collNetSupport, int nvlsSupport, uint64_t nnodes,
                              float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS]) {
  for (int a = 0; a < DYN_NUM_ALGOS; a++)
    for (int p = 0; p < DYN_NUM_PROTOS; p++) cost[a][p] = DYN_COST_IGNORE;
  for (int p = 0; p < DYN_NUM_PROTOS; p++) {
    cost[DYN_ALGO_RING][p] = 1.0f;
    if (coll == 4) cost[DYN_ALGO_TREE][p] = 1.0f;
  }
  int multi = nnodes > 1, ag_rs = coll == 2 || coll == 3;
  if (coll == 4 && collNetSupport == 1) cost[DYN_ALGO_COLLNET_CHAIN][DYN_PROTO_SIMPLE] = 1.0f;
  if (nvlsSupport == 1 && (coll == 4 || ag_rs) && (!multi || (coll == 4 && collNetSupport == 1)))
    cost[DYN_ALGO_NVLS][DYN_PROTO_SIMPLE] = 1.0f;
  if (nvlsSupport == 1 && coll == 4 && multi) cost[DYN_ALGO_NVLS_TREE][DYN_PROTO_SIMPLE] = 1.0f;
}

/* ---------- epoch entries ---------- */
static inline uint32_t dyn_entry_status(uint64_t w) { return (uint32_t)(w & 0xFFu); }
static inline uint64_t dyn_entry_boundary(uint64_t w) { return w >> 8; }

/* 0 if the header describes exactly the layout this build knows, within `mapped` bytes. */
static int dyn_header_validate(const dyn_shm_header_t* h, size_t mapped) {
  if (mapped < sizeof(dyn_shm_header_t)) return -1;
  if (h->magic != DYN_SHM_MAGIC) return -2;
  if (h->layout_version != DYN_SHM_LAYOUT_VERSION) return -3;
  if (h->ready != 1) return -4;
  if (h->crc != dyn_crc32(h, 80)) return -5;
  if (h->header_size != DYN_HEADER_SIZE || h->ctrl_off != DYN_CTRL_OFF || h->tables_off != DYN_TABLES_OFF ||
      h->table_slot_size != DYN_TABLE_SLOT_SIZE || h->n_table_slots != DYN_MAX_EPOCHS ||
      h->procs_off != DYN_PROCS_OFF || h->proc_slot_size != DYN_PROC_SLOT_SIZE ||
      h->n_proc_slots != DYN_MAX_PROCS || h->ring_cap != DYN_RING_CAP || h->record_size != DYN_RECORD_SIZE)
    return -6;
  if (h->file_size != DYN_FILE_SIZE || mapped < DYN_FILE_SIZE) return -7;
  uint64_t L = h->epoch_interval;
  if (L < DYN_MIN_INTERVAL || L > DYN_MAX_INTERVAL || (L & (L - 1))) return -8;
  return 0;
}

/* ---------- profiler string decoding (NCCL passes its own static strings) ---------- */
static inline uint8_t dyn_func_id(const char* s) {
  if (!s) return 255;
  size_t n = strlen(s);
  if (n == 9 && s[0] == 'B') return 0;                  /* Broadcast */
  if (n == 6 && s[0] == 'R') return 1;                  /* Reduce */
  if (n == 9 && s[0] == 'A' && s[3] == 'G') return 2;   /* AllGather */
  if (n == 13 && s[0] == 'R') return 3;                 /* ReduceScatter */
  if (n == 9 && s[0] == 'A' && s[3] == 'R') return 4;   /* AllReduce */
  return 255;
}
static inline uint8_t dyn_algo_id(const char* s) {
  if (!s) return 255;
  size_t n = strlen(s);
  switch (s[0] | 0x20) {
    case 't': return n == 4 ? 0 : 255;
    case 'r': return n == 4 ? 1 : 255;
    case 'c': return n == 14 ? 2 : (n == 13 ? 3 : 255);
    case 'n': return n == 4 ? 4 : (n == 9 ? 5 : 255);
    case 'p': return n == 3 ? 6 : 255;
    default: return 255;
  }
}
static inline uint8_t dyn_proto_id(const char* s) {
  if (!s) return 255;
  size_t n = strlen(s);
  if (n == 2 && (s[0] | 0x20) == 'l') return 0;  /* LL */
  if (n == 5 && (s[0] | 0x20) == 'l') return 1;  /* LL128 */
  if (n == 6 && (s[0] | 0x20) == 's') return 2;  /* SIMPLE / Simple */
  return 255;
}
/* size of an NCCL datatype from its name ("ncclFloat32", "ncclBfloat16", "ncclFloat8e4m3", ...) */
static inline uint32_t dyn_dtype_size(const char* s) {
  if (!s) return 0;
  size_t n = strlen(s);
  if (n < 2) return 0;
  char a = s[n - 2], b = s[n - 1];
  if (a == '1' && b == '6') return 2;
  if (a == '3' && b == '2') return 4;
  if (a == '6' && b == '4') return 8;
  if (b == '8' || a == 'm') return 1; /* Int8, Uint8, Float8e4m3, Float8e5m2 */
  return 0;
}

#endif
