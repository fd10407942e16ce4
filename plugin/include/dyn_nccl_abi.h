/*
 * dyn_nccl_abi.h -- the subset of NCCL's plugin ABI that DynamICCL implements.
 *
 * Written from the facts (names, integer values, argument order, struct
 * layouts) of NCCL's public plugin headers: tuner ABI v2..v7 and profiler ABI
 * v4..v7.  Only what this plugin touches is declared.  Layouts must match NCCL
 * byte for byte on LP64 (x86_64, aarch64); tests/test_abi_layout.c asserts at compile time the
 * offsets, widths, sizes and values we rely on, with NCCL's numbers (make -C plugin test).
 */
#ifndef DYN_NCCL_ABI_H
#define DYN_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

#define DYN_NCCL_SUBSYS_INIT 0x1UL
#define DYN_NCCL_SUBSYS_TUNING 0x40UL
#define DYN_NCCL_SUBSYS_PROFILE 0x4000UL

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

/* ncclFunc_t: only the first five are tuned. */
typedef int ncclFunc_t;
#define DYN_NUM_FUNCS 5

#define DYN_NUM_ALGOS 7 /* TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT */
#define DYN_NUM_PROTOS 3 /* LL LL128 SIMPLE */
#define DYN_ALGO_TREE 0
#define DYN_ALGO_RING 1
#define DYN_ALGO_COLLNET_DIRECT 2
#define DYN_ALGO_COLLNET_CHAIN 3
#define DYN_ALGO_NVLS 4
#define DYN_ALGO_NVLS_TREE 5
#define DYN_ALGO_PAT 6
#define DYN_PROTO_LL 0
#define DYN_PROTO_LL128 1
#define DYN_PROTO_SIMPLE 2
#define DYN_COST_IGNORE (-1.0f) /* NCCL marks unavailable (algo, proto) pairs with -1.0 */

/* ---- tuner v2 (NCCL 2.21): the plugin returns algorithm/protocol itself ---- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                              int* nChannels);
  ncclResult_t (*destroy)(void* context);
} dyn_tuner_v2_t;

/* ---- tuner v3: cost table in/out ---- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} dyn_tuner_v3_t;

/* ---- tuner v4: adds regBuff (ignored by design: not rank-identical) ---- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*destroy)(void* context);
} dyn_tuner_v4_t;

/* ---- tuner v5 / v6: commId, NVL domain info and tuning constants at init ---- */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} dyn_nvl_domain_info_v5_t;

#define DYN_NUM_HW_LINKS_V5 3
#define DYN_NUM_COMPCAPS_V5 4
#define DYN_NUM_TUNING_SCALES_V5 3
typedef struct {
  double baseLatencies[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  double hwLatencies[DYN_NUM_HW_LINKS_V5][DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  double llMaxBws[DYN_NUM_COMPCAPS_V5][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[DYN_NUM_COMPCAPS_V5][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[DYN_NUM_COMPCAPS_V5][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[DYN_NUM_COMPCAPS_V5][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[DYN_NUM_COMPCAPS_V5][DYN_NUM_TUNING_SCALES_V5];
} dyn_tuner_constants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, dyn_nvl_domain_info_v5_t* nvlDomainInfo,
                       dyn_tuner_constants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
} dyn_tuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, dyn_nvl_domain_info_v5_t* nvlDomainInfo,
                       dyn_tuner_constants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} dyn_tuner_v6_t;

/* ---- tuner v7 (NCCL 2.32.6): v6's callbacks; the constants gain a fifth compute-capability row ---- */
#define DYN_NUM_COMPCAPS_V7 5
typedef struct {
  double baseLatencies[DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  double hwLatencies[DYN_NUM_HW_LINKS_V5][DYN_NUM_ALGOS][DYN_NUM_PROTOS];
  double llMaxBws[DYN_NUM_COMPCAPS_V7][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[DYN_NUM_COMPCAPS_V7][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[DYN_NUM_COMPCAPS_V7][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[DYN_NUM_COMPCAPS_V7][DYN_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[DYN_NUM_COMPCAPS_V7][DYN_NUM_TUNING_SCALES_V5];
} dyn_tuner_constants_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, dyn_nvl_domain_info_v5_t* nvlDomainInfo,
                       dyn_tuner_constants_v7_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} dyn_tuner_v7_t;

/* ---- profiler v4..v7 ---- */
#define DYN_PROFILE_COLL (1 << 1)
#define DYN_PROFILE_KERNEL_CH (1 << 6)
#define DYN_PROFILE_KERNEL_PHASE (1 << 15) /* v7: kernel barrier phase sub-event of a KernelCh */
#define DYN_PROFILER_KERNEL_CH_STOP 22 /* ncclProfilerKernelChStop */
#define DYN_PROFILER_KERNEL_PHASE_STOP 31 /* v7: ncclProfilerKernelPhaseStop (args: kernelCh.pTimer) */
#define DYN_KERNEL_PHASES 3 /* v7 phaseId: 0 initial sync, 1 compute, 2 final sync */

typedef int dyn_profiler_event_state_t; /* ncclProfilerEventState_t (an enum: int-sized) */

/* The fields of the "coll" member of the descriptor union; identical prefix in v4, v5, v6. */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
} dyn_prof_coll_v4_t;

typedef struct {
  uint8_t channelId;
  uint64_t pTimer; /* GPU globaltimer at channel start */
} dyn_prof_kernel_ch_t;

/* v4 descriptor: type is uint8_t; the union is pointer-aligned (offset 24). */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    dyn_prof_coll_v4_t coll;
    dyn_prof_kernel_ch_t kernelCh;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int64_t id; void* data; } netPlugin;
  };
} dyn_prof_descr_v4_t;

typedef struct {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
} dyn_prof_coll_v5_t;

/* v5 and v6 descriptors: type is uint64_t; same union offset. v6 only adds union members
 * we never read (CE events), which can only make the union larger, never move it. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    dyn_prof_coll_v5_t coll;
    dyn_prof_kernel_ch_t kernelCh;
    struct { int64_t id; void* data; } netPlugin;
  };
} dyn_prof_descr_v5_t;

/* v7: v5's coll fields, then the kernel variant (symmetric kernels), the symmetric flag and the
 * user's per-call tag (0 = untagged).  One AMD fork's "v7" ends after isSymColl (no userTag):
 * profiler.h refuses to read this struct there. */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
  const char* kernelVariant; /* NULL unless isSymColl */
  bool isSymColl;
  uint64_t userTag;
} dyn_prof_coll_v7_t;

/* v7 KernelPhase descriptor: a phase of one channel's kernel; its parent is the KernelCh event. */
typedef struct {
  uint8_t channelId;
  uint8_t phaseId;
  const char* phaseName;
  uint64_t pTimer; /* GPU globaltimer at phase start; the stop comes as KernelPhaseStop's kernelCh.pTimer */
} dyn_prof_kernel_phase_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    dyn_prof_coll_v7_t coll;
    dyn_prof_kernel_ch_t kernelCh;
    dyn_prof_kernel_phase_t kernelPhase;
    struct { int64_t id; void* data; } netPlugin;
  };
} dyn_prof_descr_v7_t;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh; /* GPU globaltimer at channel stop */
} dyn_prof_state_args_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, dyn_prof_descr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, dyn_profiler_event_state_t eState,
                                   dyn_prof_state_args_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} dyn_profiler_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, dyn_prof_descr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, dyn_profiler_event_state_t eState,
                                   dyn_prof_state_args_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} dyn_profiler_v5_t; /* v6 has the same function table shape (its descriptor union is larger) */

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, dyn_prof_descr_v7_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, dyn_profiler_event_state_t eState,
                                   dyn_prof_state_args_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} dyn_profiler_v7_t; /* v7's state args keep v6's shape: a phase stop reuses kernelCh.pTimer */

#endif
