/* Small scalar kernels shared by the CPU backend and the unit tests: the
 * plain, obviously-correct definitions of the SAN's special pieces. */
#ifndef ND_CPU_KERNELS_H
#define ND_CPU_KERNELS_H

#include <math.h>
#include "core/threadpool.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "core/fastmath.h"
#include "model/constants.h"

/* rows per vectorised group in the SoA kernels (Sinkhorn, Hadamard MLP):
 * one AVX-512 vector of floats */
#define SK_W 16
/* queries per attention work block (forward and backward use the same
 * blocks, so the backward recomputes the very same score GEMMs) */
#define SAN_ATTN_QBLOCK 64

/* Dot product with 32 independent partial sums: a single running sum is
 * one chain of dependent adds (a few flops per cycle at best), while the
 * partial sums vectorise into independent accumulators. Reduced in a fixed
 * pairwise order, so the result depends only on the inputs. */
static inline float san_dot(const float *a, const float *b, int n)
{
    float acc[32] = {0}, tail = 0.0f;
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++)
            acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        tail += a[i] * b[i];
    for (int w = 16; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return acc[0] + tail;
}

static inline float san_sigmoid(float x)
{
    return 1.0f / (1.0f + san_expf(-x));
}
static inline float san_silu(float x)
{
    return x * san_sigmoid(x);
}

/* Upstream's Walsh matrix is float32 (+-1) / sqrt(n): the scale is the
 * float32 rounding of 1/sqrt(n). */
static inline float san_walsh_scale(int n)
{
    return 1.0f / (float)sqrt((double)n);
}

/* In-place fast Walsh-Hadamard transform of length n (power of two) in
 * Sylvester order, times `scale`. */
static inline void san_fwht(float *x, int n, float scale)
{
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += h << 1)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < n; i++)
        x[i] *= scale;
}

/* san_fwht on one row, with SIMD where the CPU has it (cpu_fwht_x86.c;
 * NEEDLE_FWHT_REF=1 keeps the plain loops): the same bits */
void cpu_fwht_row(float *x, int n, float scale);

/* san_fwht on SK_W vectors at once, stored side by side (element i of
 * vector k at X[i * SK_W + k]): the same float operations per vector, but
 * every butterfly is one full-width vector operation, including the first
 * stages whose pairs sit 1, 2, 4 elements apart in a single row. */
static inline void san_fwht_soa(float *X, int n, float scale)
{
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += h << 1)
            for (int j = i; j < i + h; j++) {
                float *a = X + (size_t)j * SK_W, *b = X + (size_t)(j + h) * SK_W;
                for (int k = 0; k < SK_W; k++) {
                    float p = a[k], q = b[k];
                    a[k] = p + q;
                    b[k] = p - q;
                }
            }
    for (int i = 0; i < n * SK_W; i++)
        X[i] *= scale;
}

/* Engram hash of table k (order `order`) at position t of one sequence. */
static inline uint32_t san_engram_index(const int32_t *seq, int t, int order, int k, int slots)
{
    uint32_t acc = SAN_ENGRAM_SEED * (uint32_t)(k + 1);
    for (int j = 0; j < order; j++) {
        uint32_t tok = t - j >= 0 ? (uint32_t)seq[t - j] : 0u;
        acc = (acc ^ tok) * SAN_ENGRAM_PRIME;
    }
    acc ^= acc >> 15;
    return acc % (uint32_t)slots;
}

/* The same hash from the previous tokens themselves: hist[j] is the token
 * j steps back (0 before the sequence start). */
static inline uint32_t san_engram_index_hist(const uint32_t *hist, int order, int k, int slots)
{
    uint32_t acc = SAN_ENGRAM_SEED * (uint32_t)(k + 1);
    for (int j = 0; j < order; j++)
        acc = (acc ^ hist[j]) * SAN_ENGRAM_PRIME;
    acc ^= acc >> 15;
    return acc % (uint32_t)slots;
}

/* In place: M (n x n logits) -> exp of `rounds` alternating row then
 * column log-normalisations. */
void san_sinkhorn(float *M, int n, int rounds);
/* The same on `rows` consecutive n x n matrices (cpu_sinkhorn.c). */
void san_sinkhorn_rows(float *M, long rows, int n, int rounds);
/* Matrices per vectorised Sinkhorn group, and one half-round on a group in
 * SoA form (see cpu_sinkhorn.c). */
void san_sinkhorn_halfstep(float *Z, float *E, int n, int rowstep);

/* Dot products keep DOT_LANES independent partial sums. Without
 * -ffast-math the compiler may not reorder a float accumulator, and a single
 * 8-wide chain is bound by the add latency (one vector per ~3 cycles); 32
 * lanes are two zmm (four ymm) chains kept in registers, which is as fast as
 * the loads allow here (64 measured no faster). The lanes are then added
 * pairwise in a fixed order, so the result depends only on the inputs, not
 * on the thread count or alignment. */
#define DOT_LANES 32

/* Sum of w (a power of two) partial sums, pairwise by halving, in place */
static inline float lanes_sum(float *a, int w)
{
    for (w /= 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            a[j] += a[j + w];
    return a[0];
}

static inline float fdot(const float *a, const float *b, int n)
{
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int j = 0; j < DOT_LANES; j++)
            acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++)
        acc[j] += a[i] * b[i];
    return lanes_sum(acc, DOT_LANES);
}

/* sum_i a_i * (1 + w_i) * b_i, same scheme */
static inline float fdotw(const float *a, const float *w, const float *b, int n)
{
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int j = 0; j < DOT_LANES; j++)
            acc[j] += a[i + j] * (1.0f + w[i + j]) * b[i + j];
    for (int j = 0; i < n; i++, j++)
        acc[j] += a[i] * (1.0f + w[i]) * b[i];
    return lanes_sum(acc, DOT_LANES);
}

/* calloc that aborts: the op table has no error path */
void *cpu_xalloc(size_t bytes);

/* hada3_mix(_backward) plans made so far (cpu_hada3.c caches them per
 * offset table; tests count the misses) */
long cpu_hada3_plans_made(void);

/* The CPU backend's ops, one per entry of backend/ops.def (semantics
 * there): cpu_<name> in cpu_backend.c, cpu_backward.c, cpu_attention.c,
 * cpu_lanes_backward.c. */
#define ND_OP(name, kind, ...) void cpu_##name(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__));
#include "backend/ops.def"
#undef ND_OP

#endif
