/* Measures this machine's fp32 FMA peak: per thread, 12 independent
 * 8-wide FMA chains (enough to cover FMA latency x throughput on current
 * x86 cores), all threads at once. Build: see bench/README.md. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

__attribute__((target("avx2,fma"))) static float run(long iters)
{
    __m256 a[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

int main(void)
{
    long iters = 200000000;
    int threads = omp_get_max_threads();
    float sink = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sink)
    sink += run(iters);
    double dt = omp_get_wtime() - t0;
    double flops = 2.0 * 8 * 12 * (double)iters * threads;
    printf("fp32 FMA peak: %.1f GFLOP/s on %d threads (%.1f per thread)  [sink %g]\n",
           flops / dt / 1e9, threads, flops / dt / 1e9 / threads, sink);
    return 0;
}
