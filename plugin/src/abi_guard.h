/*
 * abi_guard.h -- is the profiler ABI v7 that NCCL handed us the layout this build reads?
 * Part of plugin.c's unity build (profiler.h).
 *
 * NCCL's profiler v7 (2.31.2) passes no size or version field with a descriptor, so the plugin
 * cannot ask NCCL which "v7" it speaks.  One AMD fork (RCCL) publishes a "v7" whose coll, collApi,
 * p2pApi and ceColl members lack userTag: reading coll.userTag there reads 8 bytes past its
 * descriptor.  What is checked, and what happens:
 *
 *  1. At init: is a fork's host library in the process?  dl_iterate_phdr lists every loaded
 *     object, RTLD_LOCAL ones included; a basename starting with "librccl" is RCCL.  Then the
 *     v7 profiler asks NCCL for no event (mask 0), records nothing and reports no profiler ABI
 *     to the sidecar: nothing is measured, NCCL's own choice (and the table) stand.
 *  2. On every Coll event: the fields before userTag must hold what NVIDIA's v7 puts there --
 *     isSymColl is a bool (byte 0 or 1), kernelVariant is set exactly when isSymColl is (NCCL
 *     names the symmetric kernel variant, NULL otherwise).  A descriptor that breaks this is a
 *     layout we do not know: the communicator's profiler reads no Coll descriptor from then on (one
 *     warning through NCCL's logger) and never touches that one's userTag; the collectives it read
 *     before complete as usual (their KernelCh/KernelPhase events carry our own handles).
 *
 * The tuner v7 needs no guard: its callbacks are v6's, and the constants (the only struct whose
 * size changed) are passed through untouched; getCollInfo bounds every write by numAlgo/numProto.
 */
#ifndef DYN_ABI_GUARD_H
#define DYN_ABI_GUARD_H

#include <link.h>
#include <string.h>
#include "../include/dyn_nccl_abi.h"

#define DYN_FORK_LIB_PREFIX "librccl"

static int dyn_phdr_is_fork(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size, (void)data;
  const char* path = info->dlpi_name;
  if (!path || !*path) return 0;
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  return strncmp(base, DYN_FORK_LIB_PREFIX, sizeof(DYN_FORK_LIB_PREFIX) - 1) == 0;
}

/* 1 if a NCCL fork with a different profiler v7 layout is loaded in this process. */
static int dyn_fork_loaded(void) { return dl_iterate_phdr(dyn_phdr_is_fork, NULL) != 0; }

/* 1 if a v7 Coll descriptor's fields before userTag look like NVIDIA NCCL's v7 (see 2. above). */
static inline int dyn_coll_v7_ok(const dyn_prof_coll_v7_t* coll) {
  uint8_t sym;
  memcpy(&sym, &coll->isSymColl, 1); /* read as a byte: a bool holding 2..255 is undefined in C */
  if (sym > 1) return 0;
  return sym ? coll->kernelVariant != NULL : coll->kernelVariant == NULL;
}

#endif
