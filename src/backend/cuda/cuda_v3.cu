/* The rest of Needle 3's block on CUDA: the headwise attention gate and
 * the causal q/k/v convolution (forward and backward). attention_ext lives
 * with attention (cuda_attention.cu), engram_hash_seeded with engram_hash
 * (cuda_ops.cu). Semantics in backend/ops.def; reference
 * src/backend/cpu/cpu_v3.c, whose float operations every element repeats. */
#include "cuda_common.cuh"

/* ---- gate_heads ---- */

/* one thread per element of att [N, H*hd] */
__global__ void k_gate_heads(float *o, const float *att, const float *g, long n, int hd)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    o[i] = att[i] * dev_sigmoid(g[i / hd]);
}

void cuda_gate_heads(const nd_backend *be, float *o, const float *att, const float *g, long N,
                     int H, int hd)
{
    if (N <= 0 || H <= 0 || hd <= 0)
        return;
    long n = N * H * hd;
    cuda_ctx *C = cuda_op_begin(be);
    const float *da = STAGE(C, att, n), *dg = STAGE(C, g, N * H);
    k_gate_heads<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(o, da, dg, n, hd);
    CUDA_LAUNCHED();
}

/* one thread per (row, head): the dot over hd in index order, as the CPU;
 * datt may alias dout (each element read before it is written) */
__global__ void k_gate_heads_backward(float *datt, float *dg, const float *dout, const float *att,
                                      const float *g, long nh, int hd)
{
    long rh = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (rh >= nh)
        return;
    float s = dev_sigmoid(g[rh]), acc = 0.0f;
    size_t base = (size_t)rh * hd;
    for (int i = 0; i < hd; i++) {
        float dy = dout[base + i];
        acc += dy * att[base + i];
        datt[base + i] = dy * s;
    }
    dg[rh] = acc * s * (1.0f - s);
}

void cuda_gate_heads_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                              const float *att, const float *g, long N, int H, int hd)
{
    if (N <= 0 || H <= 0 || hd <= 0)
        return;
    long nh = N * H, n = nh * hd;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddo = STAGE(C, dout, n), *da = STAGE(C, att, n), *dgi = STAGE(C, g, nh);
    k_gate_heads_backward<<<cuda_blocks(nh, 128), 128, 0, C->stream>>>(datt, dg, ddo, da, dgi, nh,
                                                                       hd);
    CUDA_LAUNCHED();
}

/* ---- qkv_taps ---- */

/* taps that a row reads: j < ntaps and, when set, j < window */
static int taps_used(int ntaps, int window)
{
    return window > 0 && window < ntaps ? window : ntaps;
}

/* one thread per element of y [N, width]; taps in j order, stopping at the
 * first missing row */
__global__ void k_qkv_taps(float *y, const float *x, const float *taps, dev_layout L, int width,
                           int nt)
{
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= L.N * width)
        return;
    long r = e / width;
    int i = (int)(e % width);
    float acc = 0.0f;
    for (int j = 0; j < nt; j++) {
        long b = dev_layout_back(L, r, j);
        if (b < 0)
            break;
        acc += taps[(size_t)j * width + i] * x[(size_t)b * width + i];
    }
    y[e] = acc;
}

void cuda_qkv_taps(const nd_backend *be, float *y, const float *x, const float *taps,
                   const nd_layout *L, int width, int ntaps, int window)
{
    long N = L->N;
    if (N <= 0 || width <= 0)
        return;
    int nt = taps_used(ntaps, window);
    nt = nt > 0 ? nt : 0;
    long n = N * width;
    cuda_ctx *C = cuda_op_begin(be);
    const float *dx = STAGE(C, x, n);
    const float *dt = nt ? STAGE(C, taps, (long)nt * width) : NULL;
    dev_layout dl = cuda_layout(C, L);
    k_qkv_taps<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(y, dx, dt, dl, width, nt);
    CUDA_LAUNCHED();
}

/* one thread per channel: the scatter into dx and each tap's sum over rows
 * in the CPU's order (taps j, then rows r), so the result is deterministic */
__global__ void k_qkv_taps_backward(float *dx, float *dtaps, const float *dy, const float *x,
                                    const float *taps, dev_layout L, int width, int nt)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width)
        return;
    long N = L.N;
    for (long r = 0; r < N; r++)
        dx[(size_t)r * width + i] = 0.0f;
    for (int j = 0; j < nt; j++) {
        float tj = taps[(size_t)j * width + i];
        float dt = dtaps ? dtaps[(size_t)j * width + i] : 0.0f;
        for (long r = 0; r < N; r++) {
            long b = dev_layout_back(L, r, j);
            if (b < 0)
                continue;
            float d = dy[(size_t)r * width + i];
            dx[(size_t)b * width + i] += tj * d;
            if (dtaps)
                dt += d * x[(size_t)b * width + i];
        }
        if (dtaps)
            dtaps[(size_t)j * width + i] = dt;
    }
}

void cuda_qkv_taps_backward(const nd_backend *be, float *dx, float *dtaps, const float *dy,
                            const float *x, const float *taps, const nd_layout *L, int width,
                            int ntaps, int window)
{
    long N = L->N;
    if (N <= 0 || width <= 0)
        return;
    int nt = taps_used(ntaps, window);
    nt = nt > 0 ? nt : 0;
    long n = N * width;
    cuda_ctx *C = cuda_op_begin(be);
    const float *ddy = STAGE(C, dy, n), *dxx = STAGE(C, x, n);
    const float *dt = nt ? STAGE(C, taps, (long)nt * width) : NULL;
    dev_layout dl = cuda_layout(C, L);
    k_qkv_taps_backward<<<cuda_blocks(width, 64), 64, 0, C->stream>>>(dx, nt ? dtaps : NULL, ddy,
                                                                      dxx, dt, dl, width, nt);
    CUDA_LAUNCHED();
}
