/*
 * cases_runtime.h -- the process's runtime through the tuner and profiler entry points
 * (included by test_plugin.c after its shared-memory helpers): epochs committed and aborted
 * at their boundaries, scale classes with their own cells, recycled epoch slots, the process
 * slot's lease, and the profiler ring (records in order, a full ring drops, never blocks).
 */

static void* resolve_later(void* arg) {
  (void)arg;
  dyn_sleep_us(50000);
  set_entry(2, DYN_EPOCH_COMMITTED, 256);
  return NULL;
}

static int play_calls(void* ctx, int n, int* seen) {
  float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  for (int i = 0; i < n; i++) {
    ring_cost(cost);
    int nch = 0;
    ncclTunerPlugin_v5.getCollInfo(ctx, 4, 4096, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
    if (seen) seen[i] = nch;
  }
  return 0;
}

static void t_epochs_through_the_tuner(void) {
  make_shm(64);
  void* ctx = NULL;
  CHECK(ncclTunerPlugin_v5.init(&ctx, 42, 16, 2, NULL, NULL, NULL) == ncclSuccess && ctx);
  CHECK(atomic_load(&g_dyn.mapped) == 1);
  static dyn_table_t t1, t2;
  int sc = dyn_scale_class(16, 2);
  fill_table(&t1, 1, sc, 11);
  fill_table(&t2, 2, sc, 22);
  put_table(1, &t1);
  put_table(2, &t2);
  set_entry(1, DYN_EPOCH_COMMITTED, 128);
  set_entry(2, DYN_EPOCH_PENDING, 256);
  pthread_t th;
  pthread_create(&th, NULL, resolve_later, NULL);
  static int seen[600];
  play_calls(ctx, 400, seen);
  pthread_join(th, NULL);
  CHECK(seen[0] == 0 && seen[127] == 0);   /* NCCL's choice before epoch 1 */
  CHECK(seen[128] == 11 && seen[255] == 11); /* epoch 1 from call 128 */
  CHECK(seen[256] == 22 && seen[399] == 22); /* waited at 256 for epoch 2, committed meanwhile */
  CHECK(dyn_proc(g_dyn.base, 0)->owner_pid == (uint64_t)getpid());
  CHECK(dyn_proc(g_dyn.base, 0)->max_boundary == 384);
  CHECK(dyn_proc(g_dyn.base, 0)->needs[0] == 2); /* the communicator uses epoch 2 */
  /* an aborted epoch 3 stops the scan; its number comes back with a later boundary */
  set_entry(3, DYN_EPOCH_ABORTED, 448);
  play_calls(ctx, 100, seen);
  CHECK(seen[99] == 22 && dyn_proc(g_dyn.base, 0)->needs[0] == 2);
  static dyn_table_t t3;
  fill_table(&t3, 3, sc, 33);
  put_table(3, &t3);
  set_entry(3, DYN_EPOCH_COMMITTED, 576);
  play_calls(ctx, 100, seen); /* calls 500..599 */
  CHECK(seen[75] == 22 && seen[76] == 33 && dyn_proc(g_dyn.base, 0)->needs[0] == 3);
  /* a late communicator replays the history from call 0 */
  void* late = NULL;
  CHECK(ncclTunerPlugin_v5.init(&late, 43, 16, 2, NULL, NULL, NULL) == ncclSuccess && late);
  play_calls(late, 600, seen);
  CHECK(seen[127] == 0 && seen[128] == 11 && seen[256] == 22 && seen[575] == 22 && seen[576] == 33);
  CHECK(dyn_proc(g_dyn.base, 0)->needs[1] == 3);
  ncclTunerPlugin_v5.finalize(late);
  CHECK(dyn_proc(g_dyn.base, 0)->needs[1] == 0); /* its word is free again */
  /* a malformed entry (boundary not a multiple of L) freezes the communicator on its epoch */
  set_entry(4, DYN_EPOCH_COMMITTED, 650);
  for (int i = 0; i < 200; i++) {
    int nch = -1;
    play_calls(ctx, 1, &nch);
    CHECK(nch == 33);
  }
  ncclTunerPlugin_v5.finalize(ctx);
}

/* Scale classes past 128 nodes: a 1 024-node and a 12 000-node communicator each adopt their own
 * cells of one table; a 128-node one (not in the table) keeps NCCL's own choice. */
static void t_large_scales_own_cells(void) {
  static dyn_table_t t;
  fill_table(&t, 1, dyn_scale_class(8192, 1024), 10);
  t.scale_ids[1] = (uint8_t)dyn_scale_class(96000, 12000);
  t.n_scales = 2;
  memcpy(t.cells[1], t.cells[0], sizeof t.cells[0]);
  for (int f = 0; f < DYN_N_FUNCS; f++)
    for (int b = 0; b < DYN_N_BUCKETS; b++)
      for (int k = 0; k < 2; k++) t.cells[1][f][b].choices[k].nchannels = 14;
  t.crc = dyn_crc32((uint8_t*)&t + 8, DYN_TABLE_BYTES - 8);
  CHECK(dyn_table_validate(&t, 1) == 0);
  const size_t shapes[3][2] = {{8192, 1024}, {96000, 12000}, {1024, 128}};
  const int want[3] = {10, 14, 0};
  for (int i = 0; i < 3; i++) {
    void* ctx = NULL;
    CHECK(ncclTunerPlugin_v5.init(&ctx, 50 + (uint64_t)i, shapes[i][0], shapes[i][1], NULL, NULL, NULL) == ncclSuccess && ctx);
    dyn_tuner_ctx_t* c = (dyn_tuner_ctx_t*)ctx;
    c->es.dead = 1; /* no epoch scan: the table below is the one in effect */
    c->es.cur_tab = &t;
    dyn_adopt(c, 1);
    float cost[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
    ring_cost(cost);
    int nch = 0;
    ncclTunerPlugin_v5.getCollInfo(ctx, 4, 4096, 1, (float**)cost, DYN_NUM_ALGOS, DYN_NUM_PROTOS, 0, &nch);
    CHECK(nch == want[i]);
    ncclTunerPlugin_v5.finalize(ctx);
  }
}

/* Slots are reused: epoch n + 63 takes epoch n's slot.  A communicator that reaches the boundary
 * of an epoch whose slot is being rewritten waits; one created after the reuse skips the epochs
 * that left the slots and replays the ones still there, ending on the latest table. */
static void t_recycled_slots(void) {
  make_shm(64);
  memset(g_dyn.base + DYN_CTRL_OFF, 0, 1024); /* entries and sequence words of the previous case */
  memset((void*)g_dyn.table_state, 0, sizeof g_dyn.table_state);
  static dyn_table_t t;
  int sc = dyn_scale_class(16, 2);
  for (uint32_t e = 1; e <= 70; e++) { /* epochs 1..70: 8..70 in the slots, 1..7 retired */
    fill_table(&t, e, sc, (uint8_t)(e + 10));
    put_table(e, &t);
    set_entry(e, DYN_EPOCH_COMMITTED, 64ull * (e + 1));
  }
  void* late = NULL;
  CHECK(ncclTunerPlugin_v5.init(&late, 44, 16, 2, NULL, NULL, NULL) == ncclSuccess && late);
  static int seen[64 * 80];
  play_calls(late, 64 * 80, seen);
  CHECK(seen[64 * 2] == 0 && seen[64 * 9 - 1] == 0); /* epochs 1..7 retired: NCCL's choice */
  CHECK(seen[64 * 9] == 18);                        /* epoch 8 from its boundary on */
  CHECK(seen[64 * 71] == 80 && seen[64 * 80 - 1] == 80); /* ends on the latest table, epoch 70 */
  CHECK(dyn_proc(g_dyn.base, 0)->needs[0] == 70);
  ncclTunerPlugin_v5.finalize(late);
}

/* A process slot's lease (an OFD lock the kernel drops when its holder is gone) tells a live
 * owner from a dead one: this process holds its own; a new process takes over a slot whose owner
 * is gone, with the dead owner's needs words cleared, and never one whose owner lives. */
static void t_slot_lease(void) {
  /* relies on the mapping made by t_epochs_through_the_tuner (this process: slot 0) */
  int fd = open(g_path, O_RDWR | O_CLOEXEC);
  CHECK(fd >= 0);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = DYN_PROCS_OFF, .l_len = 1};
  int ofd = fcntl(fd, F_OFD_GETLK, &fl) == 0; /* 0: no OFD locks here (old kernel, some emulators) */
  CHECK(dyn_proc(g_dyn.base, 0)->lease == (uint8_t)ofd);
  if (ofd) CHECK(fl.l_type == F_WRLCK); /* held, seen through another open file description */
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, NULL, 0);
  for (int i = 1; i < DYN_MAX_PROCS; i++) { /* every other slot: a dead owner that took a lease */
    dyn_proc_hdr_t* p = dyn_proc(g_dyn.base, i);
    p->owner_pid = (uint64_t)gone;
    p->lease = (uint8_t)ofd;
    p->needs[0] = 7;
  }
  pid_t child = fork();
  if (child == 0) {
    dyn_proc_hdr_t* p = dyn_claim_slot(g_dyn.base, fd);
    _exit(p ? (int)((uint8_t*)p - (g_dyn.base + DYN_PROCS_OFF)) / (int)DYN_PROC_SLOT_SIZE : 99);
  }
  int st = 0;
  waitpid(child, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* slot 0 lives (this process): slot 1 taken over */
  CHECK(dyn_proc(g_dyn.base, 1)->owner_pid == (uint64_t)child && dyn_proc(g_dyn.base, 1)->needs[0] == 0);
  CHECK(dyn_proc(g_dyn.base, 2)->needs[0] == 7);
  CHECK(dyn_proc(g_dyn.base, 0)->owner_pid == (uint64_t)getpid());
  for (int i = 1; i < DYN_MAX_PROCS; i++) memset(dyn_proc(g_dyn.base, i), 0, DYN_PROC_HDR_SIZE);
  close(fd);
}

static void t_profiler_ring(void) {
  /* relies on the mapping made by t_epochs_through_the_tuner */
  void* ctx = NULL;
  int mask = 0;
  CHECK(ncclProfiler_v5.init(&ctx, 99, &mask, "c", 1, 8, 0, NULL) == ncclSuccess);
  CHECK(mask == (DYN_PROFILE_COLL | DYN_PROFILE_KERNEL_CH));
  dyn_proc_hdr_t* p = g_dyn.slot;
  uint64_t head0 = p->head;
  dyn_prof_descr_v5_t d = {0};
  d.type = DYN_PROFILE_COLL;
  d.coll.func = "AllGather";
  d.coll.count = 1000;
  d.coll.datatype = "ncclFloat16";
  d.coll.algo = "RING";
  d.coll.proto = "LL128";
  d.coll.nChannels = 2;
  d.coll.seqNumber = 5;
  void* h = NULL;
  ncclProfiler_v5.startEvent(ctx, &h, &d);
  CHECK(h != NULL);
  void* k[2];
  for (int c = 0; c < 2; c++) {
    dyn_prof_descr_v5_t kd = {0};
    kd.type = DYN_PROFILE_KERNEL_CH;
    kd.parentObj = h;
    kd.kernelCh.channelId = (uint8_t)c;
    kd.kernelCh.pTimer = 1000 + 10 * (uint64_t)c;
    ncclProfiler_v5.startEvent(ctx, &k[c], &kd);
  }
  ncclProfiler_v5.stopEvent(h); /* the collective stops before its kernels finish */
  CHECK(p->head == head0);
  for (int c = 0; c < 2; c++) {
    dyn_prof_state_args_t a = {0};
    a.kernelCh.pTimer = 1000 + 10 * (uint64_t)c + (c ? 500 : 700);
    ncclProfiler_v5.recordEventState(k[c], DYN_PROFILER_KERNEL_CH_STOP, &a);
    ncclProfiler_v5.stopEvent(k[c]);
  }
  CHECK(p->head == head0 + 1);
  dyn_record_t* r = (dyn_record_t*)((uint8_t*)p + DYN_PROC_HDR_SIZE + (head0 & (DYN_RING_CAP - 1)) * DYN_RECORD_SIZE);
  CHECK(r->seq == head0 + 1 && r->comm_id == 99 && r->coll == 2 && r->nbytes == 1000 * 2 * 8);
  CHECK(r->algo == 1 && r->proto == 1 && r->nchannels == 2 && r->n_kernel_ch == 2);
  CHECK(r->start_ns == 1000 && r->stop_ns == 1700 && r->exec_ns == 700);
  /* a full ring drops instead of blocking */
  dyn_record_t x = {0};
  for (int i = 0; i < DYN_RING_CAP + 10; i++) dyn_ring_push(&x);
  CHECK(p->head - p->tail == DYN_RING_CAP && p->dropped >= 10);
  ncclProfiler_v5.finalize(ctx);
  unlink(g_path);
}
