/* Causal grouped-query attention on the CPU.
 *
 * Work is split over (sequence, head, block of 64 queries); each block is
 * two small GEMMs (scores, then probabilities @ V) over the keys it can
 * see. With the OpenMP build of OpenBLAS, a GEMM inside our parallel
 * region runs on the calling thread, so the two levels do not fight. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

void cpu_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, int B, int T, int H, int G, int hd)
{
    (void)be;
    int nblk = (T + SAN_ATTN_QBLOCK - 1) / SAN_ATTN_QBLOCK, rep = H / G;
    long tasks = (long)B * H * nblk;
    float scale = 1.0f / sqrtf((float)hd);
    int qs = H * hd, ks = G * hd;
#pragma omp parallel
    {
        float *S = malloc((size_t)SAN_ATTN_QBLOCK * T * sizeof *S);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; task++) {
            /* largest blocks first balances the causal triangle */
            int blk = nblk - 1 - (int)(task % nblk);
            int h = (int)((task / nblk) % H), b = (int)(task / ((long)nblk * H));
            int g = h / rep, t0 = blk * SAN_ATTN_QBLOCK,
                t1 = t0 + SAN_ATTN_QBLOCK < T ? t0 + SAN_ATTN_QBLOCK : T;
            int rows = t1 - t0, keys = t1;
            const float *Q = q + ((size_t)b * T + t0) * qs + (size_t)h * hd;
            const float *K = k + (size_t)b * T * ks + (size_t)g * hd;
            const float *Vv = v + (size_t)b * T * ks + (size_t)g * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, scale, Q, qs, K,
                        ks, 0.0f, S, keys);
            for (int r = 0; r < rows; r++) {
                float *s = S + (size_t)r * keys;
                int last = t0 + r; /* keys 0..last are visible */
                float mx = -FLT_MAX;
                for (int j = 0; j <= last; j++)
                    mx = s[j] > mx ? s[j] : mx;
                float sum = 0.0f;
                for (int j = 0; j <= last; j++) {
                    s[j] = san_expf(s[j] - mx);
                    sum += s[j];
                }
                float inv = 1.0f / sum;
                for (int j = 0; j <= last; j++)
                    s[j] *= inv;
                for (int j = last + 1; j < keys; j++)
                    s[j] = 0.0f;
                if (lse)
                    lse[((size_t)b * H + h) * T + t0 + r] = mx + logf(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, S, keys,
                        Vv, ks, 0.0f, out + ((size_t)b * T + t0) * qs + (size_t)h * hd, qs);
        }
        free(S);
    }
}
