/* Kernels stream through weight and activation buffers of hundreds of MB
 * with row strides of kilobytes; with 4 KB pages the TLB misses (dear under
 * virtualisation) made the forward GEMMs 2.5x slower than the same GEMMs on
 * reused buffers. So big blocks are 2 MB-aligned and offered to
 * transparent huge pages (Linux's default "madvise" mode only uses them
 * where asked). */
#define _DEFAULT_SOURCE /* madvise */
#include "core/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ND_BIG_MIN ((size_t)8 << 20)
#define ND_BIG_ALIGN ((size_t)2 << 20)

void *nd_calloc_big(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    size_t bytes = n * size;
    if (bytes < ND_BIG_MIN)
        return calloc(1, bytes ? bytes : 1);
    void *p = NULL;
    if (posix_memalign(&p, ND_BIG_ALIGN, bytes))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
    memset(p, 0, bytes);
    return p;
}

void nd_prefault(void *p, size_t bytes)
{
#ifdef MADV_POPULATE_WRITE
    static long page;
    if (!page)
        page = sysconf(_SC_PAGESIZE);
    if (!p || !bytes || page <= 0)
        return;
    uintptr_t a = (uintptr_t)p & ~((uintptr_t)page - 1);
    uintptr_t e = ((uintptr_t)p + bytes + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    madvise((void *)a, e - a, MADV_POPULATE_WRITE); /* pages stay as they are: no data changes */
#else
    (void)p;
    (void)bytes;
#endif
}
