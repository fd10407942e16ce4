/* libFuzzer target: arbitrary ABI-respecting sequences of profiler callbacks (fuzzed strings,
 * counts, channel ids, timestamps, orders) writing records into a real ring.  As in NCCL, a
 * collective announces nChannels, gets at most that many KernelCh events, and its Coll event is
 * stopped once (at enqueue, before or after its kernels).  After every input all collectives
 * are completed and the event pool must be entirely free again.
 *
 * The first byte of an input picks the profiler ABI: v6, or v7 with its descriptor fields
 * fuzzed too -- userTag, kernelVariant, the isSymColl byte (2..255 included: abi_guard.h must
 * refuse such a layout before reading userTag) -- and KernelPhase sub-events of open channels
 * (any phaseId, started and stopped in any order before their channel stops, as in NCCL).  A
 * v7 communicator that saw a foreign layout reads nothing more; each input starts as a fresh
 * communicator (bad_layout cleared) so that one refused descriptor does not mute the rest. */
#include "../src/plugin.c"

static void* g_ctx6;
static void* g_ctx7;
static char g_file[64];

static void setup(void) {
  snprintf(g_file, sizeof g_file, "/tmp/dyn-fuzz-%d.shm", (int)getpid());
  int fd = open(g_file, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, DYN_FILE_SIZE) != 0) abort();
  dyn_shm_header_t h = {DYN_SHM_MAGIC, DYN_SHM_LAYOUT_VERSION, DYN_HEADER_SIZE, DYN_FILE_SIZE, 64, DYN_CTRL_OFF,
                        DYN_TABLES_OFF, DYN_TABLE_SLOT_SIZE, DYN_MAX_EPOCHS, DYN_PROCS_OFF, DYN_PROC_SLOT_SIZE,
                        DYN_MAX_PROCS, DYN_RING_CAP, DYN_RECORD_SIZE, 0, 1};
  h.crc = dyn_crc32(&h, 80);
  if (pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) abort();
  close(fd);
  setenv(DYN_ENV_SHM_PATH, g_file, 1);
  int mask;
  ncclProfiler_v6.init(&g_ctx6, 7, &mask, "f", 2, 16, 0, NULL);
  ncclProfiler_v7.init(&g_ctx7, 8, &mask, "f7", 2, 16, 0, NULL);
  unlink(g_file);
  if (!g_ctx6 || !g_ctx7) abort();
}

#define SLOTS 8
#define MAXCH 32
static const char* strs[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send",
                             "RING", "TREE", "NVLS_TREE", "PAT", "LL", "LL128", "SIMPLE", "ncclFloat32",
                             "ncclBfloat16", "ncclFloat8e5m2", "", "X"};
enum { NS = sizeof strs / sizeof *strs };

typedef struct {
  void* h;
  int announced, started, open, stopped;
} coll_t;

typedef struct {
  int v7;
  void* ctx;
  coll_t colls[SLOTS];
  void* chans[MAXCH];
  int owner[MAXCH];
  int nch;
  void* phase[MAXCH]; /* v7: the open KernelPhase of chans[k], or NULL */
} run_t;

static ncclResult_t start(run_t* r, void** h, const dyn_prof_descr_v7_t* d7, const dyn_prof_descr_v5_t* d5) {
  return r->v7 ? ncclProfiler_v7.startEvent(r->ctx, h, (dyn_prof_descr_v7_t*)d7)
               : ncclProfiler_v6.startEvent(r->ctx, h, (dyn_prof_descr_v5_t*)d5);
}

static void stop_phase(run_t* r, int k, uint64_t t) {
  if (!r->phase[k]) return;
  dyn_prof_state_args_t a = {0};
  a.kernelCh.pTimer = t;
  ncclProfiler_v7.recordEventState(r->phase[k], DYN_PROFILER_KERNEL_PHASE_STOP, &a);
  ncclProfiler_v7.stopEvent(r->phase[k]);
  r->phase[k] = NULL;
}

static void start_phase(run_t* r, int k, uint8_t id, uint64_t t) {
  if (r->phase[k]) return; /* NCCL runs a channel's phases one after the other */
  dyn_prof_descr_v7_t d = {0};
  d.type = DYN_PROFILE_KERNEL_PHASE;
  d.parentObj = r->chans[k];
  d.kernelPhase.phaseId = (uint8_t)(id % (DYN_KERNEL_PHASES + 1)); /* 3: out of range */
  d.kernelPhase.channelId = id;
  d.kernelPhase.phaseName = strs[id % NS];
  d.kernelPhase.pTimer = t;
  ncclProfiler_v7.startEvent(r->ctx, &r->phase[k], &d);
}

static void stop_channel(run_t* r, int k, uint64_t t) {
  stop_phase(r, k, t);
  dyn_prof_state_args_t a = {0};
  a.kernelCh.pTimer = t;
  ncclProfiler_v6.recordEventState(r->chans[k], DYN_PROFILER_KERNEL_CH_STOP, &a);
  ncclProfiler_v6.stopEvent(r->chans[k]);
  r->colls[r->owner[k]].open--;
  int last = r->nch - 1;
  r->chans[k] = r->chans[last];
  r->owner[k] = r->owner[last];
  r->phase[k] = r->phase[last];
  r->phase[last] = NULL;
  r->nch--;
}

static void start_channel(run_t* r, int s, uint8_t id, uint64_t t) {
  dyn_prof_descr_v5_t d5 = {0};
  dyn_prof_descr_v7_t d7 = {0};
  d5.type = d7.type = DYN_PROFILE_KERNEL_CH;
  d5.parentObj = d7.parentObj = r->colls[s].h;
  d5.kernelCh.channelId = d7.kernelCh.channelId = id;
  d5.kernelCh.pTimer = d7.kernelCh.pTimer = t;
  void* h = NULL;
  start(r, &h, &d7, &d5);
  r->colls[s].started++;
  if (!h) return;
  r->chans[r->nch] = h;
  r->owner[r->nch] = s;
  r->phase[r->nch] = NULL;
  r->nch++;
  r->colls[s].open++;
}

static void start_coll(run_t* r, coll_t* c, const uint8_t* op) {
  dyn_prof_descr_v5_t d5 = {0};
  dyn_prof_descr_v7_t d7 = {0};
  d5.type = d7.type = DYN_PROFILE_COLL;
  d5.coll.func = d7.coll.func = strs[op[1] % NS];
  d5.coll.algo = d7.coll.algo = strs[op[2] % NS];
  d5.coll.proto = d7.coll.proto = strs[(op[1] + op[2]) % NS];
  d5.coll.datatype = d7.coll.datatype = strs[op[3] % NS];
  d5.coll.count = d7.coll.count = (size_t)op[1] << (op[2] % 40);
  d5.coll.nChannels = d7.coll.nChannels = (uint8_t)(op[3] % 5);
  /* v7's own fields: mostly NVIDIA's layout (isSymColl 0/1, a variant exactly when symmetric),
   * sometimes not (a byte of 2..255, or a variant that disagrees with the flag) */
  uint8_t sym = (uint8_t)((op[2] >> 4) % 3 == 2 ? op[3] : (op[2] >> 4) & 1);
  memcpy(&d7.coll.isSymColl, &sym, 1);
  int variant = (op[2] & 0x08) ? !(sym & 1) : (sym & 1);
  d7.coll.kernelVariant = variant ? strs[op[1] % NS] : NULL;
  d7.coll.userTag = ((uint64_t)op[3] << 56) | ((uint64_t)op[1] << 8) | op[2];
  start(r, &c->h, &d7, &d5);
  if (c->h) c->announced = d5.coll.nChannels;
}

static int finished(const coll_t* c) { return c->stopped && c->started == c->announced && c->open == 0; }

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_ctx6) setup();
  if (size == 0) return 0;
  run_t r = {0};
  r.v7 = data[0] & 1;
  r.ctx = r.v7 ? g_ctx7 : g_ctx6;
  atomic_store(&((dyn_prof_ctx_t*)g_ctx7)->bad_layout, 0); /* a fresh communicator per input */
  dyn_proc_hdr_t* p = g_dyn.slot;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    const uint8_t* op = data + i;
    if (p && (op[3] & 0x80)) p->tail = p->head; /* the sidecar drains sometimes */
    int s = op[1] % SLOTS;
    coll_t* c = &r.colls[s];
    if (c->h && finished(c)) memset(c, 0, sizeof *c);
    switch (op[0] % (r.v7 ? 6 : 4)) {
      case 0: /* start a collective */
        if (!c->h && !c->stopped) start_coll(&r, c, op);
        break;
      case 1: /* a kernel channel of a collective starts */
        if (c->h && c->started < c->announced && r.nch < MAXCH) start_channel(&r, s, op[2], op[3] * 1000u);
        break;
      case 2: /* a channel stops */
        if (r.nch) stop_channel(&r, op[2] % r.nch, (uint64_t)op[3] * 997);
        break;
      case 3: /* the collective was enqueued */
        if (c->h && !c->stopped) {
          ncclProfiler_v6.stopEvent(c->h);
          c->stopped = 1;
        }
        break;
      case 4: /* v7: a phase of an open channel starts */
        if (r.nch) start_phase(&r, op[2] % r.nch, op[3], (uint64_t)op[1] * 1009);
        break;
      default: /* v7: a phase stops */
        if (r.nch) stop_phase(&r, op[2] % r.nch, (uint64_t)op[3] * 1013);
        break;
    }
  }
  /* complete everything as NCCL eventually would */
  for (int s = 0; s < SLOTS; s++) {
    coll_t* c = &r.colls[s];
    if (!c->h) continue;
    if (!c->stopped) {
      ncclProfiler_v6.stopEvent(c->h);
      c->stopped = 1;
    }
    while (c->started < c->announced && r.nch < MAXCH) start_channel(&r, s, 1, 5);
  }
  while (r.nch) stop_channel(&r, r.nch - 1, 77);
  for (int v = 0; v < 2; v++) {
    dyn_prof_ctx_t* ctx = (dyn_prof_ctx_t*)(v ? g_ctx7 : g_ctx6);
    for (int e = 0; e < DYN_PROF_EVENTS; e++)
      if (atomic_load(&ctx->ev[e].refs) != 0) __builtin_trap();
  }
  return 0;
}
