/*
 * plugin.c -- DynamICCL's NCCL tuner (ABI v2..v7) and profiler (ABI v4..v7).
 *
 * Unity build: core.h, mapping.h and runtime.h are included here so every function is static and
 * the only exported symbols are the ten plugin structs (checked by `make test`).
 * Hot path (getCollInfo): two counter increments, one mask test, one table lookup (v6: one
 * chunk note), no allocation, no lock, no system call.  Every entry point returns ncclSuccess.
 */
#include "chunk.h"
#include "profiler.h"

#define DYN_EXPORT __attribute__((visibility("default")))
#define DYN_NAME "dynamiccl"

/* ====================================================================== tuner */

typedef struct {
  uint64_t calls;            /* per-communicator call index (all collectives) */
  uint64_t lmask;            /* copy of es.lmask, next to calls */
  const dyn_cell_t* cells;   /* [DYN_N_FUNCS][DYN_N_BUCKETS] of the table in effect, NULL = NCCL's */
  uint32_t half_life_log2;
  int want_chunk;            /* v6: note decisions for getChunkSize */
  uint32_t bucket_calls[DYN_N_FUNCS][DYN_N_BUCKETS]; /* per-(collective, size bucket) call counters */
  uint64_t hprefix[DYN_N_FUNCS][DYN_N_BUCKETS];      /* exploration hash prefix per cell */
  dyn_epoch_state_t es;
  uint64_t comm_id;          /* 0 when the ABI version does not provide it (v2..v4) */
  uint64_t nranks, nnodes;
  int scale_class;
  int user_env;              /* NCCL_ALGO / NCCL_PROTO set: never fight it */
  uint32_t table_epoch;
  dyn_chunk_state_t chunk;   /* v6: this group's decisions, see chunk.h */
} dyn_tuner_ctx_t;

static int dyn_env_set(const char* name) {
  const char* v = getenv(name);
  return v && *v;
}

/* No profiler init before the tuner's: NCCL >= 2.27 inits the profiler of a communicator first, and
 * older NCCL cannot load ours (profiler ABI v4+), so nothing of this process will be measured. */
static void dyn_check_profiler(int tuner_abi) {
  if (atomic_load(&g_dyn.abi[DYN_ABI_PROFILER])) return;
  static const char* const nccl_of_abi[] = {"?", "?", "2.21", "2.22-2.23", "2.24-2.27", "2.28-2.29",
                                             "2.30-2.32.5", ">= 2.32.6"};
  const char* nccl = nccl_of_abi[tuner_abi >= 2 && tuner_abi <= 7 ? tuner_abi : 0];
  dyn_log(DYN_LOG_NO_PROFILER, NCCL_LOG_WARN,
          "no DynamICCL profiler loaded (NCCL %s loaded tuner ABI v%d; the profiler needs NCCL >= 2.27 and "
          "NCCL_PROFILER_PLUGIN=dynamiccl): tuning from the table only, no collective is measured",
          nccl, tuner_abi);
}

static ncclResult_t dyn_tuner_init_common(void** context, uint64_t comm_id, size_t nRanks, size_t nNodes,
                                          ncclDebugLogger_t logfn, int abi) {
  dyn_set_logger(logfn);
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)calloc(1, sizeof(dyn_tuner_ctx_t));
  if (!c) {
    dyn_log(DYN_LOG_NOMEM, NCCL_LOG_WARN, "out of memory; NCCL's own tuning stays in effect");
    *context = NULL;
    return ncclSuccess;
  }
  c->comm_id = comm_id;
  c->nranks = nRanks;
  c->nnodes = nNodes;
  c->scale_class = dyn_scale_class(nRanks, nNodes);
  c->es.lmask = DYN_PROBE_INTERVAL - 1;
  c->lmask = c->es.lmask;
  c->es.next_e = 1;
  c->es.need_idx = -2;
  c->want_chunk = abi >= 6; /* v7 keeps v6's getChunkSize */
  c->chunk.gen = 1;
  c->user_env = dyn_env_set("NCCL_ALGO") || dyn_env_set("NCCL_PROTO");
  if (c->user_env)
    dyn_log(DYN_LOG_USER_ENV, NCCL_LOG_INFO, "NCCL_ALGO/NCCL_PROTO set by the user; leaving NCCL's choice alone");
  dyn_try_map();
  dyn_note_abi(DYN_ABI_TUNER, abi);
  dyn_check_profiler(abi);
  *context = c;
  return ncclSuccess;
}

static void dyn_adopt(dyn_tuner_ctx_t* c, uint32_t e) {
  c->table_epoch = e;
  const dyn_table_t* t = c->es.cur_tab;
  int s = t ? dyn_table_scale_index(t, c->scale_class) : -1;
  c->cells = NULL;
  if (s < 0 || c->user_env) return;
  for (uint32_t f = 0; f < DYN_N_FUNCS; f++)
    for (uint32_t b = 0; b < DYN_N_BUCKETS; b++)
      c->hprefix[f][b] = dyn_hash_prefix(t->seed, c->comm_id, c->nranks, c->nnodes, f, b);
  c->half_life_log2 = t->half_life_log2;
  c->cells = &t->cells[s][0][0];
}

/* Rare path: every L calls (or every probe interval before the file is mapped). */
static __attribute__((noinline, cold)) void dyn_boundary_step(dyn_tuner_ctx_t* c, uint64_t i) {
  uint32_t e = dyn_boundary(&c->es, i);
  c->lmask = c->es.lmask;
  if (e != c->table_epoch) dyn_adopt(c, e);
}

/* v6: what this aggregate will run, for getChunkSize (chunk.h). */
static inline __attribute__((always_inline)) void dyn_note_chunk(dyn_tuner_ctx_t* c, int coll, int b,
                                                                 const dyn_choice_t* ch, const float* cost,
                                                                 int numAlgo, int numProto) {
  int a = 0, p = 0;
  if (ch) dyn_chunk_note(&c->chunk, coll, b, ch->algo, ch->proto, ch->chunk_log2);
  else if (dyn_nccl_pick(cost, numAlgo, numProto, &a, &p)) dyn_chunk_note(&c->chunk, coll, b, a, p, 0);
}

/* The hot path shared by every ABI version. cost is float[numAlgo][numProto].
 * Returns the choice applied, or NULL (NCCL's own choice stands). */
static inline __attribute__((always_inline)) const dyn_choice_t* dyn_decide(dyn_tuner_ctx_t* c, int coll,
                                                                            size_t nBytes, float* cost,
                                                                            int numAlgo, int numProto,
                                                                            int* nChannels) {
  uint64_t i = c->calls++;
  dyn_chunk_begin(&c->chunk);
  if (__builtin_expect((i & c->lmask) == 0, 0)) dyn_boundary_step(c, i);
  if ((unsigned)coll >= DYN_N_FUNCS) return NULL;
  int b = dyn_size_bucket(nBytes);
  uint64_t j = c->bucket_calls[coll][b]++;
  const dyn_cell_t* cells = c->cells;
  if (!cells || !cost) {
    dyn_chunk_unknown(&c->chunk, coll);
    return NULL;
  }
  const dyn_choice_t* ch = dyn_apply_cell_h(&cells[coll * DYN_N_BUCKETS + b], c->hprefix[coll][b],
                                            c->half_life_log2, j, cost, numAlgo, numProto, nChannels);
  if (c->want_chunk) dyn_note_chunk(c, coll, b, ch, cost, numAlgo, numProto);
  return ch;
}

static ncclResult_t dyn_get_coll_info_v3(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                         float** collCostTable, int numAlgo, int numProto, int* nChannels) {
  (void)numPipeOps;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (c) dyn_decide(c, collType, nBytes, (float*)collCostTable, numAlgo, numProto, nChannels);
  return ncclSuccess;
}

static ncclResult_t dyn_get_coll_info_v4(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                         float** collCostTable, int numAlgo, int numProto, int regBuff,
                                         int* nChannels) {
  (void)regBuff; /* not rank-identical: never an input to a decision */
  (void)numPipeOps;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (c) dyn_decide(c, collType, nBytes, (float*)collCostTable, numAlgo, numProto, nChannels);
  return ncclSuccess;
}

/* v2 (NCCL 2.21): NCCL skips its own checks when the plugin names both algorithm and protocol, so the
 * availability rebuilt by dyn_v2_cost_table must mirror 2.21's rules exactly (core.h). */
static ncclResult_t dyn_get_coll_info_v2(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                                         int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                                         int* nChannels) {
  (void)numPipeOps;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (!c) return ncclSuccess;
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  dyn_v2_cost_table(collType, collNetSupport, nvlsSupport, c->nnodes, cost);
  int nch = 0;
  const dyn_choice_t* ch = dyn_decide(c, collType, nBytes, &cost[0][0], DYN_NUM_ALGOS, DYN_NUM_PROTOS, &nch);
  if (ch) { /* a choice was applied: report both algorithm and protocol */
    if (algorithm) *algorithm = ch->algo;
    if (protocol) *protocol = ch->proto;
    if (nch && nChannels) *nChannels = nch;
  }
  return ncclSuccess;
}

/* v6: called after all of a group's getCollInfo calls, per task and channel range (chunk.h). */
static ncclResult_t dyn_get_chunk_size(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                                       int nChannels, size_t* chunkSize) {
  (void)nChannels; /* 1 for a channel's slice, the task's channels for CollNet: the bucket rule covers both */
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (!c || !chunkSize) return ncclSuccess;
  uint32_t l = dyn_chunk_lookup(&c->chunk, collType, nBytes, algo, proto);
  if (l) *chunkSize = (size_t)1 << l;
  return ncclSuccess;
}

static ncclResult_t dyn_tuner_destroy(void* context) {
  if (context) dyn_release_need(&((dyn_tuner_ctx_t*)context)->es);
  free(context);
  return ncclSuccess;
}

static ncclResult_t dyn_tuner_init_v2(size_t nRanks, size_t nNodes, ncclDebugLogger_t logfn, void** context) {
  return dyn_tuner_init_common(context, 0, nRanks, nNodes, logfn, 2);
}

static ncclResult_t dyn_tuner_init_v3(size_t nRanks, size_t nNodes, ncclDebugLogger_t logfn, void** context) {
  return dyn_tuner_init_common(context, 0, nRanks, nNodes, logfn, 3);
}

static ncclResult_t dyn_tuner_init_v4(size_t nRanks, size_t nNodes, ncclDebugLogger_t logfn, void** context) {
  return dyn_tuner_init_common(context, 0, nRanks, nNodes, logfn, 4);
}

static ncclResult_t dyn_tuner_init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logfn, dyn_nvl_domain_info_v5_t* nvl,
                                      dyn_tuner_constants_v5_t* constants) {
  (void)nvl;
  (void)constants; /* NCCL's constants are left exactly as NCCL set them */
  return dyn_tuner_init_common(context, commId, nRanks, nNodes, logfn, 5);
}

static ncclResult_t dyn_tuner_init_v6(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logfn, dyn_nvl_domain_info_v5_t* nvl,
                                      dyn_tuner_constants_v5_t* constants) {
  (void)nvl;
  (void)constants;
  return dyn_tuner_init_common(context, commId, nRanks, nNodes, logfn, 6);
}

/* v7 (NCCL 2.32.6): v6's callbacks; the constants have five compute-capability rows. They are left
 * exactly as NCCL set them, as for v5/v6: DynamICCL's choices come from measured tables, not NCCL's
 * cost model, and a fork's different constants layout is therefore never read (abi_guard.h). */
static ncclResult_t dyn_tuner_init_v7(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logfn, dyn_nvl_domain_info_v5_t* nvl,
                                      dyn_tuner_constants_v7_t* constants) {
  (void)nvl;
  (void)constants;
  return dyn_tuner_init_common(context, commId, nRanks, nNodes, logfn, 7);
}

DYN_EXPORT dyn_tuner_v2_t ncclTunerPlugin_v2 = {DYN_NAME, dyn_tuner_init_v2, dyn_get_coll_info_v2,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v3_t ncclTunerPlugin_v3 = {DYN_NAME, dyn_tuner_init_v3, dyn_get_coll_info_v3,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v4_t ncclTunerPlugin_v4 = {DYN_NAME, dyn_tuner_init_v4, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v5_t ncclTunerPlugin_v5 = {DYN_NAME, dyn_tuner_init_v5, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v6_t ncclTunerPlugin_v6 = {DYN_NAME, dyn_tuner_init_v6, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy, dyn_get_chunk_size};
DYN_EXPORT dyn_tuner_v7_t ncclTunerPlugin_v7 = {DYN_NAME, dyn_tuner_init_v7, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy, dyn_get_chunk_size};

DYN_EXPORT dyn_profiler_v4_t ncclProfiler_v4 = {DYN_NAME, dyn_prof_init_v4, dyn_prof_start_v4, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
DYN_EXPORT dyn_profiler_v5_t ncclProfiler_v5 = {DYN_NAME, dyn_prof_init_v5, dyn_prof_start_v5, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
DYN_EXPORT dyn_profiler_v5_t ncclProfiler_v6 = {DYN_NAME, dyn_prof_init_v6, dyn_prof_start_v5, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
DYN_EXPORT dyn_profiler_v7_t ncclProfiler_v7 = {DYN_NAME, dyn_prof_init_v7, dyn_prof_start_v7, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
