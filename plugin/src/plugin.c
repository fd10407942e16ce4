/*
 * plugin.c -- DynamICCL's NCCL tuner (ABI v2..v6) and profiler (ABI v4..v6).
 *
 * Unity build: core.h and runtime.h are included here so every function is static and
 * the only exported symbols are the eight plugin structs (checked by `make test`).
 * Hot path (getCollInfo): two counter increments, one mask test, one table lookup,
 * no allocation, no lock, no system call.  Every entry point returns ncclSuccess.
 */
#include "runtime.h"

#define DYN_EXPORT __attribute__((visibility("default")))
#define DYN_NAME "dynamiccl"

/* ====================================================================== tuner */

typedef struct {
  uint64_t calls;            /* per-communicator call index (all collectives) */
  uint64_t lmask;            /* copy of es.lmask, next to calls */
  const dyn_cell_t* cells;   /* [DYN_N_FUNCS][DYN_N_BUCKETS] of the table in effect, NULL = NCCL's */
  uint32_t half_life_log2;
  int want_last;             /* v6: remember the last decision for getChunkSize */
  /* last decision, for getChunkSize (v6) */
  int last_coll, last_algo, last_proto;
  uint32_t last_chunk_log2;
  uint64_t last_nbytes;
  uint32_t bucket_calls[DYN_N_FUNCS][DYN_N_BUCKETS]; /* per-(collective, size bucket) call counters */
  uint64_t hprefix[DYN_N_FUNCS][DYN_N_BUCKETS];      /* exploration hash prefix per cell */
  dyn_epoch_state_t es;
  uint64_t comm_id;          /* 0 when the ABI version does not provide it (v2..v4) */
  uint64_t nranks, nnodes;
  int scale_class;
  int user_env;              /* NCCL_ALGO / NCCL_PROTO set: never fight it */
  uint32_t table_epoch;
} dyn_tuner_ctx_t;

static int dyn_env_set(const char* name) {
  const char* v = getenv(name);
  return v && *v;
}

static ncclResult_t dyn_tuner_init_common(void** context, uint64_t comm_id, size_t nRanks, size_t nNodes,
                                          ncclDebugLogger_t logfn, int want_last) {
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
  c->last_coll = -1;
  c->want_last = want_last;
  c->user_env = dyn_env_set("NCCL_ALGO") || dyn_env_set("NCCL_PROTO");
  if (c->user_env)
    dyn_log(DYN_LOG_USER_ENV, NCCL_LOG_INFO, "NCCL_ALGO/NCCL_PROTO set by the user; leaving NCCL's choice alone");
  dyn_try_map();
  *context = c;
  return ncclSuccess;
}

static void dyn_adopt(dyn_tuner_ctx_t* c, uint32_t e) {
  c->table_epoch = e;
  const dyn_table_t* t = dyn_get_table(e);
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

/* The hot path shared by every ABI version. cost is float[numAlgo][numProto]. */
static inline __attribute__((always_inline)) void dyn_decide(dyn_tuner_ctx_t* c, int coll, size_t nBytes,
                                                             float* cost, int numAlgo, int numProto,
                                                             int* nChannels) {
  uint64_t i = c->calls++;
  c->last_coll = -1;
  if (__builtin_expect((i & c->lmask) == 0, 0)) dyn_boundary_step(c, i);
  if ((unsigned)coll >= DYN_N_FUNCS) return;
  int b = dyn_size_bucket(nBytes);
  uint64_t j = c->bucket_calls[coll][b]++;
  const dyn_cell_t* cells = c->cells;
  if (!cells || !cost) return;
  const dyn_choice_t* ch = dyn_apply_cell_h(&cells[coll * DYN_N_BUCKETS + b], c->hprefix[coll][b],
                                            c->half_life_log2, j, cost, numAlgo, numProto, nChannels);
  if (ch && c->want_last) {
    c->last_coll = coll;
    c->last_nbytes = nBytes;
    c->last_algo = ch->algo;
    c->last_proto = ch->proto;
    c->last_chunk_log2 = ch->chunk_log2;
  }
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

static ncclResult_t dyn_get_coll_info_v2(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                                         int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                                         int* nChannels) {
  (void)numPipeOps;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (!c) return ncclSuccess;
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  dyn_v2_cost_table(collType, collNetSupport, nvlsSupport, c->nnodes, cost);
  int nch = 0;
  dyn_decide(c, collType, nBytes, &cost[0][0], DYN_NUM_ALGOS, DYN_NUM_PROTOS, &nch);
  if (c->last_coll >= 0) { /* a choice was applied: report both algorithm and protocol */
    if (algorithm) *algorithm = c->last_algo;
    if (protocol) *protocol = c->last_proto;
    if (nch && nChannels) *nChannels = nch;
  }
  return ncclSuccess;
}

static ncclResult_t dyn_get_chunk_size(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                                       int nChannels, size_t* chunkSize) {
  (void)nChannels;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)context;
  if (!c || !chunkSize) return ncclSuccess;
  if (c->last_coll == collType && c->last_nbytes == nBytes && c->last_algo == algo && c->last_proto == proto &&
      c->last_chunk_log2)
    *chunkSize = (size_t)1 << c->last_chunk_log2;
  return ncclSuccess;
}

static ncclResult_t dyn_tuner_destroy(void* context) {
  free(context);
  return ncclSuccess;
}

static ncclResult_t dyn_tuner_init_v2(size_t nRanks, size_t nNodes, ncclDebugLogger_t logfn, void** context) {
  return dyn_tuner_init_common(context, 0, nRanks, nNodes, logfn, 1);
}

static ncclResult_t dyn_tuner_init_v3(size_t nRanks, size_t nNodes, ncclDebugLogger_t logfn, void** context) {
  return dyn_tuner_init_common(context, 0, nRanks, nNodes, logfn, 0);
}

static ncclResult_t dyn_tuner_init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logfn, dyn_nvl_domain_info_v5_t* nvl,
                                      dyn_tuner_constants_v5_t* constants) {
  (void)nvl;
  (void)constants; /* NCCL's constants are left exactly as NCCL set them */
  return dyn_tuner_init_common(context, commId, nRanks, nNodes, logfn, 0);
}

static ncclResult_t dyn_tuner_init_v6(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logfn, dyn_nvl_domain_info_v5_t* nvl,
                                      dyn_tuner_constants_v5_t* constants) {
  (void)nvl;
  (void)constants;
  return dyn_tuner_init_common(context, commId, nRanks, nNodes, logfn, 1);
}

DYN_EXPORT dyn_tuner_v2_t ncclTunerPlugin_v2 = {DYN_NAME, dyn_tuner_init_v2, dyn_get_coll_info_v2,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v3_t ncclTunerPlugin_v3 = {DYN_NAME, dyn_tuner_init_v3, dyn_get_coll_info_v3,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v4_t ncclTunerPlugin_v4 = {DYN_NAME, dyn_tuner_init_v3, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v5_t ncclTunerPlugin_v5 = {DYN_NAME, dyn_tuner_init_v5, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy};
DYN_EXPORT dyn_tuner_v6_t ncclTunerPlugin_v6 = {DYN_NAME, dyn_tuner_init_v6, dyn_get_coll_info_v4,
                                                      dyn_tuner_destroy, dyn_get_chunk_size};

/* =================================================================== profiler */

#define DYN_PROF_EVENTS 128 /* in-flight collectives per communicator (~200 KB per context) */
#define DYN_PROF_CH 64
#define DYN_KIND_COLL 0xC011u
#define DYN_KIND_CH 0xC4A7u

struct dyn_prof_ev;
typedef struct {
  uint32_t kind;
  uint32_t pad;
  uint64_t start;
  struct dyn_prof_ev* ev;
} dyn_prof_ch_t;

/* A collective's profiler state.  NCCL stops the Coll event when the collective is enqueued,
 * before its kernels run; the collective is complete when as many KernelCh events as it
 * announced (coll.nChannels) have stopped.  refs: 1 for "not complete" + 1 per open KernelCh;
 * the record is pushed and the slot freed when refs drops to 0. */
typedef struct dyn_prof_ev {
  uint32_t kind;
  _Atomic uint32_t refs;    /* 0 = free */
  _Atomic uint32_t n_done;  /* KernelCh events stopped */
  uint32_t expect;          /* KernelCh events announced */
  uint64_t comm_id, nbytes, coll_seq;
  uint64_t start_min, stop_max, exec_max;
  uint32_t n_ch;
  uint8_t coll, algo, proto, nch;
  struct dyn_prof_ctx* ctx; /* the owning communicator */
  dyn_prof_ch_t ch[DYN_PROF_CH];
} dyn_prof_ev_t;

typedef struct dyn_prof_ctx {
  uint64_t comm_id;
  uint64_t nranks, nnodes;
  _Atomic int registered; /* shape recorded in the file's communicator registry */
  uint32_t next;
  dyn_prof_ev_t ev[DYN_PROF_EVENTS];
} dyn_prof_ctx_t;

static ncclResult_t dyn_prof_init_common(void** context, uint64_t comm_id, int* mask, int nnodes, int nranks,
                                         ncclDebugLogger_t logfn) {
  dyn_set_logger(logfn);
  dyn_prof_ctx_t* c = (dyn_prof_ctx_t*)calloc(1, sizeof(dyn_prof_ctx_t));
  *context = c;
  if (!c) {
    dyn_log(DYN_LOG_NOMEM, NCCL_LOG_WARN, "out of memory; profiler records disabled");
    return ncclSuccess;
  }
  c->comm_id = comm_id;
  c->nranks = nranks > 0 ? (uint64_t)nranks : 1;
  c->nnodes = nnodes > 0 ? (uint64_t)nnodes : 1;
  for (int i = 0; i < DYN_PROF_EVENTS; i++) {
    c->ev[i].kind = DYN_KIND_COLL;
    c->ev[i].ctx = c;
    for (int k = 0; k < DYN_PROF_CH; k++) {
      c->ev[i].ch[k].kind = DYN_KIND_CH;
      c->ev[i].ch[k].ev = &c->ev[i];
    }
  }
  if (mask) *mask = DYN_PROFILE_COLL | DYN_PROFILE_KERNEL_CH;
  dyn_try_map();
  return ncclSuccess;
}

static ncclResult_t dyn_prof_init_v4(void** context, int* mask, const char* commName, uint64_t commHash, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  return dyn_prof_init_common(context, commHash, mask, nNodes, nranks, logfn);
}

static ncclResult_t dyn_prof_init_v5(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  return dyn_prof_init_common(context, commId, mask, nNodes, nranks, logfn);
}

static void dyn_prof_release(dyn_prof_ev_t* ev) {
  uint32_t cur = atomic_load_explicit(&ev->refs, memory_order_relaxed);
  do {
    if (cur == 0) return; /* a stray stop after completion: ignore */
  } while (!atomic_compare_exchange_weak_explicit(&ev->refs, &cur, cur - 1, memory_order_acq_rel,
                                                  memory_order_relaxed));
  if (cur != 1) return;
  dyn_record_t r;
  r.seq = 0;
  r.comm_id = ev->comm_id;
  r.nbytes = ev->nbytes;
  r.start_ns = ev->n_ch ? ev->start_min : 0;
  r.stop_ns = ev->stop_max;
  r.exec_ns = ev->exec_max;
  r.coll_seq = ev->coll_seq;
  r.coll = ev->coll;
  r.algo = ev->algo;
  r.proto = ev->proto;
  r.nchannels = ev->nch;
  r.n_kernel_ch = ev->n_ch;
  /* the communicator's shape is in the registry before its first record is in a ring */
  dyn_prof_ctx_t* c = ev->ctx;
  if (!atomic_load_explicit(&c->registered, memory_order_relaxed) && dyn_register_comm(c->comm_id, c->nranks, c->nnodes))
    atomic_store_explicit(&c->registered, 1, memory_order_relaxed);
  dyn_ring_push(&r);
}

static void dyn_prof_start_coll(dyn_prof_ctx_t* c, void** eHandle, const dyn_prof_coll_v4_t* coll) {
  if (coll->nChannels == 0) return; /* no KernelCh events will come: nothing to measure */
  for (int tries = 0; tries < 8; tries++) {
    dyn_prof_ev_t* ev = &c->ev[(c->next++) & (DYN_PROF_EVENTS - 1)];
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong_explicit(&ev->refs, &zero, 1, memory_order_acquire, memory_order_relaxed))
      continue;
    ev->comm_id = c->comm_id;
    ev->coll = dyn_func_id(coll->func);
    uint64_t n = (uint64_t)coll->count * dyn_dtype_size(coll->datatype);
    if (ev->coll == 2 || ev->coll == 3) n *= c->nranks; /* tuner convention: the whole gathered buffer */
    ev->nbytes = n;
    ev->coll_seq = coll->seqNumber;
    ev->algo = dyn_algo_id(coll->algo);
    ev->proto = dyn_proto_id(coll->proto);
    ev->nch = coll->nChannels;
    ev->expect = coll->nChannels;
    atomic_store_explicit(&ev->n_done, 0, memory_order_relaxed);
    ev->start_min = UINT64_MAX;
    ev->stop_max = 0;
    ev->exec_max = 0;
    ev->n_ch = 0;
    *eHandle = ev;
    return;
  }
  dyn_log(DYN_LOG_PROF_FULL, NCCL_LOG_INFO, "too many collectives in flight; some profiler records are skipped");
}

static void dyn_prof_start_ch(void** eHandle, void* parent, const dyn_prof_kernel_ch_t* kc) {
  dyn_prof_ev_t* ev = (dyn_prof_ev_t*)parent;
  if (!ev || ev->kind != DYN_KIND_COLL) return;
  uint32_t cur = atomic_load_explicit(&ev->refs, memory_order_relaxed);
  do {
    if (cur == 0) return; /* the collective already completed: a stray channel */
  } while (!atomic_compare_exchange_weak_explicit(&ev->refs, &cur, cur + 1, memory_order_acquire,
                                                  memory_order_relaxed));
  dyn_prof_ch_t* ch = &ev->ch[kc->channelId & (DYN_PROF_CH - 1)];
  ch->start = kc->pTimer;
  if (kc->pTimer < ev->start_min) ev->start_min = kc->pTimer;
  ev->n_ch++;
  *eHandle = ch;
}

static ncclResult_t dyn_prof_start_v4(void* context, void** eHandle, dyn_prof_descr_v4_t* d) {
  *eHandle = NULL;
  dyn_prof_ctx_t* c = (dyn_prof_ctx_t*)context;
  if (!c || !d) return ncclSuccess;
  if (d->type == DYN_PROFILE_COLL) dyn_prof_start_coll(c, eHandle, &d->coll);
  else if (d->type == DYN_PROFILE_KERNEL_CH) dyn_prof_start_ch(eHandle, d->parentObj, &d->kernelCh);
  return ncclSuccess;
}

static ncclResult_t dyn_prof_start_v5(void* context, void** eHandle, dyn_prof_descr_v5_t* d) {
  *eHandle = NULL;
  dyn_prof_ctx_t* c = (dyn_prof_ctx_t*)context;
  if (!c || !d) return ncclSuccess;
  if (d->type == DYN_PROFILE_COLL) dyn_prof_start_coll(c, eHandle, (const dyn_prof_coll_v4_t*)&d->coll);
  else if (d->type == DYN_PROFILE_KERNEL_CH) dyn_prof_start_ch(eHandle, d->parentObj, &d->kernelCh);
  return ncclSuccess;
}

static ncclResult_t dyn_prof_record(void* eHandle, dyn_profiler_event_state_t st, dyn_prof_state_args_t* a) {
  if (!eHandle || st != DYN_PROFILER_KERNEL_CH_STOP || !a) return ncclSuccess;
  dyn_prof_ch_t* ch = (dyn_prof_ch_t*)eHandle;
  if (ch->kind != DYN_KIND_CH) return ncclSuccess;
  dyn_prof_ev_t* ev = ch->ev;
  uint64_t stop = a->kernelCh.pTimer;
  if (stop > ev->stop_max) ev->stop_max = stop;
  if (stop > ch->start && stop - ch->start > ev->exec_max) ev->exec_max = stop - ch->start;
  return ncclSuccess;
}

static ncclResult_t dyn_prof_stop(void* eHandle) {
  if (!eHandle) return ncclSuccess;
  uint32_t kind = *(uint32_t*)eHandle;
  if (kind != DYN_KIND_CH) return ncclSuccess; /* Coll stop = enqueued, not complete */
  dyn_prof_ev_t* ev = ((dyn_prof_ch_t*)eHandle)->ev;
  uint32_t done = atomic_fetch_add_explicit(&ev->n_done, 1, memory_order_relaxed) + 1;
  if (done == ev->expect) dyn_prof_release(ev); /* the last announced channel: complete */
  dyn_prof_release(ev);
  return ncclSuccess;
}

static ncclResult_t dyn_prof_finalize(void* context) {
  free(context);
  return ncclSuccess;
}

DYN_EXPORT dyn_profiler_v4_t ncclProfiler_v4 = {DYN_NAME, dyn_prof_init_v4, dyn_prof_start_v4, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
DYN_EXPORT dyn_profiler_v5_t ncclProfiler_v5 = {DYN_NAME, dyn_prof_init_v5, dyn_prof_start_v5, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
DYN_EXPORT dyn_profiler_v5_t ncclProfiler_v6 = {DYN_NAME, dyn_prof_init_v5, dyn_prof_start_v5, dyn_prof_stop,
                                                      dyn_prof_record, dyn_prof_finalize};
