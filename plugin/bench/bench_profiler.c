/*
 * bench_profiler.c -- what DynamICCL's profiler adds to one collective call, v6 path against v7
 * path, on the real .so, driven by benchmarks/profiler_overhead.py.
 *   bench_profiler SO NCH MODE N   MODE: base | v6 | v7 | v7sym
 * One call is what NCCL does for a collective of NCH channels with the events DynamICCL subscribes
 * to: Coll start and stop, per channel KernelCh start, KernelChStop state and stop (v6, v7); v7sym
 * adds, per channel, the three KernelPhase events (start, KernelPhaseStop state, stop) that NCCL
 * sends for symmetric kernels.  base runs the same loop (descriptors filled the same way) through
 * empty functions: the harness's own cost, subtracted by the driver.
 * Prints one JSON line: ns per call (fastest and median of 15 repetitions) and, where perf_event_open is
 * permitted, user-space instructions per call counted by the CPU (else null and the errno).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "../include/dyn_nccl_abi.h"
#include "../include/dyn_shm.h"
#include "../src/core.h"
#include "bench_util.h"

typedef ncclResult_t (*start_fn)(void*, void**, void*);
typedef ncclResult_t (*stop_fn)(void*);
typedef ncclResult_t (*record_fn)(void*, dyn_profiler_event_state_t, dyn_prof_state_args_t*);
static start_fn volatile g_start;
static stop_fn volatile g_stop;
static record_fn volatile g_record;
static void* g_ctx;
static int g_nch, g_phases, g_mode_v7;

static int g_dummy_handle = 0xC4A7;
__attribute__((noinline)) static ncclResult_t empty_start(void* c, void** h, void* d) {
  (void)c, (void)d;
  __asm__ volatile("" ::: "memory");
  *h = &g_dummy_handle;
  return ncclSuccess;
}
__attribute__((noinline)) static ncclResult_t empty_stop(void* h) {
  (void)h;
  __asm__ volatile("" ::: "memory");
  return ncclSuccess;
}
__attribute__((noinline)) static ncclResult_t empty_record(void* h, dyn_profiler_event_state_t s, dyn_prof_state_args_t* a) {
  (void)h, (void)s, (void)a;
  __asm__ volatile("" ::: "memory");
  return ncclSuccess;
}

/* one collective as NCCL's host and profiler thread call it (v6 and v7 descriptors share the
 * prefix the v6 path reads; a v7 descriptor is passed to both so the loops are identical) */
__attribute__((noinline)) static uint64_t one_call(uint64_t i) {
  dyn_prof_descr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = DYN_PROFILE_COLL;
  d.coll.func = "AllReduce";
  d.coll.count = 32768; /* 128 KiB of float32 */
  d.coll.datatype = "ncclFloat32";
  d.coll.algo = g_phases ? "LL_R" : "RING";
  d.coll.proto = g_phases ? "" : "LL";
  d.coll.nChannels = (uint8_t)g_nch;
  d.coll.seqNumber = i;
  d.coll.kernelVariant = g_phases ? "AGxLL_R" : NULL;
  d.coll.isSymColl = g_phases != 0;
  d.coll.userTag = g_mode_v7 ? 7 : 0;
  void* h = NULL;
  g_start(g_ctx, &h, &d);
  g_stop(h);
  void* kh[64];
  for (int c = 0; c < g_nch; c++) {
    dyn_prof_descr_v7_t k;
    memset(&k, 0, sizeof k);
    k.type = DYN_PROFILE_KERNEL_CH;
    k.parentObj = h;
    k.kernelCh.channelId = (uint8_t)c;
    k.kernelCh.pTimer = 1000 + i;
    kh[c] = NULL;
    g_start(g_ctx, &kh[c], &k);
  }
  for (int c = 0; c < g_nch; c++) {
    uint64_t t = 1000 + i;
    for (int p = 0; p < 3 * g_phases; p++) {
      dyn_prof_descr_v7_t pd;
      memset(&pd, 0, sizeof pd);
      pd.type = DYN_PROFILE_KERNEL_PHASE;
      pd.parentObj = kh[c];
      pd.kernelPhase.channelId = (uint8_t)c;
      pd.kernelPhase.phaseId = (uint8_t)p;
      pd.kernelPhase.phaseName = "compute";
      pd.kernelPhase.pTimer = t;
      void* ph = NULL;
      g_start(g_ctx, &ph, &pd);
      t += 1000;
      dyn_prof_state_args_t a;
      a.kernelCh.pTimer = t;
      g_record(ph, DYN_PROFILER_KERNEL_PHASE_STOP, &a);
      g_stop(ph);
    }
    dyn_prof_state_args_t a;
    a.kernelCh.pTimer = t + 500;
    g_record(kh[c], DYN_PROFILER_KERNEL_CH_STOP, &a);
    g_stop(kh[c]);
  }
  return h != NULL;
}

__attribute__((noinline)) static uint64_t loop(long n, uint64_t i0) {
  uint64_t acc = 0;
  for (long i = 0; i < n; i++) {
    if ((i & 511) == 0) drain_ring();
    acc += one_call(i0 + (uint64_t)i);
  }
  return acc;
}

static void setup(const char* so, const char* mode) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dyn-bench-prof-%d.shm", (int)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, DYN_FILE_SIZE) != 0) abort();
  g_map = mmap(NULL, DYN_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  dyn_shm_header_t h = {DYN_SHM_MAGIC, DYN_SHM_LAYOUT_VERSION, DYN_HEADER_SIZE, DYN_FILE_SIZE, 4096, DYN_CTRL_OFF,
                        DYN_TABLES_OFF, DYN_TABLE_SLOT_SIZE, DYN_MAX_EPOCHS, DYN_PROCS_OFF, DYN_PROC_SLOT_SIZE,
                        DYN_MAX_PROCS, DYN_RING_CAP, DYN_RECORD_SIZE, 0, 1};
  h.crc = dyn_crc32(&h, 80);
  memcpy(g_map, &h, sizeof h);
  setenv("DYNAMICCL_SHM_PATH", path, 1);
  g_phases = !strcmp(mode, "v7sym");
  if (g_phases) setenv("DYNAMICCL_KERNEL_PHASES", "1", 1); /* the opt-in */
  g_mode_v7 = !strncmp(mode, "v7", 2);
  if (!strcmp(mode, "base")) {
    g_start = empty_start, g_stop = empty_stop, g_record = empty_record;
    unlink(path);
    return;
  }
  void* lib = dlopen(so, RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", so, dlerror());
    exit(2);
  }
  dyn_profiler_v7_t* p = (dyn_profiler_v7_t*)dlsym(lib, g_mode_v7 ? "ncclProfiler_v7" : "ncclProfiler_v6");
  int mask = 0;
  p->init(&g_ctx, 7, &mask, "bench", 1, 8, 0, NULL);
  g_start = (start_fn)p->startEvent, g_stop = p->stopEvent, g_record = p->recordEventState;
  printf("{\"mask\": %d, ", mask);
  unlink(path);
}

/* user-space instructions retired over n calls, or -errno if the kernel does not allow counting */
static double instructions_per_call(long n) {
  struct perf_event_attr pe;
  memset(&pe, 0, sizeof pe);
  pe.type = PERF_TYPE_HARDWARE;
  pe.size = sizeof pe;
  pe.config = PERF_COUNT_HW_INSTRUCTIONS;
  pe.disabled = 1;
  pe.exclude_kernel = 1;
  pe.exclude_hv = 1;
  int fd = (int)syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0);
  if (fd < 0) return -(double)errno;
  ioctl(fd, PERF_EVENT_IOC_RESET, 0);
  ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
  loop(n, 1u << 30);
  ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
  long long count = 0;
  ssize_t got = read(fd, &count, sizeof count);
  close(fd);
  return got == (ssize_t)sizeof count ? (double)count / (double)n : -(double)EIO;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s SO NCH base|v6|v7|v7sym N\n", argv[0]);
    return 2;
  }
  g_nch = atoi(argv[2]);
  if (g_nch < 1 || g_nch > 64) return 2;
  long n = atol(argv[4]);
  setup(argv[1], argv[3]);
  if (!strcmp(argv[3], "base")) printf("{\"mask\": 0, ");
  loop(n, 0); /* warm up */
  double v[15];
  for (int r = 0; r < 15; r++) {
    double t0 = now_ns();
    loop(n, (uint64_t)(r + 1) * (uint64_t)n);
    v[r] = (now_ns() - t0) / (double)n;
  }
  qsort(v, 15, sizeof(double), cmp_d);
  double ins = instructions_per_call(n);
  int events = 2 + 3 * g_nch + (g_phases ? 9 * g_nch : 0);
  if (ins >= 0)
    printf("\"ns_per_call\": %.2f, \"median_ns_per_call\": %.2f, \"instructions_per_call\": %.1f, "
           "\"events_per_call\": %d}\n", v[0], v[7], ins, events);
  else
    printf("\"ns_per_call\": %.2f, \"median_ns_per_call\": %.2f, \"instructions_per_call\": null, "
           "\"perf_errno\": %d, \"events_per_call\": %d}\n", v[0], v[7], (int)-ins, events);
  return 0;
}
