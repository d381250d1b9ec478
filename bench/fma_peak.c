/* Measures this machine's fp32 FMA peak: per thread, 12 independent
 * 8-wide (AVX2) or 16-wide (AVX-512) FMA chains (enough to cover FMA
 * latency x throughput on current x86 cores), all threads at once. The
 * peak is the faster of the two: on CPUs with two 512-bit FMA units
 * AVX-512 doubles it; where AVX-512 is double-pumped (AMD Zen 4) it does
 * not. Build: see bench/README.md. */
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

__attribute__((target("avx512f"))) static float run512(long iters)
{
    __m512 a[12], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s) / 16.0f;
}

static double measure(int wide, long iters, int threads, float *sink)
{
    double t0 = omp_get_wtime();
    float acc = 0;
#pragma omp parallel reduction(+ : acc)
    acc += wide ? run512(iters) : run(iters);
    double dt = omp_get_wtime() - t0;
    *sink += acc;
    return 2.0 * (wide ? 16 : 8) * 12 * (double)iters * threads / dt / 1e9;
}

int main(void)
{
    long iters = 200000000;
    int threads = omp_get_max_threads();
    float sink = 0;
    double g256 = measure(0, iters, threads, &sink), g512 = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        g512 = measure(1, iters / 2, threads, &sink);
    double peak = g512 > g256 ? g512 : g256;
    printf("  avx2 8-wide FMA: %.1f GFLOP/s", g256);
    if (g512 > 0)
        printf("   avx512 16-wide FMA: %.1f GFLOP/s", g512);
    printf("\n");
    printf("fp32 FMA peak: %.1f GFLOP/s on %d threads (%.1f per thread)  [sink %g]\n", peak,
           threads, peak / threads, sink);
    return 0;
}
