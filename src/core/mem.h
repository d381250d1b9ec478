/* Zeroed allocations for the big flat buffers (weights, activations,
 * gradients). Release with free(). */
#ifndef ND_MEM_H
#define ND_MEM_H

#include <stddef.h>

/* calloc(n, size); blocks of 8 MB and more are 2 MB-aligned and offered to
 * transparent huge pages. NULL on overflow or when memory runs out. */
void *nd_calloc_big(size_t n, size_t size);

#endif
