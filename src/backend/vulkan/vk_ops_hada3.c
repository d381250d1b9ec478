/* Needle 3's Hadamard MLP ops on Vulkan: hada3_mix and its backward (the
 * element-wise stages, read and written through per-feature offset
 * tables), softmax_rows and its backward (the cond logits). Semantics in
 * backend/ops.def; the float operations follow cpu_hada3.c. */
#include "backend/vulkan/vk_ops.h"

/* Bytes of the array a hada3_mix reads or writes through `off` with row
 * stride rs over N rows: up to the largest placed element, (N-1)*rs +
 * max(off) + 1 floats; 0 when no feature is placed (off all negative).
 * The host reads the table at issue (ops.def: host memory, or alloc memory
 * the host may read then), for the bytes to stage and the ranges the
 * hazard tracker sees. */
static size_t mix_extent(const int32_t *off, int cols, long N, int rs)
{
    long mx = -1;
    for (int m = 0; m < cols; m++)
        mx = off[m] > mx ? off[m] : mx;
    if (mx < 0)
        return 0;
    vk_i32(rs);
    return (size_t)vk_i32(mx + 1 + (N - 1) * (long)rs) * 4;
}

void vk_hada3_mix(const nd_backend *be, float *dst, const int32_t *doff, int drs, const float *src,
                  const int32_t *soff, int srs, const float *scale, const float *p, const float *cu,
                  int rank, const float *bias, int silu, long N, int cols)
{
    (void)be;
    if (N <= 0 || cols <= 0)
        return;
    size_t dst_bytes = mix_extent(doff, cols, N, drs), src_bytes = mix_extent(soff, cols, N, srs);
    if (!dst_bytes)
        return; /* nothing is written */
    vk_i32(N * (long)cols);
    struct {
        uint64_t dst, doff, src, soff, scale, p, cu, bias;
        int32_t drs, srs, rank, silu, N, cols;
    } a;
    a.doff = vk_in(doff, (size_t)cols * 4);
    a.soff = vk_in(soff, (size_t)cols * 4);
    a.src = src && src_bytes ? vk_in(src, src_bytes) : 0;
    a.scale = vk_in(scale, (size_t)cols * 4);
    a.p = p && rank > 0 ? vk_in(p, (size_t)N * rank * 4) : 0;
    a.cu = a.p ? vk_in(cu, (size_t)rank * cols * 4) : 0;
    a.bias = vk_in_opt(bias, (size_t)cols * 4);
    a.dst = vk_out(dst, dst_bytes);
    a.drs = drs;
    a.srs = srs;
    a.rank = a.p ? rank : 0;
    a.silu = silu;
    a.N = vk_i32(N);
    a.cols = cols;
    vk_dispatch("hada3_mix", &a, sizeof a, vk_groups(N * (long)cols, 256), 1, 1);
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
    vk_i32(N * (long)cols);
    /* row blocks: with sums, at least 32 rows and at most 512 blocks (the
     * split depends only on N); without, as many blocks as the grid has */
    int want = dscale || dbias;
    long rpb = want ? (N + 511) / 512 : (N + 65534) / 65535;
    if (want && rpb < 32)
        rpb = 32;
    long blocks = (N + rpb - 1) / rpb;
    size_t part_floats = want ? (size_t)2 * cols * blocks : 0;
    float *part = want ? vk_scratch(part_floats * 4) : NULL; /* before any staging */
    size_t ddst_bytes = mix_extent(doff, cols, N, drs), src_bytes = mix_extent(soff, cols, N, srs);
    struct {
        uint64_t dsrc, dcond, part, ddst, doff, src, soff, scale, p, cu, bias;
        int32_t drs, srs, rank, silu, N, cols, rows_per_block, blocks, want_scale, want_bias;
    } a;
    a.doff = vk_in(doff, (size_t)cols * 4);
    a.soff = vk_in(soff, (size_t)cols * 4);
    a.ddst = ddst_bytes ? vk_in(ddst, ddst_bytes) : 0;
    a.src = src && src_bytes ? vk_in(src, src_bytes) : 0;
    a.scale = vk_in(scale, (size_t)cols * 4);
    a.p = p && rank > 0 ? vk_in(p, (size_t)N * rank * 4) : 0;
    a.cu = a.p ? vk_in(cu, (size_t)rank * cols * 4) : 0;
    a.bias = vk_in_opt(bias, (size_t)cols * 4);
    a.dsrc = dsrc && src_bytes ? vk_out(dsrc, src_bytes) : 0;
    a.dcond = vk_out_opt(dcond, (size_t)N * cols * 4);
    a.part = vk_out_opt(part, part_floats * 4);
    a.drs = drs;
    a.srs = srs;
    a.rank = a.p ? rank : 0;
    a.silu = silu;
    a.N = vk_i32(N);
    a.cols = cols;
    a.rows_per_block = (int32_t)rpb;
    a.blocks = (int32_t)blocks;
    a.want_scale = dscale != NULL;
    a.want_bias = dbias != NULL;
    vk_dispatch("hada3_mix_bwd", &a, sizeof a, (uint32_t)((cols + 63) / 64), (uint32_t)blocks, 1);
    if (want) {
        vk_colsum(dscale, part, (int)blocks, cols, 1.0f);
        vk_colsum(dbias, part + (size_t)cols * blocks, (int)blocks, cols, 1.0f);
    }
}

void vk_softmax_rows(const nd_backend *be, float *x, long N, int k)
{
    (void)be;
    if (N <= 0 || k <= 0)
        return;
    struct {
        uint64_t x;
        int32_t N, k;
    } a;
    a.x = vk_out(x, (size_t)vk_i32(N * (long)k) * 4);
    a.N = vk_i32(N);
    a.k = k;
    vk_dispatch("softmax_rows", &a, sizeof a, vk_groups(N, 64), 1, 1);
}

void vk_softmax_rows_backward(const nd_backend *be, float *dx, const float *dy, const float *y,
                              long N, int k)
{
    (void)be;
    if (N <= 0 || k <= 0)
        return;
    size_t bytes = (size_t)vk_i32(N * (long)k) * 4;
    struct {
        uint64_t dx, dy, y;
        int32_t N, k;
    } a;
    a.dy = vk_in(dy, bytes);
    a.y = vk_in(y, bytes);
    a.dx = vk_out(dx, bytes);
    a.N = vk_i32(N);
    a.k = k;
    vk_dispatch("softmax_rows_bwd", &a, sizeof a, vk_groups(N, 64), 1, 1);
}
