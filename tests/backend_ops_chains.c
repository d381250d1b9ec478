/* Chains of dependent ops issued before one sync (test_backend_ops.c):
 * a device backend that forgets a barrier between an op and the next one
 * reading its output, or between two ops accumulating into the same
 * buffer, fails here even when every op is right on its own. */
#include "backend_ops.h"
#include "model/san.h"

#define F(k) ((float *)p[k])
#define CF(k) ((const float *)p[k])
#define I32(k) ((int32_t *)p[k])
#define CI32(k) ((const int32_t *)p[k])

/* rmsnorm -> matmul -> gate_sigmoid -> add -> matmul (transposed) */
static void is_dense(const nd_backend *be, const bo_case *c, void *const *p)
{
    long N = c->i[0];
    int d = (int)c->i[1], q = (int)c->i[2];
    /* out: 0 a [N,d], 1 rstd, 2 h [N,q], 3 o [N,q], 4 acc [N,q], 5 back [N,d];
     * in: 6 x [N,d], 7 scale [d], 8 W [d,q], 9 g [N,q] */
    be->rmsnorm(be, F(0), F(1), CF(6), CF(7), N, d);
    be->matmul(be, 0, 0, (int)N, q, d, 1.0f, F(0), d, CF(8), q, 0.0f, F(2), q);
    be->gate_sigmoid(be, F(3), F(2), CF(9), N * q);
    be->add(be, F(4), F(3), 0.5f, N * q);
    be->matmul(be, 0, 1, (int)N, d, q, 1.0f, F(4), q, CF(8), q, 1.0f, F(5), d);
    be->rmsnorm(be, F(5), NULL, F(5), NULL, N, d); /* in place */
}

/* engram: hash -> gather (idx in alloc memory) -> matmul -> taps, and the
 * backward's gather_backward accumulating twice into one table */
static void is_engram(const nd_backend *be, const bo_case *c, void *const *p)
{
    const nd_layout *L = c->L;
    int no = (int)c->i[0], heads = (int)c->i[1], slots = (int)c->i[2], sub = (int)c->i[3];
    int d = (int)c->i[4], K = no * heads, ed = K * sub;
    /* out: 0 idx, 1 e [N,ed], 2 vp [N,d], 3 v [N,d], 4 dtab; in: 5 tok, 6 tab, 7 wv [ed,d], 8 taps
     */
    be->engram_hash(be, I32(0), CI32(5), L, c->orders, no, heads, slots);
    be->engram_gather(be, F(1), CF(6), I32(0), L, c->orders, no, heads, slots, sub);
    be->matmul(be, 0, 0, (int)L->N, d, ed, 1.0f, F(1), ed, CF(7), d, 0.0f, F(2), d);
    be->engram_taps(be, F(3), F(2), CF(8), L, d, 3);
    be->engram_gather_backward(be, F(4), F(1), I32(0), L, c->orders, no, heads, slots, sub);
    be->engram_gather_backward(be, F(4), F(1), I32(0), L, c->orders, no, heads, slots, sub);
}

/* attention block: rope q and k, attention, gate, then the backward of
 * all of it */
static void is_attn(const nd_backend *be, const bo_case *c, void *const *p)
{
    const nd_layout *L = c->L;
    int H = (int)c->i[0], G = (int)c->i[1], hd = (int)c->i[2];
    long nq = L->N * H * hd;
    /* out: 0 qn, 1 kn, 2 att, 3 lse, 4 o, 5 datt, 6 dg, 7 dq, 8 dk, 9 dv;
     * in: 10 q, 11 k, 12 v, 13 g, 14 do, 15 cos, 16 sin */
    be->copy2d(be, F(0), H * hd, CF(10), H * hd, L->N, H * hd);
    be->copy2d(be, F(1), G * hd, CF(11), G * hd, L->N, G * hd);
    be->rmsnorm(be, F(0), NULL, F(0), NULL, L->N * H, hd);
    be->rope(be, F(0), CF(15), CF(16), L, H, hd);
    be->rope(be, F(1), CF(15), CF(16), L, G, hd);
    be->attention(be, F(2), F(3), F(0), F(1), CF(12), L, H, G, hd);
    be->gate_sigmoid(be, F(4), F(2), CF(13), nq);
    be->gate_sigmoid_backward(be, F(5), F(6), CF(14), F(2), CF(13), nq);
    be->attention_backward(be, F(7), F(8), F(9), F(5), F(0), F(1), CF(12), F(2), F(3), L, H, G, hd);
    be->rope_backward(be, F(7), CF(15), CF(16), L, H, hd);
    be->rope_backward(be, F(8), CF(15), CF(16), L, G, hd);
}

/* hyper-connections: coeffs -> combine -> Hadamard MLP -> update, then
 * backward pieces accumulating into shared parameter gradients twice */
static void is_hyper(const nd_backend *be, const bo_case *c, void *const *p)
{
    long N = c->i[0];
    int n = (int)c->i[1], d = (int)c->i[2], hn = (int)c->i[3];
    /* out: 0 hpre, 1 hpost, 2 M, 3 u, 4 y, 5 h1, 6 Xo, 7 dpre, 8 dpost, 9 dres, 10 da[3],
     * 11 dbres, 12 dz, 13 dd (3 hn), 14 dX;
     * in: 15 pre, 16 post, 17 res, 18 b (2n + n*n), 19 X, 20 dvec (3 hn), 21 dy */
    const float *b = CF(18), *dv = CF(20);
    be->hyper_coeffs(be, F(0), F(1), F(2), CF(15), CF(16), CF(17), 0.7f, 1.1f, 1.3f, b, b + n,
                     b + 2 * n, 1, N, n);
    be->lanes_combine(be, F(3), F(0), CF(19), N, n, d);
    be->hadamard_mlp(be, F(4), F(5), F(3), F(3), F(3), dv, dv + hn, dv + 2 * hn, N, d, hn);
    be->lanes_update(be, F(6), F(2), CF(19), F(1), F(4), N, n, d);
    for (int rep = 0; rep < 2; rep++) {
        be->hyper_coeffs_backward(be, F(7), F(8), F(9), F(10), F(10) + 1, F(10) + 2, NULL, NULL,
                                  F(11), F(0), F(1), F(2), CF(15), CF(16), CF(17), F(0), F(1), 0.7f,
                                  1.1f, 1.3f, b + 2 * n, N, n);
        be->hadamard_mlp_backward(be, F(12), F(13), F(13) + hn, F(13) + 2 * hn, CF(21), F(3), F(5),
                                  dv, dv + hn, dv + 2 * hn, N, d, hn);
        be->lanes_combine_backward(be, F(7), F(14), F(12), F(0), CF(19), N, n, d);
    }
}

/* row ops accumulating into the same rows, then reading them */
static void is_rows(const nd_backend *be, const bo_case *c, void *const *p)
{
    long n = c->i[0];
    int d = (int)c->i[1], V = (int)c->i[2];
    /* out: 0 dst [V,d], 1 g [n,d], 2 loss [n], 3 logits [n,V]; in: 4 src [n,d], 5 rows, 6 W [V,d]
     */
    be->scatter_add_rows(be, F(0), CF(4), CI32(5), n, d);
    be->embed_backward(be, F(0), CF(4), CI32(5), n, d, 0.5f);
    be->gather_rows(be, F(1), F(0), CI32(5), n, d);
    be->matmul(be, 0, 1, (int)n, V, d, 1.0f, F(1), d, CF(6), d, 0.0f, F(3), V);
    be->cross_entropy(be, F(2), F(3), CI32(5), n, V);
    be->cross_entropy_backward(be, F(3), CI32(5), F(2), n, V);
    be->matmul(be, 0, 0, (int)n, d, V, 1.0f, F(3), V, CF(6), d, 1.0f, F(1), d);
}

void bo_cases_chains(void)
{
    bo_case *c = bo_new("chain: rmsnorm>matmul>gate>add", 1e-4, is_dense);
    long N = 37, d = 64, q = 96;
    long sz[] = {N * d, N, N * q, N * q, N * q, N * d};
    for (int j = 0; j < 6; j++)
        bo_fout(c, sz[j], 1.0);
    bo_fin(c, N * d, 1.0);
    bo_fin(c, d, 0.3);
    bo_fin(c, d * q, 0.2);
    bo_fin(c, N * q, 1.0);
    c->i[0] = N;
    c->i[1] = d;
    c->i[2] = q;
    bo_run(c);

    const nd_layout *L = bo_layouts(4);
    c = bo_new("chain: engram hash>gather>taps", 1e-4, is_engram);
    int no = 2, heads = 2, slots = 11, sub = 12, ed = no * heads * sub, dd = 40;
    bo_iout(c, L->N * no * heads);
    bo_fout(c, L->N * ed, 1.0);
    bo_fout(c, L->N * dd, 1.0);
    bo_fout(c, L->N * dd, 1.0);
    bo_fout(c, (long)ed * slots, 1.0);
    bo_rand_ints(bo_i(c, bo_iin(c, L->N, NULL)), L->N, 50);
    bo_fin(c, (long)ed * slots, 1.0);
    bo_fin(c, (long)ed * dd, 0.2);
    bo_fin(c, 4L * dd, 1.0);
    c->L = L;
    c->orders = bo_orders3;
    c->i[0] = no;
    c->i[1] = heads;
    c->i[2] = slots;
    c->i[3] = sub;
    c->i[4] = dd;
    bo_run(c);

    int H = 8, G = 4, hd = 64, T = nd_layout_max_pos(L);
    long nq = L->N * H * hd, nk = L->N * G * hd;
    c = bo_new("chain: rope>attention>backward", 1e-4, is_attn);
    long asz[] = {nq, nk, nq, L->N * H, nq, nq, nq, nq, nk, nk};
    for (int j = 0; j < 10; j++)
        bo_fout(c, asz[j], 1.0);
    bo_fin(c, nq, 1.0);
    bo_fin(c, nk, 1.0);
    bo_fin(c, nk, 1.0);
    bo_fin(c, nq, 1.0);
    bo_fin(c, nq, 1.0);
    int ic = bo_fin(c, (long)T * hd / 2, 0), is = bo_fin(c, (long)T * hd / 2, 0);
    san_rope_tables(bo_f(c, ic), bo_f(c, is), T, hd, 10000.0);
    c->L = L;
    c->i[0] = H;
    c->i[1] = G;
    c->i[2] = hd;
    bo_run(c);

    c = bo_new("chain: hyper>lanes>hadamard>backward", 1e-4, is_hyper);
    int n = 4, hn = 64;
    N = 130;
    d = 48;
    long hsz[] = {N * n, N * n,     N * n * n, N * d, N * d, N * hn, N * n * d, N * n,
                  N * n, N * n * n, 3,         n * n, N * d, 3 * hn, N * n * d};
    for (int j = 0; j < 15; j++)
        bo_fout(c, hsz[j], 1.0);
    bo_fin(c, N * n, 1.0);
    bo_fin(c, N * n, 1.0);
    bo_fin(c, N * n * n, 1.0);
    bo_fin(c, 2 * n + n * n, 1.0);
    bo_fin(c, N * n * d, 1.0);
    bo_fin(c, 3 * hn, 1.0);
    bo_fin(c, N * d, 1.0);
    c->i[0] = N;
    c->i[1] = n;
    c->i[2] = d;
    c->i[3] = hn;
    bo_run(c);

    c = bo_new("chain: scatter>gather>cross_entropy", 1e-4, is_rows);
    N = 37;
    d = 24;
    int V = 29;
    bo_fout(c, V * d, 1.0);
    bo_fout(c, N * d, 1.0);
    bo_fout(c, N, 1.0);
    bo_fout(c, N * V, 1.0);
    bo_fin(c, N * d, 1.0);
    bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, 7);
    bo_fin(c, V * d, 0.3);
    c->i[0] = N;
    c->i[1] = d;
    c->i[2] = V;
    bo_run(c);
}
