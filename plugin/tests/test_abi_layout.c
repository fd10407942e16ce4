/*
 * test_abi_layout.c -- include/dyn_nccl_abi.h against the layout of NCCL's plugin ABI.
 *
 * Every row below is a fact read in NCCL's public plugin headers (tuner ABI v2..v7:
 * src/include/plugin/tuner/tuner_v<N>.h; profiler ABI v4..v7: src/include/plugin/profiler/
 * profiler_v<N>.h; the event bits and states: src/include/plugin/nccl_profiler.h; algorithm and
 * protocol ids: src/include/plugin/nccl_tuner.h; ncclFunc_t: src/include/nccl_common.h): the
 * byte offset of a field NCCL and the plugin exchange, the size of a struct one side reads from
 * the other, or an integer value.  The numbers are NCCL's, not computed from our header, so a
 * header that drifts from NCCL does not compile.
 *
 * The offsets and sizes are those of LP64 Linux, the only targets the plugin ships for: x86_64
 * and aarch64 lay these structs out identically (8-byte pointers, size_t, long and uint64_t,
 * 4-byte int and enums, natural alignment).  `make -C plugin test` compiles this file for the
 * host, and cross-test compiles it for x86_64 and aarch64 (zig cc) and runs the aarch64 build
 * under qemu: both must print what the host build prints.
 *
 * Running it prints the table, one `kind NAME N` line per row (kind: offset, member_size, size, value);
 * tests/unit/sidecar/test_ctypes_abi.py reads those lines and checks the Python ctypes
 * declarations (sidecar/ctypes_abi.py) and NCCL's ids in dynamiccl/api/nccl.py against them, so
 * each number is written only here.
 */
#include <stdio.h>

#include "../include/dyn_nccl_abi.h"

_Static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(long) == 8 && sizeof(int) == 4,
               "the numbers below are LP64's (x86_64, aarch64)");

/* X(struct, member, offset): field offsets. */
#define DYN_ABI_OFFSETS(X)                                                          \
  /* tuner function tables, v2..v6: NCCL reads them from the exported symbols */    \
  X(dyn_tuner_v2_t, name, 0)                                                        \
  X(dyn_tuner_v2_t, init, 8)                                                        \
  X(dyn_tuner_v2_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v2_t, destroy, 24)                                                    \
  X(dyn_tuner_v3_t, name, 0)                                                        \
  X(dyn_tuner_v3_t, init, 8)                                                        \
  X(dyn_tuner_v3_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v3_t, destroy, 24)                                                    \
  X(dyn_tuner_v4_t, name, 0)                                                        \
  X(dyn_tuner_v4_t, init, 8)                                                        \
  X(dyn_tuner_v4_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v4_t, destroy, 24)                                                    \
  X(dyn_tuner_v5_t, name, 0)                                                        \
  X(dyn_tuner_v5_t, init, 8)                                                        \
  X(dyn_tuner_v5_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v5_t, finalize, 24)                                                   \
  X(dyn_tuner_v6_t, name, 0)                                                        \
  X(dyn_tuner_v6_t, init, 8)                                                        \
  X(dyn_tuner_v6_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v6_t, finalize, 24)                                                   \
  X(dyn_tuner_v6_t, getChunkSize, 32)                                               \
  X(dyn_tuner_v7_t, name, 0)                                                        \
  X(dyn_tuner_v7_t, init, 8)                                                        \
  X(dyn_tuner_v7_t, getCollInfo, 16)                                                \
  X(dyn_tuner_v7_t, finalize, 24)                                                   \
  X(dyn_tuner_v7_t, getChunkSize, 32)                                               \
  /* tuner v5/v6 init arguments (v6 uses v5's structs) */                           \
  X(dyn_nvl_domain_info_v5_t, nNvlDomains, 0)                                       \
  X(dyn_nvl_domain_info_v5_t, minRanksPerNvlDomain, 4)                              \
  X(dyn_nvl_domain_info_v5_t, maxRanksPerNvlDomain, 8)                              \
  X(dyn_tuner_constants_v5_t, baseLatencies, 0)                                     \
  X(dyn_tuner_constants_v5_t, hwLatencies, 168)                                     \
  X(dyn_tuner_constants_v5_t, llMaxBws, 672)                                        \
  X(dyn_tuner_constants_v5_t, perChMaxRingLL128Bws, 768)                            \
  X(dyn_tuner_constants_v5_t, perChMaxTreeLL128Bws, 864)                            \
  X(dyn_tuner_constants_v5_t, perChMaxTreeBws, 960)                                 \
  X(dyn_tuner_constants_v5_t, perChMaxNVLSTreeBws, 1056)                            \
  /* tuner v7 constants: five compute-capability rows of three scales each */       \
  X(dyn_tuner_constants_v7_t, baseLatencies, 0)                                     \
  X(dyn_tuner_constants_v7_t, hwLatencies, 168)                                     \
  X(dyn_tuner_constants_v7_t, llMaxBws, 672)                                        \
  X(dyn_tuner_constants_v7_t, perChMaxRingLL128Bws, 792)                            \
  X(dyn_tuner_constants_v7_t, perChMaxTreeLL128Bws, 912)                            \
  X(dyn_tuner_constants_v7_t, perChMaxTreeBws, 1032)                                \
  X(dyn_tuner_constants_v7_t, perChMaxNVLSTreeBws, 1152)                            \
  /* profiler function tables, v4..v6 (v6 has v5's shape) */                        \
  X(dyn_profiler_v4_t, name, 0)                                                     \
  X(dyn_profiler_v4_t, init, 8)                                                     \
  X(dyn_profiler_v4_t, startEvent, 16)                                              \
  X(dyn_profiler_v4_t, stopEvent, 24)                                               \
  X(dyn_profiler_v4_t, recordEventState, 32)                                        \
  X(dyn_profiler_v4_t, finalize, 40)                                                \
  X(dyn_profiler_v5_t, name, 0)                                                     \
  X(dyn_profiler_v5_t, init, 8)                                                     \
  X(dyn_profiler_v5_t, startEvent, 16)                                              \
  X(dyn_profiler_v5_t, stopEvent, 24)                                               \
  X(dyn_profiler_v5_t, recordEventState, 32)                                        \
  X(dyn_profiler_v5_t, finalize, 40)                                                \
  X(dyn_profiler_v7_t, name, 0)                                                     \
  X(dyn_profiler_v7_t, init, 8)                                                     \
  X(dyn_profiler_v7_t, startEvent, 16)                                              \
  X(dyn_profiler_v7_t, stopEvent, 24)                                               \
  X(dyn_profiler_v7_t, recordEventState, 32)                                        \
  X(dyn_profiler_v7_t, finalize, 40)                                                \
  /* event descriptors: v4 has an 8-bit type, v5 and v6 a 64-bit one; the union    \
   * starts at 24 in all three */                                                   \
  X(dyn_prof_descr_v4_t, type, 0)                                                   \
  X(dyn_prof_descr_v4_t, parentObj, 8)                                              \
  X(dyn_prof_descr_v4_t, rank, 16)                                                  \
  X(dyn_prof_descr_v4_t, coll, 24)                                                  \
  X(dyn_prof_descr_v4_t, kernelCh, 24)                                              \
  X(dyn_prof_descr_v5_t, type, 0)                                                   \
  X(dyn_prof_descr_v5_t, parentObj, 8)                                              \
  X(dyn_prof_descr_v5_t, rank, 16)                                                  \
  X(dyn_prof_descr_v5_t, coll, 24)                                                  \
  X(dyn_prof_descr_v5_t, kernelCh, 24)                                              \
  X(dyn_prof_descr_v7_t, type, 0)                                                   \
  X(dyn_prof_descr_v7_t, parentObj, 8)                                              \
  X(dyn_prof_descr_v7_t, rank, 16)                                                  \
  X(dyn_prof_descr_v7_t, coll, 24)                                                  \
  X(dyn_prof_descr_v7_t, kernelCh, 24)                                              \
  X(dyn_prof_descr_v7_t, kernelPhase, 24)                                           \
  /* the descriptor's coll member: v4's is a prefix of v5's (profiler.h reads a v5  \
   * one through the v4 type), v5 and v6 add parentGroup */                         \
  X(dyn_prof_coll_v4_t, seqNumber, 0)                                               \
  X(dyn_prof_coll_v4_t, func, 8)                                                    \
  X(dyn_prof_coll_v4_t, sendBuff, 16)                                               \
  X(dyn_prof_coll_v4_t, recvBuff, 24)                                               \
  X(dyn_prof_coll_v4_t, count, 32)                                                  \
  X(dyn_prof_coll_v4_t, root, 40)                                                   \
  X(dyn_prof_coll_v4_t, datatype, 48)                                               \
  X(dyn_prof_coll_v4_t, nChannels, 56)                                              \
  X(dyn_prof_coll_v4_t, nWarps, 57)                                                 \
  X(dyn_prof_coll_v4_t, algo, 64)                                                   \
  X(dyn_prof_coll_v4_t, proto, 72)                                                  \
  X(dyn_prof_coll_v5_t, seqNumber, 0)                                               \
  X(dyn_prof_coll_v5_t, func, 8)                                                    \
  X(dyn_prof_coll_v5_t, sendBuff, 16)                                               \
  X(dyn_prof_coll_v5_t, recvBuff, 24)                                               \
  X(dyn_prof_coll_v5_t, count, 32)                                                  \
  X(dyn_prof_coll_v5_t, root, 40)                                                   \
  X(dyn_prof_coll_v5_t, datatype, 48)                                               \
  X(dyn_prof_coll_v5_t, nChannels, 56)                                              \
  X(dyn_prof_coll_v5_t, nWarps, 57)                                                 \
  X(dyn_prof_coll_v5_t, algo, 64)                                                   \
  X(dyn_prof_coll_v5_t, proto, 72)                                                  \
  X(dyn_prof_coll_v5_t, parentGroup, 80)                                            \
  /* v7 coll: v5's fields, then kernelVariant, isSymColl, userTag (v4 prefix read   \
   * through the v4 type as for v5) */                                             \
  X(dyn_prof_coll_v7_t, seqNumber, 0)                                               \
  X(dyn_prof_coll_v7_t, func, 8)                                                    \
  X(dyn_prof_coll_v7_t, count, 32)                                                  \
  X(dyn_prof_coll_v7_t, datatype, 48)                                               \
  X(dyn_prof_coll_v7_t, nChannels, 56)                                              \
  X(dyn_prof_coll_v7_t, algo, 64)                                                   \
  X(dyn_prof_coll_v7_t, proto, 72)                                                  \
  X(dyn_prof_coll_v7_t, parentGroup, 80)                                            \
  X(dyn_prof_coll_v7_t, kernelVariant, 88)                                          \
  X(dyn_prof_coll_v7_t, isSymColl, 96)                                              \
  X(dyn_prof_coll_v7_t, userTag, 104)                                               \
  /* v7 KernelPhase: its start timestamp; the stop comes in kernelCh.pTimer */      \
  X(dyn_prof_kernel_phase_t, channelId, 0)                                          \
  X(dyn_prof_kernel_phase_t, phaseId, 1)                                            \
  X(dyn_prof_kernel_phase_t, phaseName, 8)                                          \
  X(dyn_prof_kernel_phase_t, pTimer, 16)                                            \
  /* KernelCh: GPU start timestamp; the state args of KernelChStop: the stop one */ \
  X(dyn_prof_kernel_ch_t, channelId, 0)                                             \
  X(dyn_prof_kernel_ch_t, pTimer, 8)                                                \
  X(dyn_prof_state_args_t, kernelCh.pTimer, 0)

/* X(struct, member, size): widths of the fields the plugin reads whose neighbours' offsets
 * would not reveal a wrong width (the descriptor's type is 8 bits in v4, 64 in v5/v6). */
#define DYN_ABI_MEMBER_SIZES(X)                      \
  X(dyn_prof_descr_v4_t, type, 1)                    \
  X(dyn_prof_descr_v5_t, type, 8)                    \
  X(dyn_prof_descr_v7_t, type, 8)                    \
  X(dyn_prof_coll_v7_t, isSymColl, 1)                \
  X(dyn_prof_coll_v7_t, userTag, 8)                  \
  X(dyn_prof_kernel_phase_t, channelId, 1)           \
  X(dyn_prof_kernel_phase_t, phaseId, 1)             \
  X(dyn_prof_kernel_phase_t, pTimer, 8)              \
  X(dyn_prof_descr_v4_t, rank, 4)                    \
  X(dyn_prof_descr_v5_t, rank, 4)                    \
  X(dyn_prof_coll_v4_t, count, 8)                    \
  X(dyn_prof_coll_v4_t, nChannels, 1)                \
  X(dyn_prof_coll_v4_t, nWarps, 1)                   \
  X(dyn_prof_coll_v5_t, count, 8)                    \
  X(dyn_prof_coll_v5_t, nChannels, 1)                \
  X(dyn_prof_coll_v5_t, nWarps, 1)                   \
  X(dyn_prof_kernel_ch_t, channelId, 1)              \
  X(dyn_prof_kernel_ch_t, pTimer, 8)                 \
  X(dyn_prof_state_args_t, kernelCh.pTimer, 8)

/* X(struct, size): sizes of what one side reads as a whole. The descriptors are not listed: our
 * header declares only the union members the plugin reads, and NCCL owns their memory. */
#define DYN_ABI_SIZES(X)                 \
  X(dyn_tuner_v2_t, 32)                  \
  X(dyn_tuner_v3_t, 32)                  \
  X(dyn_tuner_v4_t, 32)                  \
  X(dyn_tuner_v5_t, 32)                  \
  X(dyn_tuner_v6_t, 40)                  \
  X(dyn_tuner_v7_t, 40)                  \
  X(dyn_tuner_constants_v7_t, 1272)      \
  X(dyn_profiler_v7_t, 48)               \
  X(dyn_prof_coll_v7_t, 112)             \
  X(dyn_prof_kernel_phase_t, 24)         \
  X(dyn_nvl_domain_info_v5_t, 12)        \
  X(dyn_tuner_constants_v5_t, 1152)      \
  X(dyn_profiler_v4_t, 48)               \
  X(dyn_profiler_v5_t, 48)               \
  X(dyn_prof_coll_v4_t, 80)              \
  X(dyn_prof_coll_v5_t, 88)              \
  X(dyn_prof_kernel_ch_t, 16)            \
  X(dyn_prof_state_args_t, 8)            \
  X(dyn_profiler_event_state_t, 4)

/* X(name, value): integers the ABI carries. */
#define DYN_ABI_VALUES(X)                \
  X(DYN_NUM_FUNCS, 5)                    \
  X(DYN_NUM_ALGOS, 7)                    \
  X(DYN_NUM_PROTOS, 3)                   \
  X(DYN_ALGO_TREE, 0)                    \
  X(DYN_ALGO_RING, 1)                    \
  X(DYN_ALGO_COLLNET_DIRECT, 2)          \
  X(DYN_ALGO_COLLNET_CHAIN, 3)           \
  X(DYN_ALGO_NVLS, 4)                    \
  X(DYN_ALGO_NVLS_TREE, 5)               \
  X(DYN_ALGO_PAT, 6)                     \
  X(DYN_PROTO_LL, 0)                     \
  X(DYN_PROTO_LL128, 1)                  \
  X(DYN_PROTO_SIMPLE, 2)                 \
  X(DYN_PROFILE_COLL, 2)                 \
  X(DYN_PROFILE_KERNEL_CH, 64)           \
  X(DYN_PROFILER_KERNEL_CH_STOP, 22)     \
  X(DYN_PROFILE_KERNEL_PHASE, 32768)     \
  X(DYN_PROFILER_KERNEL_PHASE_STOP, 31)  \
  X(DYN_NUM_COMPCAPS_V7, 5)              \
  X(DYN_NCCL_SUBSYS_INIT, 1)             \
  X(DYN_NCCL_SUBSYS_TUNING, 64)          \
  X(DYN_NCCL_SUBSYS_PROFILE, 16384)      \
  X(NCCL_LOG_WARN, 2)                    \
  X(NCCL_LOG_INFO, 3)                    \
  X(ncclSuccess, 0)

#define DYN_CHECK_OFFSET(s, m, n) \
  _Static_assert(offsetof(s, m) == (n), #s "." #m " is at byte " #n " in NCCL's header");
#define DYN_CHECK_MEMBER_SIZE(s, m, n) \
  _Static_assert(sizeof(((s*)0)->m) == (n), #s "." #m " is " #n " bytes wide in NCCL's header");
#define DYN_CHECK_SIZE(s, n) _Static_assert(sizeof(s) == (n), "sizeof(" #s ") is " #n " in NCCL's header");
#define DYN_CHECK_VALUE(k, n) _Static_assert((k) == (n), #k " is " #n " in NCCL's header");
DYN_ABI_OFFSETS(DYN_CHECK_OFFSET)
DYN_ABI_MEMBER_SIZES(DYN_CHECK_MEMBER_SIZE)
DYN_ABI_SIZES(DYN_CHECK_SIZE)
DYN_ABI_VALUES(DYN_CHECK_VALUE)

#define DYN_PRINT_OFFSET(s, m, n) printf("offset %s.%s %d\n", #s, #m, (n));
#define DYN_PRINT_MEMBER_SIZE(s, m, n) printf("member_size %s.%s %d\n", #s, #m, (n));
#define DYN_PRINT_SIZE(s, n) printf("size %s %d\n", #s, (n));
#define DYN_PRINT_VALUE(k, n) printf("value %s %d\n", #k, (n));

int main(void) {
  DYN_ABI_OFFSETS(DYN_PRINT_OFFSET)
  DYN_ABI_MEMBER_SIZES(DYN_PRINT_MEMBER_SIZE)
  DYN_ABI_SIZES(DYN_PRINT_SIZE)
  DYN_ABI_VALUES(DYN_PRINT_VALUE)
  return 0;
}
