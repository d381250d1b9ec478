/* Zeroed allocations for the big flat buffers (weights, activations,
 * gradients). Release with free(). */
#ifndef ND_MEM_H
#define ND_MEM_H

#include <stddef.h>

/* calloc(n, size); blocks of 8 MB and more are 2 MB-aligned and offered to
 * transparent huge pages. NULL on overflow or when memory runs out. */
void *nd_calloc_big(size_t n, size_t size);

/* Map the pages under [p, p + bytes) now, writable, in one system call
 * (Linux's MADV_POPULATE_WRITE), where a buffer about to be written would
 * otherwise take a page fault per 4 KB page: under virtualisation a fault
 * costs ~15 us, a 256-token prompt's first KV rows ~1,000 of them. Advice
 * only: where the call is missing or fails, the pages fault in as before. */
void nd_prefault(void *p, size_t bytes);

/* getrusage's ru_maxrss in MB: Linux counts kilobytes, macOS bytes. */
static inline double nd_maxrss_mb(long maxrss)
{
#ifdef __APPLE__
    return (double)maxrss / (1024.0 * 1024.0);
#else
    return (double)maxrss / 1024.0;
#endif
}

#endif
