/* Needle 3's Hadamard MLP ops on Vulkan: hada3_mix and its backward,
 * softmax_rows and its backward (shaders hada3_mix*.comp, softmax_rows.comp). */
#include "backend/vulkan/vk_ops.h"

/* Floats reachable through offsets off[0..cols) with row stride rs over N
 * rows (0 when no offset is in use). */
static size_t mix_extent(const int32_t *off, int cols, int rs, long N)
{
    long hi = -1;
    for (int m = 0; m < cols; m++)
        hi = off[m] > hi ? off[m] : hi;
    return hi < 0 ? 0 : (size_t)hi + (size_t)(N - 1) * (size_t)rs + 1;
}

typedef struct {
    uint64_t out0, out1, in, doff, src, soff, scale, p, cu, bias;
    int32_t drs, srs, rank, silu, N, cols;
} mix_args;

static void mix_common(mix_args *a, const int32_t *doff, int drs, const float *src,
                       const int32_t *soff, int srs, const float *scale, const float *p,
                       const float *cu, int rank, const float *bias, int silu, long N, int cols)
{
    size_t es = mix_extent(soff, cols, srs, N);
    a->doff = vk_in(doff, (size_t)cols * 4);
    a->soff = vk_in(soff, (size_t)cols * 4);
    a->src = src && es ? vk_in(src, es * 4) : 0;
    a->scale = vk_in(scale, (size_t)cols * 4);
    a->p = p ? vk_in(p, (size_t)N * (size_t)rank * 4) : 0;
    a->cu = p ? vk_in(cu, (size_t)rank * (size_t)cols * 4) : 0;
    a->bias = vk_in_opt(bias, (size_t)cols * 4);
    a->drs = drs;
    a->srs = srs;
    a->rank = p ? rank : 0;
    a->silu = silu;
    a->N = vk_i32(N);
    a->cols = cols;
}

void vk_hada3_mix(const nd_backend *be, float *dst, const int32_t *doff, int drs, const float *src,
                  const int32_t *soff, int srs, const float *scale, const float *p, const float *cu,
                  int rank, const float *bias, int silu, long N, int cols)
{
    (void)be;
    if (N <= 0 || cols <= 0)
        return;
    vk_i32(N * cols);
    mix_args a = {0};
    size_t ed = mix_extent(doff, cols, drs, N);
    if (!ed)
        return;
    mix_common(&a, doff, drs, src, soff, srs, scale, p, cu, rank, bias, silu, N, cols);
    a.out0 = vk_out(dst, ed * 4);
    /* the shader's argument block: dst first, then from doff on */
    struct {
        uint64_t dst, doff, src, soff, scale, p, cu, bias;
        int32_t drs, srs, rank, silu, N, cols;
    } s = {a.out0, a.doff, a.src, a.soff, a.scale, a.p, a.cu,
           a.bias, a.drs,  a.srs, a.rank, a.silu,  a.N, a.cols};
    vk_dispatch("hada3_mix", &s, sizeof s, vk_groups(N * cols, 256), 1, 1);
}

void vk_hada3_mix_backward(const nd_backend *be, float *dsrc, float *dcond, float *dscale,
                           float *dbias, const float *ddst, const int32_t *doff, int drs,
                           const float *src, const int32_t *soff, int srs, const float *scale,
                           const float *p, const float *cu, int rank, const float *bias, int silu,
                           long N, int cols)
{
    (void)be;
    if (N <= 0 || cols <= 0)
        return;
    vk_i32(N * cols);
    mix_args a = {0};
    mix_common(&a, doff, drs, src, soff, srs, scale, p, cu, rank, bias, silu, N, cols);
    size_t ed = mix_extent(doff, cols, drs, N), es = mix_extent(soff, cols, srs, N);
    uint64_t in = ed ? vk_in(ddst, ed * 4) : 0;
    if (!ed) { /* no gradient reaches any feature: e = 0 everywhere, read nothing */
        static const float zero = 0.0f;
        in = vk_in(&zero, 4);
    }
    struct {
        uint64_t o0, o1, ddst, doff, src, soff, scale, p, cu, bias;
        int32_t drs, srs, rank, silu, N, cols;
    } s = {0,    0,      in,    a.doff, a.src,  a.soff, a.scale, a.p,
           a.cu, a.bias, a.drs, a.srs,  a.rank, a.silu, a.N,     a.cols};
    if (dsrc || dcond) {
        s.o0 = dsrc && es ? vk_out(dsrc, es * 4) : 0;
        s.o1 = dcond ? vk_out(dcond, (size_t)N * (size_t)cols * 4) : 0;
        if (s.o0 || s.o1)
            vk_dispatch("hada3_mix_bwd", &s, sizeof s, vk_groups(N * cols, 256), 1, 1);
    }
    if (dscale || dbias) {
        s.o0 = vk_out_opt(dscale, (size_t)cols * 4);
        s.o1 = vk_out_opt(dbias, (size_t)cols * 4);
        vk_dispatch("hada3_mix_sum", &s, sizeof s, vk_groups(cols, 64), 1, 1);
    }
}

static void softmax_dispatch(float *x, const float *dy, const float *y, long N, int k, int bwd)
{
    if (N <= 0 || k <= 0)
        return;
    size_t bytes = (size_t)N * (size_t)k * 4;
    vk_i32(N * k);
    struct {
        uint64_t x, dy, y;
        int32_t N, k, bwd;
    } a = {0};
    if (bwd) {
        a.dy = vk_in(dy, bytes);
        a.y = vk_in(y, bytes);
    }
    a.x = vk_out(x, bytes);
    a.N = vk_i32(N);
    a.k = k;
    a.bwd = bwd;
    vk_dispatch("softmax_rows", &a, sizeof a, vk_groups(N, 64), 1, 1);
}

void vk_softmax_rows(const nd_backend *be, float *x, long N, int k)
{
    (void)be;
    softmax_dispatch(x, NULL, NULL, N, k, 0);
}

void vk_softmax_rows_backward(const nd_backend *be, float *dx, const float *dy, const float *y,
                              long N, int k)
{
    (void)be;
    softmax_dispatch(dx, dy, y, N, k, 1);
}
