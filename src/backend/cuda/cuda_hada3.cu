/* Needle 3's Hadamard MLP ops on CUDA: hada3_mix and its backward,
 * softmax_rows and its backward. Semantics: backend/ops.def; reference:
 * src/backend/cpu/cpu_hada3.c (the same order of operations). dscale /
 * dbias sum rows in fixed chunks (cuda_reduce_partials), so a given row
 * count always gives the same bits. */
#include "cuda_common.cuh"

/* Floats reachable through offsets off[0..cols) with row stride rs over N
 * rows (0 when no offset is in use); off is read on the host (it is host
 * memory or host-visible alloc memory, synced by the caller). */
static size_t mix_extent(const int32_t *off, int cols, int rs, long N)
{
    long hi = -1;
    for (int m = 0; m < cols; m++)
        hi = off[m] > hi ? off[m] : hi;
    return hi < 0 ? 0 : (size_t)hi + (size_t)(N - 1) * (size_t)rs + 1;
}

struct mix_in {
    const int32_t *doff, *soff;
    const float *src, *scale, *p, *cu, *bias;
    int drs, srs, rank, silu, cols;
    long N;
};

__device__ __forceinline__ float mix_gain(const mix_in &a, long r, int m)
{
    float g = 1.0f;
    if (a.p)
        for (int q = 0; q < a.rank; q++)
            g += a.p[r * a.rank + q] * a.cu[(long)q * a.cols + m];
    return g;
}

__global__ void k_hada3_mix(float *dst, mix_in a)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.N * a.cols)
        return;
    long r = idx / a.cols;
    int m = (int)(idx - r * a.cols);
    int od = a.doff[m], os = a.soff[m];
    if (od < 0)
        return;
    float v = os < 0 ? 0.0f : a.src[os + r * a.srs];
    float g = mix_gain(a, r, m);
    float h = v * (a.scale[m] * g);
    if (a.bias)
        h += a.bias[m];
    dst[od + r * a.drs] = a.silu ? h * dev_sigmoid(h) : h;
}

/* e = ddst * silu'(h) for feature m of row r; *v the source value */
__device__ __forceinline__ float mix_e(const mix_in &a, const float *ddst, long r, int m, float g,
                                       float *v)
{
    int od = a.doff[m], os = a.soff[m];
    float e = od < 0 ? 0.0f : ddst[od + r * a.drs];
    *v = (a.src && os >= 0) ? a.src[os + r * a.srs] : 0.0f;
    if (a.silu) {
        float h = a.scale[m] * g * *v;
        if (a.bias)
            h += a.bias[m];
        float s = dev_sigmoid(h);
        e *= s * (1.0f + h * (1.0f - s));
    }
    return e;
}

__global__ void k_hada3_mix_bwd(float *dsrc, float *dcond, const float *ddst, mix_in a)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.N * a.cols)
        return;
    long r = idx / a.cols;
    int m = (int)(idx - r * a.cols);
    float g = mix_gain(a, r, m), v;
    float e = mix_e(a, ddst, r, m, g, &v), sc = a.scale[m];
    int os = a.soff[m];
    if (dsrc && os >= 0)
        dsrc[os + r * a.srs] = e * sc * g;
    if (dcond)
        dcond[idx] = e * sc * v;
}

/* partials[p][m] (dscale) and partials[p][cols + m] (dbias) over chunk p's rows */
__global__ void k_hada3_mix_sum(double *partials, const float *ddst, mix_in a, int chunks)
{
    int m = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (m >= a.cols)
        return;
    long r0 = a.N * p / chunks, r1 = a.N * (p + 1) / chunks;
    double ss = 0.0, sb = 0.0;
    for (long r = r0; r < r1; r++) {
        float g = mix_gain(a, r, m), v;
        float e = mix_e(a, ddst, r, m, g, &v);
        ss += (double)(e * g * v);
        sb += (double)e;
    }
    partials[(size_t)p * 2 * a.cols + m] = ss;
    partials[(size_t)p * 2 * a.cols + a.cols + m] = sb;
}

static mix_in mix_stage(cuda_ctx *C, const int32_t *doff, int drs, const float *src,
                        const int32_t *soff, int srs, const float *scale, const float *p,
                        const float *cu, int rank, const float *bias, int silu, long N, int cols)
{
    mix_in a;
    size_t es = mix_extent(soff, cols, srs, N);
    a.doff = STAGE(C, doff, cols);
    a.soff = STAGE(C, soff, cols);
    a.src = src && es ? STAGE(C, src, es) : NULL;
    a.scale = STAGE(C, scale, cols);
    a.p = p ? STAGE(C, p, N * rank) : NULL;
    a.cu = p ? STAGE(C, cu, (long)rank * cols) : NULL;
    a.bias = bias ? STAGE(C, bias, cols) : NULL;
    a.drs = drs;
    a.srs = srs;
    a.rank = p ? rank : 0;
    a.silu = silu;
    a.cols = cols;
    a.N = N;
    return a;
}

void cuda_hada3_mix(const nd_backend *be, float *dst, const int32_t *doff, int drs,
                    const float *src, const int32_t *soff, int srs, const float *scale,
                    const float *p, const float *cu, int rank, const float *bias, int silu, long N,
                    int cols)
{
    if (N <= 0 || cols <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    mix_in a = mix_stage(C, doff, drs, src, soff, srs, scale, p, cu, rank, bias, silu, N, cols);
    k_hada3_mix<<<cuda_blocks(N * cols, 256), 256, 0, C->stream>>>(dst, a);
    CUDA_LAUNCHED();
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
    mix_in a = mix_stage(C, doff, drs, src, soff, srs, scale, p, cu, rank, bias, silu, N, cols);
    size_t ed = mix_extent(doff, cols, drs, N);
    int chunks = cuda_row_chunks(N), sums = dscale || dbias;
    /* one scratch block (valid for this op): the partials, then a zero for
     * when no gradient reaches any feature */
    size_t np = sums ? (size_t)chunks * 2 * cols : 0;
    double *scratch = (double *)cuda_scratch(C, sizeof(double) * (np + 1));
    const float *dd = ed ? STAGE(C, ddst, ed) : NULL;
    if (!dd) {
        CUDA_CHECK(cudaMemsetAsync(scratch + np, 0, sizeof(double), C->stream));
        dd = (const float *)(scratch + np);
    }
    if (sums) {
        dim3 grid(cuda_blocks(cols, 128), (unsigned)chunks);
        k_hada3_mix_sum<<<grid, 128, 0, C->stream>>>(scratch, dd, a, chunks);
        CUDA_LAUNCHED();
        cuda_reduce_partials(C, dscale, scratch, chunks, 2 * cols, 0, cols);
        cuda_reduce_partials(C, dbias, scratch, chunks, 2 * cols, cols, cols);
    }
    if (dsrc || dcond) {
        k_hada3_mix_bwd<<<cuda_blocks(N * cols, 256), 256, 0, C->stream>>>(dsrc, dcond, dd, a);
        CUDA_LAUNCHED();
    }
}

__global__ void k_softmax_rows(float *x, const float *dy, const float *y, long N, int k, int bwd)
{
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N)
        return;
    long b = r * k;
    if (bwd) {
        float s = 0.0f;
        for (int i = 0; i < k; i++)
            s += y[b + i] * dy[b + i];
        for (int i = 0; i < k; i++)
            x[b + i] = y[b + i] * (dy[b + i] - s);
        return;
    }
    float mx = x[b];
    for (int i = 1; i < k; i++)
        mx = fmaxf(mx, x[b + i]);
    float s = 0.0f;
    for (int i = 0; i < k; i++) {
        float e = expf(x[b + i] - mx);
        x[b + i] = e;
        s += e;
    }
    float inv = 1.0f / s;
    for (int i = 0; i < k; i++)
        x[b + i] *= inv;
}

void cuda_softmax_rows(const nd_backend *be, float *x, long N, int k)
{
    if (N <= 0 || k <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    k_softmax_rows<<<cuda_blocks(N, 128), 128, 0, C->stream>>>(x, (const float *)NULL,
                                                               (const float *)NULL, N, k, 0);
    CUDA_LAUNCHED();
}

void cuda_softmax_rows_backward(const nd_backend *be, float *dx, const float *dy, const float *y,
                                long N, int k)
{
    if (N <= 0 || k <= 0)
        return;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, N * k), *dyy = STAGE(C, y, N * k);
    k_softmax_rows<<<cuda_blocks(N, 128), 128, 0, C->stream>>>(dx, ddy, dyy, N, k, 1);
    CUDA_LAUNCHED();
}
