/* Causal grouped-query attention on the CPU, forward and backward, over a
 * segment layout (backend/layout.h).
 *
 * A query row of segment s sees two key spans: all rows of s's parent (the
 * shared prefix, when there is one) and the rows of s up to itself. Work
 * is split over (segment, head, block of 64 queries); each block is small
 * GEMMs over the two spans, written side by side into one score matrix.
 * With the OpenMP build of OpenBLAS, a GEMM inside our parallel region runs
 * on the calling thread, so the two levels do not fight. */
#include "backend/cpu/blas.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

typedef struct {
    int seg, blk, keys;
} attn_block;

static int by_keys_desc(const void *a, const void *b)
{
    const attn_block *x = a, *y = b;
    if (x->keys != y->keys)
        return x->keys > y->keys ? -1 : 1;
    if (x->seg != y->seg)
        return x->seg < y->seg ? -1 : 1;
    return x->blk < y->blk ? -1 : x->blk > y->blk;
}

static int parent_len(const nd_layout *L, const nd_segment *s)
{
    return s->parent >= 0 ? L->seg[s->parent].len : 0;
}

/* Query blocks of every segment, largest key count first (balances the
 * causal triangle under dynamic scheduling). *maxkeys: the widest score row. */
static attn_block *attn_blocks(const nd_layout *L, long *count, int *maxkeys)
{
    long n = 0;
    *maxkeys = 1;
    for (int s = 0; s < L->n_seg; s++)
        n += (L->seg[s].len + SAN_ATTN_QBLOCK - 1) / SAN_ATTN_QBLOCK;
    attn_block *b = malloc(sizeof *b * (size_t)(n ? n : 1));
    if (!b)
        return NULL;
    long i = 0;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *g = &L->seg[s];
        int plen = parent_len(L, g);
        for (int t0 = 0; t0 < g->len; t0 += SAN_ATTN_QBLOCK) {
            int t1 = t0 + SAN_ATTN_QBLOCK < g->len ? t0 + SAN_ATTN_QBLOCK : g->len;
            b[i++] = (attn_block){s, t0 / SAN_ATTN_QBLOCK, plen + t1};
            *maxkeys = plen + t1 > *maxkeys ? plen + t1 : *maxkeys;
        }
    }
    qsort(b, (size_t)n, sizeof *b, by_keys_desc);
    *count = n;
    return b;
}

void cpu_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, const nd_layout *L, int H, int G, int hd)
{
    (void)be;
    long nb;
    int maxkeys, rep = H / G;
    attn_block *blocks = attn_blocks(L, &nb, &maxkeys);
    if (!blocks)
        abort(); /* a few bytes per block: nothing sensible to do without them */
    float scale = 1.0f / sqrtf((float)hd);
    int qs = H * hd, ks = G * hd;
    long tasks = nb * H;
#pragma omp parallel
    {
        float *S = cpu_xalloc((size_t)SAN_ATTN_QBLOCK * maxkeys * sizeof *S);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; task++) {
            const attn_block *bk = &blocks[task / H];
            int h = (int)(task % H), g = h / rep;
            const nd_segment *sg = &L->seg[bk->seg];
            int plen = parent_len(L, sg), p0 = plen ? L->seg[sg->parent].start : 0;
            int t0 = bk->blk * SAN_ATTN_QBLOCK;
            int t1 = t0 + SAN_ATTN_QBLOCK < sg->len ? t0 + SAN_ATTN_QBLOCK : sg->len;
            int rows = t1 - t0, keys = plen + t1;
            long r0 = (long)sg->start + t0;
            const float *Q = q + (size_t)r0 * qs + (size_t)h * hd;
            const float *Ks = k + (size_t)sg->start * ks + (size_t)g * hd;
            const float *Vs = v + (size_t)sg->start * ks + (size_t)g * hd;
            const float *Kp = k + (size_t)p0 * ks + (size_t)g * hd;
            const float *Vp = v + (size_t)p0 * ks + (size_t)g * hd;
            if (plen)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, plen, hd, scale, Q, qs,
                            Kp, ks, 0.0f, S, keys);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hd, scale, Q, qs, Ks, ks,
                        0.0f, S + plen, keys);
            for (int r = 0; r < rows; r++) {
                float *s = S + (size_t)r * keys;
                int last = plen + t0 + r; /* keys 0..last are visible */
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
                    lse[(size_t)(r0 + r) * H + h] = mx + logf(sum);
            }
            float *O = out + (size_t)r0 * qs + (size_t)h * hd;
            if (plen)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, plen, 1.0f, S,
                            keys, Vp, ks, 0.0f, O, qs);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, t1, 1.0f, S + plen,
                        keys, Vs, ks, plen ? 1.0f : 0.0f, O, qs);
        }
        free(S);
    }
    free(blocks);
}

/* Flash-style backward: probabilities are recomputed per 64-query block
 * from q, k and the saved lse. One task owns a (segment, kv head) pair and
 * walks all query heads of its group, so the segment's own dk/dv rows have
 * a single writer. What a segment's queries send to its parent's keys goes
 * to a private buffer, summed into the parent's rows afterwards in segment
 * order (deterministic for any thread count). */
void cpu_attention_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *out, const float *lse, const nd_layout *L, int H, int G,
                            int hd)
{
    (void)be;
    int rep = H / G, maxkeys = 1;
    float scale = 1.0f / sqrtf((float)hd);
    int qs = H * hd, ks = G * hd;
    /* private parent-gradient buffers: [dK | dV] of plen x hd per (child, g) */
    size_t *poff = malloc(sizeof *poff * (size_t)(L->n_seg + 1));
    if (!poff)
        abort();
    size_t ptotal = 0;
    for (int s = 0; s < L->n_seg; s++) {
        int plen = parent_len(L, &L->seg[s]);
        poff[s] = ptotal;
        ptotal += (size_t)2 * plen * hd * G;
        int kk = plen + L->seg[s].len;
        maxkeys = kk > maxkeys ? kk : maxkeys;
    }
    float *pbuf = ptotal ? cpu_xalloc(ptotal * sizeof *pbuf) : NULL;
    long tasks = (long)L->n_seg * G;
#pragma omp parallel
    {
        size_t bs = (size_t)SAN_ATTN_QBLOCK * maxkeys;
        float *Pb = cpu_xalloc((2 * bs + SAN_ATTN_QBLOCK) * sizeof *Pb);
        float *dP = Pb + bs, *Dr = dP + bs;
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; task++) {
            int s = (int)(task / G), g = (int)(task % G);
            const nd_segment *sg = &L->seg[s];
            int plen = parent_len(L, sg), p0 = plen ? L->seg[sg->parent].start : 0, T = sg->len;
            size_t kv0 = (size_t)sg->start * ks + (size_t)g * hd;
            const float *Ks = k + kv0, *Vs = v + kv0;
            const float *Kp = k + (size_t)p0 * ks + (size_t)g * hd;
            const float *Vp = v + (size_t)p0 * ks + (size_t)g * hd;
            float *dKs = dk + kv0, *dVs = dv + kv0;
            float *dKp = plen ? pbuf + poff[s] + (size_t)2 * plen * hd * g : NULL;
            float *dVp = plen ? dKp + (size_t)plen * hd : NULL;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hd; i++) {
                    dKs[(size_t)t * ks + i] = 0.0f;
                    dVs[(size_t)t * ks + i] = 0.0f;
                }
            if (plen)
                memset(dKp, 0, sizeof(float) * 2 * (size_t)plen * hd);
            for (int h = g * rep; h < (g + 1) * rep; h++)
                for (int t0 = 0; t0 < T; t0 += SAN_ATTN_QBLOCK) {
                    int t1 = t0 + SAN_ATTN_QBLOCK < T ? t0 + SAN_ATTN_QBLOCK : T;
                    int rows = t1 - t0, keys = plen + t1;
                    long r0 = (long)sg->start + t0;
                    size_t qo = (size_t)r0 * qs + (size_t)h * hd;
                    const float *Q = q + qo, *dO = dout + qo, *O = out + qo;
                    /* P = exp(scale * Q [Kp|Ks]^T - lse), causal in the own span */
                    if (plen)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, plen, hd, scale,
                                    Q, qs, Kp, ks, 0.0f, Pb, keys);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hd, scale, Q, qs,
                                Ks, ks, 0.0f, Pb + plen, keys);
                    for (int r = 0; r < rows; r++) {
                        float *p = Pb + (size_t)r * keys, l = lse[(size_t)(r0 + r) * H + h];
                        int last = plen + t0 + r;
                        for (int j = 0; j <= last; j++)
                            p[j] = san_expf(p[j] - l);
                        for (int j = last + 1; j < keys; j++)
                            p[j] = 0.0f;
                        const float *a = dO + (size_t)r * qs, *b = O + (size_t)r * qs;
                        float acc = 0.0f;
                        for (int i = 0; i < hd; i++)
                            acc += a[i] * b[i];
                        Dr[r] = acc;
                    }
                    /* dV += P^T dO; dP = dO V^T */
                    if (plen) {
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, plen, hd, rows, 1.0f,
                                    Pb, keys, dO, qs, 1.0f, dVp, hd);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, plen, hd, 1.0f,
                                    dO, qs, Vp, ks, 0.0f, dP, keys);
                    }
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, rows, 1.0f,
                                Pb + plen, keys, dO, qs, 1.0f, dVs, ks);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hd, 1.0f, dO, qs,
                                Vs, ks, 0.0f, dP + plen, keys);
                    /* dS = P * (dP - rowsum(dO*O)); masked entries have P = 0 */
                    for (int r = 0; r < rows; r++) {
                        float *ds = dP + (size_t)r * keys;
                        const float *p = Pb + (size_t)r * keys;
                        float D = Dr[r];
                        for (int j = 0; j < keys; j++)
                            ds[j] = p[j] * (ds[j] - D);
                    }
                    /* dQ = scale * dS K; dK += scale * dS^T Q */
                    if (plen) {
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, plen,
                                    scale, dP, keys, Kp, ks, 0.0f, dq + qo, qs);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, plen, hd, rows, scale,
                                    dP, keys, Q, qs, 1.0f, dKp, hd);
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, t1, scale,
                                dP + plen, keys, Ks, ks, plen ? 1.0f : 0.0f, dq + qo, qs);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, rows, scale,
                                dP + plen, keys, Q, qs, 1.0f, dKs, ks);
                }
        }
        free(Pb);
        /* parents' rows collect their children's buffers, children in order */
        for (int s = 0; s < L->n_seg; s++) {
            const nd_segment *sg = &L->seg[s];
            int plen = parent_len(L, sg);
            if (!plen)
                continue;
            int p0 = L->seg[sg->parent].start;
#pragma omp for schedule(static)
            for (long x = 0; x < (long)plen * G; x++) {
                int t = (int)(x / G), g = (int)(x % G);
                const float *src = pbuf + poff[s] + (size_t)2 * plen * hd * g + (size_t)t * hd;
                float *dK = dk + (size_t)(p0 + t) * ks + (size_t)g * hd;
                float *dV = dv + (size_t)(p0 + t) * ks + (size_t)g * hd;
                for (int i = 0; i < hd; i++) {
                    dK[i] += src[i];
                    dV[i] += src[(size_t)plen * hd + i];
                }
            }
        }
    }
    free(pbuf);
    free(poff);
}

void cpu_gather_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                     long n, int d)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        memcpy(dst + (size_t)i * d, src + (size_t)rows[i] * d, sizeof(float) * (size_t)d);
}

void cpu_scatter_add_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                          long n, int d)
{
    (void)be;
    /* columns split across threads: each element sums its rows in order i */
    int nch = (d + 63) / 64;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < nch; c++) {
        int c0 = c * 64, c1 = c0 + 64 < d ? c0 + 64 : d;
        for (long i = 0; i < n; i++) {
            float *o = dst + (size_t)rows[i] * d;
            const float *x = src + (size_t)i * d;
            for (int j = c0; j < c1; j++)
                o[j] += x[j];
        }
    }
}
