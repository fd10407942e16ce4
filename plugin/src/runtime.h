/*
 * runtime.h -- per-process state: mapping the shared-memory file, claiming a process slot,
 * the epoch-boundary step of the agreement protocol, validated private table copies and the
 * profiler ring.  Nothing here runs on the per-call hot path except dyn_ring_push.
 */
#ifndef DYN_RUNTIME_H
#define DYN_RUNTIME_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core.h"

#define DYN_ENV_SHM_PATH "DYNAMICCL_SHM_PATH"
#define DYN_PROBE_INTERVAL 4096u /* how often an unmapped process retries the file */

/* log-once reasons */
enum {
  DYN_LOG_NO_SHM = 1u << 0,
  DYN_LOG_BAD_SHM = 1u << 1,
  DYN_LOG_NO_SLOT = 1u << 2,
  DYN_LOG_BAD_TABLE = 1u << 3,
  DYN_LOG_BAD_ENTRY = 1u << 4,
  DYN_LOG_USER_ENV = 1u << 5,
  DYN_LOG_MAPPED = 1u << 6,
  DYN_LOG_WAIT = 1u << 7,
  DYN_LOG_NOMEM = 1u << 8,
  DYN_LOG_PROF_FULL = 1u << 9,
  DYN_LOG_LATE = 1u << 11,
  DYN_LOG_COMMS_FULL = 1u << 10,
  DYN_LOG_NO_PROFILER = 1u << 12,
  DYN_LOG_SHM_ACCESS = 1u << 13,
  DYN_LOG_PROF_FORK = 1u << 14,
  DYN_LOG_PROF_LAYOUT = 1u << 15,
};
enum { DYN_ABI_TUNER = 0, DYN_ABI_PROFILER = 1 };

static struct {
  pthread_mutex_t mu;
  _Atomic int mapped;         /* 1 once the file is mapped and our slot claimed */
  uint8_t* base;
  uint64_t interval;          /* L */
  dyn_proc_hdr_t* slot;
  _Atomic(ncclDebugLogger_t) log;
  _Atomic uint32_t logged;
  _Atomic uint8_t abi[2];     /* ABI versions NCCL loaded: [DYN_ABI_TUNER], [DYN_ABI_PROFILER] */
  _Atomic uint64_t table_state[DYN_MAX_EPOCHS]; /* per slot: epoch << 8 | (0 unknown, 1 valid, 2 unusable) */
  dyn_table_t tables[DYN_MAX_EPOCHS];          /* private validated copies, one epoch per slot */
  dyn_table_t scratch;                         /* a copy being validated (under mu) */
} g_dyn = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void dyn_log(uint32_t once_bit, ncclDebugLogLevel lvl, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void dyn_log(uint32_t once_bit, ncclDebugLogLevel lvl, const char* fmt, ...) {
  if (once_bit) {
    uint32_t prev = atomic_fetch_or(&g_dyn.logged, once_bit);
    if (prev & once_bit) return;
  }
  ncclDebugLogger_t fn = atomic_load(&g_dyn.log);
  if (!fn) return;
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fn(lvl, DYN_NCCL_SUBSYS_TUNING, __FILE__, __LINE__, "DynamICCL: %s", buf);
}

static void dyn_set_logger(ncclDebugLogger_t fn) {
  ncclDebugLogger_t expected = NULL;
  if (fn) atomic_compare_exchange_strong(&g_dyn.log, &expected, fn);
}

static inline dyn_shm_ctrl_t* dyn_ctrl(void) { return (dyn_shm_ctrl_t*)(g_dyn.base + DYN_CTRL_OFF); }
static inline dyn_proc_hdr_t* dyn_proc(uint8_t* base, int i) {
  return (dyn_proc_hdr_t*)(base + DYN_PROCS_OFF + (size_t)i * DYN_PROC_SLOT_SIZE);
}

static int dyn_pid_alive(uint64_t pid) {
  if (pid == 0 || pid > (uint64_t)INT32_MAX) return 0;
  return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Open-file-description locks (Linux >= 3.15; the numbers are the kernel's, the same on every
 * architecture; glibc 2.17's headers lack them). */
#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

/* Take process slot i's lease: an OFD write lock on the slot's first byte.  The lock belongs to
 * the open file description the process keeps for its whole life; the kernel drops it when the
 * process is gone, whatever its pid namespace, so the sidecar (another container) can tell a live
 * owner from a dead one (docs/plugin.md, "Process slots").  1: taken (a previous owner is gone),
 * 0: a live process holds it, -1: no OFD locks here. */
static int dyn_lease(int fd, int i, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = (off_t)DYN_PROCS_OFF + (off_t)i * (off_t)DYN_PROC_SLOT_SIZE;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 1;
  return (errno == EAGAIN || errno == EACCES) ? 0 : -1;
}

/* Claim a process slot: a free one first, else one whose owner is gone.  With OFD locks, "gone"
 * is the kernel's word (the lease); without them, the owner pid is probed (same pid namespace
 * only).  A slot taken over starts clean: boundary, ABIs and needs words of the dead owner go. */
static dyn_proc_hdr_t* dyn_claim_slot(uint8_t* base, int fd) {
  uint64_t me = (uint64_t)getpid();
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < DYN_MAX_PROCS; i++) {
      dyn_proc_hdr_t* p = dyn_proc(base, i);
      _Atomic uint64_t* owner = (_Atomic uint64_t*)&p->owner_pid;
      uint64_t cur = atomic_load(owner);
      if (cur == me) return p; /* another copy of the plugin in this process claimed it */
      if (pass == 0 && cur != 0) continue;
      int lease = dyn_lease(fd, i, F_WRLCK);
      if (lease == 0) continue; /* a live owner, or another process claiming it right now */
      if (lease < 0 && pass == 1 && (cur == 0 || dyn_pid_alive(cur))) continue;
      if (!atomic_compare_exchange_strong(owner, &cur, me)) {
        if (lease > 0) dyn_lease(fd, i, F_UNLCK);
        continue;
      }
      atomic_store((_Atomic uint64_t*)&p->max_boundary, 0);
      atomic_store((_Atomic uint8_t*)&p->tuner_abi, 0);
      atomic_store((_Atomic uint8_t*)&p->profiler_abi, 0);
      for (int k = 0; k < DYN_MAX_NEEDS; k++) atomic_store((_Atomic uint32_t*)&p->needs[k], 0);
      atomic_store((_Atomic uint32_t*)&p->need_overflow, 0);
      atomic_store((_Atomic uint8_t*)&p->lease, (uint8_t)(lease > 0));
      atomic_fetch_add((_Atomic uint64_t*)&p->generation, 1);
      return p;
    }
  return NULL;
}

/* Map the file named by DYNAMICCL_SHM_PATH. Never fails loudly: one log line, then passthrough. */
static void dyn_try_map(void) {
  if (atomic_load(&g_dyn.mapped)) return;
  pthread_mutex_lock(&g_dyn.mu);
  if (atomic_load(&g_dyn.mapped)) goto out;
  const char* path = getenv(DYN_ENV_SHM_PATH);
  if (!path || !*path) {
    dyn_log(DYN_LOG_NO_SHM, NCCL_LOG_INFO, "%s not set; NCCL's own tuning stays in effect", DYN_ENV_SHM_PATH);
    goto out;
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) /* the sidecar has not created it yet: normal at start, retried */
      dyn_log(DYN_LOG_NO_SHM, NCCL_LOG_INFO, "shared memory %s not there yet; NCCL's own tuning stays in effect",
              path);
    else /* it exists but this process may not use it (a uid or mode problem): the job runs untuned */
      dyn_log(DYN_LOG_SHM_ACCESS, NCCL_LOG_WARN,
              "cannot open shared memory %s (%s) as uid %d; this process runs untuned (NCCL's own choices)", path,
              strerror(err), (int)geteuid());
    goto out;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < DYN_FILE_SIZE) {
    close(fd);
    dyn_log(DYN_LOG_BAD_SHM, NCCL_LOG_WARN, "shared memory %s too small; NCCL's own tuning stays in effect", path);
    goto out;
  }
  void* m = mmap(NULL, DYN_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    dyn_log(DYN_LOG_BAD_SHM, NCCL_LOG_WARN, "cannot map %s (%s); NCCL's own tuning stays in effect", path,
            strerror(errno));
    goto out;
  }
  const dyn_shm_header_t* h = (const dyn_shm_header_t*)m;
  if (atomic_load((_Atomic uint32_t*)&h->ready) != 1 || dyn_header_validate(h, DYN_FILE_SIZE) != 0) {
    close(fd);
    munmap(m, DYN_FILE_SIZE);
    dyn_log(DYN_LOG_BAD_SHM, NCCL_LOG_WARN, "shared memory %s has an unknown or corrupt header; NCCL's own tuning stays in effect", path);
    goto out;
  }
  dyn_proc_hdr_t* slot = dyn_claim_slot((uint8_t*)m, fd); /* fd stays open: it holds the lease */
  if (!slot) {
    close(fd);
    munmap(m, DYN_FILE_SIZE);
    dyn_log(DYN_LOG_NO_SLOT, NCCL_LOG_WARN, "no free process slot in %s; NCCL's own tuning stays in effect", path);
    goto out;
  }
  g_dyn.base = (uint8_t*)m;
  g_dyn.interval = h->epoch_interval;
  g_dyn.slot = slot;
  atomic_store((_Atomic uint8_t*)&slot->tuner_abi, atomic_load(&g_dyn.abi[DYN_ABI_TUNER]));
  atomic_store((_Atomic uint8_t*)&slot->profiler_abi, atomic_load(&g_dyn.abi[DYN_ABI_PROFILER]));
  atomic_store(&g_dyn.mapped, 1);
  dyn_log(DYN_LOG_MAPPED, NCCL_LOG_INFO, "using %s (epoch interval %llu)", path, (unsigned long long)g_dyn.interval);
out:
  pthread_mutex_unlock(&g_dyn.mu);
}

/* Remember which ABI version NCCL loaded (the newest wins), in the process slot too once mapped, so
 * the sidecar can tell "no profiler, nothing measured" from "nothing ran". */
static void dyn_note_abi(int kind, int version) {
  uint8_t v = (uint8_t)version, cur = atomic_load(&g_dyn.abi[kind]);
  while (cur < v && !atomic_compare_exchange_weak(&g_dyn.abi[kind], &cur, v)) {
  }
  if (!atomic_load(&g_dyn.mapped)) return;
  _Atomic uint8_t* f = kind == DYN_ABI_TUNER ? (_Atomic uint8_t*)&g_dyn.slot->tuner_abi
                                             : (_Atomic uint8_t*)&g_dyn.slot->profiler_abi;
  atomic_store(f, atomic_load(&g_dyn.abi[kind]));
}

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
