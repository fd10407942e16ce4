/* libFuzzer target: decision-table validation and applying any valid table to any cost table.
 * Input: flag byte (bit0: fix the CRC so the fuzzer reaches the structural checks), cost table
 * (21 floats), then the table image. Invariants: -1.0/NaN entries are never touched and at most
 * one entry is forced to 0.0. */
#include "../src/plugin.c"
#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static dyn_table_t t;
  if (size < 1 + 21 * sizeof(float)) return 0;
  uint8_t flags = data[0];
  float cost0[DYN_NUM_ALGOS * DYN_NUM_PROTOS];
  memcpy(cost0, data + 1, sizeof cost0);
  data += 1 + sizeof cost0;
  size -= 1 + sizeof cost0;
  memset(&t, 0, sizeof t);
  memcpy(&t, data, size < sizeof t ? size : sizeof t);
  if (flags & 1) t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  if (dyn_table_validate(&t, t.epoch) != 0) return 0;
  dyn_explore_key_t k = {t.seed, flags, 16, 2, t.half_life_log2};
  for (int s = 0; s < (int)t.n_scales; s++)
    for (int f = 0; f < DYN_N_FUNCS; f++)
      for (int b = 0; b < DYN_N_BUCKETS; b += 7) {
        float cost[DYN_NUM_ALGOS * DYN_NUM_PROTOS];
        memcpy(cost, cost0, sizeof cost);
        int nch = 0;
        const dyn_choice_t* c = dyn_apply_cell(&t.cells[s][f][b], &k, (uint32_t)f, (uint32_t)b, flags, cost,
                                               DYN_NUM_ALGOS - (flags >> 7), DYN_NUM_PROTOS, &nch);
        int changed = 0;
        for (int i = 0; i < DYN_NUM_ALGOS * DYN_NUM_PROTOS; i++) {
          int same = memcmp(&cost[i], &cost0[i], sizeof(float)) == 0;
          if (!same) {
            changed++;
            if (!(cost0[i] >= 0.0f) || cost[i] != 0.0f) __builtin_trap();
          }
        }
        if (changed > 1 || (changed == 1 && !c)) __builtin_trap();
      }
  return 0;
}
