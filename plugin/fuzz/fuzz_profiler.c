/* libFuzzer target: arbitrary ABI-respecting sequences of profiler callbacks (fuzzed strings,
 * counts, channel ids, timestamps, orders) writing records into a real ring.  As in NCCL, a
 * collective announces nChannels, gets at most that many KernelCh events, and its Coll event is
 * stopped once (at enqueue, before or after its kernels).  After every input all collectives
 * are completed and the event pool must be entirely free again. */
#include "../src/plugin.c"

static void* g_ctx;
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
  ncclProfiler_v6.init(&g_ctx, 7, &mask, "f", 2, 16, 0, NULL);
  unlink(g_file);
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

static void stop_channel(void** chans, int* owner, int* nch, coll_t* colls, int k, uint64_t t) {
  dyn_prof_state_args_t a = {0};
  a.kernelCh.pTimer = t;
  ncclProfiler_v6.recordEventState(chans[k], DYN_PROFILER_KERNEL_CH_STOP, &a);
  ncclProfiler_v6.stopEvent(chans[k]);
  colls[owner[k]].open--;
  chans[k] = chans[*nch - 1];
  owner[k] = owner[*nch - 1];
  (*nch)--;
}

static void start_channel(void** chans, int* owner, int* nch, coll_t* colls, int s, uint8_t id, uint64_t t) {
  dyn_prof_descr_v5_t d = {0};
  d.type = DYN_PROFILE_KERNEL_CH;
  d.parentObj = colls[s].h;
  d.kernelCh.channelId = id;
  d.kernelCh.pTimer = t;
  void* h = NULL;
  ncclProfiler_v6.startEvent(g_ctx, &h, &d);
  colls[s].started++;
  if (!h) return;
  chans[*nch] = h;
  owner[*nch] = s;
  (*nch)++;
  colls[s].open++;
}

static int finished(const coll_t* c) { return c->stopped && c->started == c->announced && c->open == 0; }

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_ctx) setup();
  coll_t colls[SLOTS] = {0};
  void* chans[MAXCH];
  int owner[MAXCH];
  int nch = 0;
  dyn_proc_hdr_t* p = g_dyn.slot;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    const uint8_t* op = data + i;
    if (p && (op[3] & 0x80)) p->tail = p->head; /* the sidecar drains sometimes */
    int s = op[1] % SLOTS;
    coll_t* c = &colls[s];
    if (c->h && finished(c)) memset(c, 0, sizeof *c);
    switch (op[0] % 4) {
      case 0: { /* start a collective */
        if (c->h || c->stopped) break;
        dyn_prof_descr_v5_t d = {0};
        d.type = DYN_PROFILE_COLL;
        d.coll.func = strs[op[1] % NS];
        d.coll.algo = strs[op[2] % NS];
        d.coll.proto = strs[(op[1] + op[2]) % NS];
        d.coll.datatype = strs[op[3] % NS];
        d.coll.count = (size_t)op[1] << (op[2] % 40);
        d.coll.nChannels = (uint8_t)(op[3] % 5);
        ncclProfiler_v6.startEvent(g_ctx, &c->h, &d);
        if (!c->h) break;
        c->announced = d.coll.nChannels;
        break;
      }
      case 1: /* a kernel channel of a collective starts */
        if (c->h && c->started < c->announced && nch < MAXCH) start_channel(chans, owner, &nch, colls, s, op[2], op[3] * 1000u);
        break;
      case 2: /* a channel stops */
        if (nch) stop_channel(chans, owner, &nch, colls, op[2] % nch, (uint64_t)op[3] * 997);
        break;
      default: /* the collective was enqueued */
        if (c->h && !c->stopped) {
          ncclProfiler_v6.stopEvent(c->h);
          c->stopped = 1;
        }
        break;
    }
  }
  /* complete everything as NCCL eventually would */
  for (int s = 0; s < SLOTS; s++) {
    coll_t* c = &colls[s];
    if (!c->h) continue;
    if (!c->stopped) {
      ncclProfiler_v6.stopEvent(c->h);
      c->stopped = 1;
    }
    while (c->started < c->announced && nch < MAXCH) start_channel(chans, owner, &nch, colls, s, 1, 5);
  }
  while (nch) stop_channel(chans, owner, &nch, colls, nch - 1, 77);
  dyn_prof_ctx_t* ctx = (dyn_prof_ctx_t*)g_ctx;
  for (int e = 0; e < DYN_PROF_EVENTS; e++)
    if (atomic_load(&ctx->ev[e].refs) != 0) __builtin_trap();
  return 0;
}
