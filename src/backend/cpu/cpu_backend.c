/* CPU backend: GEMMs through cblas (OpenBLAS or Accelerate), everything else as plain
 * loops parallelised over token rows (core/threadpool.h: OpenMP or our pool). */
#include "backend/cpu/blas.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/mem.h"
#include "core/status.h"
#include "core/threadpool.h"

static void *cpu_alloc(const nd_backend *be, size_t bytes)
{
    (void)be;
    return nd_calloc_big(1, bytes);
}

static void cpu_free(const nd_backend *be, void *p)
{
    (void)be;
    free(p);
}

/* One GEMM on all threads, split by us: each thread runs a single-threaded
 * cblas_sgemm on its own block of rows of C (or of columns when C has few
 * rows). OpenBLAS's own threading synchronises its threads several times
 * per call with sched_yield spins, which on a shared virtual machine cost
 * ~10% of a training step; a block split needs one barrier at the end and
 * only re-packs the shared operand once per thread. */
typedef struct {
    enum CBLAS_TRANSPOSE TA, TB;
    int ta, tb, M, N, K, lda, ldb, ldc, by_rows, along;
    int fixed; /* > 0: blocks of this many rows / columns at any team size */
    float alpha, beta;
    const float *A, *B;
    float *C;
} gemm_args;

/* rows (or columns) [lo, hi) of C: one single-threaded cblas_sgemm */
static void gemm_range(const gemm_args *g, int lo, int hi)
{
    if (g->by_rows) {
        const float *Ab = g->ta ? g->A + lo : g->A + (size_t)lo * g->lda;
        cblas_sgemm(CblasRowMajor, g->TA, g->TB, hi - lo, g->N, g->K, g->alpha, Ab, g->lda, g->B,
                    g->ldb, g->beta, g->C + (size_t)lo * g->ldc, g->ldc);
    } else {
        const float *Bb = g->tb ? g->B + (size_t)lo * g->ldb : g->B + lo;
        cblas_sgemm(CblasRowMajor, g->TA, g->TB, g->M, hi - lo, g->K, g->alpha, g->A, g->lda, Bb,
                    g->ldb, g->beta, g->C + lo, g->ldc);
    }
}

static void gemm_block(void *p, int t, int nt)
{
    const gemm_args *g = p;
    if (g->fixed) { /* thread t's run of the fixed blocks, one call each */
        long lo, hi, nb = (g->along + g->fixed - 1) / g->fixed;
        nd_share(nb, t, nt, &lo, &hi);
        for (long b = lo; b < hi; b++) {
            int r1 = (int)(b + 1) * g->fixed;
            gemm_range(g, (int)b * g->fixed, r1 < g->along ? r1 : g->along);
        }
        return;
    }
    /* blocks in multiples of 16 rows/columns (the kernels' tile) */
    int step = (g->along / nt + 15) & ~15;
    int lo = t * step, hi = t == nt - 1 ? g->along : (t + 1) * step;
    if (hi > g->along)
        hi = g->along;
    if (lo < hi)
        gemm_range(g, lo, hi);
}

/* nd_fixed_split's GEMM blocks: a multiple of the kernels' 16-row tile,
 * big enough that a call's overhead and the shared operand's packing stay
 * small where it is used (the engine's Needle 3 Hadamard products, whose
 * shared operand is at most 64 x 64) */
#define GEMM_FIXED_BLOCK 256

static void gemm_split(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc)
{
    gemm_args g = {.TA = ta ? CblasTrans : CblasNoTrans,
                   .TB = tb ? CblasTrans : CblasNoTrans,
                   .ta = ta,
                   .tb = tb,
                   .M = M,
                   .N = N,
                   .K = K,
                   .lda = lda,
                   .ldb = ldb,
                   .ldc = ldc,
                   .by_rows = M >= N || N < 128,
                   .fixed = nd_fixed_split() ? GEMM_FIXED_BLOCK : 0,
                   .alpha = alpha,
                   .beta = beta,
                   .A = A,
                   .B = B,
                   .C = C};
    g.along = g.by_rows ? M : N;
    /* Inside a parallel body the region below runs on this thread alone;
     * a crew's main (also "in parallel") hands it to the crew. */
    int team = nd_get_threads(), most = g.fixed ? (g.along + g.fixed - 1) / g.fixed : g.along / 64;
    if (team > most)
        team = most;
    if (team <= 1) {
        gemm_block(&g, 0, 1);
        return;
    }
    nd_parallel_region(team, gemm_block, &g);
}

/* Set where BLAS runs on one thread (no OpenMP: our pool's threads call
 * it one block each). Then a GEMV is split over our threads too. */
static int blas_single_threaded;

/* C[lo, hi) of a one-row product: the GEMV of that block of B's columns */
static void gemv_columns(void *p, long lo, long hi, int tid)
{
    (void)tid;
    const gemm_args *g = p;
    int n = (int)(hi - lo);
    if (g->tb)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, g->K, g->alpha, g->B + (size_t)lo * g->ldb,
                    g->ldb, g->A, 1, g->beta, g->C + lo, 1);
    else
        cblas_sgemv(CblasRowMajor, CblasTrans, g->K, n, g->alpha, g->B + lo, g->ldb, g->A, 1,
                    g->beta, g->C + lo, 1);
}

void cpu_matmul(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)be;
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] *= beta;
        return;
    }
    if (M == 1 && !ta) {
        /* one row (a decode step): GEMV reads B once; GEMM would pack it.
         * beta = 0 must not read C (it may be uninitialised) */
        if (beta == 0.0f)
            for (int j = 0; j < N; j++)
                C[j] = 0.0f;
        if (blas_single_threaded) {
            gemm_args g = {
                .tb = tb, .K = K, .ldb = ldb, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
            nd_parallel_for(N, 256, gemv_columns, &g);
        } else {
            cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N,
                        alpha, B, ldb, A, 1, beta, C, 1);
        }
        return;
    }
    gemm_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Each kernel below is a row body (ctx, rows [r0, r1), tid) run by
 * nd_parallel_for over the rows, and a wrapper that packs its arguments. */

typedef struct {
    float *y, *rstd;
    const float *x, *scale;
    int dim;
} rmsnorm_args;

static void rmsnorm_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const rmsnorm_args *a = p;
    int dim = a->dim;
    for (long r = r0; r < r1; r++) {
        const float *xr = a->x + r * dim;
        float *yr = a->y + r * dim;
        float rs = 1.0f / sqrtf(san_dot(xr, xr, dim) / (float)dim + 1e-6f);
        if (a->rstd)
            a->rstd[r] = rs;
        if (a->scale)
            for (int i = 0; i < dim; i++)
                yr[i] = (1.0f + a->scale[i]) * (xr[i] * rs);
        else
            for (int i = 0; i < dim; i++)
                yr[i] = xr[i] * rs;
    }
}

void cpu_rmsnorm(const nd_backend *be, float *y, float *rstd, const float *x, const float *scale,
                 long rows, int dim)
{
    (void)be;
    rmsnorm_args a = {y, rstd, x, scale, dim};
    nd_parallel_for(rows, 1, rmsnorm_rows, &a);
}

typedef struct {
    float *x0;
    const float *emb;
    const int32_t *tok;
    int d;
    float scale;
} embed_args;

static void embed_rows(void *p, long t0, long t1, int tid)
{
    (void)tid;
    const embed_args *a = p;
    int d = a->d;
    for (long t = t0; t < t1; t++)
        for (int i = 0; i < d; i++)
            a->x0[t * d + i] = a->emb[(size_t)a->tok[t] * d + i] * a->scale;
}

void cpu_embed(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N, int d,
               float scale)
{
    (void)be;
    embed_args a = {x0, emb, tok, d, scale};
    nd_parallel_for(N, 1, embed_rows, &a);
}

/* the n-gram hash reads at most this many tokens */
#define SAN_MAX_ORDER 8

typedef struct {
    int32_t *idx;
    const int32_t *tok;
    const nd_layout *L;
    const int *orders;
    int heads, slots, K, omax, stride;
} engram_hash_args;

static void engram_hash_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const engram_hash_args *a = p;
    int K = a->K, omax = a->omax, heads = a->heads;
    for (long r = r0; r < r1; r++) {
        uint32_t hist[SAN_MAX_ORDER];
        for (int j = 0; j < omax; j++) {
            long b = nd_layout_back(a->L, r, j);
            hist[j] = b >= 0 ? (uint32_t)a->tok[b] : 0u;
        }
        for (int k = 0; k < K; k++) {
            int o = a->orders[k / heads] < omax ? a->orders[k / heads] : omax;
            int seed_k = (k / heads) * a->stride + k % heads;
            a->idx[r * K + k] = (int32_t)san_engram_index_hist(hist, o, seed_k, a->slots);
        }
    }
}

void cpu_engram_hash(const nd_backend *be, int32_t *idx, const int32_t *tok, const nd_layout *L,
                     const int *orders, int n_orders, int heads, int slots)
{
    cpu_engram_hash_seeded(be, idx, tok, L, orders, n_orders, heads, slots, heads);
}

void cpu_engram_hash_seeded(const nd_backend *be, int32_t *idx, const int32_t *tok,
                            const nd_layout *L, const int *orders, int n_orders, int heads,
                            int slots, int stride)
{
    (void)be;
    int K = n_orders * heads, omax = 0;
    for (int o = 0; o < n_orders; o++)
        omax = orders[o] > omax ? orders[o] : omax;
    omax = omax < SAN_MAX_ORDER ? omax : SAN_MAX_ORDER;
    engram_hash_args a = {idx, tok, L, orders, heads, slots, K, omax, stride};
    nd_parallel_for(L->N, 1, engram_hash_rows, &a);
}

typedef struct {
    float *e;
    const float *tables;
    const int32_t *idx;
    const nd_layout *L;
    const int *orders;
    int heads, slots, sub, K;
} engram_gather_args;

static void engram_gather_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const engram_gather_args *a = p;
    int K = a->K, sub = a->sub;
    for (long r = r0; r < r1; r++) {
        int t = a->L->pos[r];
        for (int k = 0; k < K; k++) {
            float *dst = a->e + (r * K + k) * sub;
            if (t < a->orders[k / a->heads] - 1) {
                memset(dst, 0, (size_t)sub * sizeof *dst);
                continue;
            }
            memcpy(dst, a->tables + ((size_t)k * a->slots + (size_t)a->idx[r * K + k]) * sub,
                   (size_t)sub * sizeof *dst);
        }
    }
}

void cpu_engram_gather(const nd_backend *be, float *e, const float *tables, const int32_t *idx,
                       const nd_layout *L, const int *orders, int n_orders, int heads, int slots,
                       int sub)
{
    (void)be;
    engram_gather_args a = {e, tables, idx, L, orders, heads, slots, sub, n_orders * heads};
    nd_parallel_for(L->N, 1, engram_gather_rows, &a);
}

typedef struct {
    float *v;
    const float *vp, *taps;
    const nd_layout *L;
    int d, dil;
} engram_taps_args;

static void engram_taps_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const engram_taps_args *a = p;
    int d = a->d;
    for (long r = r0; r < r1; r++) {
        float *vr = a->v + r * d;
        for (int i = 0; i < d; i++)
            vr[i] = 0.0f;
        for (int j = 0; j < 4; j++) {
            long b = nd_layout_back(a->L, r, j * a->dil);
            if (b < 0)
                break;
            const float *src = a->vp + b * d;
            const float *tj = a->taps + j * d;
            for (int i = 0; i < d; i++)
                vr[i] += tj[i] * src[i];
        }
    }
}

void cpu_engram_taps(const nd_backend *be, float *v, const float *vp, const float *taps,
                     const nd_layout *L, int d, int dil)
{
    (void)be;
    engram_taps_args a = {v, vp, taps, L, d, dil};
    nd_parallel_for(L->N, 1, engram_taps_rows, &a);
}

typedef struct {
    float *bx, *alpha;
    const float *u, *k, *v;
    int d, accumulate;
    float inv_sqrt_d;
} engram_gate_args;

static void engram_gate_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const engram_gate_args *a = p;
    int d = a->d;
    float *bx = a->bx;
    for (long r = r0; r < r1; r++) {
        const float *ur = a->u + r * d, *kr = a->k + r * d, *vr = a->v + r * d;
        float uu = san_dot(ur, ur, d), kk = san_dot(kr, kr, d), uk = san_dot(ur, kr, d);
        float ru = 1.0f / sqrtf(uu / (float)d + 1e-6f), rk = 1.0f / sqrtf(kk / (float)d + 1e-6f);
        float al = san_sigmoid(uk * ru * rk * a->inv_sqrt_d);
        a->alpha[r] = al;
        if (a->accumulate)
            for (int i = 0; i < d; i++)
                bx[r * d + i] += al * vr[i];
        else
            for (int i = 0; i < d; i++)
                bx[r * d + i] = ur[i] + al * vr[i];
    }
}

void cpu_engram_gate(const nd_backend *be, float *bx, float *alpha, const float *u, const float *k,
                     const float *v, long N, int d, int accumulate)
{
    (void)be;
    engram_gate_args a = {bx, alpha, u, k, v, d, accumulate, 1.0f / sqrtf((float)d)};
    nd_parallel_for(N, 1, engram_gate_rows, &a);
}

typedef struct {
    float *hpre, *hpost, *M;
    const float *pre, *post, *res, *b_pre, *b_post, *b_res;
    float a_pre, a_post, a_res;
    int lane, n;
    long N;
} hyper_args;

/* a contiguous share of rows per thread, so Sinkhorn runs on whole vector
 * groups of consecutive matrices */
static void hyper_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const hyper_args *a = p;
    int n = a->n;
    long nn = (long)n * n;
    for (long r = r0; r < r1; r++) {
        for (int i = 0; i < n; i++) {
            float on = i == a->lane ? 1.0f : 0.0f;
            a->hpre[r * n + i] =
                san_sigmoid(a->a_pre * a->pre[r * n + i] + a->b_pre[i] + 8.0f * on - 4.0f);
            a->hpost[r * n + i] = 2.0f * san_sigmoid(a->a_post * a->post[r * n + i] + a->b_post[i] -
                                                     4.0f * (1.0f - on));
        }
        if (!a->M)
            continue;
        float *Mr = a->M + r * nn;
        for (long i = 0; i < nn; i++)
            Mr[i] = a->a_res * a->res[r * nn + i] + a->b_res[i];
    }
    if (a->M)
        san_sinkhorn_rows(a->M + r0 * nn, r1 - r0, n, SAN_SINKHORN_ROUNDS);
}

/* A decode step's lane-mix matrices (Sinkhorn: a serial chain of exp and
 * log, ~8% of a one-thread step) are read only at the layer's end
 * (lanes_update), so inside a crew they are computed by a helper while
 * this thread runs the layer's attention: hpre and hpost here, M handed
 * off. The same code computes the same bits on either thread. Rows up to
 * ASYNC_ROWS (a decode step, a short prompt's last chunk). */
#define ASYNC_ROWS 4
static _Thread_local hyper_args pending_mix;

static void mix_rows(void *p)
{
    const hyper_args *a = p;
    int n = a->n;
    long nn = (long)n * n;
    for (long i = 0; i < a->N * nn; i++)
        a->M[i] = a->a_res * a->res[i] + a->b_res[i % nn];
    san_sinkhorn_rows(a->M, a->N, n, SAN_SINKHORN_ROUNDS);
}

void cpu_hyper_coeffs(const nd_backend *be, float *hpre, float *hpost, float *M, const float *pre,
                      const float *post, const float *res, float a_pre, float a_post, float a_res,
                      const float *b_pre, const float *b_post, const float *b_res, int lane, long N,
                      int n)
{
    (void)be;
    hyper_args a = {hpre,  hpost, M,      pre,   post, res, b_pre, b_post,
                    b_res, a_pre, a_post, a_res, lane, n,   N};
    if (N > ASYNC_ROWS) {
        nd_async_end(); /* a job of this thread's still out reads pending_mix */
        nd_parallel_for(N, 1, hyper_rows, &a);
        return;
    }
    hyper_args gates = a; /* hpre and hpost alone (M == NULL) */
    gates.M = NULL;
    hyper_rows(&gates, 0, N, 0);
    nd_async_end();
    pending_mix = a;
    nd_async_begin(mix_rows, &pending_mix);
}

typedef struct {
    float *u, *y, *X;
    const float *hpre, *hpost, *M, *x0;
    int n, d;
} lanes_args;

static void lanes_combine_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_args *a = p;
    int n = a->n, d = a->d;
    for (long r = r0; r < r1; r++) {
        float *ur = a->u + r * d;
        const float *Xr = a->X + r * n * d;
        for (int c = 0; c < d; c++)
            ur[c] = 0.0f;
        for (int i = 0; i < n; i++) {
            float h = a->hpre[r * n + i];
            for (int c = 0; c < d; c++)
                ur[c] += h * Xr[i * d + c];
        }
    }
}

void cpu_lanes_combine(const nd_backend *be, float *u, const float *hpre, const float *X, long N,
                       int n, int d)
{
    (void)be;
    lanes_args a = {.u = u, .hpre = hpre, .X = (float *)X, .n = n, .d = d};
    nd_parallel_for(N, 1, lanes_combine_rows, &a);
}

/* lanes_update_rows for 4 lanes (the released models'): LU_W columns at
 * a time, the four outputs in vector registers (GCC/Clang vector types),
 * so each X and y value is loaded once and each output stored once (the
 * plain loop read and wrote every output n + 1 times). The same
 * operations in the same order per value: the results are identical. */
#define LU_W 16
typedef float lu_vec __attribute__((vector_size(LU_W * sizeof(float))));

static void lanes_update_rows4(const lanes_args *a, long r0, long r1)
{
    int d = a->d;
    for (long r = r0; r < r1; r++) {
        const float *X = a->X + r * 4 * d, *M = a->M + r * 16, *y = a->y + r * d;
        const float *hp = a->hpost + r * 4;
        float *O = a->u + r * 4 * d;
        int c0 = 0;
        for (; c0 + LU_W <= d; c0 += LU_W) {
            /* loaded with memcpy (unaligned), never passed by value: a
             * 64-byte vector argument changes the ABI without AVX-512 */
            lu_vec yv;
            memcpy(&yv, y + c0, sizeof yv);
            lu_vec o0 = hp[0] * yv, o1 = hp[1] * yv, o2 = hp[2] * yv, o3 = hp[3] * yv;
            for (int j = 0; j < 4; j++) {
                lu_vec xj;
                memcpy(&xj, X + j * d + c0, sizeof xj);
                o0 += M[j] * xj;
                o1 += M[4 + j] * xj;
                o2 += M[8 + j] * xj;
                o3 += M[12 + j] * xj;
            }
            memcpy(O + c0, &o0, sizeof o0);
            memcpy(O + d + c0, &o1, sizeof o1);
            memcpy(O + 2 * d + c0, &o2, sizeof o2);
            memcpy(O + 3 * d + c0, &o3, sizeof o3);
        }
        for (int i = 0; i < 4; i++) /* the columns past the last full block */
            for (int c = c0; c < d; c++) {
                float v = hp[i] * y[c];
                for (int j = 0; j < 4; j++)
                    v += M[i * 4 + j] * X[j * d + c];
                O[i * d + c] = v;
            }
    }
}

/* Xo (in a->u) = hpost y + M X per row */
static void lanes_update_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_args *a = p;
    int n = a->n, d = a->d;
    if (n == 4) {
        lanes_update_rows4(a, r0, r1);
        return;
    }
    for (long r = r0; r < r1; r++) {
        const float *Xr = a->X + r * n * d, *Mr = a->M + r * n * n, *yr = a->y + r * d;
        float *Or = a->u + r * n * d;
        for (int i = 0; i < n; i++) {
            float *o = Or + i * d;
            float hp = a->hpost[r * n + i];
            for (int c = 0; c < d; c++)
                o[c] = hp * yr[c];
            for (int j = 0; j < n; j++) {
                float m = Mr[i * n + j];
                for (int c = 0; c < d; c++)
                    o[c] += m * Xr[j * d + c];
            }
        }
    }
}

void cpu_lanes_update(const nd_backend *be, float *Xo, const float *M, const float *X,
                      const float *hpost, const float *y, long N, int n, int d)
{
    (void)be;
    nd_async_end(); /* M may still be on a helper (cpu_hyper_coeffs) */
    lanes_args a = {
        .u = Xo, .y = (float *)y, .X = (float *)X, .hpost = hpost, .M = M, .n = n, .d = d};
    nd_parallel_for(N, 1, lanes_update_rows, &a);
}

static void lanes_broadcast_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_args *a = p;
    int n = a->n, d = a->d;
    for (long r = r0; r < r1; r++)
        for (int i = 0; i < n; i++)
            memcpy(a->X + (r * n + i) * d, a->x0 + r * d, (size_t)d * sizeof *a->X);
}

void cpu_lanes_broadcast(const nd_backend *be, float *X, const float *x0, long N, int n, int d)
{
    (void)be;
    lanes_args a = {.X = X, .x0 = x0, .n = n, .d = d};
    nd_parallel_for(N, 1, lanes_broadcast_rows, &a);
}

/* mean of the lanes of X into a->u */
static void lanes_mean_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_args *a = p;
    int n = a->n, d = a->d;
    float inv = 1.0f / (float)n;
    for (long r = r0; r < r1; r++) {
        /* lane by lane over whole rows (contiguous, vectorises) */
        float *o = a->u + r * d;
        const float *Xr = a->X + r * n * d;
        for (int c = 0; c < d; c++)
            o[c] = Xr[c];
        for (int i = 1; i < n; i++)
            for (int c = 0; c < d; c++)
                o[c] += Xr[i * d + c];
        for (int c = 0; c < d; c++)
            o[c] *= inv;
    }
}

void cpu_lanes_mean(const nd_backend *be, float *xm, const float *X, long N, int n, int d)
{
    (void)be;
    lanes_args a = {.u = xm, .X = (float *)X, .n = n, .d = d};
    nd_parallel_for(N, 1, lanes_mean_rows, &a);
}

typedef struct {
    float *x;
    const float *cos_t, *sin_t;
    const nd_layout *L;
    int heads, hd;
} rope_args;

static void rope_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const rope_args *a = p;
    int half = a->hd / 2;
    for (long r = r0; r < r1; r++) {
        int t = a->L->pos[r];
        const float *c = a->cos_t + (size_t)t * half, *s = a->sin_t + (size_t)t * half;
        for (int h = 0; h < a->heads; h++) {
            float *v = a->x + (r * a->heads + h) * a->hd;
            for (int i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c[i] - x2 * s[i];
                v[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

void cpu_rope(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
              const nd_layout *L, int heads, int hd)
{
    (void)be;
    rope_args a = {x, cos_t, sin_t, L, heads, hd};
    nd_parallel_for(L->N, 1, rope_rows, &a);
}

typedef struct {
    float *o;
    const float *x, *r;
    float s;
} elementwise_args;

static void gate_sigmoid_range(void *p, long i0, long i1, int tid)
{
    (void)tid;
    const elementwise_args *a = p;
    for (long i = i0; i < i1; i++)
        a->o[i] = a->x[i] * san_sigmoid(a->r[i]);
}

void cpu_gate_sigmoid(const nd_backend *be, float *o, const float *att, const float *g, long n)
{
    (void)be;
    elementwise_args a = {o, att, g, 0.0f};
    nd_parallel_for(n, 1, gate_sigmoid_range, &a);
}

static void residual_scaled_range(void *p, long i0, long i1, int tid)
{
    (void)tid;
    const elementwise_args *a = p;
    for (long i = i0; i < i1; i++)
        a->o[i] = a->x[i] + a->s * a->r[i];
}

void cpu_residual_scaled(const nd_backend *be, float *y, const float *x, const float *r, float gate,
                         long n)
{
    (void)be;
    elementwise_args a = {y, x, r, san_sigmoid(gate)};
    nd_parallel_for(n, 1, residual_scaled_range, &a);
}

typedef struct {
    float *y, *h1;
    const float *x, *z, *u, *d1, *d2, *d3;
    int d, hn;
    float scale;
} hadamard_args;

/* hadamard_rows one row at a time with san_fwht: the same float operations
 * per element as the SoA form, for the few rows of a decode step */
static void hadamard_rows_one(const hadamard_args *a, long r0, long r1)
{
    int d = a->d, hn = a->hn;
    float stack[2 * 1024]; /* no allocation per decoded token at usual widths */
    float *H = hn <= 1024 ? stack : cpu_xalloc((size_t)2 * hn * sizeof *H), *S = H + hn;
    for (long r = r0; r < r1; r++) {
        const float *zr = a->z + r * d, *xr = a->x + r * d;
        float *yr = a->y + r * d, *h = a->h1 + r * hn;
        for (int i = 0; i < d; i++)
            H[i] = a->d1[i] * zr[i];
        for (int i = d; i < hn; i++)
            H[i] = 0.0f;
        cpu_fwht_row(H, hn, a->scale);
        memcpy(h, H, (size_t)hn * sizeof *H);
        for (int i = 0; i < hn; i++)
            S[i] = san_silu(a->d2[i] * H[i]);
        cpu_fwht_row(S, hn, a->scale);
        if (a->u)
            for (int i = 0; i < d; i++)
                yr[i] = (xr[i] + a->d3[i] * S[i]) - a->u[r * d + i];
        else
            for (int i = 0; i < d; i++)
                yr[i] = xr[i] + a->d3[i] * S[i];
    }
    if (H != stack)
        free(H);
}

static void hadamard_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const hadamard_args *a = p;
    int d = a->d, hn = a->hn;
    if (r1 - r0 < 4) { /* a decode step: contiguous rows, no idle SoA lanes */
        hadamard_rows_one(a, r0, r1);
        return;
    }
    /* SK_W consecutive rows at a time in SoA form, so every transform
     * stage is full-width vector work (see san_fwht_soa) */
    float *H = cpu_xalloc((size_t)2 * hn * SK_W * sizeof *H), *S = H + (size_t)hn * SK_W;
    for (long g0 = r0; g0 < r1; g0 += SK_W) {
        int w = r1 - g0 < SK_W ? (int)(r1 - g0) : SK_W;
        memset(H, 0, (size_t)hn * SK_W * sizeof *H); /* pad rows d..hn, idle lanes */
        for (int k = 0; k < w; k++) {
            const float *zr = a->z + (g0 + k) * d;
            for (int i = 0; i < d; i++)
                H[(size_t)i * SK_W + k] = a->d1[i] * zr[i];
        }
        san_fwht_soa(H, hn, a->scale);
        for (int k = 0; k < w; k++) {
            float *h = a->h1 + (g0 + k) * hn;
            for (int i = 0; i < hn; i++)
                h[i] = H[(size_t)i * SK_W + k];
        }
        for (int i = 0; i < hn; i++)
            for (int k = 0; k < SK_W; k++)
                S[(size_t)i * SK_W + k] = san_silu(a->d2[i] * H[(size_t)i * SK_W + k]);
        san_fwht_soa(S, hn, a->scale);
        for (int k = 0; k < w; k++) {
            long r = g0 + k;
            const float *xr = a->x + r * d;
            float *yr = a->y + r * d;
            if (a->u)
                for (int i = 0; i < d; i++)
                    yr[i] = (xr[i] + a->d3[i] * S[(size_t)i * SK_W + k]) - a->u[r * d + i];
            else
                for (int i = 0; i < d; i++)
                    yr[i] = xr[i] + a->d3[i] * S[(size_t)i * SK_W + k];
        }
    }
    free(H);
}

void cpu_hadamard_mlp(const nd_backend *be, float *y, float *h1, const float *x, const float *z,
                      const float *u, const float *d1, const float *d2, const float *d3, long N,
                      int d, int hn)
{
    (void)be;
    hadamard_args a = {y, h1, x, z, u, d1, d2, d3, d, hn, san_walsh_scale(hn)};
    nd_parallel_for(N, 1, hadamard_rows, &a);
}

typedef struct {
    float *loss;
    const float *logits;
    const int32_t *target;
    int V;
} cross_entropy_args;

static void cross_entropy_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const cross_entropy_args *a = p;
    int V = a->V;
    for (long r = r0; r < r1; r++) {
        const float *l = a->logits + r * (long)V;
        float mx = l[0];
        for (int i = 1; i < V; i++)
            mx = l[i] > mx ? l[i] : mx;
        /* the float exp of the backward (san_expf, < 3e-7 relative: log(s)
         * moves by less than 3e-7, under an ulp of the loss) in chunks that
         * vectorise, summed in 8 double partials (a libm double exp per
         * logit was most of this op's time) */
        float e[256];
        double acc[8] = {0};
        for (int i0 = 0; i0 < V; i0 += 256) {
            int w = V - i0 < 256 ? V - i0 : 256, k = 0;
            for (int k2 = 0; k2 < w; k2++)
                e[k2] = san_expf(l[i0 + k2] - mx);
            for (; k + 8 <= w; k += 8)
                for (int j = 0; j < 8; j++)
                    acc[j] += e[k + j];
            for (; k < w; k++)
                acc[k & 7] += e[k];
        }
        double s =
            ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        a->loss[r] = (float)((double)mx + log(s) - (double)l[a->target[r]]);
    }
}

void cpu_cross_entropy(const nd_backend *be, float *loss, const float *logits,
                       const int32_t *target, long N, int V)
{
    (void)be;
    cross_entropy_args a = {loss, logits, target, V};
    nd_parallel_for(N, 1, cross_entropy_rows, &a);
}

typedef struct {
    float *dst;
    const float *src;
    int dst_ld, src_ld, cols;
} copy2d_args;

static void copy2d_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const copy2d_args *a = p;
    for (long r = r0; r < r1; r++)
        memcpy(a->dst + r * a->dst_ld, a->src + r * a->src_ld, sizeof(float) * (size_t)a->cols);
}

void cpu_copy2d(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
                long rows, int cols)
{
    (void)be;
    if (dst_ld == cols && src_ld == cols) {
        memcpy(dst, src, sizeof(float) * (size_t)rows * cols);
        return;
    }
    copy2d_args a = {dst, src, dst_ld, src_ld, cols};
    /* shared only above 64K floats: a smaller copy is cheaper than a fork */
    nd_parallel_for(rows, rows * cols > 65536 ? 1 : rows, copy2d_rows, &a);
}

/* the CPU backend's state (a singleton: one process-wide thread pool) */
static struct cpu_state {
    char detail[64];
} cpu_state;

static nd_backend cpu_backend = {
    .name = "cpu",
    .ctx = &cpu_state,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_mem = 1, /* alloc is calloc: upload, download and zero are memcpy / memset */
#define ND_OP(name, kind, ...) .name = cpu_##name,
#include "backend/ops.def"
#undef ND_OP
};

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

#ifndef _OPENMP
/* The OpenMP build of OpenBLAS sizes its threading by the calling thread's
 * OpenMP setting, which each new thread (our pool's workers) starts at all
 * cores: every thread that runs our kernels sets it to one. */
static void blas_one_thread(void)
{
    nd_blas_set_threads(1);
}
#endif

static int cpu_prepare(const nd_backend *be)
{
    int rc = nd_blas_load();
    char *detail = ((struct cpu_state *)be->ctx)->detail;
    nd_blas_describe(detail, sizeof cpu_state.detail);
    return rc;
}

static void cpu_backend_init(void)
{
    cpu_backend.prepare = cpu_prepare;
    cpu_backend.threads = nd_get_threads();
#ifndef _OPENMP
    /* our pool's threads call BLAS one block each (gemm_split, attention):
     * a BLAS with threads of its own would fork again inside every one */
    nd_blas_set_threads(1);
    nd_parallel_setup(blas_one_thread);
    blas_single_threaded = 1;
#endif
    nd_blas_describe(cpu_state.detail, sizeof cpu_state.detail);
    cpu_backend.detail = cpu_state.detail;
}

const nd_backend *nd_backend_cpu(int threads)
{
    /* The table is filled once: models loaded on several threads (the
     * engine asks with threads = 0) only read it. threads > 0 changes
     * process-wide settings (the CLI's --threads), before any worker. */
    pthread_once(&cpu_once, cpu_backend_init);
    if (threads > 0) {
        nd_set_threads(threads);
#ifdef _OPENMP
        nd_blas_set_threads(threads);
#endif
        cpu_backend.threads = threads;
    }
    return &cpu_backend;
}
