/* CPU backend: GEMMs through cblas (OpenBLAS or Accelerate), everything else as plain
 * loops parallelised with OpenMP over token rows. */
#include "backend/cpu/blas.h"
#include <math.h>
#include "core/omp_compat.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/mem.h"
#include "core/status.h"

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
static void gemm_split(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc)
{
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    int team = omp_in_parallel() ? 1 : omp_get_max_threads();
    int by_rows = M >= N || N < 128;
    int along = by_rows ? M : N;
    if (team > along / 64)
        team = along / 64;
    if (team <= 1) {
        cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel num_threads(team)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        /* blocks in multiples of 16 rows/columns (the kernels' tile) */
        int step = (along / nt + 15) & ~15;
        int lo = t * step, hi = t == nt - 1 ? along : (t + 1) * step;
        if (hi > along)
            hi = along;
        if (lo < hi) {
            if (by_rows) {
                const float *Ab = ta ? A + lo : A + (size_t)lo * lda;
                cblas_sgemm(CblasRowMajor, TA, TB, hi - lo, N, K, alpha, Ab, lda, B, ldb, beta,
                            C + (size_t)lo * ldc, ldc);
            } else {
                const float *Bb = tb ? B + (size_t)lo * ldb : B + lo;
                cblas_sgemm(CblasRowMajor, TA, TB, M, hi - lo, K, alpha, A, lda, Bb, ldb, beta,
                            C + lo, ldc);
            }
        }
    }
}

static void cpu_matmul(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
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
        cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N, alpha, B,
                    ldb, A, 1, beta, C, 1);
        return;
    }
    gemm_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_rmsnorm(const nd_backend *be, float *y, float *rstd, const float *x,
                        const float *scale, long rows, int dim)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float rs = 1.0f / sqrtf(san_dot(xr, xr, dim) / (float)dim + 1e-6f);
        if (rstd)
            rstd[r] = rs;
        if (scale)
            for (int i = 0; i < dim; i++)
                yr[i] = (1.0f + scale[i]) * (xr[i] * rs);
        else
            for (int i = 0; i < dim; i++)
                yr[i] = xr[i] * rs;
    }
}

static void cpu_embed(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N,
                      int d, float scale)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < N; t++)
        for (int i = 0; i < d; i++)
            x0[t * d + i] = emb[(size_t)tok[t] * d + i] * scale;
}

/* the n-gram hash reads at most this many tokens */
#define SAN_MAX_ORDER 8

static void cpu_engram_hash(const nd_backend *be, int32_t *idx, const int32_t *tok,
                            const nd_layout *L, const int *orders, int n_orders, int heads,
                            int slots)
{
    (void)be;
    int K = n_orders * heads, omax = 0;
    for (int o = 0; o < n_orders; o++)
        omax = orders[o] > omax ? orders[o] : omax;
    omax = omax < SAN_MAX_ORDER ? omax : SAN_MAX_ORDER;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < L->N; r++) {
        uint32_t hist[SAN_MAX_ORDER];
        for (int j = 0; j < omax; j++) {
            long b = nd_layout_back(L, r, j);
            hist[j] = b >= 0 ? (uint32_t)tok[b] : 0u;
        }
        for (int k = 0; k < K; k++) {
            int o = orders[k / heads] < omax ? orders[k / heads] : omax;
            idx[r * K + k] = (int32_t)san_engram_index_hist(hist, o, k, slots);
        }
    }
}

static void cpu_engram_gather(const nd_backend *be, float *e, const float *tables,
                              const int32_t *idx, const nd_layout *L, const int *orders,
                              int n_orders, int heads, int slots, int sub)
{
    (void)be;
    int K = n_orders * heads;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < L->N; r++) {
        int t = L->pos[r];
        for (int k = 0; k < K; k++) {
            float *dst = e + (r * K + k) * sub;
            if (t < orders[k / heads] - 1) {
                memset(dst, 0, (size_t)sub * sizeof *dst);
                continue;
            }
            memcpy(dst, tables + ((size_t)k * slots + (size_t)idx[r * K + k]) * sub,
                   (size_t)sub * sizeof *dst);
        }
    }
}

static void cpu_engram_taps(const nd_backend *be, float *v, const float *vp, const float *taps,
                            const nd_layout *L, int d, int dil)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < L->N; r++) {
        float *vr = v + r * d;
        for (int i = 0; i < d; i++)
            vr[i] = 0.0f;
        for (int j = 0; j < 4; j++) {
            long b = nd_layout_back(L, r, j * dil);
            if (b < 0)
                break;
            const float *src = vp + b * d;
            const float *tj = taps + j * d;
            for (int i = 0; i < d; i++)
                vr[i] += tj[i] * src[i];
        }
    }
}

static void cpu_engram_gate(const nd_backend *be, float *bx, float *alpha, const float *u,
                            const float *k, const float *v, long N, int d, int accumulate)
{
    (void)be;
    float inv_sqrt_d = 1.0f / sqrtf((float)d);
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++) {
        const float *ur = u + r * d, *kr = k + r * d, *vr = v + r * d;
        float uu = san_dot(ur, ur, d), kk = san_dot(kr, kr, d), uk = san_dot(ur, kr, d);
        float ru = 1.0f / sqrtf(uu / (float)d + 1e-6f), rk = 1.0f / sqrtf(kk / (float)d + 1e-6f);
        float a = san_sigmoid(uk * ru * rk * inv_sqrt_d);
        alpha[r] = a;
        if (accumulate)
            for (int i = 0; i < d; i++)
                bx[r * d + i] += a * vr[i];
        else
            for (int i = 0; i < d; i++)
                bx[r * d + i] = ur[i] + a * vr[i];
    }
}

static void cpu_hyper_coeffs(const nd_backend *be, float *hpre, float *hpost, float *M,
                             const float *pre, const float *post, const float *res, float a_pre,
                             float a_post, float a_res, const float *b_pre, const float *b_post,
                             const float *b_res, int lane, long N, int n)
{
    (void)be;
    long nn = (long)n * n;
#pragma omp parallel
    {
        /* a contiguous share of rows per thread, so Sinkhorn runs on whole
         * vector groups of consecutive matrices */
        long r0, r1;
        cpu_thread_share(N, &r0, &r1);
        for (long r = r0; r < r1; r++) {
            for (int i = 0; i < n; i++) {
                float on = i == lane ? 1.0f : 0.0f;
                hpre[r * n + i] = san_sigmoid(a_pre * pre[r * n + i] + b_pre[i] + 8.0f * on - 4.0f);
                hpost[r * n + i] =
                    2.0f * san_sigmoid(a_post * post[r * n + i] + b_post[i] - 4.0f * (1.0f - on));
            }
            float *Mr = M + r * nn;
            for (long i = 0; i < nn; i++)
                Mr[i] = a_res * res[r * nn + i] + b_res[i];
        }
        if (r1 > r0)
            san_sinkhorn_rows(M + r0 * nn, r1 - r0, n, SAN_SINKHORN_ROUNDS);
    }
}

static void cpu_lanes_combine(const nd_backend *be, float *u, const float *hpre, const float *X,
                              long N, int n, int d)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++) {
        float *ur = u + r * d;
        const float *Xr = X + r * n * d;
        for (int c = 0; c < d; c++)
            ur[c] = 0.0f;
        for (int i = 0; i < n; i++) {
            float h = hpre[r * n + i];
            for (int c = 0; c < d; c++)
                ur[c] += h * Xr[i * d + c];
        }
    }
}

static void cpu_lanes_update(const nd_backend *be, float *Xo, const float *M, const float *X,
                             const float *hpost, const float *y, long N, int n, int d)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++) {
        const float *Xr = X + r * n * d, *Mr = M + r * n * n, *yr = y + r * d;
        float *Or = Xo + r * n * d;
        for (int i = 0; i < n; i++) {
            float *o = Or + i * d;
            float hp = hpost[r * n + i];
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

static void cpu_lanes_broadcast(const nd_backend *be, float *X, const float *x0, long N, int n,
                                int d)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++)
        for (int i = 0; i < n; i++)
            memcpy(X + (r * n + i) * d, x0 + r * d, (size_t)d * sizeof *X);
}

static void cpu_lanes_mean(const nd_backend *be, float *xm, const float *X, long N, int n, int d)
{
    (void)be;
    float inv = 1.0f / (float)n;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++) {
        /* lane by lane over whole rows (contiguous, vectorises) */
        float *o = xm + r * d;
        const float *Xr = X + r * n * d;
        for (int c = 0; c < d; c++)
            o[c] = Xr[c];
        for (int i = 1; i < n; i++)
            for (int c = 0; c < d; c++)
                o[c] += Xr[i * d + c];
        for (int c = 0; c < d; c++)
            o[c] *= inv;
    }
}

static void cpu_rope(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
                     const nd_layout *L, int heads, int hd)
{
    (void)be;
    int half = hd / 2;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < L->N; r++) {
        int t = L->pos[r];
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < heads; h++) {
            float *v = x + (r * heads + h) * hd;
            for (int i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c[i] - x2 * s[i];
                v[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

static void cpu_gate_sigmoid(const nd_backend *be, float *o, const float *att, const float *g,
                             long n)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        o[i] = att[i] * san_sigmoid(g[i]);
}

static void cpu_residual_scaled(const nd_backend *be, float *y, const float *x, const float *r,
                                float gate, long n)
{
    (void)be;
    float s = san_sigmoid(gate);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        y[i] = x[i] + s * r[i];
}

static void cpu_hadamard_mlp(const nd_backend *be, float *y, float *h1, const float *x,
                             const float *z, const float *u, const float *d1, const float *d2,
                             const float *d3, long N, int d, int hn)
{
    (void)be;
    float scale = san_walsh_scale(hn);
#pragma omp parallel
    {
        /* SK_W consecutive rows at a time in SoA form, so every transform
         * stage is full-width vector work (see san_fwht_soa) */
        long r0, r1;
        cpu_thread_share(N, &r0, &r1);
        float *H = cpu_xalloc((size_t)2 * hn * SK_W * sizeof *H), *S = H + (size_t)hn * SK_W;
        for (long g0 = r0; g0 < r1; g0 += SK_W) {
            int w = r1 - g0 < SK_W ? (int)(r1 - g0) : SK_W;
            memset(H, 0, (size_t)hn * SK_W * sizeof *H); /* pad rows d..hn, idle lanes */
            for (int k = 0; k < w; k++) {
                const float *zr = z + (g0 + k) * d;
                for (int i = 0; i < d; i++)
                    H[(size_t)i * SK_W + k] = d1[i] * zr[i];
            }
            san_fwht_soa(H, hn, scale);
            for (int k = 0; k < w; k++) {
                float *h = h1 + (g0 + k) * hn;
                for (int i = 0; i < hn; i++)
                    h[i] = H[(size_t)i * SK_W + k];
            }
            for (int i = 0; i < hn; i++)
                for (int k = 0; k < SK_W; k++)
                    S[(size_t)i * SK_W + k] = san_silu(d2[i] * H[(size_t)i * SK_W + k]);
            san_fwht_soa(S, hn, scale);
            for (int k = 0; k < w; k++) {
                long r = g0 + k;
                const float *xr = x + r * d;
                float *yr = y + r * d;
                if (u)
                    for (int i = 0; i < d; i++)
                        yr[i] = (xr[i] + d3[i] * S[(size_t)i * SK_W + k]) - u[r * d + i];
                else
                    for (int i = 0; i < d; i++)
                        yr[i] = xr[i] + d3[i] * S[(size_t)i * SK_W + k];
            }
        }
        free(H);
    }
}

static void cpu_cross_entropy(const nd_backend *be, float *loss, const float *logits,
                              const int32_t *target, long N, int V)
{
    (void)be;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < N; r++) {
        const float *l = logits + r * (long)V;
        float mx = l[0];
        for (int i = 1; i < V; i++)
            mx = l[i] > mx ? l[i] : mx;
        double s = 0;
        for (int i = 0; i < V; i++)
            s += exp((double)(l[i] - mx));
        loss[r] = (float)((double)mx + log(s) - (double)l[target[r]]);
    }
}

static void cpu_copy2d(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
                       long rows, int cols)
{
    (void)be;
    if (dst_ld == cols && src_ld == cols) {
        memcpy(dst, src, sizeof(float) * (size_t)rows * cols);
        return;
    }
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (long r = 0; r < rows; r++)
        memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * (size_t)cols);
}

static nd_backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .embed = cpu_embed,
    .engram_hash = cpu_engram_hash,
    .engram_gather = cpu_engram_gather,
    .engram_taps = cpu_engram_taps,
    .engram_gate = cpu_engram_gate,
    .hyper_coeffs = cpu_hyper_coeffs,
    .lanes_combine = cpu_lanes_combine,
    .lanes_update = cpu_lanes_update,
    .lanes_broadcast = cpu_lanes_broadcast,
    .lanes_mean = cpu_lanes_mean,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .gate_sigmoid = cpu_gate_sigmoid,
    .residual_scaled = cpu_residual_scaled,
    .hadamard_mlp = cpu_hadamard_mlp,
    .cross_entropy = cpu_cross_entropy,
    .copy2d = cpu_copy2d,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .embed_backward = cpu_embed_backward,
    .engram_gather_backward = cpu_engram_gather_backward,
    .engram_taps_backward = cpu_engram_taps_backward,
    .engram_gate_backward = cpu_engram_gate_backward,
    .hyper_coeffs_backward = cpu_hyper_coeffs_backward,
    .lanes_combine_backward = cpu_lanes_combine_backward,
    .lanes_update_backward = cpu_lanes_update_backward,
    .lanes_broadcast_backward = cpu_lanes_broadcast_backward,
    .lanes_mean_backward = cpu_lanes_mean_backward,
    .rope_backward = cpu_rope_backward,
    .attention_backward = cpu_attention_backward,
    .gate_sigmoid_backward = cpu_gate_sigmoid_backward,
    .residual_scaled_backward = cpu_residual_scaled_backward,
    .hadamard_mlp_backward = cpu_hadamard_mlp_backward,
    .add = cpu_add,
};

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static char cpu_detail[64];

static void cpu_backend_init(void)
{
    cpu_backend.threads = omp_get_max_threads();
    nd_blas_describe(cpu_detail, sizeof cpu_detail);
    cpu_backend.detail = cpu_detail;
}

const nd_backend *nd_backend_cpu(int threads)
{
    /* The table is filled once: models loaded on several threads (the
     * engine asks with threads = 0) only read it. threads > 0 changes
     * process-wide settings (the CLI's --threads), before any worker. */
    pthread_once(&cpu_once, cpu_backend_init);
    if (threads > 0) {
        omp_set_num_threads(threads);
        nd_blas_set_threads(threads);
        cpu_backend.threads = threads;
    }
    return &cpu_backend;
}
