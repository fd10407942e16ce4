/*
 * test_plugin.c -- named table of C test cases for the plugin internals (unity build: the
 * plugin source is included, so static functions are reachable) plus a dlopen smoke test of
 * the built .so given as argv[1].  Prints "N passed, N failed".
 */
#include "../src/plugin.c"
#include <dlfcn.h>
#include <sys/wait.h>
#include <math.h>

static int g_fail;
#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      g_fail = 1;                                                         \
    }                                                                     \
  } while (0)

static char g_path[256];

static void make_shm(uint64_t interval) {
  snprintf(g_path, sizeof g_path, "/tmp/dyn-ctest-%d.shm", (int)getpid());
  int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, DYN_FILE_SIZE) != 0) abort();
  dyn_shm_header_t h = {0};
  h.magic = DYN_SHM_MAGIC;
  h.layout_version = DYN_SHM_LAYOUT_VERSION;
  h.header_size = DYN_HEADER_SIZE;
  h.file_size = DYN_FILE_SIZE;
  h.epoch_interval = interval;
  h.ctrl_off = DYN_CTRL_OFF;
  h.tables_off = DYN_TABLES_OFF;
  h.table_slot_size = DYN_TABLE_SLOT_SIZE;
  h.n_table_slots = DYN_MAX_EPOCHS;
  h.procs_off = DYN_PROCS_OFF;
  h.proc_slot_size = DYN_PROC_SLOT_SIZE;
  h.n_proc_slots = DYN_MAX_PROCS;
  h.ring_cap = DYN_RING_CAP;
  h.record_size = DYN_RECORD_SIZE;
  h.crc = dyn_crc32(&h, 80);
  h.ready = 1;
  if (pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) abort();
  close(fd);
  setenv(DYN_ENV_SHM_PATH, g_path, 1);
}

static void fill_table(dyn_table_t* t, uint32_t epoch, int scale, uint8_t nch) {
  memset(t, 0, sizeof *t);
  t->state = DYN_TABLE_READY;
  t->magic = DYN_TABLE_MAGIC;
  t->format = DYN_TABLE_FORMAT;
  t->epoch = epoch;
  t->n_scales = 1;
  t->half_life_log2 = 255;
  memset(t->scale_ids, DYN_NO_SCALE, sizeof t->scale_ids);
  t->scale_ids[0] = (uint8_t)scale;
  for (int f = 0; f < DYN_N_FUNCS; f++)
    for (int b = 0; b < DYN_N_BUCKETS; b++) {
      dyn_cell_t* c = &t->cells[0][f][b];
      c->n_choices = 2;
      c->choices[0] = (dyn_choice_t){DYN_ALGO_NVLS, DYN_PROTO_SIMPLE, nch, 0};
      c->choices[1] = (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, nch, 17};
    }
  t->crc = dyn_crc32((uint8_t*)t + 8, DYN_TABLE_BYTES - 8);
}

static void put_table(uint32_t e, const dyn_table_t* t) {
  memcpy(g_dyn.base + DYN_TABLES_OFF + (size_t)dyn_slot_of(e) * DYN_TABLE_SLOT_SIZE, t, sizeof *t);
}
/* Epoch e in its slot, as the sidecar writes it: WRITING, sequence word, entry. */
static void set_entry(uint32_t e, uint32_t status, uint64_t k) {
  uint32_t s = dyn_slot_of(e);
  _Atomic uint64_t* q = (_Atomic uint64_t*)&dyn_ctrl()->seqs[s];
  if ((uint32_t)atomic_load(q) != e) {
    atomic_store((_Atomic uint64_t*)&dyn_ctrl()->entries[s], DYN_EPOCH_WRITING);
    atomic_store(q, ((atomic_load(q) >> 32) + 1) << 32 | e);
  }
  atomic_store((_Atomic uint64_t*)&dyn_ctrl()->entries[s], (k << 8) | status);
}

static void ring_cost(float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS]) {
  for (int a = 0; a < DYN_NUM_ALGOS; a++)
    for (int p = 0; p < DYN_NUM_PROTOS; p++) cost[a][p] = (a == DYN_ALGO_RING || a == DYN_ALGO_TREE) ? 10.0f : -1.0f;
}

#include "cases_tuner.h"
#include "cases_v7.h"
#include "cases_runtime.h"

/* ------------------------------------------------------------------ cases */
static void t_size_bucket(void) {
  CHECK(dyn_size_bucket(0) == 0);
  CHECK(dyn_size_bucket(1) == 0);
  CHECK(dyn_size_bucket(2) == 1);
  CHECK(dyn_size_bucket(1023) == 9);
  CHECK(dyn_size_bucket(1024) == 10);
  CHECK(dyn_size_bucket((1ULL << 40) + 1) == 40);
  CHECK(dyn_size_bucket(UINT64_MAX) == 40);
}

static void t_scale_class(void) {
  CHECK(dyn_scale_class(1, 1) == 0);
  CHECK(dyn_scale_class(8, 1) == 3);
  CHECK(dyn_scale_class(16, 2) == 8 + 3);
  CHECK(dyn_scale_class(2, 2) == 8);
  CHECK(dyn_scale_class(0, 0) == 0);
  CHECK(dyn_scale_class(3, 8) == 3 * 8);
  CHECK(dyn_scale_class(72, 1) == 7);                     /* an NVL72 domain: its own ranks-per-node class */
  CHECK(dyn_scale_class(1024, 128) == 7 * 8 + 3);         /* 128 nodes x 8 */
  CHECK(dyn_scale_class(8192, 1024) == 10 * 8 + 3);       /* 1 024 nodes: no longer the 128-node class */
  CHECK(dyn_scale_class(96000, 12000) == 14 * 8 + 3);     /* 12 000 nodes */
  CHECK(dyn_scale_class(16384, 16384) == 14 * 8);         /* 2^14 nodes is the last exact node class */
  CHECK(dyn_scale_class(16385, 16385) == 15 * 8);         /* more than 2^14 nodes share class 15 */
  CHECK(dyn_scale_class(UINT64_MAX, UINT64_MAX) == 15 * 8);
  CHECK(dyn_scale_class(UINT64_MAX, 1) == 7);
  CHECK(dyn_scale_class(UINT64_MAX, UINT64_MAX) < DYN_N_SCALE_CLASSES && DYN_N_SCALE_CLASSES < DYN_NO_SCALE);
}

static void t_eps_decay(void) {
  CHECK(dyn_eps_at(40000, 255, 1u << 30) == 40000);
  CHECK(dyn_eps_at(40000, 4, 15) == 40000);
  CHECK(dyn_eps_at(40000, 4, 16) == 20000);
  CHECK(dyn_eps_at(40000, 0, 16) == 0);
}

static void t_force_respects_ignore(void) {
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  ring_cost(cost);
  cost[DYN_ALGO_RING][DYN_PROTO_LL] = NAN;
  int nch = 0;
  dyn_choice_t nvls = {DYN_ALGO_NVLS, DYN_PROTO_SIMPLE, 9, 0}, nan = {DYN_ALGO_RING, DYN_PROTO_LL, 9, 0};
  dyn_choice_t ok = {DYN_ALGO_RING, DYN_PROTO_SIMPLE, 7, 0}, out = {DYN_ALGO_PAT, DYN_PROTO_SIMPLE, 1, 0};
  CHECK(!dyn_force(&nvls, &cost[0][0], DYN_NUM_ALGOS, DYN_NUM_PROTOS, &nch) && cost[4][2] == -1.0f && nch == 0);
  CHECK(!dyn_force(&nan, &cost[0][0], DYN_NUM_ALGOS, DYN_NUM_PROTOS, &nch) && nch == 0);
  CHECK(!dyn_force(&out, &cost[0][0], 6, DYN_NUM_PROTOS, &nch)); /* numAlgo 6: PAT out of range */
  CHECK(dyn_force(&ok, &cost[0][0], DYN_NUM_ALGOS, DYN_NUM_PROTOS, &nch) && cost[1][2] == 0.0f && nch == 7);
}

static void t_table_validate(void) {
  static dyn_table_t t;
  fill_table(&t, 3, 7, 5);
  CHECK(dyn_table_validate(&t, 3) == 0);
  CHECK(dyn_table_validate(&t, 4) == -3);
  t.cells[0][1][2].choices[0].proto = 3;
  CHECK(dyn_table_validate(&t, 3) == -11); /* structure before the checksum */
  t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  CHECK(dyn_table_validate(&t, 3) == -11);
  fill_table(&t, 3, 7, 5);
  t.scale_ids[1] = 7;
  t.n_scales = 2;
  t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  CHECK(dyn_table_validate(&t, 3) == -8);
  fill_table(&t, 3, 7, 5);
  t.flags ^= 1; /* covered by the checksum only */
  CHECK(dyn_table_validate(&t, 3) == -6);
  fill_table(&t, 3, DYN_N_SCALE_CLASSES - 1, 5); /* the highest scale class is valid */
  CHECK(dyn_table_validate(&t, 3) == 0);
  fill_table(&t, 3, DYN_N_SCALE_CLASSES, 5);
  CHECK(dyn_table_validate(&t, 3) == -7);
  fill_table(&t, 3, 7, 5);
  t.format = 2; /* written by a sidecar of the 32-class encoding: refused, NCCL's own choice */
  t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  CHECK(dyn_table_validate(&t, 3) == -2);
}

static void t_string_decoding(void) {
  CHECK(dyn_func_id("AllReduce") == 4 && dyn_func_id("AllGather") == 2 && dyn_func_id("Broadcast") == 0);
  CHECK(dyn_func_id("Reduce") == 1 && dyn_func_id("ReduceScatter") == 3 && dyn_func_id("Recv") == 255);
  CHECK(dyn_func_id("") == 255 && dyn_func_id(NULL) == 255);
  CHECK(dyn_algo_id("RING") == 1 && dyn_algo_id("COLLNET_CHAIN") == 3 && dyn_algo_id("NVLS_TREE") == 5);
  CHECK(dyn_algo_id("PAT") == 6 && dyn_algo_id("X") == 255);
  CHECK(dyn_proto_id("LL") == 0 && dyn_proto_id("LL128") == 1 && dyn_proto_id("SIMPLE") == 2 && dyn_proto_id("L") == 255);
  CHECK(dyn_dtype_size("ncclFloat32") == 4 && dyn_dtype_size("ncclBfloat16") == 2 && dyn_dtype_size("ncclUint8") == 1);
  CHECK(dyn_dtype_size("ncclFloat8e4m3") == 1 && dyn_dtype_size("ncclInt64") == 8 && dyn_dtype_size("x") == 0);
}

static const char* g_so;
static void t_profiler_v7_fork(void) { t_profiler_v7_under_a_fork(g_so); }
static void t_dlopen_smoke(void) {
  if (!g_so) return;
  unsetenv(DYN_ENV_SHM_PATH);
  void* lib = dlopen(g_so, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL);
  if (!lib) return;
  const char* names[] = {"ncclTunerPlugin_v2", "ncclTunerPlugin_v3", "ncclTunerPlugin_v4", "ncclTunerPlugin_v5",
                         "ncclTunerPlugin_v6", "ncclTunerPlugin_v7", "ncclProfiler_v4", "ncclProfiler_v5",
                         "ncclProfiler_v6",    "ncclProfiler_v7"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    const char* const* s = (const char* const*)dlsym(lib, names[i]);
    CHECK(s && strcmp(*s, "dynamiccl") == 0);
  }
  CHECK(dlsym(lib, "dyn_decide") == NULL && dlsym(lib, "g_dyn") == NULL);
  dyn_tuner_v6_t* t6 = (dyn_tuner_v6_t*)dlsym(lib, "ncclTunerPlugin_v6");
  void* ctx = NULL;
  CHECK(t6->init(&ctx, 1, 8, 1, NULL, NULL, NULL) == ncclSuccess);
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  ring_cost(cost);
  int nch = 0;
  CHECK(t6->getCollInfo(ctx, 4, 1 << 20, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch) == ncclSuccess);
  CHECK(nch == 0 && cost[1][2] == 10.0f);
  size_t chunk = 12345;
  CHECK(t6->getChunkSize(ctx, 4, 1 << 20, 1, 2, 4, &chunk) == ncclSuccess && chunk == 12345);
  CHECK(t6->finalize(ctx) == ncclSuccess);
  dlclose(lib);
}

static const struct {
  const char* name;
  void (*fn)(void);
} TESTS[] = {
    {"no_profiler_is_reported", t_no_profiler_is_reported}, /* first: before any profiler init */
    {"size_bucket", t_size_bucket},
    {"scale_class", t_scale_class},
    {"eps_decay", t_eps_decay},
    {"force_respects_ignore", t_force_respects_ignore},
    {"v2_mirrors_nccl_2_21", t_v2_mirrors_nccl_2_21},
    {"v2_never_forces_invalid_nvls", t_v2_never_forces_invalid_nvls},
    {"chunk_in_nccl_order", t_chunk_in_nccl_order},
    {"chunk_ambiguity_is_nccls", t_chunk_ambiguity_is_nccls},
    {"table_validate", t_table_validate},
    {"large_scales_own_cells", t_large_scales_own_cells},
    {"string_decoding", t_string_decoding},
    {"epochs_through_the_tuner", t_epochs_through_the_tuner},
    {"slot_lease", t_slot_lease},
    {"recycled_slots", t_recycled_slots},
    {"tuner_v7_in_nccl_order", t_tuner_v7_in_nccl_order},
    {"profiler_v7_in_nccl_order", t_profiler_v7_in_nccl_order},
    {"profiler_v7_foreign_layout", t_profiler_v7_foreign_layout},
    {"profiler_v7_fork", t_profiler_v7_fork},
    {"profiler_ring", t_profiler_ring},
    {"dlopen_smoke", t_dlopen_smoke},
};

int main(int argc, char** argv) {
  g_so = argc > 1 ? argv[1] : NULL;
  int passed = 0, failed = 0;
  for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++) {
    g_fail = 0;
    TESTS[i].fn();
    printf("%-28s %s\n", TESTS[i].name, g_fail ? "FAIL" : "ok");
    if (g_fail) failed++;
    else passed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
