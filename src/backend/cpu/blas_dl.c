/* OpenBLAS through dlopen (see blas.h). */
#ifndef NEEDLE_BLAS_ACCELERATE
#define _POSIX_C_SOURCE 200809L
#define ND_BLAS_DL_IMPL
#include "backend/cpu/blas.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/dlib.h"
#include "core/status.h"

nd_blas_api nd_blas;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];
static int loaded;
/* a thread's thread-count wish made before the library was loaded */
static _Thread_local int pending_threads;

static const char *const names[] = {
#ifdef NEEDLE_OPENBLAS_PATH
    NEEDLE_OPENBLAS_PATH, /* the build's own library (e.g. the OpenMP one) */
#endif
#if defined(__APPLE__)
    "libopenblas.0.dylib",
    "libopenblas.dylib",
#else
    "libopenblas.so.0",
    "libopenblas.so",
#endif
};

static void load(void)
{
    static const nd_dlib_spec spec = {"OpenBLAS",
                                      "NEEDLE_LIBBLAS",
                                      names,
                                      sizeof names / sizeof *names,
                                      "apt-get install libopenblas0-openmp",
                                      NULL};
    const nd_dlib_sym syms[] = {
        {"cblas_sgemm", &nd_blas.sgemm},
        {"cblas_sgemv", &nd_blas.sgemv},
        {"openblas_set_num_threads", &nd_blas.set_num_threads},
        {"openblas_get_corename", &nd_blas.get_corename},
    };
    if (nd_dlib_load(&spec, syms, sizeof syms / sizeof *syms, load_error, sizeof load_error) == 0)
        __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
}

int nd_blas_load(void)
{
    pthread_once(&load_once, load);
    if (load_error[0])
        return nd_error(ND_EUNSUPPORTED, "%s", load_error);
    return ND_OK;
}

void nd_blas_ready(void)
{
    if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE) && nd_blas_load() != ND_OK) {
        fprintf(stderr, "needle: %s\n", load_error);
        exit(1);
    }
    if (pending_threads) {
        nd_blas.set_num_threads(pending_threads);
        pending_threads = 0;
    }
}

void nd_blas_describe(char *buf, size_t size)
{
    if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
        snprintf(buf, size, "OpenBLAS %s", nd_blas.get_corename());
    else
        snprintf(buf, size, "OpenBLAS");
}

void nd_blas_set_threads(int threads)
{
    if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
        nd_blas.set_num_threads(threads);
    else
        pending_threads = threads;
}
#else
typedef int nd_blas_dl_unused; /* Accelerate is linked: nothing to load */
#endif
