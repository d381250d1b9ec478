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

void san_sinkhorn_rows(float *M, long rows, int n, int rounds)
{
    int nn = n * n;
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
