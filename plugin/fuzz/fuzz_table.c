/* libFuzzer target: decision-table validation and applying any valid table to any cost table.
 * Input: flag byte (bit0: fix the CRC so the fuzzer reaches the structural checks; bit7: one
 * algorithm fewer in NCCL's table), cost table (21 floats), the 64-byte table header, then
 * patches of (cell index: u16, cell: 48 bytes) over an all-empty table.  Invariants: -1.0/NaN
 * entries are never touched and at most one entry is forced to 0.0, only by a returned choice;
 * then a v6 communicator on scale 0 of the table gets a call sequence derived from the input
 * (getCollInfo groups, getChunkSize with any arguments): every chunk answer is NCCL's own or the
 * chunk of a choice/candidate of that collective in the table. */
#include "../src/plugin.c"

#define NCELLS (DYN_MAX_SCALES * DYN_N_FUNCS * DYN_N_BUCKETS)

static int chunk_in_table(const dyn_table_t* t, int coll, size_t v) {
  for (int b = 0; b < DYN_N_BUCKETS; b++) {
    const dyn_cell_t* c = &t->cells[0][coll][b];
    for (int k = 0; k < c->n_choices; k++)
      if (c->choices[k].chunk_log2 && v == (size_t)1 << c->choices[k].chunk_log2) return 1;
    for (int k = 0; k < c->n_cands; k++)
      if (c->cands[k].chunk_log2 && v == (size_t)1 << c->cands[k].chunk_log2) return 1;
  }
  return 0;
}

static void fuzz_chunk(const dyn_table_t* t, const float* cost0, uint64_t seed) {
  void* ctx = NULL;
  ncclTunerPlugin_v6.init(&ctx, seed, 16, 2, NULL, NULL, NULL);
  if (!ctx) return;
  dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)ctx;
  c->es.dead = 1; /* no shared memory: the injected cells stay in effect */
  c->half_life_log2 = t->half_life_log2;
  c->cells = &t->cells[0][0][0];
  for (uint64_t k = 0; k < 96; k++) {
    uint64_t h = dyn_mix(seed ^ (k * 0x9E3779B97F4A7C15ULL));
    int coll = (int)(h % 6), algo = (int)((h >> 8) % 8), proto = (int)((h >> 16) % 4);
    size_t n = (size_t)1 << ((h >> 24) % 41) | (size_t)((h >> 32) & 0xFFF);
    if ((h >> 60) < 9) {
      float cost[DYN_NUM_ALGOS * DYN_NUM_PROTOS];
      memcpy(cost, cost0, sizeof cost);
      int nch = 0;
      ncclTunerPlugin_v6.getCollInfo(ctx, coll, n, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
    } else {
      size_t v = 12345;
      ncclTunerPlugin_v6.getChunkSize(ctx, coll, n, algo, proto, 1, &v);
      if (v != 12345 && (coll >= DYN_N_FUNCS || !chunk_in_table(t, coll, v))) __builtin_trap();
    }
  }
  ncclTunerPlugin_v6.finalize(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static dyn_table_t t;
  if (size < 1 + 21 * sizeof(float) + 64) return 0;
  uint8_t flags = data[0];
  float cost0[DYN_NUM_ALGOS * DYN_NUM_PROTOS];
  memcpy(cost0, data + 1, sizeof cost0);
  data += 1 + sizeof cost0;
  size -= 1 + sizeof cost0;
  memset(&t, 0, sizeof t);
  memcpy(&t, data, 64);
  data += 64;
  size -= 64;
  dyn_cell_t* cells = &t.cells[0][0][0];
  while (size >= 2 + sizeof(dyn_cell_t)) {
    unsigned idx = (unsigned)(data[0] | (data[1] << 8)) % NCELLS;
    memcpy(&cells[idx], data + 2, sizeof(dyn_cell_t));
    data += 2 + sizeof(dyn_cell_t);
    size -= 2 + sizeof(dyn_cell_t);
  }
  if (flags & 1) t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  if (dyn_table_validate(&t, t.epoch) != 0) return 0;
  int numAlgo = DYN_NUM_ALGOS - (flags >> 7);
  for (int s = 0; s < (int)t.n_scales; s++)
    for (int f = 0; f < DYN_N_FUNCS; f++)
      for (int b = 0; b < DYN_N_BUCKETS; b++) {
        const dyn_cell_t* cell = &t.cells[s][f][b];
        if (!cell->n_choices && !cell->n_cands) continue;
        for (uint64_t j = 0; j < 4; j++) {
          float cost[DYN_NUM_ALGOS * DYN_NUM_PROTOS];
          memcpy(cost, cost0, sizeof cost);
          int nch = 0;
          uint64_t hp = dyn_hash_prefix(t.seed, flags, 16, 2, (uint32_t)f, (uint32_t)b);
          const dyn_choice_t* c = dyn_apply_cell_h(cell, hp, t.half_life_log2, j * 977, cost, numAlgo,
                                                   DYN_NUM_PROTOS, &nch);
          int changed = 0;
          for (int i = 0; i < DYN_NUM_ALGOS * DYN_NUM_PROTOS; i++) {
            if (memcmp(&cost[i], &cost0[i], sizeof(float)) != 0) {
              changed++;
              if (!(cost0[i] >= 0.0f) || cost[i] != 0.0f) __builtin_trap();
              if (!c || i != c->algo * DYN_NUM_PROTOS + c->proto) __builtin_trap();
            }
          }
          if (changed > 1 || (c && !(cost0[c->algo * DYN_NUM_PROTOS + c->proto] >= 0.0f))) __builtin_trap();
          if (c && c->nchannels != nch && c->nchannels) __builtin_trap();
        }
      }
  fuzz_chunk(&t, cost0, dyn_crc32(cost0, sizeof cost0) ^ flags);
  return 0;
}
