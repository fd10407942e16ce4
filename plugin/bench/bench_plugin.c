/*
 * bench_plugin.c -- cost of the real .so's hot paths, driven by benchmarks/plugin_bench.py.
 *   bench_plugin SO time            median ns per call: baseline, getCollInfo (v6, table active,
 *                                   explore on), getCollInfo passthrough, profiler event
 *   bench_plugin SO base|gci|pass|prof N   run one loop N times (for callgrind --toggle-collect)
 * The baseline loop does everything the getCollInfo loop does (reset the cost table, pick the
 * size) but calls an empty function through a pointer instead of the plugin.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../include/dyn_nccl_abi.h"
#include "../include/dyn_shm.h"
#include "../src/core.h"
#include "bench_util.h"

#define NSIZES 8
static const size_t SIZES[NSIZES] = {256, 4096, 65536, 1 << 20, 3000, 1 << 24, 777, 1 << 16};
static float g_template[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
static float g_cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
static dyn_tuner_v6_t* g_t6;
static dyn_profiler_v5_t* g_p6;
static void* g_ctx;
static void* g_ctx_pass;
static void* g_pctx;
static char g_path[64];

typedef ncclResult_t (*gci_fn)(void*, ncclFunc_t, size_t, int, float**, int, int, int, int*);
__attribute__((noinline)) static ncclResult_t empty_gci(void* c, ncclFunc_t f, size_t n, int np, float** t, int na,
                                                        int npr, int rb, int* ch) {
  (void)c, (void)f, (void)n, (void)np, (void)t, (void)na, (void)npr, (void)rb, (void)ch;
  __asm__ volatile("" ::: "memory");
  return ncclSuccess;
}
static gci_fn volatile g_empty = empty_gci;

__attribute__((noinline)) static uint64_t loop_base(long n) {
  uint64_t acc = 0;
  for (long i = 0; i < n; i++) {
    memcpy(g_cost, g_template, sizeof g_cost);
    int nch = 0;
    g_empty(g_ctx, 4, SIZES[i & (NSIZES - 1)], 1, (float**)g_cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
    acc += (uint64_t)nch;
  }
  return acc;
}

__attribute__((noinline)) static uint64_t loop_gci(long n) {
  uint64_t acc = 0;
  for (long i = 0; i < n; i++) {
    memcpy(g_cost, g_template, sizeof g_cost);
    int nch = 0;
    g_t6->getCollInfo(g_ctx, 4, SIZES[i & (NSIZES - 1)], 1, (float**)g_cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
    acc += (uint64_t)nch;
  }
  return acc;
}

__attribute__((noinline)) static uint64_t loop_pass(long n) {
  uint64_t acc = 0;
  for (long i = 0; i < n; i++) {
    memcpy(g_cost, g_template, sizeof g_cost);
    int nch = 0;
    g_t6->getCollInfo(g_ctx_pass, 4, SIZES[i & (NSIZES - 1)], 1, (float**)g_cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0,
                      &nch);
    acc += (uint64_t)nch;
  }
  return acc;
}

/* one collective = 5 profiler events: coll start, kernelCh start, kernelCh record, kernelCh stop, coll stop */
#define PROF_EVENTS_PER_ITER 5
__attribute__((noinline)) static uint64_t loop_prof(long n) {
  uint64_t acc = 0;
  for (long i = 0; i < n; i++) {
    dyn_prof_descr_v5_t d;
    memset(&d, 0, sizeof d);
    d.type = DYN_PROFILE_COLL;
    d.coll.func = "AllReduce";
    d.coll.count = 1u << 18;
    d.coll.datatype = "ncclFloat32";
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    d.coll.nChannels = 1;
    d.coll.seqNumber = (uint64_t)i;
    void* h = NULL;
    g_p6->startEvent(g_pctx, &h, &d);
    dyn_prof_descr_v5_t k;
    memset(&k, 0, sizeof k);
    k.type = DYN_PROFILE_KERNEL_CH;
    k.parentObj = h;
    k.kernelCh.pTimer = 1000 + (uint64_t)i;
    void* kh = NULL;
    g_p6->startEvent(g_pctx, &kh, &k);
    dyn_prof_state_args_t a;
    a.kernelCh.pTimer = 5000 + (uint64_t)i;
    g_p6->recordEventState(kh, DYN_PROFILER_KERNEL_CH_STOP, &a);
    g_p6->stopEvent(kh);
    g_p6->stopEvent(h);
    acc += (uint64_t)(h != NULL);
  }
  return acc;
}

#include <sys/mman.h>
static void setup(const char* so) {
  snprintf(g_path, sizeof g_path, "/tmp/dyn-bench-%d.shm", (int)getpid());
  int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, DYN_FILE_SIZE) != 0) abort();
  g_map = mmap(NULL, DYN_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  dyn_shm_header_t h = {DYN_SHM_MAGIC, DYN_SHM_LAYOUT_VERSION, DYN_HEADER_SIZE, DYN_FILE_SIZE, 4096, DYN_CTRL_OFF,
                        DYN_TABLES_OFF, DYN_TABLE_SLOT_SIZE, DYN_MAX_EPOCHS, DYN_PROCS_OFF, DYN_PROC_SLOT_SIZE,
                        DYN_MAX_PROCS, DYN_RING_CAP, DYN_RECORD_SIZE, 0, 1};
  h.crc = dyn_crc32(&h, 80);
  memcpy(g_map, &h, sizeof h);
  /* epoch 1 committed at call 4096: every cell has an exploration draw and two ranked choices */
  dyn_table_t* t = (dyn_table_t*)(g_map + DYN_TABLES_OFF + DYN_TABLE_SLOT_SIZE);
  t->magic = DYN_TABLE_MAGIC;
  t->format = DYN_TABLE_FORMAT;
  t->epoch = 1;
  t->n_scales = 1;
  t->seed = 42;
  t->half_life_log2 = 255;
  memset(t->scale_ids, DYN_NO_SCALE, sizeof t->scale_ids);
  t->scale_ids[0] = (uint8_t)dyn_scale_class(64, 8);
  for (int f = 0; f < DYN_N_FUNCS; f++)
    for (int b = 0; b < DYN_N_BUCKETS; b++) {
      dyn_cell_t* c = &t->cells[0][f][b];
      c->n_choices = 2;
      c->choices[0] = (dyn_choice_t){DYN_ALGO_NVLS, DYN_PROTO_SIMPLE, 16, 0};
      c->choices[1] = (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, 8, 0};
      c->n_cands = 2;
      c->eps_q16 = 6554; /* 10% */
      c->cands[0] = (dyn_choice_t){DYN_ALGO_TREE, DYN_PROTO_LL, 4, 0};
      c->cands[1] = (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_SIMPLE, 2, 0};
      c->weights[0] = c->weights[1] = 1;
    }
  t->crc = dyn_crc32((uint8_t*)t + 8, DYN_TABLE_BYTES - 8);
  t->state = DYN_TABLE_READY;
  ((dyn_shm_ctrl_t*)(g_map + DYN_CTRL_OFF))->seqs[1] = 1; /* slot 1 holds epoch 1 */
  ((dyn_shm_ctrl_t*)(g_map + DYN_CTRL_OFF))->entries[1] = (4096ull << 8) | DYN_EPOCH_COMMITTED;
  setenv("DYNAMICCL_SHM_PATH", g_path, 1);
  void* lib = dlopen(so, RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", so, dlerror());
    exit(2);
  }
  g_t6 = (dyn_tuner_v6_t*)dlsym(lib, "ncclTunerPlugin_v6");
  g_p6 = (dyn_profiler_v5_t*)dlsym(lib, "ncclProfiler_v6");
  g_t6->init(&g_ctx, 7, 64, 8, NULL, NULL, NULL);
  g_t6->init(&g_ctx_pass, 8, 3, 3, NULL, NULL, NULL); /* a scale class the table does not carry */
  int mask;
  g_p6->init(&g_pctx, 7, &mask, "bench", 8, 64, 0, NULL);
  for (int a = 0; a < DYN_NUM_ALGOS; a++)
    for (int p = 0; p < DYN_NUM_PROTOS; p++)
      g_template[a][p] = (a == DYN_ALGO_RING || a == DYN_ALGO_TREE || (a == DYN_ALGO_NVLS && p == 2)) ? 10.0f + a + p : -1.0f;
  loop_gci(8192); /* past the boundary at 4096: the table is in effect */
  loop_pass(8192);
  unlink(g_path);
}

static double median_ns(uint64_t (*loop)(long), long n, int reps, int per_iter) {
  double v[64];
  for (int r = 0; r < reps; r++) {
    drain_ring();
    double t0 = now_ns();
    loop(n);
    v[r] = (now_ns() - t0) / ((double)n * per_iter);
  }
  qsort(v, (size_t)reps, sizeof(double), cmp_d);
  return v[reps / 2];
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SO time|base|gci|pass|prof [N]\n", argv[0]);
    return 2;
  }
  uint64_t (*count)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "dyn_bench_alloc_count");
  uint64_t s0 = count ? count() : 0;
  setup(argv[1]); /* dlopen + init: allocates (proves the counter counts) */
  long n = argc > 3 ? atol(argv[3]) : 200000;
  uint64_t a0 = count ? count() : 0;
  if (!strcmp(argv[2], "time")) {
    int reps = 31;
    double base = median_ns(loop_base, n, reps, 1);
    double gci = median_ns(loop_gci, n, reps, 1);
    double pass = median_ns(loop_pass, n, reps, 1);
    double prof = median_ns(loop_prof, n / 4, reps, PROF_EVENTS_PER_ITER);
    uint64_t a1 = count ? count() : 0;
    printf("{\"baseline_ns\": %.2f, \"getcollinfo_ns\": %.2f, \"passthrough_ns\": %.2f, "
           "\"profiler_event_ns\": %.2f, \"hot_path_allocs\": %lld, \"setup_allocs\": %lld}\n",
           base, gci, pass, prof, count ? (long long)(a1 - a0) : -1LL, count ? (long long)(a0 - s0) : -1LL);
    return 0;
  }
  uint64_t r = 0;
  if (!strcmp(argv[2], "base")) r = loop_base(n);
  else if (!strcmp(argv[2], "gci")) r = loop_gci(n);
  else if (!strcmp(argv[2], "pass")) r = loop_pass(n);
  else if (!strcmp(argv[2], "prof")) {
    for (long done = 0; done < n; done += 512) {
      drain_ring();
      r += loop_prof(n - done < 512 ? n - done : 512);
    }
  }
  printf("%llu\n", (unsigned long long)r);
  return 0;
}
