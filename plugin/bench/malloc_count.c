/* LD_PRELOAD allocator shim: counts every malloc/calloc/realloc/free/posix_memalign/aligned_alloc.
 * The benchmark reads dyn_bench_alloc_count() (found with dlsym) around its hot loops. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void __libc_free(void*);
extern void* __libc_memalign(size_t, size_t);

static _Atomic uint64_t g_count;

__attribute__((visibility("default"))) uint64_t dyn_bench_alloc_count(void) { return atomic_load(&g_count); }

void* malloc(size_t n) { atomic_fetch_add(&g_count, 1); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { atomic_fetch_add(&g_count, 1); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { atomic_fetch_add(&g_count, 1); return __libc_realloc(p, n); }
void free(void* p) { if (p) atomic_fetch_add(&g_count, 1); __libc_free(p); }
void* aligned_alloc(size_t al, size_t n) { atomic_fetch_add(&g_count, 1); return __libc_memalign(al, n); }
int posix_memalign(void** out, size_t al, size_t n) {
  atomic_fetch_add(&g_count, 1);
  *out = __libc_memalign(al, n);
  return *out ? 0 : 12;
}
