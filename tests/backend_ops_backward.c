/* Backward-op cases of test_backend_ops (see test_backend_ops.c). Inputs
 * that come from a forward (rstd, alpha, hpre/hpost, lse/out, h1) are
 * computed by the CPU reference while the case is built, so each backward
 * op is checked on its own. Parameter gradients (+=) start from the same
 * random values on both sides; some cases pass NULL for them, or alias
 * the outputs the interface allows to alias. */
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "model/san.h"

#define F(k) ((float *)p[k])
#define CF(k) ((const float *)p[k])
#define CI32(k) ((const int32_t *)p[k])
#define OPT(flag, k) ((flag) ? F(k) : NULL)

#define TOL_EW 1e-5
#define TOL_RED 1e-4
#define TOL_MM 1e-4

static float *tmp(long n)
{
    float *x = calloc((size_t)(n ? n : 1), sizeof *x);
    if (!x)
        abort();
    return x;
}

/* ---- cross-entropy, rmsnorm, embed ---- */

static void is_ce_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->cross_entropy_backward(be, F(0), CI32(1), c->i[2] ? CF(2) : NULL, c->i[0], (int)c->i[1]);
}

static void is_rms_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    /* i: rows, dim, scale, rstd, accumulate, alias dx = dy, dscale */
    const long *i = c->i;
    be->rmsnorm_backward(be, F(0), OPT(i[6], 1), i[5] ? CF(0) : CF(2), CF(3), i[3] ? CF(4) : NULL,
                         i[2] ? CF(5) : NULL, i[0], (int)i[1], (int)i[4]);
}

static void is_embed_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->embed_backward(be, F(0), CF(1), CI32(2), c->i[0], (int)c->i[1], c->f[0]);
}

static void cases_rows(void)
{
    static const int ce[][3] = {{1, 64, 1},   {7, 515, 0},  {37, 64, 1},
                                {5, 8192, 1}, {130, 33, 0}, {0, 64, 1}};
    for (size_t k = 0; k < sizeof ce / sizeof *ce; k++) {
        int N = ce[k][0], V = ce[k][1];
        bo_case *c = bo_new("cross_entropy_backward", TOL_RED, is_ce_bwd);
        bo_fout(c, (long)N * V, 3.0); /* logits, in place */
        bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, V);
        float *w = bo_f(c, bo_fin(c, N, 1.0));
        for (int r = 0; r < N; r++)
            w[r] = r % 3 == 1 ? 0.0f : 0.25f + (float)nd_rng_uniform(&bo_rng); /* masked rows */
        c->i[0] = N;
        c->i[1] = V;
        c->i[2] = ce[k][2];
        bo_run(c);
    }
    /* rows, dim, scale, rstd, accumulate, alias, dscale */
    static const int rn[][7] = {{1, 512, 1, 1, 0, 0, 1},  {7, 24, 1, 1, 1, 0, 1},
                                {37, 64, 0, 0, 0, 1, 0},  {130, 2048, 0, 1, 1, 0, 0},
                                {130, 33, 1, 0, 0, 0, 1}, {8, 64, 1, 1, 0, 1, 0},
                                {37, 512, 1, 1, 1, 0, 1}, {2500, 64, 1, 1, 0, 0, 1}};
    for (size_t k = 0; k < sizeof rn / sizeof *rn; k++) {
        int rows = rn[k][0], dim = rn[k][1];
        long n = (long)rows * dim;
        bo_case *c = bo_new("rmsnorm_backward", TOL_RED, is_rms_bwd);
        bo_fout(c, n, 1.0);
        bo_fout(c, dim, 1.0);
        bo_fin(c, n, 1.0);
        int ix = bo_fin(c, n, 1.5), ir = bo_fin(c, rows, 0), is = bo_fin(c, dim, 0.3);
        float *y = tmp(n);
        bo_ref->rmsnorm(bo_ref, y, bo_f(c, ir), bo_f(c, ix), rn[k][2] ? bo_f(c, is) : NULL, rows,
                        dim);
        free(y);
        for (int j = 0; j < 7; j++)
            c->i[j] = rn[k][j];
        bo_run(c);
    }
    static const int em[][3] = {
        {1, 24, 64}, {37, 512, 64}, {130, 33, 9}, {7, 7, 1000}, {2000, 24, 9}};
    for (size_t k = 0; k < sizeof em / sizeof *em; k++) {
        int N = em[k][0], d = em[k][1], V = em[k][2];
        bo_case *c = bo_new("embed_backward", TOL_RED, is_embed_bwd);
        bo_fout(c, (long)V * d, 1.0);
        bo_fin(c, (long)N * d, 1.0);
        bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, V < 6 ? V : 6); /* repeats */
        c->i[0] = N;
        c->i[1] = d;
        c->f[0] = 4.5f;
        bo_run(c);
    }
}

/* ---- engram ---- */

static void is_egather_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_gather_backward(be, F(0), CF(1), CI32(2), c->L, c->orders, (int)c->i[0],
                               (int)c->i[1], (int)c->i[2], (int)c->i[3]);
}

static void is_taps_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_taps_backward(be, F(0), OPT(c->i[2], 1), CF(2), CF(3), CF(4), c->L, (int)c->i[0],
                             (int)c->i[1]);
}

static void is_egate_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_gate_backward(be, F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), c->i[0],
                             (int)c->i[1]);
}

static void cases_engram(void)
{
    static const int v[][5] = {{0, 2, 2, 13, 19}, {3, 3, 1, 8192, 64}, {4, 2, 3, 37, 6},
                               {5, 3, 2, 5, 7},   {2, 1, 1, 3, 33},    {1, 2, 2, 8192, 128},
                               {6, 2, 1, 3, 5}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        const nd_layout *L = bo_layouts(v[k][0]);
        int no = v[k][1], heads = v[k][2], slots = v[k][3], sub = v[k][4], K = no * heads;
        bo_case *c = bo_new("engram_gather_backward", TOL_RED, is_egather_bwd);
        bo_fout(c, (long)K * slots * sub, 1.0);
        bo_fin(c, L->N * K * sub, 1.0);
        bo_engram_idx(c, L, no, heads, slots);
        c->L = L;
        c->orders = bo_orders3;
        c->i[0] = no;
        c->i[1] = heads;
        c->i[2] = slots;
        c->i[3] = sub;
        bo_run(c);
    }
    static const int t[][4] = {{0, 24, 3, 1}, {3, 512, 3, 1}, {4, 33, 2, 1}, {5, 5, 4, 1},
                               {2, 7, 1, 0},  {4, 24, 3, 0},  {6, 24, 3, 1}};
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        const nd_layout *L = bo_layouts(t[k][0]);
        int d = t[k][1];
        bo_case *c = bo_new("engram_taps_backward", TOL_RED, is_taps_bwd);
        bo_fout(c, L->N * d, 1.0);
        bo_fout(c, 4L * d, 1.0);
        bo_fin(c, L->N * d, 1.0);
        bo_fin(c, L->N * d, 1.0);
        bo_fin(c, 4L * d, 1.0);
        c->L = L;
        c->i[0] = d;
        c->i[1] = t[k][2];
        c->i[2] = t[k][3];
        bo_run(c);
    }
    static const int g[][2] = {{1, 24}, {37, 512}, {130, 33}, {7, 512}};
    for (size_t k = 0; k < sizeof g / sizeof *g; k++) {
        int N = g[k][0], d = g[k][1];
        long n = (long)N * d;
        bo_case *c = bo_new("engram_gate_backward", TOL_RED, is_egate_bwd);
        for (int j = 0; j < 3; j++)
            bo_fout(c, n, 1.0);
        bo_fin(c, n, 1.0);
        int iu = bo_fin(c, n, 1.0), ik = bo_fin(c, n, 0.6), iv = bo_fin(c, n, 1.0);
        int ia = bo_fin(c, N, 0);
        float *u = bo_f(c, iu), *kk = bo_f(c, ik), *bx = tmp(n);
        for (long i = 0; i < n; i++)
            kk[i] += 0.5f * u[i] * (float)((i / d) % 3 - 1);
        bo_ref->engram_gate(bo_ref, bx, bo_f(c, ia), u, kk, bo_f(c, iv), N, d, 0);
        free(bx);
        c->i[0] = N;
        c->i[1] = d;
        bo_run(c);
    }
}

/* ---- hyper-connections and lanes ---- */

static void is_hc_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    int a = (int)c->i[3], b = (int)c->i[4];
    be->hyper_coeffs_backward(be, F(0), F(1), F(2), OPT(a, 3), OPT(a, 4), OPT(a, 5), OPT(b, 6),
                              OPT(b, 7), OPT(b, 8), CF(9), CF(10), CF(11), CF(12), CF(13), CF(14),
                              CF(15), CF(16), c->f[0], c->f[1], c->f[2], CF(17), c->i[1],
                              (int)c->i[2]);
}

static void is_lanes_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    long N = c->i[0];
    int n = (int)c->i[1], d = (int)c->i[2];
    /* outputs: 0 [N,n] 1 [N,n,d] 2 [N,n,n] 3 [N,d]; inputs: 4 [N,n,d] 5 [N,n]
     * 6 [N,n,n] 7 [N,n,d] 8 [N,d] */
    switch (c->i[3]) {
    case 0: be->lanes_combine_backward(be, F(0), F(1), CF(8), CF(5), CF(4), N, n, d); break;
    case 1:
        be->lanes_update_backward(be, F(1), F(2), F(0), F(3), c->i[4] ? CF(1) : CF(7), CF(6), CF(4),
                                  CF(5), CF(8), N, n, d);
        break;
    case 2: be->lanes_broadcast_backward(be, F(3), CF(4), N, n, d); break;
    default: be->lanes_mean_backward(be, F(1), CF(8), N, n, d); break;
    }
}

static void cases_lanes(void)
{
    /* N, n, lane, param grads, bias grads */
    static const int h[][5] = {{1, 2, 0, 1, 1},   {37, 3, 2, 1, 1}, {130, 4, 1, 1, 1},
                               {7, 4, 3, 1, 0},   {37, 2, 1, 0, 0}, {130, 3, 0, 1, 1},
                               {2100, 4, 2, 1, 1}};
    for (size_t k = 0; k < sizeof h / sizeof *h; k++) {
        int N = h[k][0], n = h[k][1];
        long Nn = (long)N * n, Nnn = Nn * n;
        bo_case *c = bo_new("hyper_coeffs_backward", TOL_MM, is_hc_bwd);
        bo_fout(c, Nn, 1.0);
        bo_fout(c, Nn, 1.0);
        bo_fout(c, Nnn, 1.0);
        for (int j = 0; j < 3; j++)
            bo_fout(c, 1, 1.0);
        bo_fout(c, n, 1.0);
        bo_fout(c, n, 1.0);
        bo_fout(c, (long)n * n, 1.0);
        bo_fin(c, Nn, 1.0);
        bo_fin(c, Nn, 1.0);
        bo_fin(c, Nnn, 1.0);
        int ip = bo_fin(c, Nn, 1.0), iq = bo_fin(c, Nn, 1.0), ir = bo_fin(c, Nnn, 1.5);
        int ih = bo_fin(c, Nn, 0), ihp = bo_fin(c, Nn, 0), ib = bo_fin(c, (long)n * n, 1.0);
        c->f[0] = 0.7f;
        c->f[1] = 1.3f;
        c->f[2] = k % 2 ? 0.9f : 2.5f;
        float *bpre = tmp(n), *bpost = tmp(n), *M = tmp(Nnn);
        for (int i = 0; i < n; i++) {
            bpre[i] = (float)nd_rng_normal(&bo_rng);
            bpost[i] = (float)nd_rng_normal(&bo_rng);
        }
        bo_ref->hyper_coeffs(bo_ref, bo_f(c, ih), bo_f(c, ihp), M, bo_f(c, ip), bo_f(c, iq),
                             bo_f(c, ir), c->f[0], c->f[1], c->f[2], bpre, bpost, bo_f(c, ib),
                             h[k][2], N, n);
        free(bpre);
        free(bpost);
        free(M);
        c->i[1] = N;
        c->i[2] = n;
        c->i[3] = h[k][3];
        c->i[4] = h[k][4];
        bo_run(c);
    }
    static const char *names[4] = {"lanes_combine_backward", "lanes_update_backward",
                                   "lanes_broadcast_backward", "lanes_mean_backward"};
    static const int v[][4] = {{1, 2, 24, 0}, {37, 4, 512, 1}, {130, 3, 37, 0},
                               {7, 4, 33, 1}, {37, 9, 18, 0},  {130, 4, 64, 0}};
    for (int op = 0; op < 4; op++)
        for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
            int N = v[k][0], n = v[k][1], d = v[k][2];
            long nd = (long)N * d, nX = nd * n, Nn = (long)N * n;
            bo_case *c = bo_new(names[op], op < 3 ? TOL_RED : TOL_EW, is_lanes_bwd);
            bo_fout(c, Nn, 1.0);
            bo_fout(c, nX, 1.0);
            bo_fout(c, Nn * n, 1.0);
            bo_fout(c, nd, 1.0);
            bo_fin(c, nX, 1.0);
            bo_fin(c, Nn, 1.0);
            bo_fin(c, Nn * n, 0.5);
            bo_fin(c, nX, 1.0);
            bo_fin(c, nd, 1.0);
            c->i[0] = N;
            c->i[1] = n;
            c->i[2] = d;
            c->i[3] = op;
            c->i[4] = v[k][3]; /* update: dX aliases dXo (buffer 1 holds dXo) */
            bo_run(c);
        }
}

/* ---- rope, attention ---- */

static void is_rope_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->rope_backward(be, F(0), CF(1), CF(2), c->L, (int)c->i[0], (int)c->i[1]);
}

static void is_attn_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->attention_backward(be, F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), CF(8), c->L,
                           (int)c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void cases_attention(void)
{
    static const int v[][4] = {{0, 4, 2, 16}, {1, 8, 4, 64}, {3, 4, 1, 32}, {4, 8, 4, 64},
                               {2, 2, 2, 16}, {5, 3, 3, 32}, {7, 4, 2, 64}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        const nd_layout *L = bo_layouts(v[k][0]);
        int H = v[k][1], G = v[k][2], hd = v[k][3], T = nd_layout_max_pos(L);
        long nq = L->N * H * hd, nk = L->N * G * hd;
        bo_case *c = bo_new("rope_backward", TOL_EW, is_rope_bwd);
        bo_fout(c, nq, 1.0);
        int ic = bo_fin(c, (long)T * hd / 2, 0), is = bo_fin(c, (long)T * hd / 2, 0);
        san_rope_tables(bo_f(c, ic), bo_f(c, is), T, hd, 100.0);
        c->L = L;
        c->i[0] = H;
        c->i[1] = hd;
        bo_run(c);

        c = bo_new("attention_backward", TOL_MM, is_attn_bwd);
        bo_fout(c, nq, 1.0);
        bo_fout(c, nk, 1.0);
        bo_fout(c, nk, 1.0);
        bo_fin(c, nq, 1.0);
        int iq = bo_fin(c, nq, 1.0), ik = bo_fin(c, nk, 1.0), iv = bo_fin(c, nk, 1.0);
        int io = bo_fin(c, nq, 0), il = bo_fin(c, L->N * H, 0);
        bo_ref->attention(bo_ref, bo_f(c, io), bo_f(c, il), bo_f(c, iq), bo_f(c, ik), bo_f(c, iv),
                          L, H, G, hd);
        c->L = L;
        c->i[0] = H;
        c->i[1] = G;
        c->i[2] = hd;
        bo_run(c);
    }
}

/* ---- element-wise, Hadamard MLP ---- */

static void is_ew_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    long n = c->i[0];
    const float *dy = c->i[2] ? CF(0) : CF(2); /* aliased: the gradient starts in buffer 0 */
    if (c->i[1] == 0)
        be->gate_sigmoid_backward(be, F(0), F(1), dy, CF(3), CF(4), n);
    else
        be->residual_scaled_backward(be, F(0), c->i[3] ? F(1) : NULL, dy, CF(3), c->f[0], n);
}

static void is_hada_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    int w = (int)c->i[3];
    be->hadamard_mlp_backward(be, F(0), OPT(w & 1, 1), OPT(w & 2, 2), OPT(w & 4, 3), CF(4), CF(5),
                              CF(6), CF(7), CF(8), CF(9), c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void cases_misc(void)
{
    static const long ns[] = {1, 7, 1001, 130L * 512};
    static const float gates[] = {0.3f, -2.0f, 1.0f, -0.75f};
    for (int op = 0; op < 2; op++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            long n = ns[k];
            bo_case *c = bo_new(op ? "residual_scaled_backward" : "gate_sigmoid_backward",
                                op ? TOL_RED : TOL_EW, is_ew_bwd);
            bo_fout(c, n, 1.0);
            bo_fout(c, op ? 1 : n, 1.0);
            bo_fin(c, n, 1.0);
            bo_fin(c, n, 1.0);
            bo_fin(c, n, 2.0);
            c->i[0] = n;
            c->i[1] = op;
            c->i[2] = k % 2;  /* alias */
            c->i[3] = k != 2; /* residual: dgate (else NULL) */
            c->f[0] = gates[k];
            bo_run(c);
        }
    static const int h[][4] = {{1, 24, 32, 7}, {37, 512, 512, 7}, {7, 33, 64, 5},
                               {130, 5, 8, 7}, {37, 24, 32, 0},   {1100, 24, 32, 7}};
    for (size_t k = 0; k < sizeof h / sizeof *h; k++) {
        int N = h[k][0], d = h[k][1], hn = h[k][2];
        long n = (long)N * d;
        bo_case *c = bo_new("hadamard_mlp_backward", TOL_RED, is_hada_bwd);
        bo_fout(c, n, 1.0);
        for (int j = 0; j < 3; j++)
            bo_fout(c, hn, 1.0);
        bo_fin(c, n, 1.0);
        int iz = bo_fin(c, n, 1.0), ih = bo_fin(c, (long)N * hn, 0);
        int i1 = bo_fin(c, hn, 1.0), i2 = bo_fin(c, hn, 1.0), i3 = bo_fin(c, hn, 1.0);
        float *y = tmp(n);
        bo_ref->hadamard_mlp(bo_ref, y, bo_f(c, ih), bo_f(c, iz), bo_f(c, iz), NULL, bo_f(c, i1),
                             bo_f(c, i2), bo_f(c, i3), N, d, hn);
        free(y);
        c->i[0] = N;
        c->i[1] = d;
        c->i[2] = hn;
        c->i[3] = h[k][3];
        bo_run(c);
    }
}

void bo_cases_backward(void)
{
    cases_rows();
    cases_engram();
    cases_lanes();
    cases_attention();
    cases_misc();
}
