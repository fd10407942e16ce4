/*
 * cases_tuner.h -- C test cases for the tuner as real NCCL drives it: getChunkSize in NCCL's call
 * order (v6), NCCL 2.21's validity rules (v2), and the "no profiler" report.  Included by
 * test_plugin.c (unity build: CHECK, ring_cost and the plugin's statics are in scope).
 */

/* A v6 communicator whose table is `t` (scale 0), independent of any shared-memory file:
 * the epoch scan is switched off so nothing replaces the injected cells. */
static void* v6_comm_with(const dyn_table_t* t) {
  void* ctx = NULL;
  ncclTunerPlugin_v6.init(&ctx, 7, 8, 1, NULL, NULL, NULL);
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)ctx;
  c->es.dead = 1;
  c->half_life_log2 = 255;
  c->cells = &t->cells[0][0][0];
  return ctx;
}

static void set_cell(dyn_table_t* t, int coll, uint64_t nbytes, dyn_choice_t ch) {
  dyn_cell_t* cell = &t->cells[0][coll][dyn_size_bucket(nbytes)];
  cell->n_choices = 1;
  cell->choices[0] = ch;
}

static void gci6(void* ctx, int coll, size_t nbytes) {
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  ring_cost(cost);
  int nch = 0;
  ncclTunerPlugin_v6.getCollInfo(ctx, coll, nbytes, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
}

#define NCCL_CHUNK ((size_t)131072) /* what NCCL computed; left alone unless the table decides */
static size_t chunk6(void* ctx, int coll, size_t nbytes, int algo, int proto, int nch) {
  size_t v = NCCL_CHUNK;
  CHECK(ncclTunerPlugin_v6.getChunkSize(ctx, coll, nbytes, algo, proto, nch, &v) == ncclSuccess);
  return v;
}

/* NCCL >= 2.30: one getCollInfo per aggregated task for the whole group, then getChunkSize per task
 * and channel range with that channel's bytes (nChannels = 1), the whole task for CollNet. */
static void t_chunk_in_nccl_order(void) {
  static dyn_table_t t;
  memset(&t, 0, sizeof t);
  set_cell(&t, 4, 8u << 20, (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, 0, 17});  /* AR 8 MiB */
  set_cell(&t, 2, 1u << 20, (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_SIMPLE, 0, 19}); /* AG 1 MiB */
  set_cell(&t, 4, 64u << 20, (dyn_choice_t){DYN_ALGO_TREE, DYN_PROTO_SIMPLE, 0, 0}); /* AR 64 MiB */
  void* ctx = v6_comm_with(&t);
  gci6(ctx, 4, 8u << 20);  /* group 1: an all-reduce aggregate, */
  gci6(ctx, 2, 1u << 20);  /* an all-gather aggregate (nRanks x count bytes), */
  gci6(ctx, 4, 64u << 20); /* an all-reduce aggregate the table leaves at NCCL's chunk */
  /* the all-reduce task over 16 channels: 512 KiB per channel, asked once per channel range */
  CHECK(chunk6(ctx, 4, 512u << 10, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == (size_t)1 << 17);
  CHECK(chunk6(ctx, 4, 300000, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == (size_t)1 << 17); /* the "lo" range */
  CHECK(chunk6(ctx, 2, 65536, DYN_ALGO_RING, DYN_PROTO_SIMPLE, 1) == (size_t)1 << 19);
  CHECK(chunk6(ctx, 4, 4u << 20, DYN_ALGO_TREE, DYN_PROTO_SIMPLE, 1) == NCCL_CHUNK); /* chunk 0 in the table */
  CHECK(chunk6(ctx, 4, 512u << 10, DYN_ALGO_RING, DYN_PROTO_SIMPLE, 1) == NCCL_CHUNK); /* nobody chose it */
  CHECK(chunk6(ctx, 3, 65536, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == NCCL_CHUNK);        /* other collective */
  /* a slice larger than every aggregate with that triple cannot belong to one of them */
  CHECK(chunk6(ctx, 2, 4u << 20, DYN_ALGO_RING, DYN_PROTO_SIMPLE, 1) == NCCL_CHUNK);
  /* the next getCollInfo starts group 2: group 1's decisions no longer answer */
  gci6(ctx, 2, 1u << 20);
  CHECK(chunk6(ctx, 4, 512u << 10, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == NCCL_CHUNK);
  CHECK(chunk6(ctx, 2, 1u << 20, DYN_ALGO_RING, DYN_PROTO_SIMPLE, 4) == (size_t)1 << 19); /* CollNet-style */
  ncclTunerPlugin_v6.finalize(ctx);
}

/* Two aggregates of one group run the same (algo, proto) with different chunks: a slice only one
 * of them can contain gets that one's chunk; a slice both can contain gets NCCL's. */
static void t_chunk_ambiguity_is_nccls(void) {
  static dyn_table_t t;
  memset(&t, 0, sizeof t);
  set_cell(&t, 4, 1u << 20, (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, 0, 16});
  set_cell(&t, 4, 4u << 20, (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, 0, 18});
  void* ctx = v6_comm_with(&t);
  gci6(ctx, 4, 1u << 20);
  gci6(ctx, 4, 4u << 20);
  CHECK(chunk6(ctx, 4, 2u << 20, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == (size_t)1 << 18);
  CHECK(chunk6(ctx, 4, 256u << 10, DYN_ALGO_RING, DYN_PROTO_LL128, 1) == NCCL_CHUNK);
  /* an aggregate the table has no choice for runs NCCL's pick (the first smallest cost entry: tree/LL
   * in ring_cost) with NCCL's chunk: it makes that triple ambiguous for the slices it may contain */
  static dyn_table_t t2;
  memset(&t2, 0, sizeof t2);
  set_cell(&t2, 4, 1u << 20, (dyn_choice_t){DYN_ALGO_TREE, DYN_PROTO_LL, 0, 15});
  void* ctx2 = v6_comm_with(&t2);
  gci6(ctx2, 4, 1u << 20);
  CHECK(chunk6(ctx2, 4, 65536, DYN_ALGO_TREE, DYN_PROTO_LL, 1) == (size_t)1 << 15);
  gci6(ctx2, 4, 2u << 20); /* group 2: the 1 MiB cell again + a 2 MiB one NCCL decides (tree/LL) */
  gci6(ctx2, 4, 1u << 20);
  CHECK(chunk6(ctx2, 4, 65536, DYN_ALGO_TREE, DYN_PROTO_LL, 1) == NCCL_CHUNK);
  /* a decision without a table (no cost table passed) leaves the whole collective to NCCL */
  int nch = 0;
  ncclTunerPlugin_v6.getCollInfo(ctx2, 4, 1u << 20, 1, NULL, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
  gci6(ctx2, 4, 1u << 20);
  CHECK(chunk6(ctx2, 4, 65536, DYN_ALGO_TREE, DYN_PROTO_LL, 1) == NCCL_CHUNK);
  ncclTunerPlugin_v6.finalize(ctx);
  ncclTunerPlugin_v6.finalize(ctx2);
}

/* 2.21 (the only NCCL that uses our v2) skips its checks when we set algorithm and protocol. */
static void t_v2_mirrors_nccl_2_21(void) {
  float c[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  for (int coll = 0; coll < DYN_NUM_FUNCS; coll++)
    for (int cn = 0; cn <= 1; cn++)
      for (int nv = 0; nv <= 1; nv++)
        for (uint64_t nodes = 1; nodes <= 4; nodes *= 4) {
          dyn_v2_cost_table(coll, cn, nv, nodes, c);
          int ag_rs = coll == 2 || coll == 3, ar = coll == 4, multi = nodes > 1;
          for (int p = 0; p < DYN_NUM_PROTOS; p++) {
            CHECK(c[DYN_ALGO_RING][p] > 0);
            CHECK((c[DYN_ALGO_TREE][p] > 0) == ar);
            CHECK(c[DYN_ALGO_PAT][p] < 0 && c[DYN_ALGO_COLLNET_DIRECT][p] < 0);
            if (p != DYN_PROTO_SIMPLE)
              CHECK(c[DYN_ALGO_NVLS][p] < 0 && c[DYN_ALGO_NVLS_TREE][p] < 0 && c[DYN_ALGO_COLLNET_CHAIN][p] < 0);
          }
          int nvls = nv && (ar || ag_rs) && (!multi || (ar && cn));
          CHECK((c[DYN_ALGO_NVLS][DYN_PROTO_SIMPLE] > 0) == nvls);
          CHECK((c[DYN_ALGO_NVLS_TREE][DYN_PROTO_SIMPLE] > 0) == (nv && ar && multi));
          CHECK((c[DYN_ALGO_COLLNET_CHAIN][DYN_PROTO_SIMPLE] > 0) == (cn && ar));
        }
  /* the cases of issue 18: NVLS on 2+ nodes without CollNet, NVLS all-gather/reduce-scatter on 2+ nodes */
  dyn_v2_cost_table(4, 0, 1, 2, c);
  CHECK(c[DYN_ALGO_NVLS][DYN_PROTO_SIMPLE] < 0);
  dyn_v2_cost_table(2, 1, 1, 4, c);
  CHECK(c[DYN_ALGO_NVLS][DYN_PROTO_SIMPLE] < 0);
  dyn_v2_cost_table(3, 1, 1, 2, c);
  CHECK(c[DYN_ALGO_NVLS][DYN_PROTO_SIMPLE] < 0);
}

/* Through the exported v2 entry point: a table whose first choice is NVLS never hands NVLS to a
 * multi-node 2.21 communicator without CollNet; it falls back to the next choice. */
static void t_v2_never_forces_invalid_nvls(void) {
  static dyn_table_t t;
  memset(&t, 0, sizeof t);
  dyn_cell_t* cell = &t.cells[0][4][20];
  cell->n_choices = 2;
  cell->choices[0] = (dyn_choice_t){DYN_ALGO_NVLS, DYN_PROTO_SIMPLE, 0, 0};
  cell->choices[1] = (dyn_choice_t){DYN_ALGO_RING, DYN_PROTO_LL128, 0, 0};
  t.cells[0][2][20] = *cell;
  void* ctx = NULL;
  ncclTunerPlugin_v2.init(16, 2, NULL, &ctx);
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)ctx;
  c->es.dead = 1;
  c->half_life_log2 = 255;
  c->cells = &t.cells[0][0][0];
  int algo = -1, proto = -1, nch = 0;
  ncclTunerPlugin_v2.getCollInfo(ctx, 4, 1u << 20, 0, 1, 1, &algo, &proto, &nch);
  CHECK(algo == DYN_ALGO_RING && proto == DYN_PROTO_LL128);
  algo = proto = -1;
  ncclTunerPlugin_v2.getCollInfo(ctx, 4, 1u << 20, 1, 1, 1, &algo, &proto, &nch); /* with CollNet: allowed */
  CHECK(algo == DYN_ALGO_NVLS && proto == DYN_PROTO_SIMPLE);
  algo = proto = -1;
  ncclTunerPlugin_v2.getCollInfo(ctx, 2, 1u << 20, 1, 1, 1, &algo, &proto, &nch); /* all-gather, 2 nodes */
  CHECK(algo == DYN_ALGO_RING && proto == DYN_PROTO_LL128);
  ncclTunerPlugin_v2.destroy(ctx);
}

static int g_nlogs;
static char g_logs[8][300];
static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)level, (void)flags, (void)file, (void)line;
  va_list ap;
  va_start(ap, fmt);
  if (g_nlogs < 8) vsnprintf(g_logs[g_nlogs++], sizeof g_logs[0], fmt, ap);
  va_end(ap);
}

/* Run first (before any profiler init of this process): a tuner without our profiler says, once,
 * through NCCL's logger, that nothing is measured and which NCCL it is; the process slot
 * carries the ABI versions for the sidecar. */
static void t_no_profiler_is_reported(void) {
  atomic_store(&g_dyn.log, NULL);
  void* ctx = NULL;
  ncclTunerPlugin_v3.init(8, 1, capture_log, &ctx);
  ncclTunerPlugin_v3.destroy(ctx);
  ncclTunerPlugin_v3.init(8, 1, capture_log, &ctx);
  ncclTunerPlugin_v3.destroy(ctx);
  int n = 0;
  for (int i = 0; i < g_nlogs; i++)
    if (strstr(g_logs[i], "no DynamICCL profiler loaded") && strstr(g_logs[i], "2.22-2.23")) n++;
  CHECK(n == 1);
  CHECK(atomic_load(&g_dyn.abi[DYN_ABI_TUNER]) == 3 && atomic_load(&g_dyn.abi[DYN_ABI_PROFILER]) == 0);
  atomic_store(&g_dyn.log, NULL);
}
