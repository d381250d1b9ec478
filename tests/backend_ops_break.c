/* NEEDLE_TEST_BREAK for test_backend_ops: a copy of the target's table
 * whose entries forward to the real backend (always with the real table
 * pointer: a backend may keep its state next to its table), with one op
 * broken. The test must then fail: proof that it can.
 *
 * <op>: the op perturbs its first output by ~1e-3 relative after it ran.
 * defer:<op> (matmul, rmsnorm, engram_hash, attention, scatter_add_rows,
 *   cross_entropy, attention_backward, hyper_coeffs_backward, copy2d): the
 *   op runs only at the next sync (or at its own next call),
 *   reading its inputs then: a legal asynchronous op as long as nothing
 *   reads its outputs before the sync and its host inputs are still there,
 *   which the test breaks on purpose (chains; host inputs overwritten after
 *   issue). Like a device backend that forgets a barrier or the
 *   copy-at-issue rule.
 *
 * Generated from backend.h's table (one wrapper per entry). */
#include <string.h>

#include "backend_ops.h"

static const nd_backend *real;
static const char *broken = "", *deferred = "";
static nd_backend wrapped;
static void (*pending)(void);

static void flush(void)
{
    void (*f)(void) = pending;
    pending = NULL;
    if (f)
        f();
}

static void perturb_float(float *x)
{
    if (!x)
        return;
    nd_backend_sync(real);
    x[0] = x[0] * (1.0f + 1e-3f) + 1e-3f;
}

static void perturb_int(int32_t *x)
{
    if (!x)
        return;
    nd_backend_sync(real);
    x[0] = x[0] > 0 ? x[0] - 1 : x[0] + 1; /* another valid slot */
}

static void brk_sync(const nd_backend *be)
{
    (void)be;
    flush();
    nd_backend_sync(real);
}

static void *brk_alloc(const nd_backend *be, size_t bytes)
{
    (void)be;
    return real->alloc(real, bytes);
}

static void brk_free(const nd_backend *be, void *p)
{
    (void)be;
    real->free(real, p);
}

static struct {
    int ta;
    int tb;
    int M;
    int N;
    int K;
    float alpha;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float beta;
    float *C;
    int ldc;
} arg_matmul;

static void run_matmul(void)
{
    real->matmul(real, arg_matmul.ta, arg_matmul.tb, arg_matmul.M, arg_matmul.N, arg_matmul.K,
                 arg_matmul.alpha, arg_matmul.A, arg_matmul.lda, arg_matmul.B, arg_matmul.ldb,
                 arg_matmul.beta, arg_matmul.C, arg_matmul.ldc);
}

static void brk_matmul(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
{
    (void)be;
    if (!strcmp(deferred, "matmul")) {
        flush();
        arg_matmul.ta = ta;
        arg_matmul.tb = tb;
        arg_matmul.M = M;
        arg_matmul.N = N;
        arg_matmul.K = K;
        arg_matmul.alpha = alpha;
        arg_matmul.A = A;
        arg_matmul.lda = lda;
        arg_matmul.B = B;
        arg_matmul.ldb = ldb;
        arg_matmul.beta = beta;
        arg_matmul.C = C;
        arg_matmul.ldc = ldc;
        pending = run_matmul;
        return;
    }
    real->matmul(real, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (!strcmp(broken, "matmul"))
        perturb_float(C);
}

static struct {
    float *y;
    float *rstd;
    const float *x;
    const float *scale;
    long rows;
    int dim;
} arg_rmsnorm;

static void run_rmsnorm(void)
{
    real->rmsnorm(real, arg_rmsnorm.y, arg_rmsnorm.rstd, arg_rmsnorm.x, arg_rmsnorm.scale,
                  arg_rmsnorm.rows, arg_rmsnorm.dim);
}

static void brk_rmsnorm(const nd_backend *be, float *y, float *rstd, const float *x,
                        const float *scale, long rows, int dim)
{
    (void)be;
    if (!strcmp(deferred, "rmsnorm")) {
        flush();
        arg_rmsnorm.y = y;
        arg_rmsnorm.rstd = rstd;
        arg_rmsnorm.x = x;
        arg_rmsnorm.scale = scale;
        arg_rmsnorm.rows = rows;
        arg_rmsnorm.dim = dim;
        pending = run_rmsnorm;
        return;
    }
    real->rmsnorm(real, y, rstd, x, scale, rows, dim);
    if (!strcmp(broken, "rmsnorm"))
        perturb_float(y);
}

static void brk_embed(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N,
                      int d, float scale)
{
    (void)be;
    real->embed(real, x0, emb, tok, N, d, scale);
    if (!strcmp(broken, "embed"))
        perturb_float(x0);
}

static struct {
    int32_t *idx;
    const int32_t *tok;
    const nd_layout *L;
    const int *orders;
    int n_orders;
    int heads;
    int slots;
} arg_engram_hash;

static void run_engram_hash(void)
{
    real->engram_hash(real, arg_engram_hash.idx, arg_engram_hash.tok, arg_engram_hash.L,
                      arg_engram_hash.orders, arg_engram_hash.n_orders, arg_engram_hash.heads,
                      arg_engram_hash.slots);
}

static void brk_engram_hash(const nd_backend *be, int32_t *idx, const int32_t *tok,
                            const nd_layout *L, const int *orders, int n_orders, int heads,
                            int slots)
{
    (void)be;
    if (!strcmp(deferred, "engram_hash")) {
        flush();
        arg_engram_hash.idx = idx;
        arg_engram_hash.tok = tok;
        arg_engram_hash.L = L;
        arg_engram_hash.orders = orders;
        arg_engram_hash.n_orders = n_orders;
        arg_engram_hash.heads = heads;
        arg_engram_hash.slots = slots;
        pending = run_engram_hash;
        return;
    }
    real->engram_hash(real, idx, tok, L, orders, n_orders, heads, slots);
    if (!strcmp(broken, "engram_hash"))
        perturb_int(idx);
}

static void brk_engram_gather(const nd_backend *be, float *e, const float *tables,
                              const int32_t *idx, const nd_layout *L, const int *orders,
                              int n_orders, int heads, int slots, int sub)
{
    (void)be;
    real->engram_gather(real, e, tables, idx, L, orders, n_orders, heads, slots, sub);
    if (!strcmp(broken, "engram_gather"))
        perturb_float(e);
}

static void brk_engram_taps(const nd_backend *be, float *v, const float *vp, const float *taps,
                            const nd_layout *L, int d, int dil)
{
    (void)be;
    real->engram_taps(real, v, vp, taps, L, d, dil);
    if (!strcmp(broken, "engram_taps"))
        perturb_float(v);
}

static void brk_engram_gate(const nd_backend *be, float *bx, float *alpha, const float *u,
                            const float *k, const float *v, long N, int d, int accumulate)
{
    (void)be;
    real->engram_gate(real, bx, alpha, u, k, v, N, d, accumulate);
    if (!strcmp(broken, "engram_gate"))
        perturb_float(bx);
}

static void brk_hyper_coeffs(const nd_backend *be, float *hpre, float *hpost, float *M,
                             const float *pre, const float *post, const float *res, float a_pre,
                             float a_post, float a_res, const float *b_pre, const float *b_post,
                             const float *b_res, int lane, long N, int n)
{
    (void)be;
    real->hyper_coeffs(real, hpre, hpost, M, pre, post, res, a_pre, a_post, a_res, b_pre, b_post,
                       b_res, lane, N, n);
    if (!strcmp(broken, "hyper_coeffs"))
        perturb_float(hpre);
}

static void brk_lanes_combine(const nd_backend *be, float *u, const float *hpre, const float *X,
                              long N, int n, int d)
{
    (void)be;
    real->lanes_combine(real, u, hpre, X, N, n, d);
    if (!strcmp(broken, "lanes_combine"))
        perturb_float(u);
}

static void brk_lanes_update(const nd_backend *be, float *Xo, const float *M, const float *X,
                             const float *hpost, const float *y, long N, int n, int d)
{
    (void)be;
    real->lanes_update(real, Xo, M, X, hpost, y, N, n, d);
    if (!strcmp(broken, "lanes_update"))
        perturb_float(Xo);
}

static void brk_lanes_broadcast(const nd_backend *be, float *X, const float *x0, long N, int n,
                                int d)
{
    (void)be;
    real->lanes_broadcast(real, X, x0, N, n, d);
    if (!strcmp(broken, "lanes_broadcast"))
        perturb_float(X);
}

static void brk_lanes_mean(const nd_backend *be, float *xm, const float *X, long N, int n, int d)
{
    (void)be;
    real->lanes_mean(real, xm, X, N, n, d);
    if (!strcmp(broken, "lanes_mean"))
        perturb_float(xm);
}

static void brk_rope(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
                     const nd_layout *L, int heads, int hd)
{
    (void)be;
    real->rope(real, x, cos_t, sin_t, L, heads, hd);
    if (!strcmp(broken, "rope"))
        perturb_float(x);
}

static struct {
    float *out;
    float *lse;
    const float *q;
    const float *k;
    const float *v;
    const nd_layout *L;
    int H;
    int G;
    int hd;
} arg_attention;

static void run_attention(void)
{
    real->attention(real, arg_attention.out, arg_attention.lse, arg_attention.q, arg_attention.k,
                    arg_attention.v, arg_attention.L, arg_attention.H, arg_attention.G,
                    arg_attention.hd);
}

static void brk_attention(const nd_backend *be, float *out, float *lse, const float *q,
                          const float *k, const float *v, const nd_layout *L, int H, int G, int hd)
{
    (void)be;
    if (!strcmp(deferred, "attention")) {
        flush();
        arg_attention.out = out;
        arg_attention.lse = lse;
        arg_attention.q = q;
        arg_attention.k = k;
        arg_attention.v = v;
        arg_attention.L = L;
        arg_attention.H = H;
        arg_attention.G = G;
        arg_attention.hd = hd;
        pending = run_attention;
        return;
    }
    real->attention(real, out, lse, q, k, v, L, H, G, hd);
    if (!strcmp(broken, "attention"))
        perturb_float(out);
}

static void brk_gate_sigmoid(const nd_backend *be, float *o, const float *att, const float *g,
                             long n)
{
    (void)be;
    real->gate_sigmoid(real, o, att, g, n);
    if (!strcmp(broken, "gate_sigmoid"))
        perturb_float(o);
}

static void brk_residual_scaled(const nd_backend *be, float *y, const float *x, const float *r,
                                float gate, long n)
{
    (void)be;
    real->residual_scaled(real, y, x, r, gate, n);
    if (!strcmp(broken, "residual_scaled"))
        perturb_float(y);
}

static void brk_hadamard_mlp(const nd_backend *be, float *y, float *h1, const float *x,
                             const float *z, const float *u, const float *d1, const float *d2,
                             const float *d3, long N, int d, int hn)
{
    (void)be;
    real->hadamard_mlp(real, y, h1, x, z, u, d1, d2, d3, N, d, hn);
    if (!strcmp(broken, "hadamard_mlp"))
        perturb_float(y);
}

static void brk_gather_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                            long n, int d)
{
    (void)be;
    real->gather_rows(real, dst, src, rows, n, d);
    if (!strcmp(broken, "gather_rows"))
        perturb_float(dst);
}

static struct {
    float *dst;
    const float *src;
    const int32_t *rows;
    long n;
    int d;
} arg_scatter_add_rows;

static void run_scatter_add_rows(void)
{
    real->scatter_add_rows(real, arg_scatter_add_rows.dst, arg_scatter_add_rows.src,
                           arg_scatter_add_rows.rows, arg_scatter_add_rows.n,
                           arg_scatter_add_rows.d);
}

static void brk_scatter_add_rows(const nd_backend *be, float *dst, const float *src,
                                 const int32_t *rows, long n, int d)
{
    (void)be;
    if (!strcmp(deferred, "scatter_add_rows")) {
        flush();
        arg_scatter_add_rows.dst = dst;
        arg_scatter_add_rows.src = src;
        arg_scatter_add_rows.rows = rows;
        arg_scatter_add_rows.n = n;
        arg_scatter_add_rows.d = d;
        pending = run_scatter_add_rows;
        return;
    }
    real->scatter_add_rows(real, dst, src, rows, n, d);
    if (!strcmp(broken, "scatter_add_rows"))
        perturb_float(dst);
}

static struct {
    float *loss;
    const float *logits;
    const int32_t *target;
    long N;
    int V;
} arg_cross_entropy;

static void run_cross_entropy(void)
{
    real->cross_entropy(real, arg_cross_entropy.loss, arg_cross_entropy.logits,
                        arg_cross_entropy.target, arg_cross_entropy.N, arg_cross_entropy.V);
}

static void brk_cross_entropy(const nd_backend *be, float *loss, const float *logits,
                              const int32_t *target, long N, int V)
{
    (void)be;
    if (!strcmp(deferred, "cross_entropy")) {
        flush();
        arg_cross_entropy.loss = loss;
        arg_cross_entropy.logits = logits;
        arg_cross_entropy.target = target;
        arg_cross_entropy.N = N;
        arg_cross_entropy.V = V;
        pending = run_cross_entropy;
        return;
    }
    real->cross_entropy(real, loss, logits, target, N, V);
    if (!strcmp(broken, "cross_entropy"))
        perturb_float(loss);
}

static void brk_cross_entropy_backward(const nd_backend *be, float *logits, const int32_t *target,
                                       const float *weight, long N, int V)
{
    (void)be;
    real->cross_entropy_backward(real, logits, target, weight, N, V);
    if (!strcmp(broken, "cross_entropy_backward"))
        perturb_float(logits);
}

static void brk_rmsnorm_backward(const nd_backend *be, float *dx, float *dscale, const float *dy,
                                 const float *x, const float *rstd, const float *scale, long rows,
                                 int dim, int accumulate)
{
    (void)be;
    real->rmsnorm_backward(real, dx, dscale, dy, x, rstd, scale, rows, dim, accumulate);
    if (!strcmp(broken, "rmsnorm_backward"))
        perturb_float(dx);
}

static void brk_embed_backward(const nd_backend *be, float *demb, const float *dx0,
                               const int32_t *tok, long N, int d, float scale)
{
    (void)be;
    real->embed_backward(real, demb, dx0, tok, N, d, scale);
    if (!strcmp(broken, "embed_backward"))
        perturb_float(demb);
}

static void brk_engram_gather_backward(const nd_backend *be, float *dtables, const float *de,
                                       const int32_t *idx, const nd_layout *L, const int *orders,
                                       int n_orders, int heads, int slots, int sub)
{
    (void)be;
    real->engram_gather_backward(real, dtables, de, idx, L, orders, n_orders, heads, slots, sub);
    if (!strcmp(broken, "engram_gather_backward"))
        perturb_float(dtables);
}

static void brk_engram_taps_backward(const nd_backend *be, float *dvp, float *dtaps,
                                     const float *dv, const float *vp, const float *taps,
                                     const nd_layout *L, int d, int dil)
{
    (void)be;
    real->engram_taps_backward(real, dvp, dtaps, dv, vp, taps, L, d, dil);
    if (!strcmp(broken, "engram_taps_backward"))
        perturb_float(dvp);
}

static void brk_engram_gate_backward(const nd_backend *be, float *du, float *dk, float *dv,
                                     const float *dbx, const float *u, const float *k,
                                     const float *v, const float *alpha, long N, int d)
{
    (void)be;
    real->engram_gate_backward(real, du, dk, dv, dbx, u, k, v, alpha, N, d);
    if (!strcmp(broken, "engram_gate_backward"))
        perturb_float(du);
}

static struct {
    float *dpre;
    float *dpost;
    float *dres;
    float *da_pre;
    float *da_post;
    float *da_res;
    float *db_pre;
    float *db_post;
    float *db_res;
    const float *dhpre;
    const float *dhpost;
    const float *dM;
    const float *pre;
    const float *post;
    const float *res;
    const float *hpre;
    const float *hpost;
    float a_pre;
    float a_post;
    float a_res;
    const float *b_res;
    long N;
    int n;
} arg_hyper_coeffs_backward;

static void run_hyper_coeffs_backward(void)
{
    real->hyper_coeffs_backward(real, arg_hyper_coeffs_backward.dpre,
                                arg_hyper_coeffs_backward.dpost, arg_hyper_coeffs_backward.dres,
                                arg_hyper_coeffs_backward.da_pre, arg_hyper_coeffs_backward.da_post,
                                arg_hyper_coeffs_backward.da_res, arg_hyper_coeffs_backward.db_pre,
                                arg_hyper_coeffs_backward.db_post, arg_hyper_coeffs_backward.db_res,
                                arg_hyper_coeffs_backward.dhpre, arg_hyper_coeffs_backward.dhpost,
                                arg_hyper_coeffs_backward.dM, arg_hyper_coeffs_backward.pre,
                                arg_hyper_coeffs_backward.post, arg_hyper_coeffs_backward.res,
                                arg_hyper_coeffs_backward.hpre, arg_hyper_coeffs_backward.hpost,
                                arg_hyper_coeffs_backward.a_pre, arg_hyper_coeffs_backward.a_post,
                                arg_hyper_coeffs_backward.a_res, arg_hyper_coeffs_backward.b_res,
                                arg_hyper_coeffs_backward.N, arg_hyper_coeffs_backward.n);
}

static void brk_hyper_coeffs_backward(const nd_backend *be, float *dpre, float *dpost, float *dres,
                                      float *da_pre, float *da_post, float *da_res, float *db_pre,
                                      float *db_post, float *db_res, const float *dhpre,
                                      const float *dhpost, const float *dM, const float *pre,
                                      const float *post, const float *res, const float *hpre,
                                      const float *hpost, float a_pre, float a_post, float a_res,
                                      const float *b_res, long N, int n)
{
    (void)be;
    if (!strcmp(deferred, "hyper_coeffs_backward")) {
        flush();
        arg_hyper_coeffs_backward.dpre = dpre;
        arg_hyper_coeffs_backward.dpost = dpost;
        arg_hyper_coeffs_backward.dres = dres;
        arg_hyper_coeffs_backward.da_pre = da_pre;
        arg_hyper_coeffs_backward.da_post = da_post;
        arg_hyper_coeffs_backward.da_res = da_res;
        arg_hyper_coeffs_backward.db_pre = db_pre;
        arg_hyper_coeffs_backward.db_post = db_post;
        arg_hyper_coeffs_backward.db_res = db_res;
        arg_hyper_coeffs_backward.dhpre = dhpre;
        arg_hyper_coeffs_backward.dhpost = dhpost;
        arg_hyper_coeffs_backward.dM = dM;
        arg_hyper_coeffs_backward.pre = pre;
        arg_hyper_coeffs_backward.post = post;
        arg_hyper_coeffs_backward.res = res;
        arg_hyper_coeffs_backward.hpre = hpre;
        arg_hyper_coeffs_backward.hpost = hpost;
        arg_hyper_coeffs_backward.a_pre = a_pre;
        arg_hyper_coeffs_backward.a_post = a_post;
        arg_hyper_coeffs_backward.a_res = a_res;
        arg_hyper_coeffs_backward.b_res = b_res;
        arg_hyper_coeffs_backward.N = N;
        arg_hyper_coeffs_backward.n = n;
        pending = run_hyper_coeffs_backward;
        return;
    }
    real->hyper_coeffs_backward(real, dpre, dpost, dres, da_pre, da_post, da_res, db_pre, db_post,
                                db_res, dhpre, dhpost, dM, pre, post, res, hpre, hpost, a_pre,
                                a_post, a_res, b_res, N, n);
    if (!strcmp(broken, "hyper_coeffs_backward"))
        perturb_float(dpre);
}

static void brk_lanes_combine_backward(const nd_backend *be, float *dhpre, float *dX,
                                       const float *du, const float *hpre, const float *X, long N,
                                       int n, int d)
{
    (void)be;
    real->lanes_combine_backward(real, dhpre, dX, du, hpre, X, N, n, d);
    if (!strcmp(broken, "lanes_combine_backward"))
        perturb_float(dhpre);
}

static void brk_lanes_update_backward(const nd_backend *be, float *dX, float *dM, float *dhpost,
                                      float *dy, const float *dXo, const float *M, const float *X,
                                      const float *hpost, const float *y, long N, int n, int d)
{
    (void)be;
    real->lanes_update_backward(real, dX, dM, dhpost, dy, dXo, M, X, hpost, y, N, n, d);
    if (!strcmp(broken, "lanes_update_backward"))
        perturb_float(dX);
}

static void brk_lanes_broadcast_backward(const nd_backend *be, float *dx0, const float *dX, long N,
                                         int n, int d)
{
    (void)be;
    real->lanes_broadcast_backward(real, dx0, dX, N, n, d);
    if (!strcmp(broken, "lanes_broadcast_backward"))
        perturb_float(dx0);
}

static void brk_lanes_mean_backward(const nd_backend *be, float *dX, const float *dxm, long N,
                                    int n, int d)
{
    (void)be;
    real->lanes_mean_backward(real, dX, dxm, N, n, d);
    if (!strcmp(broken, "lanes_mean_backward"))
        perturb_float(dX);
}

static void brk_rope_backward(const nd_backend *be, float *dx, const float *cos_t,
                              const float *sin_t, const nd_layout *L, int heads, int hd)
{
    (void)be;
    real->rope_backward(real, dx, cos_t, sin_t, L, heads, hd);
    if (!strcmp(broken, "rope_backward"))
        perturb_float(dx);
}

static struct {
    float *dq;
    float *dk;
    float *dv;
    const float *dout;
    const float *q;
    const float *k;
    const float *v;
    const float *out;
    const float *lse;
    const nd_layout *L;
    int H;
    int G;
    int hd;
} arg_attention_backward;

static void run_attention_backward(void)
{
    real->attention_backward(
        real, arg_attention_backward.dq, arg_attention_backward.dk, arg_attention_backward.dv,
        arg_attention_backward.dout, arg_attention_backward.q, arg_attention_backward.k,
        arg_attention_backward.v, arg_attention_backward.out, arg_attention_backward.lse,
        arg_attention_backward.L, arg_attention_backward.H, arg_attention_backward.G,
        arg_attention_backward.hd);
}

static void brk_attention_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, const float *out, const float *lse,
                                   const nd_layout *L, int H, int G, int hd)
{
    (void)be;
    if (!strcmp(deferred, "attention_backward")) {
        flush();
        arg_attention_backward.dq = dq;
        arg_attention_backward.dk = dk;
        arg_attention_backward.dv = dv;
        arg_attention_backward.dout = dout;
        arg_attention_backward.q = q;
        arg_attention_backward.k = k;
        arg_attention_backward.v = v;
        arg_attention_backward.out = out;
        arg_attention_backward.lse = lse;
        arg_attention_backward.L = L;
        arg_attention_backward.H = H;
        arg_attention_backward.G = G;
        arg_attention_backward.hd = hd;
        pending = run_attention_backward;
        return;
    }
    real->attention_backward(real, dq, dk, dv, dout, q, k, v, out, lse, L, H, G, hd);
    if (!strcmp(broken, "attention_backward"))
        perturb_float(dq);
}

static void brk_gate_sigmoid_backward(const nd_backend *be, float *datt, float *dg,
                                      const float *dout, const float *att, const float *g, long n)
{
    (void)be;
    real->gate_sigmoid_backward(real, datt, dg, dout, att, g, n);
    if (!strcmp(broken, "gate_sigmoid_backward"))
        perturb_float(datt);
}

static void brk_residual_scaled_backward(const nd_backend *be, float *dr, float *dgate,
                                         const float *dy, const float *r, float gate, long n)
{
    (void)be;
    real->residual_scaled_backward(real, dr, dgate, dy, r, gate, n);
    if (!strcmp(broken, "residual_scaled_backward"))
        perturb_float(dr);
}

static void brk_hadamard_mlp_backward(const nd_backend *be, float *dz, float *dd1, float *dd2,
                                      float *dd3, const float *dy, const float *z, const float *h1,
                                      const float *d1, const float *d2, const float *d3, long N,
                                      int d, int hn)
{
    (void)be;
    real->hadamard_mlp_backward(real, dz, dd1, dd2, dd3, dy, z, h1, d1, d2, d3, N, d, hn);
    if (!strcmp(broken, "hadamard_mlp_backward"))
        perturb_float(dz);
}

static struct {
    float *dst;
    int dst_ld;
    const float *src;
    int src_ld;
    long rows;
    int cols;
} arg_copy2d;

static void run_copy2d(void)
{
    real->copy2d(real, arg_copy2d.dst, arg_copy2d.dst_ld, arg_copy2d.src, arg_copy2d.src_ld,
                 arg_copy2d.rows, arg_copy2d.cols);
}

static void brk_copy2d(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
                       long rows, int cols)
{
    (void)be;
    if (!strcmp(deferred, "copy2d")) {
        flush();
        arg_copy2d.dst = dst;
        arg_copy2d.dst_ld = dst_ld;
        arg_copy2d.src = src;
        arg_copy2d.src_ld = src_ld;
        arg_copy2d.rows = rows;
        arg_copy2d.cols = cols;
        pending = run_copy2d;
        return;
    }
    real->copy2d(real, dst, dst_ld, src, src_ld, rows, cols);
    if (!strcmp(broken, "copy2d"))
        perturb_float(dst);
}

static void brk_add(const nd_backend *be, float *y, const float *x, float alpha, long n)
{
    (void)be;
    real->add(real, y, x, alpha, n);
    if (!strcmp(broken, "add"))
        perturb_float(y);
}

const nd_backend *bo_break(const nd_backend *be, const char *name)
{
    static const char *const names[] = {"matmul",
                                        "rmsnorm",
                                        "embed",
                                        "engram_hash",
                                        "engram_gather",
                                        "engram_taps",
                                        "engram_gate",
                                        "hyper_coeffs",
                                        "lanes_combine",
                                        "lanes_update",
                                        "lanes_broadcast",
                                        "lanes_mean",
                                        "rope",
                                        "attention",
                                        "gate_sigmoid",
                                        "residual_scaled",
                                        "hadamard_mlp",
                                        "gather_rows",
                                        "scatter_add_rows",
                                        "cross_entropy",
                                        "cross_entropy_backward",
                                        "rmsnorm_backward",
                                        "embed_backward",
                                        "engram_gather_backward",
                                        "engram_taps_backward",
                                        "engram_gate_backward",
                                        "hyper_coeffs_backward",
                                        "lanes_combine_backward",
                                        "lanes_update_backward",
                                        "lanes_broadcast_backward",
                                        "lanes_mean_backward",
                                        "rope_backward",
                                        "attention_backward",
                                        "gate_sigmoid_backward",
                                        "residual_scaled_backward",
                                        "hadamard_mlp_backward",
                                        "copy2d",
                                        "add"};
    static const char *const defer_names[] = {"matmul",
                                              "rmsnorm",
                                              "engram_hash",
                                              "attention",
                                              "scatter_add_rows",
                                              "cross_entropy",
                                              "attention_backward",
                                              "hyper_coeffs_backward",
                                              "copy2d"};
    int defer = !strncmp(name, "defer:", 6);
    const char *op = defer ? name + 6 : name;
    const char *const *list = defer ? defer_names : names;
    size_t n = defer ? sizeof defer_names / sizeof *defer_names : sizeof names / sizeof *names;
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= !strcmp(list[i], op);
    if (!found)
        return NULL;
    real = be;
    if (defer)
        deferred = op;
    else
        broken = op;
    wrapped = *be;
    wrapped.sync = brk_sync;
    wrapped.alloc = brk_alloc;
    wrapped.free = brk_free;
    wrapped.matmul = be->matmul ? brk_matmul : NULL;
    wrapped.rmsnorm = be->rmsnorm ? brk_rmsnorm : NULL;
    wrapped.embed = be->embed ? brk_embed : NULL;
    wrapped.engram_hash = be->engram_hash ? brk_engram_hash : NULL;
    wrapped.engram_gather = be->engram_gather ? brk_engram_gather : NULL;
    wrapped.engram_taps = be->engram_taps ? brk_engram_taps : NULL;
    wrapped.engram_gate = be->engram_gate ? brk_engram_gate : NULL;
    wrapped.hyper_coeffs = be->hyper_coeffs ? brk_hyper_coeffs : NULL;
    wrapped.lanes_combine = be->lanes_combine ? brk_lanes_combine : NULL;
    wrapped.lanes_update = be->lanes_update ? brk_lanes_update : NULL;
    wrapped.lanes_broadcast = be->lanes_broadcast ? brk_lanes_broadcast : NULL;
    wrapped.lanes_mean = be->lanes_mean ? brk_lanes_mean : NULL;
    wrapped.rope = be->rope ? brk_rope : NULL;
    wrapped.attention = be->attention ? brk_attention : NULL;
    wrapped.gate_sigmoid = be->gate_sigmoid ? brk_gate_sigmoid : NULL;
    wrapped.residual_scaled = be->residual_scaled ? brk_residual_scaled : NULL;
    wrapped.hadamard_mlp = be->hadamard_mlp ? brk_hadamard_mlp : NULL;
    wrapped.gather_rows = be->gather_rows ? brk_gather_rows : NULL;
    wrapped.scatter_add_rows = be->scatter_add_rows ? brk_scatter_add_rows : NULL;
    wrapped.cross_entropy = be->cross_entropy ? brk_cross_entropy : NULL;
    wrapped.cross_entropy_backward = be->cross_entropy_backward ? brk_cross_entropy_backward : NULL;
    wrapped.rmsnorm_backward = be->rmsnorm_backward ? brk_rmsnorm_backward : NULL;
    wrapped.embed_backward = be->embed_backward ? brk_embed_backward : NULL;
    wrapped.engram_gather_backward = be->engram_gather_backward ? brk_engram_gather_backward : NULL;
    wrapped.engram_taps_backward = be->engram_taps_backward ? brk_engram_taps_backward : NULL;
    wrapped.engram_gate_backward = be->engram_gate_backward ? brk_engram_gate_backward : NULL;
    wrapped.hyper_coeffs_backward = be->hyper_coeffs_backward ? brk_hyper_coeffs_backward : NULL;
    wrapped.lanes_combine_backward = be->lanes_combine_backward ? brk_lanes_combine_backward : NULL;
    wrapped.lanes_update_backward = be->lanes_update_backward ? brk_lanes_update_backward : NULL;
    wrapped.lanes_broadcast_backward =
        be->lanes_broadcast_backward ? brk_lanes_broadcast_backward : NULL;
    wrapped.lanes_mean_backward = be->lanes_mean_backward ? brk_lanes_mean_backward : NULL;
    wrapped.rope_backward = be->rope_backward ? brk_rope_backward : NULL;
    wrapped.attention_backward = be->attention_backward ? brk_attention_backward : NULL;
    wrapped.gate_sigmoid_backward = be->gate_sigmoid_backward ? brk_gate_sigmoid_backward : NULL;
    wrapped.residual_scaled_backward =
        be->residual_scaled_backward ? brk_residual_scaled_backward : NULL;
    wrapped.hadamard_mlp_backward = be->hadamard_mlp_backward ? brk_hadamard_mlp_backward : NULL;
    wrapped.copy2d = be->copy2d ? brk_copy2d : NULL;
    wrapped.add = be->add ? brk_add : NULL;
    return &wrapped;
}
