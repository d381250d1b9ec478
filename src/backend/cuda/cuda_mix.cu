/* Hyper-connection coefficients (20-round Sinkhorn) and the Hadamard MLP,
 * forward and backward. Reference: cpu_backend.c, cpu_backward.c and
 * cpu_sinkhorn.c; every row does the float operations of the CPU's
 * one-matrix / one-row definitions (only the parameter-gradient sums run
 * in a different, but fixed, order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define HC_THREADS 128

/* ---- Sinkhorn ---- */

/* One half-round on one n x n matrix Z (san_sinkhorn_halfstep for one
 * lane): log-normalise each row (rowstep) or column; E (may be NULL) gets
 * this step's softmax. */
__device__ __forceinline__ void sinkhorn_halfstep(float *Z, float *E, int n, int rowstep)
{
    for (int a = 0; a < n; a++) {
        int base = rowstep ? a * n : a, stp = rowstep ? 1 : n;
        float mx = Z[base];
        for (int b = 1; b < n; b++) {
            float p = Z[base + b * stp];
            mx = p > mx ? p : mx;
        }
        float s = 0.0f;
        for (int b = 0; b < n; b++) {
            float e = san_expf(Z[base + b * stp] - mx);
            if (E)
                E[base + b * stp] = e;
            s += e;
        }
        float lse = mx + san_logf(s), inv = 1.0f / s;
        for (int b = 0; b < n; b++) {
            Z[base + b * stp] -= lse;
            if (E)
                E[base + b * stp] *= inv;
        }
    }
}

template <int NMAX>
__global__ void k_hyper_coeffs(float *hpre, float *hpost, float *M, const float *pre,
                               const float *post, const float *res, float a_pre, float a_post,
                               float a_res, const float *b_pre, const float *b_post,
                               const float *b_res, int lane, long N, int n)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    int nn = n * n;
    for (int i = 0; i < n; i++) {
        float on = i == lane ? 1.0f : 0.0f;
        hpre[r * n + i] = dev_sigmoid(a_pre * pre[r * n + i] + b_pre[i] + 8.0f * on - 4.0f);
        hpost[r * n + i] =
            2.0f * dev_sigmoid(a_post * post[r * n + i] + b_post[i] - 4.0f * (1.0f - on));
    }
    float Z[NMAX * NMAX];
    for (int i = 0; i < nn; i++)
        Z[i] = a_res * res[r * nn + i] + b_res[i];
    for (int it = 0; it < SAN_SINKHORN_ROUNDS; it++) {
        sinkhorn_halfstep(Z, NULL, n, 1);
        sinkhorn_halfstep(Z, NULL, n, 0);
    }
    for (int i = 0; i < nn; i++)
        M[r * nn + i] = san_expf(Z[i]);
}

static void check_lanes(int n)
{
    if (n > CUDA_MAX_LANES || n < 1) {
        fprintf(stderr, "needle cuda: %d hyper-connection lanes (1 to %d)\n", n, CUDA_MAX_LANES);
        abort();
    }
}

void cuda_hyper_coeffs(const nd_backend *be, float *hpre, float *hpost, float *M, const float *pre,
                       const float *post, const float *res, float a_pre, float a_post, float a_res,
                       const float *b_pre, const float *b_post, const float *b_res, int lane,
                       long N, int n)
{
    if (N <= 0)
        return;
    check_lanes(n);
    cuda_ctx *C = cuda_op_begin(be);
    long nn = (long)n * n;
    const float *dpre = STAGE(C, pre, N * n), *dpost = STAGE(C, post, N * n);
    const float *dres = STAGE(C, res, N * nn), *dbp = STAGE(C, b_pre, n);
    const float *dbq = STAGE(C, b_post, n), *dbr = STAGE(C, b_res, nn);
    unsigned grid = cuda_blocks(N, HC_THREADS);
    if (n <= 4)
        k_hyper_coeffs<4><<<grid, HC_THREADS, 0, C->stream>>>(
            hpre, hpost, M, dpre, dpost, dres, a_pre, a_post, a_res, dbp, dbq, dbr, lane, N, n);
    else
        k_hyper_coeffs<CUDA_MAX_LANES><<<grid, HC_THREADS, 0, C->stream>>>(
            hpre, hpost, M, dpre, dpost, dres, a_pre, a_post, a_res, dbp, dbq, dbr, lane, N, n);
    CUDA_LAUNCHED();
}

/* Per row: dpre, dpost, dres (set) and the row's parameter-gradient terms
 * into rowc[r][3 + 2n + nn] (a_pre, a_post, a_res, b_pre[n], b_post[n],
 * b_res[nn]), summed over rows afterwards in a fixed order. The Sinkhorn
 * rounds are recomputed keeping each half-round's softmax E, then walked
 * back: y = x - lse(x) has dx = dy - E * sum(dy) (in double, as the CPU). */
template <int NMAX>
__global__ void
k_hyper_coeffs_backward(float *dpre, float *dpost, float *dres, double *rowc, const float *dhpre,
                        const float *dhpost, const float *dM, const float *pre, const float *post,
                        const float *res, const float *hpre, const float *hpost, float a_pre,
                        float a_post, float a_res, const float *b_res, long N, int n)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    int nn = n * n, width = 3 + 2 * n + nn;
    double *rc = rowc + r * width;
    double apre = 0, apost = 0, ares = 0;
    for (int i = 0; i < n; i++) {
        long e = r * n + i;
        float h = hpre[e], dz = dhpre[e] * h * (1.0f - h);
        dpre[e] = a_pre * dz;
        apre += (double)(dz * pre[e]);
        rc[3 + i] = (double)dz;
        /* hpost = 2*sigmoid(z): dhpost/dz = hpost*(1 - hpost/2) */
        h = hpost[e];
        dz = dhpost[e] * h * (1.0f - 0.5f * h);
        dpost[e] = a_post * dz;
        apost += (double)(dz * post[e]);
        rc[3 + n + i] = (double)dz;
    }
    float Z[NMAX * NMAX], E[2 * SAN_SINKHORN_ROUNDS][NMAX * NMAX];
    double g[NMAX * NMAX];
    const float *rr = res + r * nn;
    for (int i = 0; i < nn; i++)
        Z[i] = a_res * rr[i] + b_res[i];
    for (int st = 0; st < 2 * SAN_SINKHORN_ROUNDS; st++)
        sinkhorn_halfstep(Z, E[st], n, !(st & 1));
    for (int i = 0; i < nn; i++) /* M = exp(Z) */
        g[i] = (double)dM[r * nn + i] * (double)san_expf(Z[i]);
    for (int st = 2 * SAN_SINKHORN_ROUNDS - 1; st >= 0; st--) {
        const float *e = E[st];
        int rowstep = !(st & 1), stp = rowstep ? 1 : n;
        for (int a = 0; a < n; a++) {
            int base = rowstep ? a * n : a;
            double sum = 0;
            for (int b = 0; b < n; b++)
                sum += g[base + b * stp];
            for (int b = 0; b < n; b++)
                g[base + b * stp] -= (double)e[base + b * stp] * sum;
        }
    }
    for (int i = 0; i < nn; i++) {
        dres[r * nn + i] = (float)(a_res * g[i]);
        ares += g[i] * rr[i];
        rc[3 + 2 * n + i] = g[i];
    }
    rc[0] = apre;
    rc[1] = apost;
    rc[2] = ares;
}

/* partials[p][col] = sum of rowc[r][col] over the rows of chunk p, in order */
__global__ void k_sum_row_chunks(double *partials, const double *rowc, long rows, int width,
                                 int chunks)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (col >= width)
        return;
    long r0 = rows * p / chunks, r1 = rows * (p + 1) / chunks;
    double acc = 0;
    for (long r = r0; r < r1; r++)
        acc += rowc[r * width + col];
    partials[(size_t)p * width + col] = acc;
}

void cuda_hyper_coeffs_backward(const nd_backend *be, float *dpre, float *dpost, float *dres,
                                float *da_pre, float *da_post, float *da_res, float *db_pre,
                                float *db_post, float *db_res, const float *dhpre,
                                const float *dhpost, const float *dM, const float *pre,
                                const float *post, const float *res, const float *hpre,
                                const float *hpost, float a_pre, float a_post, float a_res,
                                const float *b_res, long N, int n)
{
    if (N <= 0)
        return;
    check_lanes(n);
    cuda_ctx *C = cuda_op_begin(be);
    long nn = (long)n * n;
    int width = 3 + 2 * n + (int)nn, chunks = cuda_row_chunks(N);
    const float *ddhpre = STAGE(C, dhpre, N * n), *ddhpost = STAGE(C, dhpost, N * n);
    const float *ddM = STAGE(C, dM, N * nn), *dpre_in = STAGE(C, pre, N * n);
    const float *dpost_in = STAGE(C, post, N * n), *dres_in = STAGE(C, res, N * nn);
    const float *dhpre_in = STAGE(C, hpre, N * n), *dhpost_in = STAGE(C, hpost, N * n);
    const float *dbr = STAGE(C, b_res, nn);
    size_t rb = sizeof(double) * (size_t)N * width;
    char *s = (char *)cuda_scratch(C, rb + sizeof(double) * (size_t)chunks * width);
    double *rowc = (double *)s, *partials = (double *)(s + rb);
    unsigned grid = cuda_blocks(N, HC_THREADS);
    if (n <= 4)
        k_hyper_coeffs_backward<4><<<grid, HC_THREADS, 0, C->stream>>>(
            dpre, dpost, dres, rowc, ddhpre, ddhpost, ddM, dpre_in, dpost_in, dres_in, dhpre_in,
            dhpost_in, a_pre, a_post, a_res, dbr, N, n);
    else
        k_hyper_coeffs_backward<CUDA_MAX_LANES><<<grid, HC_THREADS, 0, C->stream>>>(
            dpre, dpost, dres, rowc, ddhpre, ddhpost, ddM, dpre_in, dpost_in, dres_in, dhpre_in,
            dhpost_in, a_pre, a_post, a_res, dbr, N, n);
    CUDA_LAUNCHED();
    dim3 g2(cuda_blocks(width, 32), (unsigned)chunks);
    k_sum_row_chunks<<<g2, 32, 0, C->stream>>>(partials, rowc, N, width, chunks);
    CUDA_LAUNCHED();
    cuda_reduce_partials(C, da_pre, partials, chunks, width, 0, 1);
    cuda_reduce_partials(C, da_post, partials, chunks, width, 1, 1);
    cuda_reduce_partials(C, da_res, partials, chunks, width, 2, 1);
    cuda_reduce_partials(C, db_pre, partials, chunks, width, 3, n);
    cuda_reduce_partials(C, db_post, partials, chunks, width, 3 + n, n);
    cuda_reduce_partials(C, db_res, partials, chunks, width, 3 + 2 * n, (int)nn);
}

/* ---- Hadamard MLP ---- */

/* columns per thread at most: hn <= HM_MAX_CPT * 1024 */
#define HM_MAX_CPT 4

static int hm_threads(int hn)
{
    int t = hn / 2;
    return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

static void check_hn(int d, int hn)
{
    if (hn < 2 || (hn & (hn - 1)) || hn > HM_MAX_CPT * 1024 || d > hn) {
        fprintf(stderr,
                "needle cuda: Hadamard MLP width %d (d %d): need a power of two >= d, "
                "at most %d\n",
                hn, d, HM_MAX_CPT * 1024);
        abort();
    }
}

/* In-place Walsh-Hadamard transform of length hn in shared memory, in
 * san_fwht's Sylvester order (each butterfly the same float ops), times
 * scale. Ends synchronised. Several arrays at once share the barriers. */
__device__ __forceinline__ void fwht_shared(float *X, float *Y, int hn, float scale)
{
    for (int h = 1; h < hn; h <<= 1) {
        for (int b = threadIdx.x; b < hn / 2; b += blockDim.x) {
            int j = (b / h) * 2 * h + (b % h);
            float a = X[j], c = X[j + h];
            X[j] = a + c;
            X[j + h] = a - c;
            if (Y) {
                a = Y[j];
                c = Y[j + h];
                Y[j] = a + c;
                Y[j + h] = a - c;
            }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < hn; i += blockDim.x) {
        X[i] *= scale;
        if (Y)
            Y[i] *= scale;
    }
    __syncthreads();
}

__global__ void k_hadamard_mlp(float *y, float *h1, const float *x, const float *z, const float *u,
                               const float *d1, const float *d2, const float *d3, int d, int hn,
                               float scale)
{
    extern __shared__ float hm_sh[];
    float *H = hm_sh;
    long r = blockIdx.x;
    for (int i = threadIdx.x; i < hn; i += blockDim.x)
        H[i] = i < d ? d1[i] * z[r * d + i] : 0.0f; /* pad rows d..hn */
    __syncthreads();
    fwht_shared(H, NULL, hn, scale);
    for (int i = threadIdx.x; i < hn; i += blockDim.x) {
        float h = H[i];
        h1[r * hn + i] = h;
        float sv = d2[i] * h;
        H[i] = sv * dev_sigmoid(sv); /* silu */
    }
    __syncthreads();
    fwht_shared(H, NULL, hn, scale);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = x[r * d + i] + d3[i] * H[i];
        y[r * d + i] = u ? o - u[r * d + i] : o;
    }
}

void cuda_hadamard_mlp(const nd_backend *be, float *y, float *h1, const float *x, const float *z,
                       const float *u, const float *d1, const float *d2, const float *d3, long N,
                       int d, int hn)
{
    if (N <= 0)
        return;
    check_hn(d, hn);
    cuda_ctx *C = cuda_op_begin(be);
    const float *dx = STAGE(C, x, N * d), *dz = STAGE(C, z, N * d), *du = STAGE(C, u, N * d);
    const float *dd1 = STAGE(C, d1, hn), *dd2 = STAGE(C, d2, hn), *dd3 = STAGE(C, d3, hn);
    float scale = 1.0f / (float)sqrt((double)hn); /* san_walsh_scale */
    k_hadamard_mlp<<<(unsigned)N, hm_threads(hn), sizeof(float) * (size_t)hn, C->stream>>>(
        y, h1, dx, dz, du, dd1, dd2, dd3, d, hn, scale);
    CUDA_LAUNCHED();
}

/* One block per chunk of rows, walked in order; each thread owns the
 * columns i = tid + k*blockDim of every elementwise step, so its dd1, dd2,
 * dd3 terms accumulate in registers (double) and are written once as the
 * chunk's partials[p][3 hn]. Per row (the transpose of the scaled Walsh
 * matrix is itself):
 *   W = fwht(silu(d2*h1)), dd3 += dy*W
 *   G = fwht(pad(dy*d3)) * silu'(d2*h1), dd2 += G*h1
 *   G = fwht(G*d2), dd1 += G*z, dz = G*d1 */
__global__ void k_hadamard_mlp_backward(float *dz, double *partials, const float *dy,
                                        const float *z, const float *h1, const float *d1,
                                        const float *d2, const float *d3, long N, int d, int hn,
                                        float scale, int chunks)
{
    extern __shared__ float hm_sh[];
    float *H = hm_sh, *W = H + hn, *SG = W + hn, *Gm = SG + hn;
    double a1[HM_MAX_CPT] = {0}, a2[HM_MAX_CPT] = {0}, a3[HM_MAX_CPT] = {0};
    long r0 = N * blockIdx.x / chunks, r1 = N * (blockIdx.x + 1) / chunks;
    for (long r = r0; r < r1; r++) {
        const float *gy = dy + r * d;
        for (int i = threadIdx.x; i < hn; i += blockDim.x) {
            float h = h1[r * hn + i];
            H[i] = h;
            Gm[i] = i < d ? gy[i] * d3[i] : 0.0f;
            float sv = d2[i] * h, sg = dev_sigmoid(sv);
            SG[i] = sg;
            W[i] = sv * sg;
        }
        __syncthreads();
        fwht_shared(W, Gm, hn, scale);
        for (int k = 0, i = threadIdx.x; k < HM_MAX_CPT && i < hn; k++, i += blockDim.x) {
            if (i < d)
                a3[k] += (double)(gy[i] * W[i]);
            float sv = d2[i] * H[i];
            float gm = Gm[i] * (SG[i] * (1.0f + sv * (1.0f - SG[i]))); /* silu' */
            a2[k] += (double)(gm * H[i]);
            Gm[i] = gm * d2[i];
        }
        __syncthreads();
        fwht_shared(Gm, NULL, hn, scale);
        for (int k = 0, i = threadIdx.x; k < HM_MAX_CPT && i < d; k++, i += blockDim.x) {
            float gi = Gm[i];
            a1[k] += (double)(gi * z[r * d + i]);
            dz[r * d + i] = gi * d1[i];
        }
        __syncthreads(); /* the next row overwrites the shared arrays */
    }
    if (!partials)
        return;
    double *pp = partials + (size_t)blockIdx.x * 3 * hn;
    for (int k = 0, i = threadIdx.x; k < HM_MAX_CPT && i < hn; k++, i += blockDim.x) {
        pp[i] = a1[k];
        pp[hn + i] = a2[k];
        pp[2 * hn + i] = a3[k];
    }
}

void cuda_hadamard_mlp_backward(const nd_backend *be, float *dz, float *dd1, float *dd2, float *dd3,
                                const float *dy, const float *z, const float *h1, const float *d1,
                                const float *d2, const float *d3, long N, int d, int hn)
{
    if (N <= 0)
        return;
    check_hn(d, hn);
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, N * d), *dzin = STAGE(C, z, N * d);
    const float *dh1 = STAGE(C, h1, N * hn), *dd1in = STAGE(C, d1, hn);
    const float *dd2in = STAGE(C, d2, hn), *dd3in = STAGE(C, d3, hn);
    float scale = 1.0f / (float)sqrt((double)hn);
    int chunks = cuda_row_chunks(N);
    double *partials = NULL;
    if (dd1 || dd2 || dd3)
        partials = (double *)cuda_scratch(C, sizeof(double) * (size_t)chunks * 3 * hn);
    size_t sh = 4 * sizeof(float) * (size_t)hn;
    if (sh > 48 * 1024) /* over the default: an opt-in per kernel */
        CUDA_CHECK(cudaFuncSetAttribute(k_hadamard_mlp_backward,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    k_hadamard_mlp_backward<<<(unsigned)chunks, hm_threads(hn), sh, C->stream>>>(
        dz, partials, ddy, dzin, dh1, dd1in, dd2in, dd3in, N, d, hn, scale, chunks);
    CUDA_LAUNCHED();
    if (partials) {
        cuda_reduce_partials(C, dd1, partials, chunks, 3 * hn, 0, hn);
        cuda_reduce_partials(C, dd2, partials, chunks, 3 * hn, hn, hn);
        cuda_reduce_partials(C, dd3, partials, chunks, 3 * hn, 2 * hn, hn);
    }
}
