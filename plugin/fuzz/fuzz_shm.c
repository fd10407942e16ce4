/* libFuzzer target: the shared-memory header and the epoch-entry scan (what the plugin reads
 * from the control region at every boundary).  Input: header bytes, then 64 entry words, then
 * call indices to run boundaries at.  A pending entry is resolved as ABORTED by a simulated
 * sidecar, so the wait loop terminates. */
#define DYN_PENDING_WAIT(entry, us) \
  do { (void)(us); atomic_store((entry), (atomic_load(entry) & ~0xFFull) | DYN_EPOCH_ABORTED); } while (0)
#include "../src/plugin.c"

static uint8_t* g_region;

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_region) g_region = (uint8_t*)calloc(1, DYN_FILE_SIZE);
  /* only what the scan reads or writes: header, control entries, process slot 0's header */
  memset(g_region, 0, sizeof(dyn_shm_header_t));
  memset(g_region + DYN_CTRL_OFF, 0, sizeof(dyn_shm_ctrl_t));
  memset(g_region + DYN_PROCS_OFF, 0, DYN_PROC_HDR_SIZE);
  size_t n = size < sizeof(dyn_shm_header_t) ? size : sizeof(dyn_shm_header_t);
  memcpy(g_region, data, n);
  (void)dyn_header_validate((const dyn_shm_header_t*)g_region, DYN_FILE_SIZE);
  data += n;
  size -= n;
  size_t m = size < DYN_MAX_EPOCHS * 8 ? size : DYN_MAX_EPOCHS * 8;
  memcpy(g_region + DYN_CTRL_OFF, data, m);
  data += m;
  size -= m;
  /* scan as a mapped process with L = 64 */
  g_dyn.base = g_region;
  g_dyn.interval = 64;
  g_dyn.slot = dyn_proc(g_region, 0);
  atomic_store(&g_dyn.mapped, 1);
  dyn_epoch_state_t es = {.lmask = 63, .next_e = 1};
  uint64_t i = 0;
  while (size >= 2) {
    i += (uint64_t)(data[0] | (data[1] << 8)) * 64;
    data += 2;
    size -= 2;
    uint32_t before = es.cur_e;
    uint32_t e = dyn_boundary(&es, i);
    if (e < before || e >= DYN_MAX_EPOCHS) __builtin_trap(); /* epochs never go backwards */
    if (e) {
      uint64_t w = g_dyn.slot ? ((dyn_shm_ctrl_t*)(g_region + DYN_CTRL_OFF))->entries[e] : 0;
      if (dyn_entry_boundary(w) > i || dyn_entry_status(w) != DYN_EPOCH_COMMITTED) __builtin_trap();
    }
  }
  atomic_store(&g_dyn.mapped, 0);
  return 0;
}
