/* In-run fp32 FMA peak probe for `needle bench`.
 *
 * Shared machines drift by 2x within minutes, so "share of peak" is only
 * meaningful when the peak is measured in the same run, next to the timed
 * work. Per thread: 12 independent FMA chains (covers latency x throughput
 * on current x86 cores), 16-wide where AVX-512 exists, else 8-wide; on
 * aarch64, 4-wide NEON (Advanced SIMD is part of ARMv8-A: always there).
 * Other CPUs report no probe (0 GFLOP/s, isa "none"). */
#include <stdlib.h>

#include "cli/cli.h"
#include "core/threadpool.h"

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

/* One burst of `chunk` iterations of fn on every thread. */
typedef struct {
    float (*fn)(long iters);
    long chunk;
    float *acc; /* one result per thread */
    int team;
} fma_burst;

static void fma_burst_share(void *p, int tid, int team)
{
    fma_burst *b = p;
    if (tid == 0)
        b->team = team;
    b->acc[tid] = b->fn(b->chunk);
}

/* GFLOP/s of the fastest of several short bursts (the probe's own noise) */
static __attribute__((unused)) double fma_probe(double seconds, float (*fn)(long),
                                                double flops_per_chain_iter)
{
    long chunk = 1 << 20, rounds = 0;
    double best = 0, t_start = nd_wtime();
    fma_burst b = {fn, chunk, calloc((size_t)nd_get_threads(), sizeof(float)), 1};
    if (!b.acc)
        return 0.0;
    while (nd_wtime() - t_start < seconds || rounds < 3) {
        double t0 = nd_wtime();
        nd_parallel_region(0, fma_burst_share, &b);
        double dt = nd_wtime() - t0, g = flops_per_chain_iter * (double)chunk * b.team / dt / 1e9;
        for (int t = 0; t < b.team; t++)
            bench_sink += b.acc[t];
        best = g > best ? g : best;
        rounds++;
    }
    free(b.acc);
    return best;
}

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
    return fma_probe(seconds, wide ? fma_chains512 : fma_chains256, 2.0 * (wide ? 16 : 8) * 12);
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
    return fma_probe(seconds, fma_chains128, 2.0 * 4 * 12);
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
