/* In-run fp32 FMA peak probe for `needle bench`.
 *
 * Shared machines drift by 2x within minutes, so "share of peak" is only
 * meaningful when the peak is measured in the same run, next to the timed
 * work. Per thread: 12 independent FMA chains (covers latency x throughput
 * on current x86 cores), 16-wide where AVX-512 exists, else 8-wide; on
 * aarch64, 4-wide NEON (Advanced SIMD is part of ARMv8-A: always there).
 * Other CPUs report no probe (0 GFLOP/s, isa "none"). */
#include "core/omp_compat.h"

#include "cli/cli.h"

/* 12 named accumulators: an array indexed in a loop may be left in memory
 * at -O2, which would time loads and stores instead of FMAs. */
#define FMA12(fma)                                                                                 \
    do {                                                                                           \
        a0 = fma(a0, m, c), a1 = fma(a1, m, c), a2 = fma(a2, m, c), a3 = fma(a3, m, c);            \
        a4 = fma(a4, m, c), a5 = fma(a5, m, c), a6 = fma(a6, m, c), a7 = fma(a7, m, c);            \
        a8 = fma(a8, m, c), a9 = fma(a9, m, c), a10 = fma(a10, m, c), a11 = fma(a11, m, c);        \
    } while (0)
#define SUM12() ((((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) + ((a8 + a9) + (a10 + a11)))

static volatile float bench_sink;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static float fma_chains256(long iters)
{
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2),
           a3 = _mm256_set1_ps(3), a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5),
           a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7), a8 = _mm256_set1_ps(8),
           a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (long k = 0; k < iters; k++)
        FMA12(_mm256_fmadd_ps);
    __m256 s = SUM12();
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

__attribute__((target("avx512f"))) static float fma_chains512(long iters)
{
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
           a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
           a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
           a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long k = 0; k < iters; k++)
        FMA12(_mm512_fmadd_ps);
    return _mm512_reduce_add_ps(SUM12());
}

double bench_fma_peak_width(double seconds, int width)
{
    __builtin_cpu_init();
    if (width == 16 ? !__builtin_cpu_supports("avx512f")
                    : !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return 0.0;
    int wide = width == 16;
    long chunk = 1 << 20, rounds = 0;
    double flops_per_round = 2.0 * (wide ? 16 : 8) * 12 * (double)chunk;
    double best = 0, t_start = omp_get_wtime();
    /* several short bursts; keep the fastest (the probe's own noise) */
    while (omp_get_wtime() - t_start < seconds || rounds < 3) {
        int team = 1;
        float acc = 0;
        double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : acc)
        {
#pragma omp single
            team = omp_get_num_threads();
            acc += wide ? fma_chains512(chunk) : fma_chains256(chunk);
        }
        double dt = omp_get_wtime() - t0, g = flops_per_round * team / dt / 1e9;
        bench_sink += acc;
        best = g > best ? g : best;
        rounds++;
    }
    return best;
}

double bench_fma_peak(double seconds, const char **isa)
{
    double g = bench_fma_peak_width(seconds, 16);
    *isa = "avx512";
    if (g <= 0) {
        g = bench_fma_peak_width(seconds, 8);
        *isa = g > 0 ? "avx2" : "none";
    }
    return g;
}
#elif defined(__aarch64__)
#include <arm_neon.h>

static float fma_chains128(long iters)
{
    float32x4_t m = vdupq_n_f32(0.999999f), c = vdupq_n_f32(1e-7f);
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(1), a2 = vdupq_n_f32(2), a3 = vdupq_n_f32(3),
                a4 = vdupq_n_f32(4), a5 = vdupq_n_f32(5), a6 = vdupq_n_f32(6), a7 = vdupq_n_f32(7),
                a8 = vdupq_n_f32(8), a9 = vdupq_n_f32(9), a10 = vdupq_n_f32(10),
                a11 = vdupq_n_f32(11);
    /* vfmaq_f32(acc, x, y) = acc + x*y: acc*m + c spelled as c + acc*m */
#define NEON_FMA(acc, mul, add) vfmaq_f32(add, acc, mul)
    for (long k = 0; k < iters; k++)
        FMA12(NEON_FMA);
#undef NEON_FMA
    return vaddvq_f32(SUM12());
}

double bench_fma_peak_width(double seconds, int width)
{
    if (width != 4)
        return 0.0;
    long chunk = 1 << 20, rounds = 0;
    double flops_per_round = 2.0 * 4 * 12 * (double)chunk;
    double best = 0, t_start = omp_get_wtime();
    while (omp_get_wtime() - t_start < seconds || rounds < 3) {
        int team = 1;
        float acc = 0;
        double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : acc)
        {
#pragma omp single
            team = omp_get_num_threads();
            acc += fma_chains128(chunk);
        }
        double dt = omp_get_wtime() - t0, g = flops_per_round * team / dt / 1e9;
        bench_sink += acc;
        best = g > best ? g : best;
        rounds++;
    }
    return best;
}

double bench_fma_peak(double seconds, const char **isa)
{
    double g = bench_fma_peak_width(seconds, 4);
    *isa = g > 0 ? "neon" : "none";
    return g;
}
#else
double bench_fma_peak_width(double seconds, int width)
{
    (void)seconds;
    (void)width;
    (void)bench_sink;
    return 0.0;
}

double bench_fma_peak(double seconds, const char **isa)
{
    (void)seconds;
    *isa = "none";
    return 0.0;
}
#endif
