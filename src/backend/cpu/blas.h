/* The cblas interface, from whichever BLAS CMake picked: Apple's Accelerate
 * (NEEDLE_BLAS_ACCELERATE; ACCELERATE_NEW_LAPACK selects its current cblas
 * headers) or OpenBLAS (the default). Also the two calls that are not
 * cblas: the name of the BLAS for progress lines, and its thread count.
 *
 * OpenBLAS is loaded on first use (dlopen, blas_dl.c) instead of linked:
 * its start-up (CPU probing, buffers) costs ~3.7 MB of resident memory in
 * every process, and the quantised engine (`needle run`, the C ABI) never
 * calls it. Training and the float paths load it at their first product. */
#ifndef ND_CPU_BLAS_H
#define ND_CPU_BLAS_H

#include <stddef.h>
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

static inline int nd_blas_load(void)
{
    return 0;
}
#else
#include <cblas.h>

typedef struct {
    void (*sgemm)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint,
                  blasint, float, const float *, blasint, const float *, blasint, float, float *,
                  blasint);
    void (*sgemv)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, blasint, blasint, float, const float *,
                  blasint, const float *, blasint, float, float *, blasint);
    void (*set_num_threads)(int);
    char *(*get_corename)(void);
} nd_blas_api;

extern nd_blas_api nd_blas;

/* Load OpenBLAS once (thread-safe): $NEEDLE_LIBBLAS (a path or soname) when
 * set, else the library CMake found, else the platform soname. ND_OK, or
 * ND_EUNSUPPORTED with a message naming what could not be loaded. */
int nd_blas_load(void);

/* The products below load OpenBLAS if needed; a BLAS that cannot be loaded
 * there ends the process with nd_blas_load's message (callers that want a
 * clean error call nd_blas_load first: the CPU backend's progress line). */
void nd_blas_ready(void);

/* "OpenBLAS <core>" once loaded, "OpenBLAS" before. */
void nd_blas_describe(char *buf, size_t size);

/* Applies to the calling thread (OpenBLAS's OpenMP build reads the caller's
 * OpenMP setting); before the library is loaded the wish is kept per thread
 * and applied at that thread's first product. */
void nd_blas_set_threads(int threads);

#ifndef ND_BLAS_DL_IMPL
#undef cblas_sgemm
#undef cblas_sgemv
#define cblas_sgemm(...) (nd_blas_ready(), nd_blas.sgemm(__VA_ARGS__))
#define cblas_sgemv(...) (nd_blas_ready(), nd_blas.sgemv(__VA_ARGS__))
#endif
#endif

#endif
