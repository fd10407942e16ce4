/*
 * profiler.h -- DynamICCL's NCCL profiler (ABI v4..v7): Coll + KernelCh events (v7: + KernelPhase),
 * one record per completed collective pushed into the process's ring.  Part of plugin.c's unity
 * build.  NCCL loads profiler ABI v4+ only from 2.27 on; older NCCL measures nothing (see tuner init).
 * v7 adds to the record the user's per-call tag, the symmetric-kernel flag and the longest channel
 * time of each kernel phase (only symmetric kernels report phases); abi_guard.h says what is checked
 * before a v7 descriptor is read.
 */
#ifndef DYN_PROFILER_H
#define DYN_PROFILER_H

#include "runtime.h"
#include "abi_guard.h"

#define DYN_PROF_EVENTS 128 /* in-flight collectives per communicator (~400 KB per context) */
#define DYN_PROF_CH 64
#define DYN_ENV_KERNEL_PHASES "DYNAMICCL_KERNEL_PHASES" /* "1": profiler v7 asks for KernelPhase events */

static int dyn_env_on(const char* name) {
  const char* v = getenv(name);
  return v && v[0] == '1' && v[1] == 0;
}
#define DYN_KIND_COLL 0xC011u
#define DYN_KIND_CH 0xC4A7u
#define DYN_KIND_PHASE 0xF4A5u

struct dyn_prof_ev;
struct dyn_prof_ch;
/* v7: the open KernelPhase of a channel (NCCL starts, stops and ends a phase before the next one) */
typedef struct {
  uint32_t kind;
  uint32_t id;
  uint64_t start;
  struct dyn_prof_ch* ch;
} dyn_prof_phase_t;

typedef struct dyn_prof_ch {
  uint32_t kind;
  uint32_t open; /* between the KernelCh start and its stop: phases are accepted */
  uint64_t start;
  struct dyn_prof_ev* ev;
  dyn_prof_phase_t phase;
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
  uint64_t user_tag;                 /* v7 */
  uint64_t phase_max[DYN_N_PHASES];  /* v7: longest channel time of each kernel phase */
  uint32_t n_phases;                 /* v7: KernelPhase stops seen */
  uint8_t flags;                     /* DYN_REC_* */
  struct dyn_prof_ctx* ctx; /* the owning communicator */
  dyn_prof_ch_t ch[DYN_PROF_CH];
} dyn_prof_ev_t;

typedef struct dyn_prof_ctx {
  uint64_t comm_id;
  uint64_t nranks, nnodes;
  _Atomic int registered; /* shape recorded in the file's communicator registry */
  _Atomic int bad_layout; /* v7: a descriptor did not match NVIDIA's layout: read none (abi_guard.h) */
  uint32_t next;
  dyn_prof_ev_t ev[DYN_PROF_EVENTS];
} dyn_prof_ctx_t;

static ncclResult_t dyn_prof_init_common(void** context, uint64_t comm_id, int* mask, int nnodes, int nranks,
                                         ncclDebugLogger_t logfn, int abi) {
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
      c->ev[i].ch[k].phase.kind = DYN_KIND_PHASE;
      c->ev[i].ch[k].phase.ch = &c->ev[i].ch[k];
    }
  }
  /* only the events DynamICCL reads (docs/benchmarks.md: the cost of each). Kernel phases (v7) cost
   * 9 callbacks per channel of a symmetric kernel, over the 1 % budget at 128 KiB: opt-in. */
  int phases = abi >= 7 && dyn_env_on(DYN_ENV_KERNEL_PHASES);
  if (mask) *mask = DYN_PROFILE_COLL | DYN_PROFILE_KERNEL_CH | (phases ? DYN_PROFILE_KERNEL_PHASE : 0);
  dyn_try_map();
  dyn_note_abi(DYN_ABI_PROFILER, abi); /* NCCL >= 2.27 inits the profiler before the tuner of a comm */
  return ncclSuccess;
}

static ncclResult_t dyn_prof_init_v4(void** context, int* mask, const char* commName, uint64_t commHash, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  return dyn_prof_init_common(context, commHash, mask, nNodes, nranks, logfn, 4);
}

static ncclResult_t dyn_prof_init_v5(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  return dyn_prof_init_common(context, commId, mask, nNodes, nranks, logfn, 5);
}

static ncclResult_t dyn_prof_init_v6(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  return dyn_prof_init_common(context, commId, mask, nNodes, nranks, logfn, 6);
}

static ncclResult_t dyn_prof_init_v7(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                                     int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)rank;
  if (dyn_fork_loaded()) { /* abi_guard.h 1.: a fork's "v7" layout: measure nothing */
    dyn_set_logger(logfn);
    dyn_log(DYN_LOG_PROF_FORK, NCCL_LOG_WARN,
            "profiler ABI v7 loaded by a NCCL fork (%s*) whose v7 layout differs from NCCL's; "
            "no collective is measured, NCCL's own choice and the table stand", DYN_FORK_LIB_PREFIX);
    *context = NULL;
    if (mask) *mask = 0;
    return ncclSuccess;
  }
  return dyn_prof_init_common(context, commId, mask, nNodes, nranks, logfn, 7);
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
  r.user_tag = ev->user_tag;
  for (int k = 0; k < DYN_N_PHASES; k++) r.phase_ns[k] = ev->phase_max[k];
  r.n_phases = ev->n_phases;
  r.flags = ev->flags;
  memset(r.pad, 0, sizeof r.pad);
  /* the communicator's shape is in the registry before its first record is in a ring */
  dyn_prof_ctx_t* c = ev->ctx;
  if (!atomic_load_explicit(&c->registered, memory_order_relaxed) && dyn_register_comm(c->comm_id, c->nranks, c->nnodes))
    atomic_store_explicit(&c->registered, 1, memory_order_relaxed);
  dyn_ring_push(&r);
}

static dyn_prof_ev_t* dyn_prof_start_coll(dyn_prof_ctx_t* c, void** eHandle, const dyn_prof_coll_v4_t* coll) {
  if (coll->nChannels == 0) return NULL; /* no KernelCh events will come: nothing to measure */
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
    ev->user_tag = 0;
    memset(ev->phase_max, 0, sizeof ev->phase_max);
    ev->n_phases = 0;
    ev->flags = 0;
    *eHandle = ev;
    return ev;
  }
  dyn_log(DYN_LOG_PROF_FULL, NCCL_LOG_INFO, "too many collectives in flight; some profiler records are skipped");
  return NULL;
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
  ch->open = 1;
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

/* v7: a KernelPhase of an open channel of ours (its parent is the KernelCh handle we returned) */
static void dyn_prof_start_phase(void** eHandle, void* parent, const dyn_prof_kernel_phase_t* kp) {
  dyn_prof_ch_t* ch = (dyn_prof_ch_t*)parent;
  if (!ch || ch->kind != DYN_KIND_CH || !ch->open || kp->phaseId >= DYN_N_PHASES) return;
  ch->phase.id = kp->phaseId;
  ch->phase.start = kp->pTimer;
  *eHandle = &ch->phase;
}

static ncclResult_t dyn_prof_start_v7(void* context, void** eHandle, dyn_prof_descr_v7_t* d) {
  *eHandle = NULL;
  dyn_prof_ctx_t* c = (dyn_prof_ctx_t*)context;
  if (!c || !d) return ncclSuccess;
  if (d->type == DYN_PROFILE_COLL) {
    /* after a foreign layout no new collective is read; the ones read before it complete (their
     * channels and phases below are ours, checked by kind), so their events return to the pool */
    if (atomic_load_explicit(&c->bad_layout, memory_order_relaxed)) return ncclSuccess;
    if (!dyn_coll_v7_ok(&d->coll)) { /* abi_guard.h 2.: checked before userTag is read */
      atomic_store_explicit(&c->bad_layout, 1, memory_order_relaxed);
      dyn_log(DYN_LOG_PROF_LAYOUT, NCCL_LOG_WARN,
              "profiler v7 collective descriptor does not match NCCL's v7 layout; this communicator is "
              "not measured");
      return ncclSuccess;
    }
    dyn_prof_ev_t* ev = dyn_prof_start_coll(c, eHandle, (const dyn_prof_coll_v4_t*)&d->coll);
    if (ev) {
      ev->user_tag = d->coll.userTag;
      ev->flags = (uint8_t)(DYN_REC_V7 | (d->coll.kernelVariant ? DYN_REC_SYMMETRIC : 0u));
    }
  } else if (d->type == DYN_PROFILE_KERNEL_CH) {
    dyn_prof_start_ch(eHandle, d->parentObj, &d->kernelCh);
  } else if (d->type == DYN_PROFILE_KERNEL_PHASE) {
    dyn_prof_start_phase(eHandle, d->parentObj, &d->kernelPhase);
  }
  return ncclSuccess;
}

static void dyn_prof_phase_stop(dyn_prof_phase_t* ph, uint64_t stop) {
  dyn_prof_ch_t* ch = ph->ch;
  if (!ch->open) return;
  dyn_prof_ev_t* ev = ch->ev;
  uint64_t dur = stop > ph->start ? stop - ph->start : 0;
  if (dur > ev->phase_max[ph->id]) ev->phase_max[ph->id] = dur;
  ev->n_phases++;
}

static ncclResult_t dyn_prof_record(void* eHandle, dyn_profiler_event_state_t st, dyn_prof_state_args_t* a) {
  if (!eHandle || !a) return ncclSuccess;
  uint32_t kind = *(uint32_t*)eHandle;
  if (kind == DYN_KIND_PHASE && st == DYN_PROFILER_KERNEL_PHASE_STOP) {
    dyn_prof_phase_stop((dyn_prof_phase_t*)eHandle, a->kernelCh.pTimer);
    return ncclSuccess;
  }
  if (kind != DYN_KIND_CH || st != DYN_PROFILER_KERNEL_CH_STOP) return ncclSuccess;
  dyn_prof_ch_t* ch = (dyn_prof_ch_t*)eHandle;
  dyn_prof_ev_t* ev = ch->ev;
  uint64_t stop = a->kernelCh.pTimer;
  if (stop > ev->stop_max) ev->stop_max = stop;
  if (stop > ch->start && stop - ch->start > ev->exec_max) ev->exec_max = stop - ch->start;
  return ncclSuccess;
}

static ncclResult_t dyn_prof_stop(void* eHandle) {
  if (!eHandle) return ncclSuccess;
  uint32_t kind = *(uint32_t*)eHandle;
  if (kind != DYN_KIND_CH) return ncclSuccess; /* Coll stop = enqueued, not complete; a phase: nothing */
  dyn_prof_ch_t* ch = (dyn_prof_ch_t*)eHandle;
  ch->open = 0; /* no phase after the channel's stop */
  dyn_prof_ev_t* ev = ch->ev;
  uint32_t done = atomic_fetch_add_explicit(&ev->n_done, 1, memory_order_relaxed) + 1;
  if (done == ev->expect) dyn_prof_release(ev); /* the last announced channel: complete */
  dyn_prof_release(ev);
  return ncclSuccess;
}

static ncclResult_t dyn_prof_finalize(void* context) {
  free(context);
  return ncclSuccess;
}

#endif
