/* GEMM and the simplest element-wise ops on Vulkan. */
#include "backend/vulkan/vk_ops.h"

void vk_matmul(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)be;
    if (M <= 0 || N <= 0)
        return;
    struct {
        uint64_t A, B, C;
        int32_t ta, tb, M, N, K, lda, ldb, ldc;
        float alpha, beta;
    } a = {0};
    /* extents: op(A) is M x K, op(B) is K x N */
    size_t ea = K <= 0 ? 0 : ta ? (size_t)(K - 1) * lda + M : (size_t)(M - 1) * lda + K;
    size_t eb = K <= 0 ? 0 : tb ? (size_t)(N - 1) * ldb + K : (size_t)(K - 1) * ldb + N;
    a.A = ea ? vk_in(A, ea * 4) : 0;
    a.B = eb ? vk_in(B, eb * 4) : 0;
    a.C = vk_out(C, ((size_t)(M - 1) * ldc + N) * 4);
    a.ta = ta;
    a.tb = tb;
    a.M = M;
    a.N = N;
    a.K = K > 0 ? K : 0;
    a.lda = lda;
    a.ldb = ldb;
    a.ldc = ldc;
    a.alpha = alpha;
    a.beta = beta;
    vk_dispatch("matmul", &a, sizeof a, (uint32_t)(N + 63) / 64, (uint32_t)(M + 63) / 64, 1);
}

void vk_copy2d(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
               long rows, int cols)
{
    (void)be;
    if (rows <= 0 || cols <= 0)
        return;
    struct {
        uint64_t dst, src;
        int32_t dst_ld, src_ld, rows, cols;
    } a;
    a.src = vk_in(src, ((size_t)(rows - 1) * src_ld + cols) * 4);
    a.dst = vk_out(dst, ((size_t)(rows - 1) * dst_ld + cols) * 4);
    a.dst_ld = dst_ld;
    a.src_ld = src_ld;
    a.rows = vk_i32(rows);
    a.cols = cols;
    vk_i32(rows * (long)cols);
    vk_dispatch("copy2d", &a, sizeof a, vk_groups(rows * (long)cols, 256), 1, 1);
}

void vk_add(const nd_backend *be, float *y, const float *x, float alpha, long n)
{
    (void)be;
    if (n <= 0)
        return;
    struct {
        uint64_t y, x;
        float alpha;
        int32_t n;
    } a;
    a.x = vk_in(x, (size_t)n * 4);
    a.y = vk_out(y, (size_t)n * 4);
    a.alpha = alpha;
    a.n = vk_i32(n);
    vk_dispatch("add", &a, sizeof a, vk_groups(n, 256), 1, 1);
}

void vk_rmsnorm(const nd_backend *be, float *y, float *rstd, const float *x, const float *scale,
                long rows, int dim)
{
    (void)be;
    if (rows <= 0)
        return;
    struct {
        uint64_t y, rstd, x, scale;
        int32_t rows, dim;
        float eps;
    } a;
    a.x = vk_in(x, (size_t)rows * dim * 4);
    a.scale = vk_in_opt(scale, (size_t)dim * 4);
    a.y = vk_out(y, (size_t)rows * dim * 4);
    a.rstd = vk_out_opt(rstd, (size_t)rows * 4);
    a.rows = vk_i32(rows);
    a.dim = dim;
    a.eps = 1e-6f;
    vk_dispatch("rmsnorm", &a, sizeof a, vk_groups(rows, 1), 1, 1);
}

void vk_gate_sigmoid(const nd_backend *be, float *o, const float *att, const float *g, long n)
{
    (void)be;
    if (n <= 0)
        return;
    struct {
        uint64_t o, att, g;
        int32_t n;
    } a;
    a.att = vk_in(att, (size_t)n * 4);
    a.g = vk_in(g, (size_t)n * 4);
    a.o = vk_out(o, (size_t)n * 4);
    a.n = vk_i32(n);
    vk_dispatch("gate_sigmoid", &a, sizeof a, vk_groups(n, 256), 1, 1);
}
