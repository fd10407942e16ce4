/*
 * dyn_shm.h -- byte layout of the DynamICCL shared-memory file (layout version 4).
 *
 * One file per pod, created by the sidecar, mapped by every training process.
 * sidecar/shm.py is the Python codec of the same layout; docs/plugin.md lists the
 * offsets.  All integers are little-endian (x86_64 / aarch64 native).
 *
 *   [0, 4096)            header
 *   [4096, 8192)         control region: epoch entries mirrored by the sidecar
 *   [8192, +64*81920)    decision-table slots: epoch n in slot 1 + (n - 1) % 63, reused once retired
 *   [procs_off, ...)     32 process slots: owner pid, published boundary, profiler ring
 */
#ifndef DYN_SHM_H
#define DYN_SHM_H

#include <stdint.h>
#include <stddef.h>

#define DYN_SHM_MAGIC 0x31304C4343594E44ULL /* "DNYCCL01" as little-endian bytes */
#define DYN_SHM_LAYOUT_VERSION 4u /* 4: table slots recycled (sequence words, needs words); 3: 128-byte records with user tag and kernel phases (2: 64; 1: 4 scale classes) */

#define DYN_N_FUNCS 5
#define DYN_N_BUCKETS 41    /* log2 size buckets: 2^0 .. 2^40 bytes (last one open-ended) */
#define DYN_N_SCALE_CLASSES 128 /* 16 node classes (up to 2^14 nodes, then more) x 8 ranks-per-node classes */
#define DYN_MAX_SCALES 8    /* scale classes one table carries: the job's communicator shapes */
#define DYN_MAX_CHOICES 4   /* ranked choices per cell */
#define DYN_MAX_CANDS 4     /* exploration candidates per cell */
#define DYN_MAX_EPOCHS 64   /* slots; slot 0 unused, epoch n lives in slot dyn_slot_of(n) */
#define DYN_SLOTS 63        /* usable slots: the epochs a job keeps at once */
#define DYN_MAX_NEEDS 27    /* communicators per process that publish the epoch they need */
#define DYN_MAX_PROCS 32
#define DYN_RING_CAP 1024   /* records per process ring (power of two) */
#define DYN_NO_SCALE 0xFF

#define DYN_HEADER_SIZE 4096u
#define DYN_CTRL_OFF 4096u
#define DYN_CTRL_SIZE 4096u
#define DYN_TABLES_OFF 8192u
#define DYN_TABLE_SLOT_SIZE 81920u
#define DYN_PROCS_OFF (DYN_TABLES_OFF + DYN_MAX_EPOCHS * DYN_TABLE_SLOT_SIZE)
#define DYN_RECORD_SIZE 128u
#define DYN_PROC_HDR_SIZE 256u
#define DYN_PROC_SLOT_SIZE (DYN_PROC_HDR_SIZE + DYN_RING_CAP * DYN_RECORD_SIZE)
#define DYN_FILE_SIZE (DYN_PROCS_OFF + DYN_MAX_PROCS * DYN_PROC_SLOT_SIZE)

/* epoch entry word of a slot: (K << 8) | status; the slot's sequence word says which epoch:
 * (write generation << 32) | epoch number.  WRITING: the sidecar is rewriting the slot. */
#define DYN_EPOCH_NONE 0u
#define DYN_EPOCH_PENDING 1u
#define DYN_EPOCH_COMMITTED 2u
#define DYN_EPOCH_ABORTED 3u
#define DYN_EPOCH_WRITING 4u

#define DYN_TABLE_EMPTY 0u
#define DYN_TABLE_WRITING 1u
#define DYN_TABLE_READY 2u
#define DYN_TABLE_MAGIC 0x4C425444u /* "DTBL" */
#define DYN_TABLE_FORMAT 3u /* 3: 128 scale classes (node class * 8 + ranks-per-node class); 2: 32 (node class * 4 + ...) */

#define DYN_MIN_INTERVAL 64u
#define DYN_MAX_INTERVAL (1u << 24)

typedef struct {
  uint64_t magic;          /* 0 */
  uint32_t layout_version; /* 8 */
  uint32_t header_size;    /* 12 */
  uint64_t file_size;      /* 16 */
  uint64_t epoch_interval; /* 24: L, power of two; boundaries are per-communicator call indices k*L */
  uint64_t ctrl_off;       /* 32 */
  uint64_t tables_off;     /* 40 */
  uint32_t table_slot_size;/* 48 */
  uint32_t n_table_slots;  /* 52 */
  uint64_t procs_off;      /* 56 */
  uint32_t proc_slot_size; /* 64 */
  uint32_t n_proc_slots;   /* 68 */
  uint32_t ring_cap;       /* 72 */
  uint32_t record_size;    /* 76 */
  uint32_t crc;            /* 80: CRC-32 (zlib) of bytes [0, 80) */
  uint32_t ready;          /* 84: 1 once the sidecar finished initialising the file */
} dyn_shm_header_t;

/* Communicator registry entry (control region, written by the training processes): the
 * shape of every communicator whose profiler records reach a ring, so the sidecar can
 * attribute a record (comm_id) to its nRanks / nNodes.  state: 0 free, 1 being written,
 * 2 ready (stored last, seq_cst); shape = nRanks | nNodes << 32.  Never freed. */
#define DYN_MAX_COMMS 128
#define DYN_COMMS_OFF 1024u /* within the control region */
#define DYN_COMM_FREE 0u
#define DYN_COMM_WRITING 1u
#define DYN_COMM_READY 2u
typedef struct {
  uint64_t state;   /* 0 */
  uint64_t comm_id; /* 8 */
  uint64_t shape;   /* 16 */
} dyn_comm_entry_t;

typedef struct {
  uint64_t entries[DYN_MAX_EPOCHS]; /* 0: entry of slot s at 8*s; slot 0 unused */
  uint64_t seqs[DYN_MAX_EPOCHS];    /* 512: sequence word of slot s; seqs[0]: sidecar pid | heartbeat << 32 */
  dyn_comm_entry_t comms[DYN_MAX_COMMS]; /* 1024: communicator registry */
} dyn_shm_ctrl_t;

/* The slot of epoch n (n >= 1). */
static inline uint32_t dyn_slot_of(uint32_t n) { return 1u + (n - 1u) % DYN_SLOTS; }

typedef struct {
  uint8_t algo, proto, nchannels, chunk_log2; /* chunk_log2 0 = NCCL's chunk size */
} dyn_choice_t;

typedef struct {
  uint8_t n_choices;                     /* 0 */
  uint8_t n_cands;                       /* 1 */
  uint16_t eps_q16;                      /* 2: explore probability * 65536 */
  dyn_choice_t choices[DYN_MAX_CHOICES]; /* 4 */
  dyn_choice_t cands[DYN_MAX_CANDS];     /* 20 */
  uint16_t weights[DYN_MAX_CANDS];       /* 36 */
  uint32_t pad;                          /* 44 */
} dyn_cell_t;                            /* 48 bytes */

typedef struct {
  uint32_t state;          /* 0: DYN_TABLE_* */
  uint32_t crc;            /* 4: CRC-32 of bytes [8, DYN_TABLE_BYTES) */
  uint32_t magic;          /* 8 */
  uint32_t format;         /* 12 */
  uint32_t epoch;          /* 16 */
  uint32_t n_scales;       /* 20 */
  uint64_t version;        /* 24 */
  uint64_t digest;         /* 32 */
  uint64_t seed;           /* 40 */
  uint32_t half_life_log2; /* 48: explore prob halves every 2^h calls of a cell; 255 = never */
  uint32_t flags;          /* 52 */
  uint8_t scale_ids[DYN_MAX_SCALES]; /* 56 */
  dyn_cell_t cells[DYN_MAX_SCALES][DYN_N_FUNCS][DYN_N_BUCKETS]; /* 64 */
} dyn_table_t;

#define DYN_TABLE_BYTES ((uint32_t)sizeof(dyn_table_t))

typedef struct {
  uint64_t owner_pid;    /* 0: 0 = free */
  uint64_t max_boundary; /* 8: highest boundary index any communicator of the process crossed */
  uint64_t generation;   /* 16: bumped on every claim */
  uint64_t n_comms;      /* 24 */
  uint8_t tuner_abi;     /* 32: tuner ABI version NCCL loaded in this process (0 = none yet) */
  uint8_t profiler_abi;  /* 33: profiler ABI version NCCL loaded (0 = none: nothing is measured) */
  uint8_t lease;         /* 34: 1 = the owner holds an OFD write lock on this slot's first byte for as
                          * long as it lives (the kernel drops it at exit): unlocked = owner gone;
                          * 0 = no lease (kernel without OFD locks): liveness unknown */
  uint8_t pad0[29];
  uint64_t head;         /* 64: next ring position (writers) */
  uint8_t pad1[56];
  uint64_t tail;         /* 128: next position to read (sidecar) */
  uint64_t dropped;      /* 136: records dropped because the ring was full */
  uint32_t needs[DYN_MAX_NEEDS]; /* 144: per communicator, the oldest epoch it uses or needs (0 = free) */
  uint32_t need_overflow; /* 252: communicators without a needs word (the sidecar then recycles nothing) */
} dyn_proc_hdr_t;        /* 256 bytes */

#define DYN_N_PHASES 3
#define DYN_REC_SYMMETRIC 0x1u /* v7: a symmetric-memory kernel ran the collective (isSymColl) */
#define DYN_REC_V7 0x2u        /* written by profiler ABI v7: user_tag and phases are meaningful */
typedef struct {
  uint64_t seq;      /* 0: ring position + 1, stored last (release) */
  uint64_t comm_id;  /* 8 */
  uint64_t nbytes;   /* 16 */
  uint64_t start_ns; /* 24: min GPU start over channels */
  uint64_t stop_ns;  /* 32: max GPU stop over channels */
  uint64_t exec_ns;  /* 40: max over channels of (stop - start) */
  uint64_t coll_seq; /* 48: NCCL's per-communicator collective sequence number */
  uint8_t coll;      /* 56: ncclFunc_t, 255 unknown */
  uint8_t algo;      /* 57: NCCL_ALGO_*, 255 unknown */
  uint8_t proto;     /* 58 */
  uint8_t nchannels; /* 59 */
  uint32_t n_kernel_ch; /* 60: KernelCh events seen */
  uint64_t user_tag; /* 64: profiler v7: the application's per-call tag (0 = untagged or older ABI) */
  uint64_t phase_ns[DYN_N_PHASES]; /* 72: v7: max over channels of each kernel phase (initial sync,
                                    * compute, final sync); 0 = not reported */
  uint32_t n_phases; /* 96: KernelPhase events seen */
  uint8_t flags;     /* 100: DYN_REC_* */
  uint8_t pad[27];   /* 101 */
} dyn_record_t;

_Static_assert(sizeof(dyn_shm_header_t) == 88, "header layout");
_Static_assert(sizeof(dyn_cell_t) == 48, "cell layout");
_Static_assert(sizeof(dyn_table_t) <= DYN_TABLE_SLOT_SIZE, "table fits its slot");
_Static_assert(offsetof(dyn_table_t, cells) == 64, "table header layout");
_Static_assert(sizeof(dyn_proc_hdr_t) == DYN_PROC_HDR_SIZE, "proc header layout");
_Static_assert(sizeof(dyn_record_t) == DYN_RECORD_SIZE, "record layout");
_Static_assert(offsetof(dyn_record_t, user_tag) == 64 && offsetof(dyn_record_t, flags) == 100, "record v3 fields");
_Static_assert(sizeof(dyn_shm_ctrl_t) <= DYN_CTRL_SIZE, "ctrl layout");
_Static_assert(offsetof(dyn_shm_ctrl_t, comms) == DYN_COMMS_OFF, "comm registry offset");
_Static_assert(offsetof(dyn_shm_ctrl_t, seqs) == 512, "sequence words offset");
_Static_assert(offsetof(dyn_proc_hdr_t, needs) == 144, "needs offset");
_Static_assert(offsetof(dyn_proc_hdr_t, lease) == 34, "lease offset");
_Static_assert(sizeof(dyn_comm_entry_t) == 24, "comm entry layout");

#endif
