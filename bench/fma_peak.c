/* Prints this machine's fp32 FMA peak at both x86 vector widths (NEON's
 * 4-wide on aarch64), all threads at once (the probe `needle bench` runs before every timed
 * iteration: src/cli/bench_peak.c). The peak is the faster of the two: on
 * CPUs with full-width 512-bit FMA units AVX-512 doubles it; where AVX-512
 * is double-pumped (AMD Zen 4) it does not. Built by CMake as
 * build/fma_peak. */
#include <stdio.h>

#include "cli/cli.h"
#include "core/threadpool.h"

int main(void)
{
#if defined(__aarch64__)
    double peak = bench_fma_peak_width(2.0, 4);
    printf("  neon 4-wide FMA: %.1f GFLOP/s\n", peak);
#else
    double g256 = bench_fma_peak_width(2.0, 8), g512 = bench_fma_peak_width(2.0, 16);
    double peak = g512 > g256 ? g512 : g256;
    printf("  avx2 8-wide FMA: %.1f GFLOP/s", g256);
    if (g512 > 0)
        printf("   avx512 16-wide FMA: %.1f GFLOP/s", g512);
    printf("\n");
#endif
    int threads = nd_get_threads();
    printf("fp32 FMA peak: %.1f GFLOP/s on %d threads (%.1f per thread)\n", peak, threads,
           peak / threads);
    return peak > 0 ? 0 : 1;
}
