/* The rest of Needle 3's block on Vulkan: the headwise attention gate and
 * the causal q/k/v convolution (forward and backward). attention_ext lives
 * with attention (vk_ops_attention.c), engram_hash_seeded with engram_hash
 * (vk_ops_engram.c). Semantics in backend/ops.def; the float operations
 * follow cpu_v3.c. */
#include "backend/vulkan/vk_ops.h"

void vk_gate_heads(const nd_backend *be, float *o, const float *att, const float *g, long N, int H,
                   int hd)
{
    (void)be;
    if (N <= 0 || H <= 0 || hd <= 0)
        return;
    size_t n = (size_t)vk_i32(N * (long)H * hd);
    struct {
        uint64_t o, att, g;
        int32_t n, hd;
    } a;
    a.att = vk_in(att, n * 4);
    a.g = vk_in(g, (size_t)N * H * 4);
    a.o = vk_out(o, n * 4);
    a.n = (int32_t)n;
    a.hd = hd;
    vk_dispatch("gate_heads", &a, sizeof a, vk_groups((long)n, 256), 1, 1);
}

void vk_gate_heads_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                            const float *att, const float *g, long N, int H, int hd)
{
    (void)be;
    if (N <= 0 || H <= 0 || hd <= 0)
        return;
    size_t n = (size_t)vk_i32(N * (long)H * hd), nh = (size_t)N * H;
    struct {
        uint64_t datt, dg, dout, att, g;
        int32_t NH, hd;
    } a;
    a.dout = vk_in(dout, n * 4);
    a.att = vk_in(att, n * 4);
    a.g = vk_in(g, nh * 4);
    a.datt = vk_out(datt, n * 4);
    a.dg = vk_out(dg, nh * 4);
    a.NH = vk_i32((long)nh);
    a.hd = hd;
    vk_dispatch("gate_heads_bwd", &a, sizeof a, vk_groups((long)nh, 64), 1, 1);
}

/* taps that a row reads: j < ntaps and, when set, j < window */
static int taps_used(int ntaps, int window)
{
    return window > 0 && window < ntaps ? window : ntaps;
}

void vk_qkv_taps(const nd_backend *be, float *y, const float *x, const float *taps,
                 const nd_layout *L, int width, int ntaps, int window)
{
    (void)be;
    long N = L->N;
    if (N <= 0 || width <= 0)
        return;
    int nt = taps_used(ntaps, window);
    size_t n = (size_t)vk_i32(N * (long)width);
    struct {
        uint64_t y, x, taps, lay;
        int32_t N, n_seg, width, nt;
    } a;
    a.x = vk_in(x, n * 4);
    a.taps = nt > 0 ? vk_in(taps, (size_t)nt * width * 4) : 0;
    a.lay = vk_layout(L);
    a.y = vk_out(y, n * 4);
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.width = width;
    a.nt = nt > 0 ? nt : 0;
    vk_dispatch("qkv_taps", &a, sizeof a, vk_groups((long)n, 256), 1, 1);
}

void vk_qkv_taps_backward(const nd_backend *be, float *dx, float *dtaps, const float *dy,
                          const float *x, const float *taps, const nd_layout *L, int width,
                          int ntaps, int window)
{
    (void)be;
    long N = L->N;
    if (N <= 0 || width <= 0)
        return;
    int nt = taps_used(ntaps, window);
    size_t n = (size_t)vk_i32(N * (long)width);
    struct {
        uint64_t dx, dtaps, dy, x, taps, lay;
        int32_t N, n_seg, width, nt;
    } a;
    a.dy = vk_in(dy, n * 4);
    a.x = vk_in(x, n * 4);
    a.taps = nt > 0 ? vk_in(taps, (size_t)nt * width * 4) : 0;
    a.lay = vk_layout(L);
    a.dx = vk_out(dx, n * 4);
    /* dtaps += : read and written (vk_out keeps what the array holds) */
    a.dtaps = dtaps && nt > 0 ? vk_out(dtaps, (size_t)nt * width * 4) : 0;
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.width = width;
    a.nt = nt > 0 ? nt : 0;
    vk_dispatch("qkv_taps_bwd", &a, sizeof a, vk_groups(width, 64), 1, 1);
}
