/* Sinkhorn normalisation of the hyper-connection mixing matrices.
 *
 * Every token row has its own small n x n matrix (n = lanes, 4 in needle2)
 * and 20 rounds of log-space row/column normalisation: per row that is
 * 160 log-sum-exps over 4 numbers, far too little work to vectorise inside
 * one matrix. So rows are processed SK_W at a time in structure-of-arrays
 * form (element i of SK_W matrices side by side), and every loop below runs
 * over those SK_W independent matrices: plain arithmetic (san_expf,
 * san_logf) that the compiler turns into full-width vector code. Each lane
 * performs exactly the float operations of the one-matrix definition. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

/* One half-round on SK_W matrices in SoA form Z[i * SK_W + k] (element i of
 * matrix k): log-normalise each row (rowstep) or column. If E is not NULL it
 * receives this step's softmax exp(y) for the step's output y, which is all
 * the backward needs. */
void san_sinkhorn_halfstep(float *Z, float *E, int n, int rowstep)
{
    for (int a = 0; a < n; a++) {
        int base = rowstep ? a * n : a, stp = rowstep ? 1 : n;
        float mx[SK_W], s[SK_W], lse[SK_W], inv[SK_W];
        const float *p0 = Z + (size_t)base * SK_W;
        for (int k = 0; k < SK_W; k++)
            mx[k] = p0[k];
        for (int b = 1; b < n; b++) {
            const float *p = Z + (size_t)(base + b * stp) * SK_W;
            for (int k = 0; k < SK_W; k++)
                mx[k] = p[k] > mx[k] ? p[k] : mx[k];
        }
        for (int k = 0; k < SK_W; k++)
            s[k] = 0.0f;
        for (int b = 0; b < n; b++) {
            const float *p = Z + (size_t)(base + b * stp) * SK_W;
            float *q = E ? E + (size_t)(base + b * stp) * SK_W : NULL;
            for (int k = 0; k < SK_W; k++) {
                float e = san_expf(p[k] - mx[k]);
                if (q)
                    q[k] = e;
                s[k] += e;
            }
        }
        for (int k = 0; k < SK_W; k++) {
            lse[k] = mx[k] + san_logf(s[k]);
            inv[k] = 1.0f / s[k];
        }
        for (int b = 0; b < n; b++) {
            float *p = Z + (size_t)(base + b * stp) * SK_W;
            for (int k = 0; k < SK_W; k++)
                p[k] -= lse[k];
            if (E) {
                float *q = E + (size_t)(base + b * stp) * SK_W;
                for (int k = 0; k < SK_W; k++)
                    q[k] *= inv[k];
            }
        }
    }
}

/* One matrix on its own (a decode step has one row): the SoA form would
 * spend a full vector on it per element, this one runs the nn elements of
 * each half-step through one loop instead. The same float operations per
 * element, in the same order (max, exp, sum over b = 0..n-1, log), so it
 * gives the SoA path's results. n <= 8. */
static void sinkhorn_one(float *M, int n, int rounds)
{
    float Z[64], E[64], mx[8], lse[8];
    int nn = n * n;
    memcpy(Z, M, (size_t)nn * sizeof *Z);
    for (int it = 0; it < 2 * rounds; it++) {
        int rowstep = !(it & 1), sa = rowstep ? n : 1, sb = rowstep ? 1 : n;
        for (int a = 0; a < n; a++) {
            float m = Z[a * sa];
            for (int b = 1; b < n; b++)
                m = Z[a * sa + b * sb] > m ? Z[a * sa + b * sb] : m;
            mx[a] = m;
        }
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                E[a * n + b] = Z[a * sa + b * sb] - mx[a];
        for (int i = 0; i < nn; i++)
            E[i] = san_expf(E[i]);
        for (int a = 0; a < n; a++) {
            float s = 0.0f;
            for (int b = 0; b < n; b++)
                s += E[a * n + b];
            lse[a] = mx[a] + san_logf(s);
        }
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                Z[a * sa + b * sb] -= lse[a];
    }
    for (int i = 0; i < nn; i++)
        M[i] = san_expf(Z[i]);
}

/* where a 16-float vector is native (AVX-512) or passes in registers
 * (AArch64: four NEON registers); elsewhere by-value vectors of this size
 * change the ABI (-Wpsabi) and the loop version below serves */
#if (defined(__AVX512F__) || defined(__aarch64__)) &&                                              \
    ((defined(__clang__) && __clang_major__ >= 10) || (!defined(__clang__) && __GNUC__ >= 12))
/* One 4 x 4 matrix (needle2's lanes) in one 16-float vector, element
 * a * 4 + b at lane a * 4 + b. A half-step is a chain of dependent steps
 * (max, exp, sum, log) on four groups of four: as vectors each step is one
 * operation on all 16 instead of a loop of scalar ones. Every lane does
 * the one-matrix definition's float operations in its order (the maximum
 * and the sum run b = 0..3, exp and log are fastmath.h's expressions
 * written for vectors), so the results are the same bits (test_san_parts
 * compares them with the SoA path). */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));

static inline v16f sel(v16i m, v16f a, v16f b) /* m ? a : b, lane by lane */
{
    return (v16f)((m & (v16i)a) | (~m & (v16i)b));
}

static inline v16f splat(float x)
{
    return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

static inline v16f exp16(v16f x)
{
    const v16f hi = splat(88.0f), lo = splat(-87.3f);
    v16f xc = sel(x > hi, hi, x);
    xc = sel(xc < lo, lo, xc);
    v16f kf = xc * 1.44269504088896341f + 12582912.0f;
    v16u kb = (v16u)kf;
    kf -= 12582912.0f;
    v16f r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    v16f p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    v16u e = ((kb - 0x4B400000u) + 127u) << 23;
    v16f y = p * (v16f)e;
    y = sel(x > hi, splat(INFINITY), y);
    y = sel(x < lo, splat(0.0f), y);
    return sel(x != x, x, y);
}

static inline v16f log16(v16f x)
{
    v16u u = (v16u)x;
    v16i e = (v16i)((u >> 23) & 0xffu) - 126;
    u = (u & 0x007fffffu) | 0x3f000000u;
    v16f m = (v16f)u;
    v16i lo = m < 0.707106781186547524f; /* -1 where the scalar code has 1 */
    v16f fe = __builtin_convertvector(e + lo, v16f);
    m = sel(lo, m + m - 1.0f, m - 1.0f);
    v16f z = m * m;
    v16f y = splat(7.0376836292e-2f);
    y = y * m - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return (m + y) + 0.693359375f * fe;
}

/* the lanes of element b of each lane's group: its row's (rowstep) or its
 * column's */
#define ROWB(Z, b)                                                                                 \
    __builtin_shufflevector(Z, Z, b, b, b, b, 4 + b, 4 + b, 4 + b, 4 + b, 8 + b, 8 + b, 8 + b,     \
                            8 + b, 12 + b, 12 + b, 12 + b, 12 + b)
#define COLB(Z, b)                                                                                 \
    __builtin_shufflevector(Z, Z, 4 * b, 4 * b + 1, 4 * b + 2, 4 * b + 3, 4 * b, 4 * b + 1,        \
                            4 * b + 2, 4 * b + 3, 4 * b, 4 * b + 1, 4 * b + 2, 4 * b + 3, 4 * b,   \
                            4 * b + 1, 4 * b + 2, 4 * b + 3)

static inline v16f halfstep4(v16f Z, v16f g0, v16f g1, v16f g2, v16f g3)
{
    v16f m = g0;
    m = sel(g1 > m, g1, m);
    m = sel(g2 > m, g2, m);
    m = sel(g3 > m, g3, m);
    /* the group's exps in b order: the same differences as the scalar E */
    v16f e0 = exp16(g0 - m), e1 = exp16(g1 - m), e2 = exp16(g2 - m), e3 = exp16(g3 - m);
    v16f sum = splat(0.0f);
    sum += e0;
    sum += e1;
    sum += e2;
    sum += e3;
    return Z - (m + log16(sum));
}

static void sinkhorn4(float *M, int rounds)
{
    v16f Z;
    memcpy(&Z, M, sizeof Z);
    for (int it = 0; it < rounds; it++) {
        Z = halfstep4(Z, ROWB(Z, 0), ROWB(Z, 1), ROWB(Z, 2), ROWB(Z, 3));
        Z = halfstep4(Z, COLB(Z, 0), COLB(Z, 1), COLB(Z, 2), COLB(Z, 3));
    }
    Z = exp16(Z);
    memcpy(M, &Z, sizeof Z);
}
#define ND_SINKHORN4 1
#endif

void san_sinkhorn_rows(float *M, long rows, int n, int rounds)
{
    int nn = n * n;
#ifdef ND_SINKHORN4
    if (n == 4 && rows < 4) {
        for (long r = 0; r < rows; r++)
            sinkhorn4(M + r * nn, rounds);
        return;
    }
#endif
    if (n <= 8 && rows < 4) {
        for (long r = 0; r < rows; r++)
            sinkhorn_one(M + r * nn, n, rounds);
        return;
    }
    float *Z = cpu_xalloc((size_t)nn * SK_W * sizeof *Z);
    for (long r0 = 0; r0 < rows; r0 += SK_W) {
        int w = rows - r0 < SK_W ? (int)(rows - r0) : SK_W;
        /* unused lanes of a short last group compute on zeros */
        memset(Z, 0, (size_t)nn * SK_W * sizeof *Z);
        for (int k = 0; k < w; k++)
            for (int i = 0; i < nn; i++)
                Z[(size_t)i * SK_W + k] = M[(size_t)(r0 + k) * nn + i];
        for (int it = 0; it < rounds; it++) {
            san_sinkhorn_halfstep(Z, NULL, n, 1);
            san_sinkhorn_halfstep(Z, NULL, n, 0);
        }
        for (int i = 0; i < nn * SK_W; i++)
            Z[i] = san_expf(Z[i]);
        for (int k = 0; k < w; k++)
            for (int i = 0; i < nn; i++)
                M[(size_t)(r0 + k) * nn + i] = Z[(size_t)i * SK_W + k];
    }
    free(Z);
}

void san_sinkhorn(float *M, int n, int rounds)
{
    san_sinkhorn_rows(M, 1, n, rounds);
}
