/*
 * cases_v7.h -- tuner v7 and profiler v7 in NCCL's call order (included by test_plugin.c after the
 * tuner cases, which map the shared-memory file).  NCCL 2.32.6 calls the tuner v7 as v6 (init with
 * the v7 constants, getCollInfo per task, getChunkSize, finalize); NCCL 2.31.2's profiler v7 starts a
 * Coll (with the call's userTag), then per channel a KernelCh, that channel's KernelPhase events
 * (start, KernelPhaseStop state, stop), the KernelCh stop state and its stop (src/plugin/profiler.cc).
 */
#include <sys/wait.h>

static void t_tuner_v7_in_nccl_order(void) {
  dyn_tuner_constants_v7_t k;
  for (size_t i = 0; i < sizeof k / sizeof(double); i++) ((double*)&k)[i] = 1.5 + (double)i;
  dyn_tuner_constants_v7_t before = k;
  dyn_nvl_domain_info_v5_t nvl = {1, 8, 8};
  void* ctx = NULL;
  CHECK(ncclTunerPlugin_v7.init(&ctx, 77, 8, 1, NULL, &nvl, &k) == ncclSuccess && ctx);
  CHECK(memcmp(&k, &before, sizeof k) == 0); /* NCCL's constants, all five compcap rows, untouched */
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  ring_cost(cost);
  int nch = 0;
  CHECK(ncclTunerPlugin_v7.getCollInfo(ctx, 4, 1 << 20, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch) ==
        ncclSuccess);
  size_t chunk = 4096;
  CHECK(ncclTunerPlugin_v7.getChunkSize(ctx, 4, 1 << 16, DYN_ALGO_RING, DYN_PROTO_SIMPLE, 1, &chunk) == ncclSuccess);
  CHECK(((dyn_tuner_ctx_t*)ctx)->want_chunk == 1);
  CHECK(atomic_load(&g_dyn.abi[DYN_ABI_TUNER]) == 7);
  CHECK(ncclTunerPlugin_v7.finalize(ctx) == ncclSuccess);
}

static dyn_prof_descr_v7_t v7_coll(uint64_t tag, const char* variant) {
  dyn_prof_descr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = DYN_PROFILE_COLL;
  d.coll.func = "AllReduce";
  d.coll.count = 32768;
  d.coll.datatype = "ncclFloat32";
  d.coll.algo = variant ? "LL_R" : "RING";
  d.coll.proto = variant ? "" : "LL128";
  d.coll.nChannels = 2;
  d.coll.seqNumber = 9;
  d.coll.kernelVariant = variant;
  d.coll.isSymColl = variant != NULL;
  d.coll.userTag = tag;
  return d;
}

/* one channel: KernelCh start, its three phases (durations ph[]), KernelCh stop at t0 + total */
static void v7_channel(void* ctx, void* coll, uint8_t id, uint64_t t0, const uint64_t ph[3]) {
  dyn_prof_descr_v7_t kd;
  memset(&kd, 0, sizeof kd);
  kd.type = DYN_PROFILE_KERNEL_CH;
  kd.parentObj = coll;
  kd.kernelCh.channelId = id;
  kd.kernelCh.pTimer = t0;
  void* kh = NULL;
  ncclProfiler_v7.startEvent(ctx, &kh, &kd);
  CHECK(kh != NULL);
  uint64_t t = t0;
  for (uint8_t i = 0; i < DYN_KERNEL_PHASES; i++) {
    dyn_prof_descr_v7_t pd;
    memset(&pd, 0, sizeof pd);
    pd.type = DYN_PROFILE_KERNEL_PHASE;
    pd.parentObj = kh;
    pd.kernelPhase.channelId = id;
    pd.kernelPhase.phaseId = i;
    pd.kernelPhase.phaseName = "phase";
    pd.kernelPhase.pTimer = t;
    void* ph_h = NULL;
    ncclProfiler_v7.startEvent(ctx, &ph_h, &pd);
    CHECK(ph_h != NULL);
    t += ph[i];
    dyn_prof_state_args_t a = {0};
    a.kernelCh.pTimer = t;
    ncclProfiler_v7.recordEventState(ph_h, DYN_PROFILER_KERNEL_PHASE_STOP, &a);
    ncclProfiler_v7.stopEvent(ph_h);
  }
  dyn_prof_state_args_t a = {0};
  a.kernelCh.pTimer = t;
  ncclProfiler_v7.recordEventState(kh, DYN_PROFILER_KERNEL_CH_STOP, &a);
  ncclProfiler_v7.stopEvent(kh);
}

static dyn_record_t* ring_at(uint64_t pos) {
  return (dyn_record_t*)((uint8_t*)g_dyn.slot + DYN_PROC_HDR_SIZE + (pos & (DYN_RING_CAP - 1)) * DYN_RECORD_SIZE);
}

static void t_profiler_v7_in_nccl_order(void) {
  void* ctx = NULL;
  int mask = 0;
  CHECK(ncclProfiler_v7.init(&ctx, 123, &mask, "c", 1, 8, 0, NULL) == ncclSuccess && ctx);
  CHECK(mask == (DYN_PROFILE_COLL | DYN_PROFILE_KERNEL_CH)); /* phases: opt-in */
  ncclProfiler_v7.finalize(ctx);
  setenv(DYN_ENV_KERNEL_PHASES, "1", 1);
  CHECK(ncclProfiler_v7.init(&ctx, 123, &mask, "c", 1, 8, 0, NULL) == ncclSuccess && ctx);
  unsetenv(DYN_ENV_KERNEL_PHASES);
  CHECK(mask == (DYN_PROFILE_COLL | DYN_PROFILE_KERNEL_CH | DYN_PROFILE_KERNEL_PHASE));
  CHECK(atomic_load(&g_dyn.abi[DYN_ABI_PROFILER]) == 7);
  dyn_proc_hdr_t* p = g_dyn.slot;
  uint64_t head0 = p->head;
  /* a tagged symmetric all-reduce with phases on both channels */
  dyn_prof_descr_v7_t d = v7_coll(0xC0FFEEull, "AGxLL_R");
  void* h = NULL;
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  CHECK(h != NULL);
  ncclProfiler_v7.stopEvent(h); /* enqueued */
  const uint64_t a[3] = {100, 900, 50}, b[3] = {300, 700, 20};
  v7_channel(ctx, h, 0, 10000, a);
  CHECK(p->head == head0); /* one channel of two: not complete */
  v7_channel(ctx, h, 1, 10010, b);
  CHECK(p->head == head0 + 1);
  dyn_record_t* r = ring_at(head0);
  CHECK(r->comm_id == 123 && r->coll == 4 && r->nbytes == 32768 * 4 && r->n_kernel_ch == 2);
  CHECK(r->user_tag == 0xC0FFEEull && r->flags == (DYN_REC_V7 | DYN_REC_SYMMETRIC));
  CHECK(r->phase_ns[0] == 300 && r->phase_ns[1] == 900 && r->phase_ns[2] == 50 && r->n_phases == 6);
  CHECK(r->exec_ns == 1050 && r->algo == 255); /* a symmetric variant's algo is not one of NCCL_ALGO_* */
  /* an untagged classic kernel: no phases, tag 0, not symmetric */
  d = v7_coll(0, NULL);
  h = NULL;
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  ncclProfiler_v7.stopEvent(h);
  for (uint8_t c = 0; c < 2; c++) {
    dyn_prof_descr_v7_t kd;
    memset(&kd, 0, sizeof kd);
    kd.type = DYN_PROFILE_KERNEL_CH;
    kd.parentObj = h;
    kd.kernelCh.channelId = c;
    kd.kernelCh.pTimer = 5000;
    void* kh = NULL;
    ncclProfiler_v7.startEvent(ctx, &kh, &kd);
    dyn_prof_state_args_t st = {0};
    st.kernelCh.pTimer = 5400;
    ncclProfiler_v7.recordEventState(kh, DYN_PROFILER_KERNEL_CH_STOP, &st);
    ncclProfiler_v7.stopEvent(kh);
  }
  CHECK(p->head == head0 + 2);
  r = ring_at(head0 + 1);
  CHECK(r->user_tag == 0 && r->flags == DYN_REC_V7 && r->n_phases == 0 && r->phase_ns[1] == 0);
  CHECK(r->algo == DYN_ALGO_RING && r->proto == DYN_PROTO_LL128 && r->exec_ns == 400);
  /* a phase whose channel already stopped is not ours any more: ignored */
  void* stray = NULL;
  dyn_prof_descr_v7_t pd;
  memset(&pd, 0, sizeof pd);
  pd.type = DYN_PROFILE_KERNEL_PHASE;
  pd.parentObj = &((dyn_prof_ctx_t*)ctx)->ev[0].ch[0];
  ncclProfiler_v7.startEvent(ctx, &stray, &pd);
  CHECK(stray == NULL);
  ncclProfiler_v7.finalize(ctx);
}

/* abi_guard.h 2.: a descriptor whose fields before userTag break NCCL's v7 rules stops the reading */
static void t_profiler_v7_foreign_layout(void) {
  void* ctx = NULL;
  int mask = 0;
  CHECK(ncclProfiler_v7.init(&ctx, 124, &mask, "c", 1, 8, 0, NULL) == ncclSuccess && ctx);
  uint64_t head0 = g_dyn.slot->head;
  dyn_prof_descr_v7_t d = v7_coll(5, NULL);
  void* before = NULL; /* read before the foreign descriptor: its kernels are still to come */
  ncclProfiler_v7.startEvent(ctx, &before, &d);
  CHECK(before != NULL);
  ncclProfiler_v7.stopEvent(before); /* enqueued */
  d.coll.kernelVariant = "AGxLL_R"; /* a variant without the symmetric flag */
  void* h = NULL;
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  CHECK(h == NULL);
  d = v7_coll(5, NULL); /* a well-formed one after: the communicator stays unmeasured */
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  CHECK(h == NULL && g_dyn.slot->head == head0);
  /* the collective read before completes: recorded, and its event back in the pool (the fuzzer
   * found it held for good when the guard also ignored its channels) */
  const uint64_t ph[DYN_KERNEL_PHASES] = {10, 20, 30};
  v7_channel(ctx, before, 0, 1000, ph);
  v7_channel(ctx, before, 1, 1000, ph);
  CHECK(g_dyn.slot->head == head0 + 1 && ring_at(head0)->user_tag == 5);
  CHECK(atomic_load(&((dyn_prof_ev_t*)before)->refs) == 0);
  ncclProfiler_v7.finalize(ctx);
  CHECK(ncclProfiler_v7.init(&ctx, 126, &mask, "c", 1, 8, 0, NULL) == ncclSuccess && ctx);
  d = v7_coll(5, "AGxLL_R");
  memset(&d.coll.isSymColl, 7, 1); /* not a bool */
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  CHECK(h == NULL);
  ncclProfiler_v7.finalize(ctx);
  /* another communicator is judged on its own descriptors */
  CHECK(ncclProfiler_v7.init(&ctx, 125, &mask, "c", 1, 8, 0, NULL) == ncclSuccess && ctx);
  d = v7_coll(5, NULL);
  ncclProfiler_v7.startEvent(ctx, &h, &d);
  CHECK(h != NULL);
  ncclProfiler_v7.stopEvent(h);
  ncclProfiler_v7.finalize(ctx);
}

/* abi_guard.h 1.: with a fork's library (a file named librccl*) in the process, v7 measures nothing.
 * Runs in a child process: the stand-in library stays loaded there only. */
static void t_profiler_v7_under_a_fork(const char* so) {
  if (!so) return;
  pid_t pid = fork();
  if (pid == 0) {
    char copy[128];
    snprintf(copy, sizeof copy, "/tmp/librccl-dyntest-%d.so", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", so, copy);
    int ok = system(cmd) == 0;
    void* before_ctx = (void*)1;
    int mask = -1;
    ok = ok && dyn_fork_loaded() == 0;
    void* lib = ok ? dlopen(copy, RTLD_NOW | RTLD_LOCAL) : NULL; /* the stand-in for librccl.so */
    unlink(copy);
    ok = ok && lib && dyn_fork_loaded() == 1;
    ok = ok && ncclProfiler_v7.init(&before_ctx, 1, &mask, "c", 1, 8, 0, NULL) == ncclSuccess;
    ok = ok && before_ctx == NULL && mask == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
