/* bench_util.h -- helpers shared by the plugin benchmarks (bench_plugin.c, bench_profiler.c). */
#ifndef DYN_BENCH_UTIL_H
#define DYN_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>
#include "../include/dyn_shm.h"

static uint8_t* g_map; /* the benchmark's mapping of the shared-memory file */

static void drain_ring(void) { /* stand-in for the sidecar so the ring never fills */
  for (int i = 0; i < DYN_MAX_PROCS; i++) {
    dyn_proc_hdr_t* p = (dyn_proc_hdr_t*)(g_map + DYN_PROCS_OFF + (size_t)i * DYN_PROC_SLOT_SIZE);
    p->tail = p->head;
  }
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

#endif
