/* Forward ops of the CUDA backend (except attention, hyper-connection
 * coefficients and the Hadamard MLP). Semantics: backend.h; reference:
 * src/backend/cpu/cpu_backend.c. Row ops use one block per row and the
 * fixed-tree block reductions of cuda_common.cuh. */
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_common.cuh"

#define ROW_THREADS 256

/* ---- norms, embeddings ---- */

__global__ void k_rmsnorm(float *y, float *rstd, const float *x, const float *scale, int dim)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    /* every x read is done once the sum is known: y may alias x */
    ss = block_sum(ss, sh);
    float rs = 1.0f / sqrtf(ss / (float)dim + 1e-6f);
    if (rstd && threadIdx.x == 0)
        rstd[r] = rs;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = scale ? (1.0f + scale[i]) * (xr[i] * rs) : xr[i] * rs;
}

void cuda_rmsnorm(const nd_backend *be, float *y, float *rstd, const float *x, const float *scale,
                  long rows, int dim)
{
    if (rows <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ds = STAGE(C, scale, dim), *dx = STAGE(C, x, rows * dim);
    k_rmsnorm<<<(unsigned)rows, ROW_THREADS, 0, C->stream>>>(y, rstd, dx, ds, dim);
    CUDA_LAUNCHED();
}

__global__ void k_embed(float *x0, const float *emb, const int32_t *tok, long N, int d, float scale)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d)
        return;
    long t = i / d;
    int c = (int)(i % d);
    x0[i] = emb[(size_t)tok[t] * d + c] * scale;
}

void cuda_embed(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N,
                int d, float scale)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *dt = STAGE(C, tok, N);
    k_embed<<<cuda_blocks(N * d, 256), 256, 0, C->stream>>>(x0, emb, dt, N, d, scale);
    CUDA_LAUNCHED();
}

/* ---- engram ---- */

typedef struct {
    int order[CUDA_MAX_ORDERS];
    int n;
} order_list;

static order_list read_orders(const int *orders, int n_orders)
{
    /* orders are configuration: read at issue time like a scalar */
    order_list o;
    if (n_orders > CUDA_MAX_ORDERS) {
        fprintf(stderr, "needle cuda: %d engram orders (at most %d)\n", n_orders, CUDA_MAX_ORDERS);
        abort();
    }
    o.n = n_orders;
    for (int i = 0; i < CUDA_MAX_ORDERS; i++)
        o.order[i] = i < n_orders ? orders[i] : 0;
    return o;
}

__global__ void k_engram_hash(int32_t *idx, const int32_t *tok, dev_layout L, order_list o,
                              int heads, int slots, int omax, int stride)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= L.N)
        return;
    uint32_t hist[CUDA_MAX_ENGRAM_ORDER];
    for (int j = 0; j < omax; j++) {
        long b = dev_layout_back(L, r, j);
        hist[j] = b >= 0 ? (uint32_t)tok[b] : 0u;
    }
    int K = o.n * heads;
    for (int k = 0; k < K; k++) {
        int ord = o.order[k / heads] < omax ? o.order[k / heads] : omax;
        /* san_engram_index_hist */
        int seed_k = (k / heads) * stride + k % heads; /* stride = heads: engram_hash */
        uint32_t acc = SAN_ENGRAM_SEED * (uint32_t)(seed_k + 1);
        for (int j = 0; j < ord; j++)
            acc = (acc ^ hist[j]) * SAN_ENGRAM_PRIME;
        acc ^= acc >> 15;
        idx[r * K + k] = (int32_t)(acc % (uint32_t)slots);
    }
}

void cuda_engram_hash(const nd_backend *be, int32_t *idx, const int32_t *tok, const nd_layout *L,
                      const int *orders, int n_orders, int heads, int slots)
{
    cuda_engram_hash_seeded(be, idx, tok, L, orders, n_orders, heads, slots, heads);
}

void cuda_engram_hash_seeded(const nd_backend *be, int32_t *idx, const int32_t *tok,
                             const nd_layout *L, const int *orders, int n_orders, int heads,
                             int slots, int stride)
{
    if (L->N <= 0)
        return;
    order_list o = read_orders(orders, n_orders);
    int omax = 0;
    for (int i = 0; i < n_orders; i++)
        omax = o.order[i] > omax ? o.order[i] : omax;
    omax = omax < CUDA_MAX_ENGRAM_ORDER ? omax : CUDA_MAX_ENGRAM_ORDER;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *dt = STAGE(C, tok, L->N);
    dev_layout dl = cuda_layout(C, L);
    k_engram_hash<<<cuda_blocks(L->N, 128), 128, 0, C->stream>>>(idx, dt, dl, o, heads, slots, omax,
                                                                 stride);
    CUDA_LAUNCHED();
}

__global__ void k_engram_gather(float *e, const float *tables, const int32_t *idx, dev_layout L,
                                order_list o, int heads, int slots, int sub)
{
    int K = o.n * heads;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.N * K * sub)
        return;
    long rk = i / sub;
    int c = (int)(i % sub), k = (int)(rk % K);
    long r = rk / K;
    if (L.pos[r] < o.order[k / heads] - 1)
        e[i] = 0.0f;
    else
        e[i] = tables[((size_t)k * slots + (size_t)idx[rk]) * sub + c];
}

void cuda_engram_gather(const nd_backend *be, float *e, const float *tables, const int32_t *idx,
                        const nd_layout *L, const int *orders, int n_orders, int heads, int slots,
                        int sub)
{
    if (L->N <= 0)
        return;
    order_list o = read_orders(orders, n_orders);
    long K = (long)n_orders * heads;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *di = STAGE(C, idx, L->N * K);
    const float *dtab = STAGE(C, tables, K * slots * sub);
    dev_layout dl = cuda_layout(C, L);
    k_engram_gather<<<cuda_blocks(L->N * K * sub, 256), 256, 0, C->stream>>>(e, dtab, di, dl, o,
                                                                             heads, slots, sub);
    CUDA_LAUNCHED();
}

__global__ void k_engram_taps(float *v, const float *vp, const float *taps, dev_layout L, int d,
                              int dil)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.N * d)
        return;
    long r = i / d;
    int c = (int)(i % d);
    float acc = 0.0f;
    for (int j = 0; j < 4; j++) {
        long b = dev_layout_back(L, r, j * dil);
        if (b < 0)
            break;
        acc += taps[j * d + c] * vp[b * d + c];
    }
    v[i] = acc;
}

void cuda_engram_taps(const nd_backend *be, float *v, const float *vp, const float *taps,
                      const nd_layout *L, int d, int dil)
{
    if (L->N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dtp = STAGE(C, taps, 4 * d), *dvp = STAGE(C, vp, L->N * d);
    dev_layout dl = cuda_layout(C, L);
    k_engram_taps<<<cuda_blocks(L->N * d, 256), 256, 0, C->stream>>>(v, dvp, dtp, dl, d, dil);
    CUDA_LAUNCHED();
}

__global__ void k_engram_gate(float *bx, float *alpha, const float *u, const float *k,
                              const float *v, int d, int accumulate)
{
    __shared__ float sh[32];
    long r = blockIdx.x;
    const float *ur = u + r * d, *kr = k + r * d, *vr = v + r * d;
    float uu = 0.0f, kk = 0.0f, uk = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        uu += ur[i] * ur[i];
        kk += kr[i] * kr[i];
        uk += ur[i] * kr[i];
    }
    uu = block_sum(uu, sh);
    kk = block_sum(kk, sh);
    uk = block_sum(uk, sh);
    float ru = 1.0f / sqrtf(uu / (float)d + 1e-6f), rk = 1.0f / sqrtf(kk / (float)d + 1e-6f);
    float a = dev_sigmoid(uk * ru * rk * (1.0f / sqrtf((float)d)));
    if (threadIdx.x == 0)
        alpha[r] = a;
    /* bx may alias u: each element is read by the thread that writes it,
     * after the sums */
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        if (accumulate)
            bx[r * d + i] += a * vr[i];
        else
            bx[r * d + i] = ur[i] + a * vr[i];
    }
}

void cuda_engram_gate(const nd_backend *be, float *bx, float *alpha, const float *u, const float *k,
                      const float *v, long N, int d, int accumulate)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *du = STAGE(C, u, N * d), *dk = STAGE(C, k, N * d), *dv = STAGE(C, v, N * d);
    k_engram_gate<<<(unsigned)N, ROW_THREADS, 0, C->stream>>>(bx, alpha, du, dk, dv, d, accumulate);
    CUDA_LAUNCHED();
}

/* ---- hyper-connection lanes ---- */

__global__ void k_lanes_combine(float *u, const float *hpre, const float *X, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d)
        return;
    long r = i / d;
    int c = (int)(i % d);
    const float *Xr = X + r * n * d;
    float acc = 0.0f;
    for (int j = 0; j < n; j++)
        acc += hpre[r * n + j] * Xr[j * d + c];
    u[i] = acc;
}

void cuda_lanes_combine(const nd_backend *be, float *u, const float *hpre, const float *X, long N,
                        int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dh = STAGE(C, hpre, N * n), *dX = STAGE(C, X, N * n * d);
    k_lanes_combine<<<cuda_blocks(N * d, 256), 256, 0, C->stream>>>(u, dh, dX, N, n, d);
    CUDA_LAUNCHED();
}

__global__ void k_lanes_update(float *Xo, const float *M, const float *X, const float *hpost,
                               const float *y, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * n * d)
        return;
    long ri = i / d;
    int c = (int)(i % d), li = (int)(ri % n);
    long r = ri / n;
    const float *Xr = X + r * n * d, *Mr = M + r * n * n;
    float o = hpost[ri] * y[r * d + c];
    for (int j = 0; j < n; j++)
        o += Mr[li * n + j] * Xr[j * d + c];
    Xo[i] = o;
}

void cuda_lanes_update(const nd_backend *be, float *Xo, const float *M, const float *X,
                       const float *hpost, const float *y, long N, int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dM = STAGE(C, M, N * n * n), *dX = STAGE(C, X, N * n * d);
    const float *dh = STAGE(C, hpost, N * n), *dy = STAGE(C, y, N * d);
    k_lanes_update<<<cuda_blocks(N * n * d, 256), 256, 0, C->stream>>>(Xo, dM, dX, dh, dy, N, n, d);
    CUDA_LAUNCHED();
}

__global__ void k_lanes_broadcast(float *X, const float *x0, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * n * d)
        return;
    long r = i / ((long)n * d);
    X[i] = x0[r * d + i % d];
}

void cuda_lanes_broadcast(const nd_backend *be, float *X, const float *x0, long N, int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dx0 = STAGE(C, x0, N * d);
    k_lanes_broadcast<<<cuda_blocks(N * n * d, 256), 256, 0, C->stream>>>(X, dx0, N, n, d);
    CUDA_LAUNCHED();
}

__global__ void k_lanes_mean(float *xm, const float *X, long N, int n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d)
        return;
    long r = i / d;
    int c = (int)(i % d);
    const float *Xr = X + r * n * d;
    float o = Xr[c];
    for (int j = 1; j < n; j++)
        o += Xr[j * d + c];
    xm[i] = o * (1.0f / (float)n);
}

void cuda_lanes_mean(const nd_backend *be, float *xm, const float *X, long N, int n, int d)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dX = STAGE(C, X, N * n * d);
    k_lanes_mean<<<cuda_blocks(N * d, 256), 256, 0, C->stream>>>(xm, dX, N, n, d);
    CUDA_LAUNCHED();
}

/* ---- RoPE (forward and its transpose) ---- */

__global__ void k_rope(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, long N,
                       int heads, int hd, int transpose)
{
    int half = hd / 2;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * heads * half)
        return;
    int e = (int)(i % half);
    long rh = i / half;
    long r = rh / heads;
    int t = pos[r];
    float c = cos_t[(size_t)t * half + e], s = sin_t[(size_t)t * half + e];
    float *v = x + rh * hd;
    float x1 = v[e], x2 = v[e + half];
    if (transpose) {
        v[e] = x1 * c + x2 * s;
        v[e + half] = x2 * c - x1 * s;
    } else {
        v[e] = x1 * c - x2 * s;
        v[e + half] = x2 * c + x1 * s;
    }
}

static int layout_max_pos(const nd_layout *L)
{
    int m = 0;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *g = &L->seg[s];
        int end = g->len + (g->parent >= 0 ? L->seg[g->parent].len : 0);
        m = end > m ? end : m;
    }
    return m;
}

static void rope_issue(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
                       const nd_layout *L, int heads, int hd, int transpose)
{
    if (L->N <= 0)
        return;
    long tn = (long)layout_max_pos(L) * (hd / 2);
    cuda_ctx *C = cuda_op_begin(be);
    const float *dc = STAGE(C, cos_t, tn), *ds = STAGE(C, sin_t, tn);
    dev_layout dl = cuda_layout(C, L);
    long n = L->N * heads * (hd / 2);
    k_rope<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(x, dc, ds, dl.pos, L->N, heads, hd,
                                                       transpose);
    CUDA_LAUNCHED();
}

void cuda_rope(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
               const nd_layout *L, int heads, int hd)
{
    rope_issue(be, x, cos_t, sin_t, L, heads, hd, 0);
}

void cuda_rope_backward(const nd_backend *be, float *dx, const float *cos_t, const float *sin_t,
                        const nd_layout *L, int heads, int hd)
{
    rope_issue(be, dx, cos_t, sin_t, L, heads, hd, 1);
}

/* ---- elementwise ---- */

__global__ void k_gate_sigmoid(float *o, const float *att, const float *g, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        o[i] = att[i] * dev_sigmoid(g[i]);
}

void cuda_gate_sigmoid(const nd_backend *be, float *o, const float *att, const float *g, long n)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *da = STAGE(C, att, n), *dg = STAGE(C, g, n);
    k_gate_sigmoid<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(o, da, dg, n);
    CUDA_LAUNCHED();
}

__global__ void k_residual_scaled(float *y, const float *x, const float *r, float s, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x[i] + s * r[i];
}

void cuda_residual_scaled(const nd_backend *be, float *y, const float *x, const float *r,
                          float gate, long n)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dx = STAGE(C, x, n), *dr = STAGE(C, r, n);
    k_residual_scaled<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(y, dx, dr, dev_sigmoid(gate), n);
    CUDA_LAUNCHED();
}

__global__ void k_add(float *y, const float *x, float alpha, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += alpha * x[i];
}

void cuda_add(const nd_backend *be, float *y, const float *x, float alpha, long n)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dx = STAGE(C, x, n);
    k_add<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(y, dx, alpha, n);
    CUDA_LAUNCHED();
}

/* ---- rows ---- */

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, long n, int d)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d)
        return;
    long r = i / d;
    dst[i] = src[(size_t)rows[r] * d + i % d];
}

void cuda_gather_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                      long n, int d)
{
    if (n <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *dr = STAGE(C, rows, n);
    k_gather_rows<<<cuda_blocks(n * d, 256), 256, 0, C->stream>>>(dst, src, dr, n, d);
    CUDA_LAUNCHED();
}

/* one thread per column walks the rows in order i: repeated rows sum in
 * the CPU's order and no two threads touch one element */
__global__ void k_scatter_serial(float *dst, const float *src, const int32_t *rows, long n, int d,
                                 float scale)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d)
        return;
    for (long i = 0; i < n; i++)
        dst[(size_t)rows[i] * d + c] += src[(size_t)i * d + c] * scale;
}

/* one thread per (destination row, column): its sources in order */
__global__ void k_scatter_grouped(float *dst, const float *src, const int32_t *dst_row,
                                  const int32_t *off, const int32_t *src_row, long groups, int d,
                                  float scale)
{
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= groups * d)
        return;
    long g = e / d;
    int c = (int)(e % d);
    float *o = dst + (size_t)dst_row[g] * d + c;
    float acc = *o;
    for (int j = off[g]; j < off[g + 1]; j++)
        acc += src[(size_t)src_row[j] * d + c] * scale;
    *o = acc;
}

void cuda_scatter_rows(cuda_ctx *C, float *dst, const float *src, const int32_t *rows, long n,
                       int d, float scale)
{
    if (n <= 0 || d <= 0)
        return;
    const float *ds = STAGE(C, src, n * d);
    if (!cuda_is_host(rows)) {
        k_scatter_serial<<<cuda_blocks(d, 32), 32, 0, C->stream>>>(dst, ds, rows, n, d, scale);
        CUDA_LAUNCHED();
        return;
    }
    /* group the sources by destination, in order i within a group: sort
     * (row, i) keys; the index list is host data read at issue time */
    std::vector<uint64_t> key((size_t)n);
    for (long i = 0; i < n; i++)
        key[(size_t)i] = (uint64_t)(uint32_t)rows[i] << 32 | (uint64_t)i;
    std::sort(key.begin(), key.end());
    std::vector<int32_t> dst_row, off, src_row((size_t)n);
    for (long i = 0; i < n; i++) {
        int32_t r = (int32_t)(key[(size_t)i] >> 32);
        if (!i || r != dst_row.back()) {
            dst_row.push_back(r);
            off.push_back((int32_t)i);
        }
        src_row[(size_t)i] = (int32_t)(key[(size_t)i] & 0xffffffffu);
    }
    off.push_back((int32_t)n);
    long groups = (long)dst_row.size();
    const int32_t *g_dst = STAGE(C, dst_row.data(), groups);
    const int32_t *g_off = STAGE(C, off.data(), groups + 1);
    const int32_t *g_src = STAGE(C, src_row.data(), n);
    k_scatter_grouped<<<cuda_blocks(groups * d, 256), 256, 0, C->stream>>>(dst, ds, g_dst, g_off,
                                                                           g_src, groups, d, scale);
    CUDA_LAUNCHED();
}

void cuda_scatter_add_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                           long n, int d)
{
    cuda_ctx *C = cuda_op_begin(be);
    cuda_scatter_rows(C, dst, src, rows, n, d, 1.0f);
}

/* ---- loss ---- */

__global__ void k_cross_entropy(float *loss, const float *logits, const int32_t *target, int V)
{
    __shared__ float sh[32];
    __shared__ double shd[32];
    long r = blockIdx.x;
    const float *l = logits + r * (long)V;
    float mx = -3.402823466e38f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx, sh);
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += exp((double)(l[i] - mx));
    s = block_sum_d(s, shd);
    if (threadIdx.x == 0)
        loss[r] = (float)((double)mx + log(s) - (double)l[target[r]]);
}

void cuda_cross_entropy(const nd_backend *be, float *loss, const float *logits,
                        const int32_t *target, long N, int V)
{
    if (N <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const int32_t *dt = STAGE(C, target, N);
    const float *dl = STAGE(C, logits, N * V);
    k_cross_entropy<<<(unsigned)N, ROW_THREADS, 0, C->stream>>>(loss, dl, dt, V);
    CUDA_LAUNCHED();
}

/* ---- copies ---- */

/* a kernel rather than cudaMemcpy2DAsync: the column blocks copied here
 * are often a few floats wide, which the copy engines do row by row */
__global__ void k_copy2d(float *dst, int dst_ld, const float *src, int src_ld, long rows, int cols)
{
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * cols)
        return;
    long r = e / cols;
    int c = (int)(e % cols);
    dst[r * dst_ld + c] = src[r * src_ld + c];
}

void cuda_copy2d(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
                 long rows, int cols)
{
    if (rows <= 0 || cols <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ds = STAGE(C, src, (rows - 1) * src_ld + cols);
    k_copy2d<<<cuda_blocks(rows * cols, 256), 256, 0, C->stream>>>(dst, dst_ld, ds, src_ld, rows,
                                                                   cols);
    CUDA_LAUNCHED();
}
