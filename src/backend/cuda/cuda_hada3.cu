/* Needle 3's Hadamard MLP ops on CUDA: hada3_mix and its backward (the
 * element-wise stages, read and written through per-feature offset
 * tables) and softmax_rows and its backward (the cond logits). Semantics
 * in backend/ops.def; reference src/backend/cpu/cpu_hada3.c, whose float
 * operations every element repeats (the parameter-gradient sums run over
 * fixed row chunks in double, then in chunk order). */
#include <vector>

#include "cuda_common.cuh"

/* ---- hada3_mix ---- */

/* 1 + sum_q p[r*rank + q] * cu[q*cols + m], in q order; 1 without p */
__device__ __forceinline__ float mix_gain(const float *p, const float *cu, int rank, int cols,
                                          long r, int m)
{
    float g = 1.0f;
    if (!p)
        return g;
    for (int q = 0; q < rank; q++)
        g += p[r * rank + q] * cu[(size_t)q * cols + m];
    return g;
}

/* one thread per (row, feature) */
__global__ void k_hada3_mix(float *dst, const int32_t *doff, int drs, const float *src,
                            const int32_t *soff, int srs, const float *scale, const float *p,
                            const float *cu, int rank, const float *bias, int silu, long N,
                            int cols)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * cols)
        return;
    long r = i / cols;
    int m = (int)(i - r * cols);
    int dof = doff[m];
    if (dof < 0)
        return;
    int sof = soff[m];
    float v = src && sof >= 0 ? src[sof + r * srs] : 0.0f;
    float h = v * (scale[m] * mix_gain(p, cu, rank, cols, r, m));
    if (bias)
        h += bias[m];
    if (silu)
        h = h * dev_sigmoid(h);
    dst[dof + r * drs] = h;
}

/* Floats of the array read or written through `off` with row stride rs
 * over N rows: (N-1)*rs + max(off) + 1, 0 when no feature is placed. Only
 * needed to stage a host array; the table is read at issue (ops.def), from
 * device memory by a copy on the stream after the ops issued before. */
static size_t mix_extent(cuda_ctx *C, const int32_t *off, int cols, long N, int rs)
{
    std::vector<int32_t> copy;
    if (!cuda_is_host(off)) {
        copy.resize((size_t)cols);
        CUDA_CHECK(cudaMemcpyAsync(copy.data(), off, sizeof(int32_t) * (size_t)cols,
                                   cudaMemcpyDeviceToHost, C->stream));
        CUDA_CHECK(cudaStreamSynchronize(C->stream));
        off = copy.data();
    }
    long mx = -1;
    for (int m = 0; m < cols; m++)
        mx = off[m] > mx ? off[m] : mx;
    return mx < 0 ? 0 : (size_t)(mx + 1 + (N - 1) * (long)rs);
}

/* a host input read through offsets: its staged copy (NULL when nothing
 * of it is read); device memory as it is */
static const float *stage_mixed(cuda_ctx *C, const float *a, const int32_t *off, int cols, long N,
                                int rs)
{
    if (!a || !cuda_is_host(a))
        return a;
    size_t n = mix_extent(C, off, cols, N, rs);
    return n ? STAGE(C, a, n) : NULL;
}

void cuda_hada3_mix(const nd_backend *be, float *dst, const int32_t *doff, int drs,
                    const float *src, const int32_t *soff, int srs, const float *scale,
                    const float *p, const float *cu, int rank, const float *bias, int silu, long N,
                    int cols)
{
    if (N <= 0 || cols <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dsrc = stage_mixed(C, src, soff, cols, N, srs);
    const int32_t *ddo = STAGE(C, doff, cols), *dso = STAGE(C, soff, cols);
    const float *dsc = STAGE(C, scale, cols), *db = STAGE(C, bias, cols);
    int has_p = p && rank > 0;
    const float *dp = has_p ? STAGE(C, p, N * rank) : NULL;
    const float *dcu = has_p ? STAGE(C, cu, (long)rank * cols) : NULL;
    k_hada3_mix<<<cuda_blocks(N * cols, 256), 256, 0, C->stream>>>(
        dst, ddo, drs, dsrc, dso, srs, dsc, dp, dcu, has_p ? rank : 0, db, silu, N, cols);
    CUDA_LAUNCHED();
}

/* Thread = feature m (x), block row = row chunk c (y) of `chunks`: rows
 * [N*c/chunks, N*(c+1)/chunks) in order. dsrc, dcond set; the chunk's
 * sums of e*g*v and e go to partials[c*2*cols + m] and [... + cols + m]. */
__global__ void k_hada3_mix_backward(float *dsrc, float *dcond, double *partials, const float *ddst,
                                     const int32_t *doff, int drs, const float *src,
                                     const int32_t *soff, int srs, const float *scale,
                                     const float *p, const float *cu, int rank, const float *bias,
                                     int silu, long N, int cols, int chunks)
{
    int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= cols)
        return;
    long r0 = N * blockIdx.y / chunks, r1 = N * (blockIdx.y + 1) / chunks;
    int dof = doff[m], sof = soff[m];
    float sc = scale[m], b = bias ? bias[m] : 0.0f;
    double ss = 0.0, sb = 0.0;
    for (long r = r0; r < r1; r++) {
        float e = dof >= 0 ? ddst[dof + r * drs] : 0.0f;
        float v = src && sof >= 0 ? src[sof + r * srs] : 0.0f;
        float g = mix_gain(p, cu, rank, cols, r, m);
        if (silu) { /* silu'(h) = s*(1 + h*(1 - s)) */
            float h = sc * g * v + b;
            float s = dev_sigmoid(h);
            e *= s * (1.0f + h * (1.0f - s));
        }
        if (dsrc && sof >= 0)
            dsrc[sof + r * srs] = e * sc * g;
        if (dcond)
            dcond[r * cols + m] = e * sc * v;
        ss += (double)(e * g * v);
        sb += (double)e;
    }
    if (partials) {
        double *pp = partials + (size_t)blockIdx.y * 2 * cols;
        pp[m] = ss;
        pp[cols + m] = sb;
    }
}

void cuda_hada3_mix_backward(const nd_backend *be, float *dsrc, float *dcond, float *dscale,
                             float *dbias, const float *ddst, const int32_t *doff, int drs,
                             const float *src, const int32_t *soff, int srs, const float *scale,
                             const float *p, const float *cu, int rank, const float *bias, int silu,
                             long N, int cols)
{
    if (N <= 0 || cols <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dd = stage_mixed(C, ddst, doff, cols, N, drs);
    const float *dsr = stage_mixed(C, src, soff, cols, N, srs);
    const int32_t *ddo = STAGE(C, doff, cols), *dso = STAGE(C, soff, cols);
    const float *dsc = STAGE(C, scale, cols), *db = STAGE(C, bias, cols);
    int has_p = p && rank > 0;
    const float *dp = has_p ? STAGE(C, p, N * rank) : NULL;
    const float *dcu = has_p ? STAGE(C, cu, (long)rank * cols) : NULL;
    /* with sums: the fixed row chunks of cuda_row_chunks; without, rows
     * spread over as many chunks as the grid's y allows */
    int want = dscale || dbias;
    int chunks = want ? cuda_row_chunks(N) : (int)(N < 65535 ? N : 65535);
    double *partials =
        want ? (double *)cuda_scratch(C, sizeof(double) * (size_t)chunks * 2 * cols) : NULL;
    dim3 grid(cuda_blocks(cols, 64), (unsigned)chunks);
    k_hada3_mix_backward<<<grid, 64, 0, C->stream>>>(dsrc, dcond, partials, dd, ddo, drs, dsr, dso,
                                                     srs, dsc, dp, dcu, has_p ? rank : 0, db, silu,
                                                     N, cols, chunks);
    CUDA_LAUNCHED();
    if (want) {
        cuda_reduce_partials(C, dscale, partials, chunks, 2 * cols, 0, cols);
        cuda_reduce_partials(C, dbias, partials, chunks, 2 * cols, cols, cols);
    }
}

/* ---- softmax_rows ---- */

/* one thread per row, the CPU's operations in its order */
__global__ void k_softmax_rows(float *x, long N, int k)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    float *xr = x + r * k;
    float mx = xr[0];
    for (int i = 1; i < k; i++)
        mx = xr[i] > mx ? xr[i] : mx;
    float s = 0.0f;
    for (int i = 0; i < k; i++) {
        xr[i] = san_expf(xr[i] - mx);
        s += xr[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < k; i++)
        xr[i] *= inv;
}

void cuda_softmax_rows(const nd_backend *be, float *x, long N, int k)
{
    if (N <= 0 || k <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    k_softmax_rows<<<cuda_blocks(N, 128), 128, 0, C->stream>>>(x, N, k);
    CUDA_LAUNCHED();
}

/* dx = y*(dy - <y, dy>), one thread per row; dx may alias dy */
__global__ void k_softmax_rows_backward(float *dx, const float *dy, const float *y, long N, int k)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    const float *yr = y + r * k, *gr = dy + r * k;
    float *dr = dx + r * k;
    float s = 0.0f;
    for (int i = 0; i < k; i++)
        s += yr[i] * gr[i];
    for (int i = 0; i < k; i++)
        dr[i] = yr[i] * (gr[i] - s);
}

void cuda_softmax_rows_backward(const nd_backend *be, float *dx, const float *dy, const float *y,
                                long N, int k)
{
    if (N <= 0 || k <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, N * k), *dyv = STAGE(C, y, N * k);
    k_softmax_rows_backward<<<cuda_blocks(N, 128), 128, 0, C->stream>>>(dx, ddy, dyv, N, k);
    CUDA_LAUNCHED();
}
