/* libFuzzer target: arbitrary (but ABI-respecting) sequences of profiler callbacks with fuzzed
 * strings, counts and timestamps, writing records into a real ring. Each handle is stopped at
 * most once, as NCCL does. */
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

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_ctx) setup();
  static const char* strs[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send",
                               "RING", "TREE", "NVLS_TREE", "PAT", "LL", "LL128", "SIMPLE", "ncclFloat32",
                               "ncclBfloat16", "ncclFloat8e5m2", "", "X"};
  enum { NS = sizeof strs / sizeof *strs };
  void* colls[8] = {0};
  void* chans[32] = {0};
  int nch = 0;
  dyn_proc_hdr_t* p = g_dyn.slot;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    const uint8_t* op = data + i;
    if (p && (op[3] & 0x80)) p->tail = p->head; /* the sidecar drains sometimes */
    switch (op[0] % 4) {
      case 0: { /* start a collective */
        dyn_prof_descr_v5_t d = {0};
        d.type = DYN_PROFILE_COLL;
        d.coll.func = strs[op[1] % NS];
        d.coll.algo = strs[op[2] % NS];
        d.coll.proto = strs[(op[1] + op[2]) % NS];
        d.coll.datatype = strs[op[3] % NS];
        d.coll.count = (size_t)op[1] << (op[2] % 40);
        d.coll.nChannels = op[3];
        int slot = op[1] & 7;
        if (colls[slot]) break;
        ncclProfiler_v6.startEvent(g_ctx, &colls[slot], &d);
        break;
      }
      case 1: { /* a kernel channel of a live collective starts */
        void* parent = colls[op[1] & 7];
        if (!parent || nch >= 32) break;
        dyn_prof_descr_v5_t d = {0};
        d.type = DYN_PROFILE_KERNEL_CH;
        d.parentObj = parent;
        d.kernelCh.channelId = op[2];
        d.kernelCh.pTimer = (uint64_t)op[3] * 1000;
        ncclProfiler_v6.startEvent(g_ctx, &chans[nch], &d);
        if (chans[nch]) nch++;
        break;
      }
      case 2: { /* a channel stops */
        if (!nch) break;
        int k = op[1] % nch;
        dyn_prof_state_args_t a = {0};
        a.kernelCh.pTimer = (uint64_t)op[2] * 997;
        ncclProfiler_v6.recordEventState(chans[k], op[3] & 1 ? DYN_PROFILER_KERNEL_CH_STOP : op[3], &a);
        ncclProfiler_v6.stopEvent(chans[k]);
        chans[k] = chans[--nch];
        break;
      }
      default: { /* a collective stops */
        int slot = op[1] & 7;
        if (!colls[slot]) break;
        ncclProfiler_v6.stopEvent(colls[slot]);
        colls[slot] = NULL;
        break;
      }
    }
  }
  while (nch) ncclProfiler_v6.stopEvent(chans[--nch]);
  for (int s = 0; s < 8; s++)
    if (colls[s]) ncclProfiler_v6.stopEvent(colls[s]);
  /* every event of this input is closed: the pool must be free again */
  dyn_prof_ctx_t* c = (dyn_prof_ctx_t*)g_ctx;
  for (int e = 0; e < DYN_PROF_EVENTS; e++)
    if (atomic_load(&c->ev[e].refs) != 0) __builtin_trap();
  return 0;
}
