/* Backward ops of the CUDA backend (attention: cuda_attention.cu;
 * hyper-connection coefficients and Hadamard MLP: cuda_mix.cu).
 * Semantics: backend.h; reference: src/backend/cpu/cpu_backward.c.
 *
 * Parameter gradients are never summed with atomics: a kernel writes one
 * double partial per (row chunk, column), chunks fixed by the row count,
 * and cuda_reduce_partials adds them in chunk order. Scatter-adds
 * (embedding, engram tables, rows) give each column to one thread that
 * walks the rows in order. So every result is the same on every run. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define ROW_THREADS 256
#define COL_THREADS 128

/* rows [r0, r1) of chunk p of `chunks` over `rows` */
__device__ __forceinline__ void chunk_rows(int p, int chunks, long rows, long *r0, long *r1)
{
    *r0 = rows * p / chunks;
    *r1 = rows * (p + 1) / chunks;
}

/* ---- loss ---- */

__global__ void k_cross_entropy_backward(float *logits, const int32_t *target, const float *weight,
                                         int V)
{
    __shared__ float sh[32];
    __shared__ double shd[32];
    long r = blockIdx.x;
    float *l = logits + r * (long)V;
    float w = weight ? weight[r] : 1.0f;
    if (w == 0.0f) { /* masked rows (prompt, padding) */
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            l[i] = 0.0f;
        return;
    }
    float mx = -3.402823466e38f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx, sh);
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = san_expf(l[i] - mx);
        l[i] = e;
        s += e;
    }
    s = block_sum_d(s, shd);
    float c = (float)(w / s);
    int tgt = target[r];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float p = l[i] * c;
        l[i] = i == tgt ? p - w : p;
    }
}

void cuda_cross_entropy_backward(const nd_backend *be, float *logits, const int32_t *target,
                                 const float *weight, long N, int V)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *dt = STAGE(C, target, N);
    const float *dw = STAGE(C, weight, N);
    k_cross_entropy_backward<<<(unsigned)N, ROW_THREADS, 0, C->stream>>>(logits, dt, dw, V);
    CUDA_LAUNCHED();
}

/* ---- RMSNorm ---- */

__device__ __forceinline__ float row_rstd(const float *xr, int dim, float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    return 1.0f / sqrtf(ss / (float)dim + 1e-6f);
}

__global__ void k_rmsnorm_rstd(float *rs_out, const float *x, int dim)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    float rs = row_rstd(x + r * dim, dim, sh);
    if (threadIdx.x == 0)
        rs_out[r] = rs;
}

/* partials[p][c] = sum over chunk p's rows of dy*x*rs (the dscale terms) */
__global__ void k_rmsnorm_dscale(double *partials, const float *dy, const float *x, const float *rs,
                                 long rows, int dim, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (c >= dim)
        return;
    long r0, r1;
    chunk_rows(p, chunks, rows, &r0, &r1);
    double acc = 0;
    for (long r = r0; r < r1; r++)
        acc += (double)(dy[r * dim + c] * x[r * dim + c] * rs[r]);
    partials[(size_t)p * dim + c] = acc;
}

__global__ void k_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *rstd,
                                   const float *scale, int dim, int accumulate)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    const float *xr = x + r * dim, *gr = dy + r * dim;
    float *dr = dx + r * dim;
    float rs = rstd ? rstd[r] : row_rstd(xr, dim, sh);
    float gx = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        gx += scale ? gr[i] * (1.0f + scale[i]) * xr[i] : gr[i] * xr[i];
    gx = block_sum(gx, sh);
    float c = rs * rs * rs * gx * (1.0f / (float)dim);
    /* dx may alias dy: element i is read and written by one thread, after
     * the sums */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = scale ? rs * gr[i] * (1.0f + scale[i]) - c * xr[i] : rs * gr[i] - c * xr[i];
        dr[i] = accumulate ? dr[i] + v : v;
    }
}

void cuda_rmsnorm_backward(const nd_backend *be, float *dx, float *dscale, const float *dy,
                           const float *x, const float *rstd, const float *scale, long rows,
                           int dim, int accumulate)
{
    if (rows <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, rows * dim), *dxin = STAGE(C, x, rows * dim);
    const float *drs = STAGE(C, rstd, rows), *dsc = STAGE(C, scale, dim);
    int chunks = cuda_row_chunks(rows);
    double *partials = NULL;
    if (dscale) {
        /* the dscale sums read dy before dx (which may alias it) is written */
        size_t pb = sizeof(double) * (size_t)chunks * dim;
        char *s = (char *)cuda_scratch(C, pb + sizeof(float) * (size_t)rows);
        partials = (double *)s;
        const float *rs = drs;
        if (!rs) {
            float *rsb = (float *)(s + pb);
            k_rmsnorm_rstd<<<(unsigned)rows, ROW_THREADS, 0, C->stream>>>(rsb, dxin, dim);
            CUDA_LAUNCHED();
            rs = rsb;
        }
        dim3 grid(cuda_blocks(dim, COL_THREADS), (unsigned)chunks);
        k_rmsnorm_dscale<<<grid, COL_THREADS, 0, C->stream>>>(partials, ddy, dxin, rs, rows, dim,
                                                              chunks);
        CUDA_LAUNCHED();
    }
    k_rmsnorm_backward<<<(unsigned)rows, ROW_THREADS, 0, C->stream>>>(dx, ddy, dxin, drs, dsc, dim,
                                                                      accumulate);
    CUDA_LAUNCHED();
    if (dscale)
        cuda_reduce_partials(C, dscale, partials, chunks, dim, 0, dim);
}

/* ---- scatter-adds: each element sums its rows in order ---- */

void cuda_embed_backward(const nd_backend *be, float *demb, const float *dx0, const int32_t *tok,
                         long N, int d, float scale)
{
    if (N <= 0 || !demb)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    cuda_scatter_rows(C, demb, dx0, tok, N, d, scale);
}

__global__ void k_engram_gather_backward(float *dtables, const float *de, const int32_t *idx,
                                         const int32_t *pos, long N, int K, int heads,
                                         const int *first_pos, int slots, int sub)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)K * sub)
        return;
    int k = (int)(i / sub), c = (int)(i % sub);
    int first = first_pos[k / heads]; /* earlier positions were zero rows */
    float *tab = dtables + (size_t)k * slots * sub;
    for (long r = 0; r < N; r++) {
        if (pos[r] < first)
            continue;
        tab[(size_t)idx[r * K + k] * sub + c] += de[(r * K + k) * sub + c];
    }
}

void cuda_engram_gather_backward(const nd_backend *be, float *dtables, const float *de,
                                 const int32_t *idx, const nd_layout *L, const int *orders,
                                 int n_orders, int heads, int slots, int sub)
{
    if (!dtables || L->N <= 0)
        return;
    long K = (long)n_orders * heads;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *di = STAGE(C, idx, L->N * K);
    const float *dde = STAGE(C, de, L->N * K * sub);
    /* the first visible position per order, read at issue time */
    int first[CUDA_MAX_ORDERS];
    if (n_orders > CUDA_MAX_ORDERS) {
        fprintf(stderr, "needle cuda: %d engram orders (at most %d)\n", n_orders, CUDA_MAX_ORDERS);
        abort();
    }
    for (int o = 0; o < n_orders; o++)
        first[o] = orders[o] - 1;
    const int *dfirst = (const int *)cuda_stage(C, first, sizeof(int) * (size_t)n_orders);
    dev_layout dl = cuda_layout(C, L);
    k_engram_gather_backward<<<cuda_blocks(K * sub, 32), 32, 0, C->stream>>>(
        dtables, dde, di, dl.pos, L->N, (int)K, heads, dfirst, slots, sub);
    CUDA_LAUNCHED();
}

/* ---- engram taps ---- */

/* dvp[r] = sum_j taps[j] * dv[r + j*dil] within r's segment, then what
 * the continuing segments' first rows send back to a prefix row (children
 * in order, as the CPU adds them after the whole own-segment pass) */
__global__ void k_engram_taps_dvp(float *dvp, const float *dv, const float *taps, dev_layout L,
                                  int d, int dil)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.N * d)
        return;
    long r = i / d;
    int c = (int)(i % d), s = L.row_seg[r];
    const nd_segment sg = L.seg[s];
    long end = (long)sg.start + sg.len;
    float o = 0.0f;
    for (int j = 0; j < 4 && r + (long)j * dil < end; j++)
        o += taps[j * d + c] * dv[(r + (long)j * dil) * d + c];
    /* row r sits at offset pr of segment s (a parent: len plen); child row
     * c.start + off reaches it j*dil back when off = pr - plen + j*dil */
    long pr = r - sg.start, plen = sg.len;
    for (int ci = L.child_off[s]; ci < L.child_off[s + 1]; ci++) {
        const nd_segment ch = L.seg[L.child[ci]];
        for (int j = 1; j < 4; j++) {
            long off = pr - plen + (long)j * dil;
            if (off < 0 || off >= ch.len || off >= 3L * dil)
                continue;
            o += taps[j * d + c] * dv[((long)ch.start + off) * d + c];
        }
    }
    dvp[i] = o;
}

/* partials[p][j*d + c] = sum over chunk p of dv[r,c] * vp[back(r, j*dil), c] */
__global__ void k_engram_taps_dtaps(double *partials, const float *dv, const float *vp,
                                    dev_layout L, int d, int dil, int chunks)
{
    int jc = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (jc >= 4 * d)
        return;
    int j = jc / d, c = jc % d;
    long r0, r1;
    chunk_rows(p, chunks, L.N, &r0, &r1);
    double acc = 0;
    for (long r = r0; r < r1; r++) {
        long b = dev_layout_back(L, r, j * dil);
        if (b >= 0)
            acc += (double)(dv[r * d + c] * vp[b * d + c]);
    }
    partials[(size_t)p * 4 * d + jc] = acc;
}

void cuda_engram_taps_backward(const nd_backend *be, float *dvp, float *dtaps, const float *dv,
                               const float *vp, const float *taps, const nd_layout *L, int d,
                               int dil)
{
    long N = L->N;
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddv = STAGE(C, dv, N * d), *dvpin = STAGE(C, vp, N * d);
    const float *dtp = STAGE(C, taps, 4 * d);
    dev_layout dl = cuda_layout(C, L);
    int chunks = cuda_row_chunks(N);
    double *partials = NULL;
    if (dtaps) {
        partials = (double *)cuda_scratch(C, sizeof(double) * (size_t)chunks * 4 * d);
        dim3 grid(cuda_blocks(4L * d, COL_THREADS), (unsigned)chunks);
        k_engram_taps_dtaps<<<grid, COL_THREADS, 0, C->stream>>>(partials, ddv, dvpin, dl, d, dil,
                                                                 chunks);
        CUDA_LAUNCHED();
    }
    k_engram_taps_dvp<<<cuda_blocks(N * d, 256), 256, 0, C->stream>>>(dvp, ddv, dtp, dl, d, dil);
    CUDA_LAUNCHED();
    if (dtaps)
        cuda_reduce_partials(C, dtaps, partials, chunks, 4 * d, 0, 4 * d);
}

/* ---- engram gate ---- */

__global__ void k_engram_gate_backward(float *du, float *dk, float *dv, const float *dbx,
                                       const float *u, const float *k, const float *v,
                                       const float *alpha, int d)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    const float *ur = u + r * d, *kr = k + r * d, *vr = v + r * d, *g = dbx + r * d;
    float uu = 0.0f, kk = 0.0f, uk = 0.0f, gv = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        uu += ur[i] * ur[i];
        kk += kr[i] * kr[i];
        uk += ur[i] * kr[i];
        gv += g[i] * vr[i];
    }
    uu = block_sum(uu, sh);
    kk = block_sum(kk, sh);
    uk = block_sum(uk, sh);
    gv = block_sum(gv, sh);
    float inv_d = 1.0f / (float)d, c = 1.0f / sqrtf((float)d);
    float ru = 1.0f / sqrtf(uu * inv_d + 1e-6f), rk = 1.0f / sqrtf(kk * inv_d + 1e-6f);
    float a = alpha[r];
    /* s = c*<u,k>*ru*rk, alpha = sigmoid(s) */
    float ds = gv * a * (1.0f - a) * c * ru * rk;
    float cu = uk * ru * ru * inv_d, ck = uk * rk * rk * inv_d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        du[r * d + i] += ds * (kr[i] - cu * ur[i]);
        dk[r * d + i] += ds * (ur[i] - ck * kr[i]);
        dv[r * d + i] += a * g[i];
    }
}

void cuda_engram_gate_backward(const nd_backend *be, float *du, float *dk, float *dv,
                               const float *dbx, const float *u, const float *k, const float *v,
                               const float *alpha, long N, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dg = STAGE(C, dbx, N * d), *du_in = STAGE(C, u, N * d);
    const float *dk_in = STAGE(C, k, N * d), *dv_in = STAGE(C, v, N * d);
    const float *da = STAGE(C, alpha, N);
    k_engram_gate_backward<<<(unsigned)N, ROW_THREADS, 0, C->stream>>>(du, dk, dv, dg, du_in, dk_in,
                                                                       dv_in, da, d);
    CUDA_LAUNCHED();
}

/* ---- lanes ---- */

__global__ void k_lanes_combine_backward(float *dhpre, float *dX, const float *du,
                                         const float *hpre, const float *X, int n, int d)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    const float *g = du + r * d;
    for (int li = 0; li < n; li++) {
        const float *x = X + (r * n + li) * d;
        float *o = dX + (r * n + li) * d;
        float h = hpre[r * n + li], acc = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            acc += g[c] * x[c];
            o[c] += h * g[c];
        }
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0)
            dhpre[r * n + li] = acc;
    }
}

void cuda_lanes_combine_backward(const nd_backend *be, float *dhpre, float *dX, const float *du,
                                 const float *hpre, const float *X, long N, int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dg = STAGE(C, du, N * d), *dh = STAGE(C, hpre, N * n);
    const float *dXin = STAGE(C, X, N * n * d);
    k_lanes_combine_backward<<<(unsigned)N, ROW_THREADS, 0, C->stream>>>(dhpre, dX, dg, dh, dXin, n,
                                                                         d);
    CUDA_LAUNCHED();
}

#define LU_THREADS 128
#define LU_WARPS (LU_THREADS / 32)

/* One block per row. Each thread owns columns c (strided): it reads G_i[c]
 * for every lane before writing any dX_j[c], so dX may alias G = dXo. The
 * n + n*n dot products (dhpost_i = <G_i, y>, dM_ij = <G_i, X_j>) are
 * per-thread partials, reduced warp by warp, then across warps in order. */
template <int NMAX>
__global__ void k_lanes_update_backward(float *dX, float *dM, float *dhpost, float *dy,
                                        const float *dXo, const float *M, const float *X,
                                        const float *hpost, const float *y, int n, int d)
{
    __shared__ float sh[LU_WARPS][NMAX + NMAX * NMAX];
    long r = blockIdx.x;
    const float *G = dXo + r * n * d, *Xr = X + r * n * d, *Mr = M + r * n * n;
    const float *hp = hpost + r * n, *yr = y + r * d;
    float *dXr = dX + r * n * d, *dyr = dy + r * d;
    float acc[NMAX + NMAX * NMAX];
    for (int a = 0; a < n + n * n; a++)
        acc[a] = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float g[NMAX], x[NMAX];
        for (int i = 0; i < n; i++) {
            g[i] = G[i * d + c];
            x[i] = Xr[i * d + c];
        }
        float yc = yr[c], dyc = 0.0f;
        for (int i = 0; i < n; i++) {
            dyc += hp[i] * g[i];
            acc[i] += g[i] * yc;
            for (int j = 0; j < n; j++)
                acc[n + i * n + j] += g[i] * x[j];
        }
        dyr[c] = dyc;
        for (int j = 0; j < n; j++) {
            float o = 0.0f;
            for (int i = 0; i < n; i++)
                o += Mr[i * n + j] * g[i];
            dXr[j * d + c] = o;
        }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int a = 0; a < n + n * n; a++) {
        float v = warp_sum(acc[a]);
        if (lane == 0)
            sh[w][a] = v;
    }
    __syncthreads();
    for (int a = threadIdx.x; a < n + n * n; a += blockDim.x) {
        float s = sh[0][a];
        for (int ww = 1; ww < LU_WARPS; ww++)
            s += sh[ww][a];
        if (a < n)
            dhpost[r * n + a] = s;
        else
            dM[r * n * n + (a - n)] = s;
    }
}

/* More than CUDA_MAX_LANES lanes: the same sums in separate kernels, from a
 * copy of dXo when dX aliases it. dots: block (r, a): a < n is <G_a, y>,
 * else <G_i, X_j> with a - n = i n + j. */
__global__ void k_lu_dots(float *dM, float *dhpost, const float *G, const float *X, const float *y,
                          int n, int d)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    int a = blockIdx.y;
    const float *g, *x;
    if (a < n) {
        g = G + (r * n + a) * d;
        x = y + r * d;
    } else {
        g = G + (r * n + (a - n) / n) * d;
        x = X + (r * n + (a - n) % n) * d;
    }
    float acc = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        acc += g[c] * x[c];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) {
        if (a < n)
            dhpost[r * n + a] = acc;
        else
            dM[r * n * n + (a - n)] = acc;
    }
}

/* dy (lane index n) and dX_j (j < n) per (r, lane, c) */
__global__ void k_lu_mix(float *dX, float *dy, const float *G, const float *M, const float *hpost,
                         long N, int n, int d)
{
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= N * (n + 1) * d)
        return;
    int c = (int)(e % d), j = (int)((e / d) % (n + 1));
    long r = e / ((long)(n + 1) * d);
    const float *Gr = G + r * n * d;
    float o = 0.0f;
    if (j == n) {
        for (int i = 0; i < n; i++)
            o += hpost[r * n + i] * Gr[i * d + c];
        dy[r * d + c] = o;
    } else {
        for (int i = 0; i < n; i++)
            o += M[r * n * n + i * n + j] * Gr[i * d + c];
        dX[(r * n + j) * d + c] = o;
    }
}

void cuda_lanes_update_backward(const nd_backend *be, float *dX, float *dM, float *dhpost,
                                float *dy, const float *dXo, const float *M, const float *X,
                                const float *hpost, const float *y, long N, int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dG = STAGE(C, dXo, N * n * d), *dMi = STAGE(C, M, N * n * n);
    const float *dXi = STAGE(C, X, N * n * d), *dh = STAGE(C, hpost, N * n);
    const float *dyi = STAGE(C, y, N * d);
    if (n > CUDA_MAX_LANES) {
        if (dG == dX) { /* dX is written while G is still read: read a copy */
            float *copy = (float *)cuda_scratch(C, sizeof(float) * (size_t)N * n * d);
            CUDA_CHECK(cudaMemcpyAsync(copy, dG, sizeof(float) * (size_t)N * n * d,
                                       cudaMemcpyDeviceToDevice, C->stream));
            dG = copy;
        }
        k_lu_dots<<<dim3((unsigned)N, (unsigned)(n + n * n)), 128, 0, C->stream>>>(dM, dhpost, dG,
                                                                                   dXi, dyi, n, d);
        CUDA_LAUNCHED();
        long total = N * (n + 1) * d;
        k_lu_mix<<<cuda_blocks(total, 256), 256, 0, C->stream>>>(dX, dy, dG, dMi, dh, N, n, d);
        CUDA_LAUNCHED();
        return;
    }
    if (n <= 4)
        k_lanes_update_backward<4><<<(unsigned)N, LU_THREADS, 0, C->stream>>>(
            dX, dM, dhpost, dy, dG, dMi, dXi, dh, dyi, n, d);
    else
        k_lanes_update_backward<CUDA_MAX_LANES><<<(unsigned)N, LU_THREADS, 0, C->stream>>>(
            dX, dM, dhpost, dy, dG, dMi, dXi, dh, dyi, n, d);
    CUDA_LAUNCHED();
}

__global__ void k_lanes_broadcast_backward(float *dx0, const float *dX, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d)
        return;
    long r = i / d;
    int c = (int)(i % d);
    const float *g = dX + r * n * d;
    float o = g[c];
    for (int j = 1; j < n; j++)
        o += g[j * d + c];
    dx0[i] = o;
}

void cuda_lanes_broadcast_backward(const nd_backend *be, float *dx0, const float *dX, long N, int n,
                                   int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dg = STAGE(C, dX, N * n * d);
    k_lanes_broadcast_backward<<<cuda_blocks(N * d, 256), 256, 0, C->stream>>>(dx0, dg, N, n, d);
    CUDA_LAUNCHED();
}

__global__ void k_lanes_mean_backward(float *dX, const float *dxm, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * n * d)
        return;
    long r = i / ((long)n * d);
    dX[i] = dxm[r * d + i % d] * (1.0f / (float)n);
}

void cuda_lanes_mean_backward(const nd_backend *be, float *dX, const float *dxm, long N, int n,
                              int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dg = STAGE(C, dxm, N * d);
    k_lanes_mean_backward<<<cuda_blocks(N * n * d, 256), 256, 0, C->stream>>>(dX, dg, N, n, d);
    CUDA_LAUNCHED();
}

/* ---- gates ---- */

__global__ void k_gate_sigmoid_backward(float *datt, float *dg, const float *dout, const float *att,
                                        const float *g, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float s = dev_sigmoid(g[i]), go = dout[i], a = att[i];
    datt[i] = go * s; /* may alias dout: read above */
    dg[i] = go * a * s * (1.0f - s);
}

void cuda_gate_sigmoid_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                                const float *att, const float *g, long n)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dgo = STAGE(C, dout, n), *da = STAGE(C, att, n), *dgi = STAGE(C, g, n);
    k_gate_sigmoid_backward<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(datt, dg, dgo, da, dgi, n);
    CUDA_LAUNCHED();
}

#define RS_THREADS 256

/* partials[p] = <dy, r> over chunk p of the n elements */
__global__ void k_residual_dot(double *partials, const float *dy, const float *r, long n,
                               int chunks)
{
    __shared__ double shd[32];
    long i0, i1;
    chunk_rows(blockIdx.x, chunks, n, &i0, &i1);
    double acc = 0;
    for (long i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        acc += (double)(dy[i] * r[i]);
    acc = block_sum_d(acc, shd);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

__global__ void k_residual_dgate(float *dgate, const double *partials, int chunks, float s)
{
    double sum = 0;
    for (int p = 0; p < chunks; p++)
        sum += partials[p];
    dgate[0] += (float)(sum * (double)s * (1.0 - (double)s));
}

__global__ void k_scale_into(float *dst, const float *src, float s, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = s * src[i];
}

void cuda_residual_scaled_backward(const nd_backend *be, float *dr, float *dgate, const float *dy,
                                   const float *r, float gate, long n)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, n), *drin = STAGE(C, r, n);
    float s = dev_sigmoid(gate); /* san_sigmoid, on the host */
    if (dgate) {
        /* the sum reads dy before dr (which may alias it) is written */
        long c = (n + 4095) / 4096;
        int chunks = (int)(c > CUDA_MAX_CHUNKS ? CUDA_MAX_CHUNKS : c);
        double *partials = (double *)cuda_scratch(C, sizeof(double) * (size_t)chunks);
        k_residual_dot<<<(unsigned)chunks, RS_THREADS, 0, C->stream>>>(partials, ddy, drin, n,
                                                                       chunks);
        CUDA_LAUNCHED();
        k_residual_dgate<<<1, 1, 0, C->stream>>>(dgate, partials, chunks, s);
        CUDA_LAUNCHED();
    }
    k_scale_into<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(dr, ddy, s, n);
    CUDA_LAUNCHED();
}
