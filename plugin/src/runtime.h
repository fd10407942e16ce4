/*
 * runtime.h -- the epoch-boundary step of the agreement protocol, validated private table
 * copies, the communicator registry and the profiler ring (process state and the file's
 * mapping: mapping.h).  Nothing here runs on the per-call hot path except dyn_ring_push.
 */
#ifndef DYN_RUNTIME_H
#define DYN_RUNTIME_H

#include "mapping.h"

/* A consistent (entry, sequence word) pair of slot s (the sidecar stores WRITING before it
 * changes a slot's sequence word, so two equal entry loads around it bracket one state). */
static void dyn_read_slot(uint32_t s, uint64_t* w, uint64_t* q) {
  dyn_shm_ctrl_t* ctrl = dyn_ctrl();
  for (;;) {
    uint64_t w1 = atomic_load((_Atomic uint64_t*)&ctrl->entries[s]);
    uint64_t q1 = atomic_load((_Atomic uint64_t*)&ctrl->seqs[s]);
    if (atomic_load((_Atomic uint64_t*)&ctrl->entries[s]) == w1) {
      *w = w1;
      *q = q1;
      return;
    }
  }
}

enum { DYN_TABLE_OK = 0, DYN_TABLE_RETRY = 1 };

/* The validated private copy of the committed epoch (uint32_t)q in slot s (*out NULL: unusable,
 * NCCL's own choice for it).  DYN_TABLE_RETRY when the slot changed while it was copied (the
 * sidecar rewrites a slot only between epochs: the caller waits and reads the slot again). */
static int dyn_get_table(uint32_t s, uint64_t q, const dyn_table_t** out) {
  uint32_t seq = (uint32_t)q;
  *out = NULL;
  if (s == 0 || s >= DYN_MAX_EPOCHS) return DYN_TABLE_OK;
  uint64_t st = atomic_load(&g_dyn.table_state[s]);
  if ((st >> 8) == seq && (st & 0xFF)) {
    if ((st & 0xFF) == 1) *out = &g_dyn.tables[s];
    return DYN_TABLE_OK;
  }
  int ret = DYN_TABLE_OK;
  pthread_mutex_lock(&g_dyn.mu);
  st = atomic_load(&g_dyn.table_state[s]);
  if ((st >> 8) != seq || !(st & 0xFF)) {
    const uint8_t* src = g_dyn.base + DYN_TABLES_OFF + (size_t)s * DYN_TABLE_SLOT_SIZE;
    uint32_t state = atomic_load((const _Atomic uint32_t*)src);
    memcpy(&g_dyn.scratch, src, DYN_TABLE_BYTES);
    int rc = state == DYN_TABLE_READY ? dyn_table_validate(&g_dyn.scratch, seq) : -1;
    uint64_t w, q2;
    dyn_read_slot(s, &w, &q2);
    if (q2 != q || dyn_entry_status(w) != DYN_EPOCH_COMMITTED) {
      ret = DYN_TABLE_RETRY; /* rewritten meanwhile: the copy may be torn, keep nothing */
    } else {
      /* the old copy is of an epoch no communicator of this pod uses any more (it was retired) */
      if (rc == 0) memcpy(&g_dyn.tables[s], &g_dyn.scratch, DYN_TABLE_BYTES);
      else dyn_log(DYN_LOG_BAD_TABLE, NCCL_LOG_WARN, "table of epoch %u is unusable (reason %d); NCCL's own choice for it", seq, rc);
      st = ((uint64_t)seq << 8) | (rc == 0 ? 1u : 2u);
      atomic_store(&g_dyn.table_state[s], st);
    }
  }
  pthread_mutex_unlock(&g_dyn.mu);
  if (ret == DYN_TABLE_OK && (st & 0xFF) == 1) *out = &g_dyn.tables[s];
  return ret;
}

/* Publish "some communicator of this process reached boundary i" (seq_cst max). */
static void dyn_publish_boundary(uint64_t i) {
  _Atomic uint64_t* mb = (_Atomic uint64_t*)&g_dyn.slot->max_boundary;
  uint64_t cur = atomic_load(mb);
  while (cur < i && !atomic_compare_exchange_weak(mb, &cur, i)) {
  }
}

static void dyn_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* How a rank waits for the sidecar: the outcome of a pending epoch, or a slot being rewritten
 * (fuzzers replace it by a simulated sidecar that resolves slot s; m: the epoch awaited). */
#ifndef DYN_PENDING_WAIT
#define DYN_PENDING_WAIT(s, m, us) ((void)(s), (void)(m), dyn_sleep_us(us))
#endif

/* Per-communicator epoch state.  Epochs are numbered 1, 2, ... for the whole job; epoch n lives
 * in slot dyn_slot_of(n) until a later epoch takes the slot, which the sidecar lets happen only
 * once no communicator of its pod uses or needs n (the needs words, docs/plugin.md). */
typedef struct {
  uint64_t lmask;     /* boundary test mask: L-1 once mapped, probe interval-1 before */
  uint32_t next_e;    /* next epoch to examine */
  uint32_t cur_e;     /* epoch in effect (0 = NCCL default) */
  const dyn_table_t* cur_tab; /* its validated copy (NULL: NCCL's choice) */
  uint64_t last_k;    /* boundary of the last epoch adopted */
  int dead;           /* malformed history seen: stays at cur_e for good */
  int scanned;        /* 1 after the first scan */
  int need_idx;       /* this communicator's needs word: >= 0, -1 counted in need_overflow, -2 none yet */
  uint32_t need_pub;  /* the value last published there */
  uint64_t first_i;   /* call index of the first scan (> 0: the file was mapped late) */
} dyn_epoch_state_t;

/* Publish (seq_cst) the oldest epoch this communicator uses or still needs: before it reads a
 * slot, so a sidecar about to reuse that epoch's slot either sees it or is seen (Dekker). */
static void dyn_publish_need(dyn_epoch_state_t* es) {
  uint32_t v = es->cur_e ? es->cur_e : es->next_e;
  dyn_proc_hdr_t* p = g_dyn.slot;
  if (es->need_idx == -2) {
    es->need_idx = -1;
    for (int k = 0; k < DYN_MAX_NEEDS && es->need_idx < 0; k++) {
      uint32_t zero = 0;
      if (atomic_compare_exchange_strong((_Atomic uint32_t*)&p->needs[k], &zero, v)) es->need_idx = k;
    }
    if (es->need_idx < 0) atomic_fetch_add((_Atomic uint32_t*)&p->need_overflow, 1);
    es->need_pub = v;
  }
  if (es->need_idx >= 0 && es->need_pub != v) {
    atomic_store((_Atomic uint32_t*)&p->needs[es->need_idx], v);
    es->need_pub = v;
  }
}

/* A communicator goes away: its needs word is free again. */
static void dyn_release_need(dyn_epoch_state_t* es) {
  if (!atomic_load(&g_dyn.mapped) || es->need_idx == -2) return;
  dyn_proc_hdr_t* p = g_dyn.slot;
  if (es->need_idx >= 0) atomic_store((_Atomic uint32_t*)&p->needs[es->need_idx], 0);
  else atomic_fetch_sub((_Atomic uint32_t*)&p->need_overflow, 1);
  es->need_idx = -2;
}

static void dyn_wait(uint32_t s, uint32_t m, uint64_t i, long* backoff) {
  dyn_log(DYN_LOG_WAIT, NCCL_LOG_INFO, "call %llu waits for the outcome of epoch %u", (unsigned long long)i, m);
  DYN_PENDING_WAIT(s, m, *backoff);
  if (*backoff < 2000) *backoff *= 2;
}

/* The boundary step, run by a communicator at every call index i with (i & lmask) == 0:
 *  1. publish i (seq_cst) -- "increment then check";
 *  2. read the epochs in order; each one with K <= i is resolved before going on: PENDING (or a
 *     slot being rewritten) -> wait for the sidecar (never time out here), COMMITTED -> its table
 *     is in effect from K on, ABORTED -> stop here (the epoch number is proposed again, later);
 *     an epoch whose slot already holds a later committed epoch was retired: skipped.
 * Returns the epoch in effect; its table in es->cur_tab. */
static uint32_t dyn_boundary(dyn_epoch_state_t* es, uint64_t i) {
  if (!atomic_load(&g_dyn.mapped)) {
    dyn_try_map();
    if (!atomic_load(&g_dyn.mapped)) return es->cur_e;
  }
  es->lmask = g_dyn.interval - 1;
  if (es->dead) return es->cur_e;
  dyn_publish_boundary(i);
  if (!es->scanned) {
    es->scanned = 1;
    es->first_i = i;
  }
  uint64_t L = g_dyn.interval;
  long backoff = 20;
  for (;;) {
    uint32_t m = es->next_e, s = dyn_slot_of(m);
    dyn_publish_need(es);
    uint64_t w, q;
    dyn_read_slot(s, &w, &q);
    uint32_t st = dyn_entry_status(w), sq = (uint32_t)q;
    uint64_t k = dyn_entry_boundary(w);
    if (st == DYN_EPOCH_WRITING || (sq > m && st != DYN_EPOCH_COMMITTED)) {
      dyn_wait(s, m, i, &backoff); /* a slot in transition: a reuse not decided yet */
      continue;
    }
    if (sq > m) { /* retired: every epoch up to sq - DYN_SLOTS left the slots */
      uint32_t next = sq - (DYN_SLOTS - 1);
      es->next_e = next > m ? next : m + 1;
      continue;
    }
    if (sq < m || st == DYN_EPOCH_NONE) break;
    if (st > DYN_EPOCH_WRITING || k < L || (k & (L - 1)) || k <= es->last_k) {
      dyn_log(DYN_LOG_BAD_ENTRY, NCCL_LOG_WARN, "malformed epoch entry %u; staying on epoch %u", m, es->cur_e);
      es->dead = 1;
      break;
    }
    if (k > i || st == DYN_EPOCH_ABORTED) break;
    if (st == DYN_EPOCH_PENDING) {
      dyn_wait(s, m, i, &backoff);
      continue;
    }
    const dyn_table_t* t;
    if (dyn_get_table(s, q, &t) == DYN_TABLE_RETRY) {
      dyn_wait(s, m, i, &backoff);
      continue;
    }
    if (k <= es->first_i && es->first_i > 0)
      dyn_log(DYN_LOG_LATE, NCCL_LOG_WARN,
              "shared memory seen first at call %llu, after epoch %u began at call %llu: earlier decisions "
              "of this process may differ from other ranks' (start the sidecar before training)",
              (unsigned long long)es->first_i, m, (unsigned long long)k);
    es->cur_e = m;
    es->cur_tab = t;
    es->last_k = k;
    es->next_e = m + 1;
  }
  dyn_publish_need(es);
  return es->cur_e;
}

/* ---------- communicator registry (multi-producer, read by the sidecar) ---------- */
/* Record a communicator's shape once per file.  Returns 1 when it is registered (or cannot be,
 * the registry being full: no point retrying), 0 when the file is not mapped yet. */
static int dyn_register_comm(uint64_t comm_id, uint64_t nranks, uint64_t nnodes) {
  if (!atomic_load(&g_dyn.mapped)) return 0;
  uint64_t shape = (nranks & 0xFFFFFFFFu) | ((nnodes & 0xFFFFFFFFu) << 32);
  dyn_comm_entry_t* comms = dyn_ctrl()->comms;
  for (int i = 0; i < DYN_MAX_COMMS; i++) {
    _Atomic uint64_t* st = (_Atomic uint64_t*)&comms[i].state;
    uint64_t s = atomic_load(st);
    if (s == DYN_COMM_FREE) {
      if (atomic_compare_exchange_strong(st, &s, DYN_COMM_WRITING)) {
        comms[i].comm_id = comm_id;
        comms[i].shape = shape;
        atomic_store(st, DYN_COMM_READY);
        return 1;
      }
    }
    if (s == DYN_COMM_READY && comms[i].comm_id == comm_id && comms[i].shape == shape) return 1;
  }
  dyn_log(DYN_LOG_COMMS_FULL, NCCL_LOG_INFO, "communicator registry full; the sidecar cannot attribute some records");
  return 1;
}

/* ---------- profiler ring (multi-producer, single consumer: the sidecar) ---------- */
static int dyn_ring_push(const dyn_record_t* r) {
  if (!atomic_load_explicit(&g_dyn.mapped, memory_order_acquire)) return 0;
  dyn_proc_hdr_t* p = g_dyn.slot;
  _Atomic uint64_t* head = (_Atomic uint64_t*)&p->head;
  _Atomic uint64_t* tail = (_Atomic uint64_t*)&p->tail;
  uint64_t h = atomic_load_explicit(head, memory_order_relaxed);
  for (;;) {
    uint64_t t = atomic_load_explicit(tail, memory_order_acquire);
    if (h - t >= DYN_RING_CAP) {
      atomic_fetch_add_explicit((_Atomic uint64_t*)&p->dropped, 1, memory_order_relaxed);
      return 0;
    }
    if (atomic_compare_exchange_weak_explicit(head, &h, h + 1, memory_order_acq_rel, memory_order_relaxed)) break;
  }
  dyn_record_t* slot = (dyn_record_t*)((uint8_t*)p + DYN_PROC_HDR_SIZE + (h & (DYN_RING_CAP - 1)) * DYN_RECORD_SIZE);
  /* body first, then the sequence word with release: the reader accepts seq == h + 1 only */
  memcpy((uint8_t*)slot + 8, (const uint8_t*)r + 8, DYN_RECORD_SIZE - 8);
  atomic_store_explicit((_Atomic uint64_t*)&slot->seq, h + 1, memory_order_release);
  return 1;
}

#endif
