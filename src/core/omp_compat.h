/* OpenMP or not. With OpenMP (-fopenmp defines _OPENMP) this is <omp.h>.
 * Without it (CMake -DNEEDLE_OPENMP=OFF, e.g. Apple clang with no libomp)
 * the pragmas are ignored and the omp_* calls the code makes behave as a
 * one-thread team: every parallel region runs once, on the caller. */
#ifndef ND_OMP_COMPAT_H
#define ND_OMP_COMPAT_H

#ifdef _OPENMP
#include <omp.h>
#else
#include <time.h>

static inline int omp_get_max_threads(void)
{
    return 1;
}

static inline int omp_get_num_threads(void)
{
    return 1;
}

static inline int omp_get_thread_num(void)
{
    return 0;
}

static inline int omp_in_parallel(void)
{
    return 0;
}

static inline void omp_set_num_threads(int n)
{
    (void)n;
}

/* seconds since an arbitrary origin (C11 timespec_get: no POSIX feature
 * macro needed before the first <time.h>) */
static inline double omp_get_wtime(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

#endif
