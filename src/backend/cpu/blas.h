/* The cblas interface, from whichever BLAS CMake picked: Apple's Accelerate
 * (NEEDLE_BLAS_ACCELERATE; ACCELERATE_NEW_LAPACK selects its current cblas
 * headers) or OpenBLAS (the default). Also the two calls that are not
 * cblas: the name of the BLAS for progress lines, and its thread count. */
#ifndef ND_CPU_BLAS_H
#define ND_CPU_BLAS_H

#include <stdio.h>

#ifdef NEEDLE_BLAS_ACCELERATE
#include <Accelerate/Accelerate.h>

static inline void nd_blas_describe(char *buf, size_t size)
{
    snprintf(buf, size, "Accelerate");
}

/* Accelerate sizes its own threading; our kernels call it one block per
 * thread (gemm_split) either way. */
static inline void nd_blas_set_threads(int threads)
{
    (void)threads;
}
#else
#include <cblas.h>

static inline void nd_blas_describe(char *buf, size_t size)
{
    snprintf(buf, size, "OpenBLAS %s", openblas_get_corename());
}

static inline void nd_blas_set_threads(int threads)
{
    openblas_set_num_threads(threads);
}
#endif

#endif
