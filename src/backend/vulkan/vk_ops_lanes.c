/* Hyper-connections (coefficients, lanes), the scaled residual, the
 * Hadamard MLP, and the rmsnorm / gate backwards on Vulkan.
 *
 * Parameter gradients summed over rows (da_*, db_*, dgate, dscale, dd*) are
 * reduced in two fixed stages, never with atomics: a first shader writes
 * partial sums whose split over workgroups depends only on the sizes, and
 * lanes_colsum adds them in order. The partials live in one scratch buffer
 * of this group, grown on demand. */
#include <stdio.h>

#include "backend/cpu/cpu_kernels.h" /* san_sigmoid, san_walsh_scale */
#include "backend/vulkan/vk_ops.h"
#include "model/constants.h"

/* ---- scratch ---- */

static float *lanes_scratch;
static size_t lanes_scratch_bytes;

/* At least `bytes` of device scratch. Growing frees the old buffer, and
 * vk_free first waits for the dispatches recorded with it; that sync also
 * recycles the staging ring, so an op asks for scratch before it stages
 * any input (vk_in). */
static float *scratch(size_t bytes)
{
    if (bytes > lanes_scratch_bytes) {
        size_t want = bytes > 2 * lanes_scratch_bytes ? bytes : 2 * lanes_scratch_bytes;
        vk_free(lanes_scratch);
        lanes_scratch = vk_alloc(want);
        if (!lanes_scratch) {
            fprintf(stderr, "needle: vulkan backend: cannot allocate %zu bytes of scratch\n", want);
            abort();
        }
        lanes_scratch_bytes = want;
    }
    return lanes_scratch;
}

/* dst[k] += scale * sum_t part[k*T + t], k < K (dst NULL: nothing) */
static void colsum(float *dst, const float *part, int T, int K, float scale)
{
    if (!dst || K <= 0)
        return;
    struct {
        uint64_t part, dst;
        int32_t T, K;
        float scale;
    } a;
    a.part = vk_in(part, (size_t)T * K * 4);
    a.dst = vk_out(dst, (size_t)K * 4);
    a.T = T;
    a.K = K;
    a.scale = scale;
    vk_dispatch("lanes_colsum", &a, sizeof a, vk_groups(K, 1), 1, 1);
}

float *vk_scratch(size_t bytes)
{
    return scratch(bytes);
}

void vk_colsum(float *dst, const float *part, int T, int K, float scale)
{
    colsum(dst, part, T, K, scale);
}

/* ---- hyper-connection coefficients ---- */

void vk_hyper_coeffs(const nd_backend *be, float *hpre, float *hpost, float *M, const float *pre,
                     const float *post, const float *res, float a_pre, float a_post, float a_res,
                     const float *b_pre, const float *b_post, const float *b_res, int lane, long N,
                     int n)
{
    (void)be;
    if (N <= 0 || n <= 0)
        return;
    size_t nN = (size_t)N * n, nnN = nN * n, nn = (size_t)n * n;
    struct {
        uint64_t hpre, hpost, M, pre, post, res, b_pre, b_post, b_res;
        float a_pre, a_post, a_res;
        int32_t lane, N, n, rounds;
    } a;
    a.pre = vk_in(pre, nN * 4);
    a.post = vk_in(post, nN * 4);
    a.res = vk_in(res, nnN * 4);
    a.b_pre = vk_in(b_pre, (size_t)n * 4);
    a.b_post = vk_in(b_post, (size_t)n * 4);
    a.b_res = vk_in(b_res, nn * 4);
    a.hpre = vk_out(hpre, nN * 4);
    a.hpost = vk_out(hpost, nN * 4);
    a.M = vk_out(M, nnN * 4);
    a.a_pre = a_pre;
    a.a_post = a_post;
    a.a_res = a_res;
    a.lane = lane;
    a.N = vk_i32(N);
    a.n = n;
    a.rounds = SAN_SINKHORN_ROUNDS;
    vk_i32((long)nnN);
    vk_dispatch("hyper_coeffs", &a, sizeof a, vk_groups(N, 64), 1, 1);
}

void vk_hyper_coeffs_backward(const nd_backend *be, float *dpre, float *dpost, float *dres,
                              float *da_pre, float *da_post, float *da_res, float *db_pre,
                              float *db_post, float *db_res, const float *dhpre,
                              const float *dhpost, const float *dM, const float *pre,
                              const float *post, const float *res, const float *hpre,
                              const float *hpost, float a_pre, float a_post, float a_res,
                              const float *b_res, long N, int n)
{
    (void)be;
    if (N <= 0 || n <= 0)
        return;
    long nn = (long)n * n, K = 3 + 2L * n + nn, rounds = SAN_SINKHORN_ROUNDS;
    /* per invocation: the half-rounds' softmaxes, Z and g (work), K partial
     * sums; T invocations, fewer for big matrices (about 16 MB of scratch) */
    long per = (2 * rounds + 2) * nn, T = (N + 63) / 64 * 64;
    long cap = ((4L << 20) / (per + K)) / 64 * 64;
    if (cap < 64)
        cap = 64;
    if (T > cap)
        T = cap;
    size_t nN = (size_t)N * n, nnN = nN * n;
    float *work = scratch((size_t)T * (per + K) * 4), *part = work + (size_t)T * per;
    struct {
        uint64_t dpre, dpost, dres, dhpre, dhpost, dM, pre, post, res, hpre, hpost, b_res, work,
            part;
        float a_pre, a_post, a_res;
        int32_t N, n, T, rounds;
    } a;
    a.dhpre = vk_in(dhpre, nN * 4);
    a.dhpost = vk_in(dhpost, nN * 4);
    a.dM = vk_in(dM, nnN * 4);
    a.pre = vk_in(pre, nN * 4);
    a.post = vk_in(post, nN * 4);
    a.res = vk_in(res, nnN * 4);
    a.hpre = vk_in(hpre, nN * 4);
    a.hpost = vk_in(hpost, nN * 4);
    a.b_res = vk_in(b_res, (size_t)nn * 4);
    a.dpre = vk_out(dpre, nN * 4);
    a.dpost = vk_out(dpost, nN * 4);
    a.dres = vk_out(dres, nnN * 4);
    a.work = vk_out(work, (size_t)T * per * 4);
    a.part = vk_out(part, (size_t)T * K * 4);
    a.a_pre = a_pre;
    a.a_post = a_post;
    a.a_res = a_res;
    a.N = vk_i32(N);
    a.n = n;
    a.T = (int32_t)T;
    a.rounds = (int32_t)rounds;
    vk_i32((long)nnN);
    vk_i32(T * (per + K));
    vk_dispatch("hyper_coeffs_bwd", &a, sizeof a, (uint32_t)(T / 64), 1, 1);
    /* partial layout: a_pre, a_post, a_res, b_pre[n], b_post[n], b_res[nn] */
    colsum(da_pre, part, (int)T, 1, 1.0f);
    colsum(da_post, part + T, (int)T, 1, 1.0f);
    colsum(da_res, part + 2 * T, (int)T, 1, 1.0f);
    colsum(db_pre, part + 3 * T, (int)T, n, 1.0f);
    colsum(db_post, part + (3 + n) * T, (int)T, n, 1.0f);
    colsum(db_res, part + (3 + 2L * n) * T, (int)T, (int)nn, 1.0f);
}

/* ---- lanes ---- */

/* the argument block shared by the lane shaders with two arrays */
typedef struct {
    uint64_t out, in;
    int32_t N, n, d;
} lanes2_args;

static void lanes2(const char *shader, float *out, size_t out_floats, const float *in,
                   size_t in_floats, long N, int n, int d, long items)
{
    lanes2_args a;
    a.in = vk_in(in, in_floats * 4);
    a.out = vk_out(out, out_floats * 4);
    a.N = vk_i32(N);
    a.n = n;
    a.d = d;
    vk_i32((long)N * n * d);
    vk_dispatch(shader, &a, sizeof a, vk_groups(items, 256), 1, 1);
}

void vk_lanes_broadcast(const nd_backend *be, float *X, const float *x0, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d;
    lanes2("lanes_broadcast", X, Nd * n, x0, Nd, N, n, d, (long)Nd * n);
}

void vk_lanes_mean(const nd_backend *be, float *xm, const float *X, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d;
    lanes2("lanes_mean", xm, Nd, X, Nd * n, N, n, d, (long)Nd);
}

void vk_lanes_broadcast_backward(const nd_backend *be, float *dx0, const float *dX, long N, int n,
                                 int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d;
    lanes2("lanes_broadcast_bwd", dx0, Nd, dX, Nd * n, N, n, d, (long)Nd);
}

void vk_lanes_mean_backward(const nd_backend *be, float *dX, const float *dxm, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d;
    lanes2("lanes_mean_bwd", dX, Nd * n, dxm, Nd, N, n, d, (long)Nd * n);
}

void vk_lanes_combine(const nd_backend *be, float *u, const float *hpre, const float *X, long N,
                      int n, int d)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d;
    struct {
        uint64_t u, hpre, X;
        int32_t N, n, d;
    } a;
    a.hpre = vk_in(hpre, (size_t)N * n * 4);
    a.X = vk_in(X, Nd * n * 4);
    a.u = vk_out(u, Nd * 4);
    a.N = vk_i32(N);
    a.n = n;
    a.d = d;
    vk_i32((long)Nd * n);
    vk_dispatch("lanes_combine", &a, sizeof a, vk_groups((long)Nd, 256), 1, 1);
}

void vk_lanes_combine_backward(const nd_backend *be, float *dhpre, float *dX, const float *du,
                               const float *hpre, const float *X, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d, Nn = (size_t)N * n;
    struct {
        uint64_t dhpre, dX, du, hpre, X;
        int32_t N, n, d;
    } a;
    a.du = vk_in(du, Nd * 4);
    a.hpre = vk_in(hpre, Nn * 4);
    a.X = vk_in(X, Nd * n * 4);
    a.dhpre = vk_out(dhpre, Nn * 4);
    a.dX = vk_out(dX, Nd * n * 4);
    a.N = vk_i32(N);
    a.n = n;
    a.d = d;
    vk_i32((long)Nd * n);
    vk_dispatch("lanes_combine_bwd", &a, sizeof a, vk_groups((long)Nn, 1), 1, 1);
}

void vk_lanes_update(const nd_backend *be, float *Xo, const float *M, const float *X,
                     const float *hpost, const float *y, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    size_t Nd = (size_t)N * d, Nn = (size_t)N * n;
    struct {
        uint64_t Xo, M, X, hpost, y;
        int32_t N, n, d;
    } a;
    a.M = vk_in(M, Nn * n * 4);
    a.X = vk_in(X, Nd * n * 4);
    a.hpost = vk_in(hpost, Nn * 4);
    a.y = vk_in(y, Nd * 4);
    a.Xo = vk_out(Xo, Nd * n * 4);
    a.N = vk_i32(N);
    a.n = n;
    a.d = d;
    vk_i32((long)Nd * n);
    vk_dispatch("lanes_update", &a, sizeof a, vk_groups((long)Nd * n, 256), 1, 1);
}

void vk_lanes_update_backward(const nd_backend *be, float *dX, float *dM, float *dhpost, float *dy,
                              const float *dXo, const float *M, const float *X, const float *hpost,
                              const float *y, long N, int n, int d)
{
    (void)be;
    if (N <= 0 || n <= 0 || d <= 0)
        return;
    if (n > 64) { /* the shader keeps a column of the n lanes in registers */
        fprintf(stderr, "needle: vulkan backend: lanes_update_backward supports up to 64 lanes\n");
        abort();
    }
    size_t Nd = (size_t)N * d, Nn = (size_t)N * n;
    struct {
        uint64_t dX, dM, dhpost, dy, dXo, M, X, hpost, y;
        int32_t N, n, d;
    } a;
    a.dXo = vk_in(dXo, Nd * n * 4);
    a.M = vk_in(M, Nn * n * 4);
    a.X = vk_in(X, Nd * n * 4);
    a.hpost = vk_in(hpost, Nn * 4);
    a.y = vk_in(y, Nd * 4);
    a.dX = vk_out(dX, Nd * n * 4);
    a.dM = vk_out(dM, Nn * n * 4);
    a.dhpost = vk_out(dhpost, Nn * 4);
    a.dy = vk_out(dy, Nd * 4);
    a.N = vk_i32(N);
    a.n = n;
    a.d = d;
    vk_i32((long)Nd * n);
    vk_dispatch("lanes_update_bwd", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

/* ---- scaled residual ---- */

void vk_residual_scaled(const nd_backend *be, float *y, const float *x, const float *r, float gate,
                        long n)
{
    (void)be;
    if (n <= 0)
        return;
    struct {
        uint64_t y, x, r;
        float gate;
        int32_t n;
    } a;
    a.x = vk_in(x, (size_t)n * 4);
    a.r = vk_in(r, (size_t)n * 4);
    a.y = vk_out(y, (size_t)n * 4);
    a.gate = gate;
    a.n = vk_i32(n);
    vk_dispatch("resid_scaled", &a, sizeof a, vk_groups(n, 256), 1, 1);
}

void vk_residual_scaled_backward(const nd_backend *be, float *dr, float *dgate, const float *dy,
                                 const float *r, float gate, long n)
{
    (void)be;
    if (n <= 0)
        return;
    /* the grid (and so the split of the sum) depends only on n */
    uint32_t groups = vk_groups(n, 256 * 8);
    if (groups > 1024)
        groups = 1024;
    struct {
        uint64_t dr, dy, r, part;
        float gate;
        int32_t n;
    } a;
    float *part = dgate ? scratch((size_t)groups * 4) : NULL;
    a.dy = vk_in(dy, (size_t)n * 4);
    a.r = vk_in(r, (size_t)n * 4);
    a.dr = vk_out(dr, (size_t)n * 4);
    a.part = vk_out_opt(part, (size_t)groups * 4);
    a.gate = gate;
    a.n = vk_i32(n);
    vk_dispatch("resid_scaled_bwd", &a, sizeof a, groups, 1, 1);
    float s = san_sigmoid(gate);
    colsum(dgate, part, (int)groups, 1, s * (1.0f - s));
}

/* ---- Hadamard MLP ---- */

static void check_hn(int hn)
{
    if (hn < 1 || hn > 4096 || (hn & (hn - 1))) {
        fprintf(stderr,
                "needle: vulkan backend: the Hadamard MLP needs a power-of-two width up to "
                "4096 (got %d)\n",
                hn);
        abort();
    }
}

void vk_hadamard_mlp(const nd_backend *be, float *y, float *h1, const float *x, const float *z,
                     const float *u, const float *d1, const float *d2, const float *d3, long N,
                     int d, int hn)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    check_hn(hn);
    size_t Nd = (size_t)N * d;
    struct {
        uint64_t y, h1, x, z, u, d1, d2, d3;
        int32_t N, d, hn;
        float scale;
    } a;
    a.x = vk_in(x, Nd * 4);
    a.z = vk_in(z, Nd * 4);
    a.u = vk_in_opt(u, Nd * 4);
    a.d1 = vk_in(d1, (size_t)d * 4);
    a.d2 = vk_in(d2, (size_t)hn * 4);
    a.d3 = vk_in(d3, (size_t)d * 4);
    a.y = vk_out(y, Nd * 4);
    a.h1 = vk_out(h1, (size_t)N * hn * 4);
    a.N = vk_i32(N);
    a.d = d;
    a.hn = hn;
    a.scale = san_walsh_scale(hn);
    vk_i32(N * (long)hn);
    vk_dispatch("hada_mlp", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

void vk_hadamard_mlp_backward(const nd_backend *be, float *dz, float *dd1, float *dd2, float *dd3,
                              const float *dy, const float *z, const float *h1, const float *d1,
                              const float *d2, const float *d3, long N, int d, int hn)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    check_hn(hn);
    /* row blocks: workgroup b takes rows [b*rpb, (b+1)*rpb) */
    long blocks = N < 256 ? N : 256, rpb = (N + blocks - 1) / blocks;
    blocks = (N + rpb - 1) / rpb;
    int want = dd1 || dd2 || dd3;
    size_t part_floats = (size_t)3 * hn * blocks, Nd = (size_t)N * d;
    float *part = want ? scratch(part_floats * 4) : NULL;
    struct {
        uint64_t dz, part, dy, z, h1, d1, d2, d3;
        int32_t N, d, hn, rows_per_block, blocks;
        float scale;
    } a;
    a.dy = vk_in(dy, Nd * 4);
    a.z = vk_in(z, Nd * 4);
    a.h1 = vk_in(h1, (size_t)N * hn * 4);
    a.d1 = vk_in(d1, (size_t)d * 4);
    a.d2 = vk_in(d2, (size_t)hn * 4);
    a.d3 = vk_in(d3, (size_t)d * 4);
    a.dz = vk_out(dz, Nd * 4);
    a.part = vk_out_opt(part, part_floats * 4);
    a.N = vk_i32(N);
    a.d = d;
    a.hn = hn;
    a.rows_per_block = (int32_t)rpb;
    a.blocks = (int32_t)blocks;
    a.scale = san_walsh_scale(hn);
    vk_i32(N * (long)hn);
    vk_dispatch("hada_mlp_bwd", &a, sizeof a, (uint32_t)blocks, 1, 1);
    if (want) {
        colsum(dd1, part, (int)blocks, hn, 1.0f);
        colsum(dd2, part + (size_t)hn * blocks, (int)blocks, hn, 1.0f);
        colsum(dd3, part + (size_t)2 * hn * blocks, (int)blocks, hn, 1.0f);
    }
}

/* ---- norm and gate backwards ---- */

void vk_rmsnorm_backward(const nd_backend *be, float *dx, float *dscale, const float *dy,
                         const float *x, const float *rstd, const float *scale, long rows, int dim,
                         int accumulate)
{
    (void)be;
    if (rows <= 0 || dim <= 0)
        return;
    size_t nel = (size_t)rows * dim;
    vk_i32((long)nel);
    /* dscale partials: row blocks of at least 32 rows, at most 512 blocks */
    long rpb = (rows + 511) / 512;
    if (rpb < 32)
        rpb = 32;
    long blocks = (rows + rpb - 1) / rpb;
    size_t rs_floats = rstd ? 0 : (size_t)rows, part_floats = dscale ? (size_t)dim * blocks : 0;
    float *rs_buf = NULL, *part = NULL;
    if (rs_floats + part_floats) {
        float *s = scratch((rs_floats + part_floats) * 4);
        rs_buf = rstd ? NULL : s;
        part = dscale ? s + rs_floats : NULL;
    }
    const float *rs = rstd ? rstd : rs_buf;
    if (!rstd) {
        struct {
            uint64_t rstd, x;
            int32_t rows, dim;
            float eps;
        } a;
        a.x = vk_in(x, nel * 4);
        a.rstd = vk_out(rs_buf, (size_t)rows * 4);
        a.rows = vk_i32(rows);
        a.dim = dim;
        a.eps = 1e-6f;
        vk_dispatch("norm_bwd_rstd", &a, sizeof a, vk_groups(rows, 1), 1, 1);
    }
    if (dscale) { /* before dx is written: dx may alias dy */
        struct {
            uint64_t part, dy, x, rstd;
            int32_t rows, dim, rows_per_block, blocks;
        } a;
        a.dy = vk_in(dy, nel * 4);
        a.x = vk_in(x, nel * 4);
        a.rstd = vk_in(rs, (size_t)rows * 4);
        a.part = vk_out(part, part_floats * 4);
        a.rows = vk_i32(rows);
        a.dim = dim;
        a.rows_per_block = (int32_t)rpb;
        a.blocks = (int32_t)blocks;
        vk_dispatch("norm_bwd_dscale", &a, sizeof a, (uint32_t)(dim + 63) / 64, (uint32_t)blocks,
                    1);
    }
    struct {
        uint64_t dx, dy, x, rstd, scale;
        int32_t rows, dim, accumulate;
    } a;
    a.dy = vk_in(dy, nel * 4);
    a.x = vk_in(x, nel * 4);
    a.rstd = vk_in(rs, (size_t)rows * 4);
    a.scale = vk_in_opt(scale, (size_t)dim * 4);
    a.dx = vk_out(dx, nel * 4);
    a.rows = vk_i32(rows);
    a.dim = dim;
    a.accumulate = accumulate != 0;
    vk_dispatch("norm_bwd_dx", &a, sizeof a, vk_groups(rows, 1), 1, 1);
    if (dscale)
        colsum(dscale, part, (int)blocks, dim, 1.0f);
}

void vk_gate_sigmoid_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                              const float *att, const float *g, long n)
{
    (void)be;
    if (n <= 0)
        return;
    struct {
        uint64_t datt, dg, dout, att, g;
        int32_t n;
    } a;
    a.dout = vk_in(dout, (size_t)n * 4);
    a.att = vk_in(att, (size_t)n * 4);
    a.g = vk_in(g, (size_t)n * 4);
    a.datt = vk_out(datt, (size_t)n * 4);
    a.dg = vk_out(dg, (size_t)n * 4);
    a.n = vk_i32(n);
    vk_dispatch("gate_bwd_sigmoid", &a, sizeof a, vk_groups(n, 256), 1, 1);
}
