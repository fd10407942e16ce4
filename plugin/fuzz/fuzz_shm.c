/* libFuzzer target: the shared-memory header and the epoch scan (what the plugin reads from the
 * control region at every boundary).  Input: header bytes, then 64 entry words and 64 sequence
 * words, then call indices to run boundaries at.  A simulated sidecar resolves every wait: the
 * awaited slot becomes epoch m, ABORTED (a reuse that did not happen, an aborted epoch), so the
 * wait loop terminates. */
#define DYN_PENDING_WAIT(s, m, us)                                                           \
  do {                                                                                       \
    (void)(us);                                                                              \
    dyn_shm_ctrl_t* c_ = (dyn_shm_ctrl_t*)(g_region + DYN_CTRL_OFF);                         \
    atomic_store((_Atomic uint64_t*)&c_->seqs[s], (uint64_t)(m));                            \
    atomic_store((_Atomic uint64_t*)&c_->entries[s], (c_->entries[s] & ~0xFFull) | DYN_EPOCH_ABORTED); \
  } while (0)
#include <stdint.h>
static uint8_t* g_region;
#include "../src/plugin.c"

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
  size_t m = size < DYN_MAX_EPOCHS * 16 ? size : DYN_MAX_EPOCHS * 16;
  memcpy(g_region + DYN_CTRL_OFF, data, m);
  data += m;
  size -= m;
  /* scan as a mapped process with L = 64 */
  g_dyn.base = g_region;
  g_dyn.interval = 64;
  g_dyn.slot = dyn_proc(g_region, 0);
  atomic_store(&g_dyn.mapped, 1);
  dyn_epoch_state_t es = {.lmask = 63, .next_e = 1, .need_idx = -2};
  uint64_t i = 0;
  while (size >= 2) {
    i += (uint64_t)(data[0] | (data[1] << 8)) * 64;
    data += 2;
    size -= 2;
    uint32_t before = es.cur_e, next = es.next_e;
    uint32_t e = dyn_boundary(&es, i);
    if (e < before || es.next_e < next) __builtin_trap(); /* epochs never go backwards */
    if (e != before && es.last_k > i) __builtin_trap();  /* nothing adopted before its boundary */
    if (es.need_idx >= 0 && g_dyn.slot->needs[es.need_idx] != (e ? e : es.next_e)) __builtin_trap();
  }
  dyn_release_need(&es);
  atomic_store(&g_dyn.mapped, 0);
  return 0;
}
