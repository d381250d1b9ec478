/* Zeroed allocations for the big flat buffers (weights, activations,
 * gradients). Release with free(). */
#ifndef ND_MEM_H
#define ND_MEM_H

#include <stddef.h>

/* calloc(n, size); blocks of 8 MB and more are 2 MB-aligned and offered to
 * transparent huge pages. NULL on overflow or when memory runs out. */
void *nd_calloc_big(size_t n, size_t size);

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
