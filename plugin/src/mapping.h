/*
 * mapping.h -- per-process state and start-up: logging through NCCL's logger (once per
 * reason), mapping the shared-memory file, claiming a process slot (with its lease) and noting
 * which ABI versions NCCL loaded.  Nothing here runs on the per-call hot path.
 */
#ifndef DYN_MAPPING_H
#define DYN_MAPPING_H

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

#endif /* DYN_MAPPING_H */
