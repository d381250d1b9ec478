/* Small scalar kernels shared by the CPU backend and the unit tests: the
 * plain, obviously-correct definitions of the SAN's special pieces. */
#ifndef ND_CPU_KERNELS_H
#define ND_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "backend/backend.h"

#define SAN_SINKHORN_ROUNDS 20
#define SAN_ENGRAM_SEED 0x9E3779B9u
#define SAN_ENGRAM_PRIME 0x01000193u

static inline float san_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float san_silu(float x) { return x * san_sigmoid(x); }

/* Upstream's Walsh matrix is float32 (+-1) / sqrt(n): the scale is the
 * float32 rounding of 1/sqrt(n). */
static inline float san_walsh_scale(int n) { return 1.0f / (float)sqrt((double)n); }

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

/* In place: M (n x n logits) -> exp of `rounds` alternating row then
 * column log-normalisations. */
void san_sinkhorn(float *M, int n, int rounds);

void cpu_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, int B, int T, int H, int G, int hd);

#endif
