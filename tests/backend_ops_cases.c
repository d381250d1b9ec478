/* Forward-op cases and chains of test_backend_ops (see test_backend_ops.c).
 * Shapes are awkward on purpose: 1, 7, 37, 130 rows, widths that are not
 * multiples of 16/32/64, plus the model's own (d 512, hd 64, 8/4 heads,
 * 4 lanes). Buffers are numbered in the order a case adds them. */
#include <math.h>
#include <stdio.h>

#include "backend_ops.h"
#include "model/san.h"

#define F(k) ((float *)p[k])
#define CF(k) ((const float *)p[k])
#define I32(k) ((int32_t *)p[k])
#define CI32(k) ((const int32_t *)p[k])

/* On the relative error (see test_backend_ops.c): element-wise ops 1e-5;
 * anything that sums (rows, lanes, FWHT, GEMMs, attention, the Sinkhorn
 * iterations) 1e-4, as a device's summation order and FMA contraction
 * differ from the CPU's; copies and the hash are exact. */
#define TOL_EW 1e-5
#define TOL_RED 1e-4
#define TOL_MM 1e-4

/* Layouts: dense batches and shared prefixes longer than 64 rows (one
 * and two prefix groups, children of 1 row, a prefix shorter than the
 * engram taps). */
static const int lay_dense_3x7[] = {7, -1, 7, -1, 7, -1};
static const int lay_dense_2x37[] = {37, -1, 37, -1};
static const int lay_one[] = {1, -1};
static const int lay_share1[] = {70, -1, 1, 0, 66, 0, 5, 0, 12, 0, 9, -1};
static const int lay_share2[] = {130, -1, 7, 0, 1, 0, 37, 0, 3, -1, 20, -1, 65, 5, 1, 5};
static const int lay_short[] = {2, -1, 1, 0, 9, 0, 4, -1};
static const int lay_dense_8x300[] = {300, -1, 300, -1, 300, -1, 300, -1,
                                      300, -1, 300, -1, 300, -1, 300, -1};
static const int lay_long[] = {200, -1, 100, 0, 1, 0};

#define LAY(slot, a) bo_layout(slot, a, (int)(sizeof a / sizeof *a / 2))

const nd_layout *bo_layouts(int k)
{
    switch (k) {
    case 0: return LAY(0, lay_dense_3x7);
    case 1: return LAY(1, lay_dense_2x37);
    case 2: return LAY(2, lay_one);
    case 3: return LAY(3, lay_share1);
    case 4: return LAY(4, lay_share2);
    case 5: return LAY(5, lay_short);
    case 6: return LAY(6, lay_dense_8x300);
    default: return LAY(7, lay_long);
    }
}

/* cos/sin tables [T, hd/2] (small theta: large angles at every position) */
static void rope_tables(bo_case *c, int T, int hd, int *ic, int *is)
{
    *ic = bo_fin(c, (long)T * hd / 2, 0);
    *is = bo_fin(c, (long)T * hd / 2, 0);
    san_rope_tables(bo_f(c, *ic), bo_f(c, *is), T, hd, 100.0);
}

/* ---- matmul ---- */

static void is_matmul(const nd_backend *be, const bo_case *c, void *const *p)
{
    const long *i = c->i;
    be->matmul(be, (int)i[0], (int)i[1], (int)i[2], (int)i[3], (int)i[4], c->f[0], CF(0), (int)i[5],
               CF(1), (int)i[6], c->f[1], F(2), (int)i[7]);
}

static void cases_matmul(void)
{
    static const int shapes[][3] = {{1, 1, 1},  {7, 37, 13},    {1, 130, 70},   {130, 1, 37},
                                    {37, 7, 1}, {130, 70, 300}, {37, 24, 2048}, {7, 515, 64}};
    static const float ab[][2] = {{1, 0}, {0.5f, 1}, {-1.25f, 0.75f}, {2, -0.5f}};
    int k = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++, k++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int pad = k % 3 == 0 ? 0 : k % 3 == 1 ? 3 : 17;
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + (pad ? pad + 2 : 0);
                int ldc = N + (k % 2 ? 5 : 0);
                /* K up to 2048 summed in another order: lavapipe's
                 * shaders differ from OpenBLAS by 6e-5 here */
                bo_case *c = bo_new("matmul", 2 * TOL_MM, is_matmul);
                bo_fin(c, (long)(ta ? K : M) * lda, 1.0);
                bo_fin(c, (long)(tb ? N : K) * ldb, 1.0);
                bo_fout(c, (long)M * ldc, 1.0);
                long iv[] = {ta, tb, M, N, K, lda, ldb, ldc};
                for (int j = 0; j < 8; j++)
                    c->i[j] = iv[j];
                c->f[0] = ab[k % 4][0];
                c->f[1] = ab[k % 4][1];
                bo_run(c);
            }
}

/* ---- rmsnorm ---- */

static void is_rmsnorm(const nd_backend *be, const bo_case *c, void *const *p)
{
    /* i: rows, dim, with scale, with rstd, in place */
    const float *x = c->i[4] ? CF(0) : CF(2);
    be->rmsnorm(be, F(0), c->i[3] ? F(1) : NULL, x, c->i[2] ? CF(3) : NULL, c->i[0], (int)c->i[1]);
}

static void cases_rmsnorm(void)
{
    static const int v[][5] = {{1, 512, 1, 1, 0},    {7, 24, 1, 1, 0},   {37, 64, 0, 0, 0},
                               {130, 2048, 0, 1, 0}, {130, 33, 1, 1, 1}, {8, 64, 1, 0, 1}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        bo_case *c = bo_new("rmsnorm", TOL_RED, is_rmsnorm);
        long n = (long)v[k][0] * v[k][1];
        bo_fout(c, n, 1.5); /* y (x itself when in place) */
        bo_fout(c, v[k][0], 1.0);
        bo_fin(c, n, 1.5);
        bo_fin(c, v[k][1], 0.3);
        for (int j = 0; j < 5; j++)
            c->i[j] = v[k][j];
        bo_run(c);
    }
}

/* ---- embed, gather_rows, scatter_add_rows, cross_entropy ---- */

void bo_rand_ints(int32_t *x, long n, int below)
{
    for (long i = 0; i < n; i++)
        x[i] = (int32_t)nd_rng_below(&bo_rng, (uint64_t)below);
}

static void is_embed(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->embed(be, F(0), CF(1), CI32(2), c->i[0], (int)c->i[1], c->f[0]);
}

static void is_gather(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->gather_rows(be, F(0), CF(1), CI32(2), c->i[0], (int)c->i[1]);
}

static void is_scatter(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->scatter_add_rows(be, F(0), CF(1), CI32(2), c->i[0], (int)c->i[1]);
}

static void is_ce(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->cross_entropy(be, F(0), CF(1), CI32(2), c->i[0], (int)c->i[1]);
}

static void cases_rows(void)
{
    static const int v[][3] = {{1, 24, 64}, {37, 512, 64}, {130, 33, 9}, {7, 7, 1000}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        int N = v[k][0], d = v[k][1], V = v[k][2];
        bo_case *c = bo_new("embed", TOL_EW, is_embed);
        bo_fout(c, (long)N * d, 1.0);
        bo_fin(c, (long)V * d, 1.0);
        bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, V);
        c->i[0] = N;
        c->i[1] = d;
        c->f[0] = sqrtf((float)d);
        bo_run(c);

        /* gather: n rows of a [V, d] source, repeats; scatter the same back */
        c = bo_new("gather_rows", TOL_EW, is_gather);
        bo_fout(c, (long)N * d, 1.0);
        bo_fin(c, (long)V * d, 1.0);
        bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, V);
        c->i[0] = N;
        c->i[1] = d;
        bo_run(c);

        c = bo_new("scatter_add_rows", TOL_RED, is_scatter);
        bo_fout(c, (long)V * d, 1.0);
        bo_fin(c, (long)N * d, 1.0);
        int32_t *r = bo_i(c, bo_iin(c, N, NULL));
        bo_rand_ints(r, N, V < 5 ? V : 5); /* many repeats */
        c->i[0] = N;
        c->i[1] = d;
        bo_run(c);
    }
    /* 0 rows: a packed micro-batch without loss positions issues that */
    static const int ce[][2] = {{1, 64}, {7, 515}, {37, 64}, {5, 8192}, {130, 33}, {0, 64}};
    for (size_t k = 0; k < sizeof ce / sizeof *ce; k++) {
        int N = ce[k][0], V = ce[k][1];
        bo_case *c = bo_new("cross_entropy", TOL_RED, is_ce);
        bo_fout(c, N, 1.0);
        bo_fin(c, (long)N * V, 3.0);
        bo_rand_ints(bo_i(c, bo_iin(c, N, NULL)), N, V);
        c->i[0] = N;
        c->i[1] = V;
        bo_run(c);
    }
}

/* ---- engram ---- */

const int bo_orders3[3] = {2, 3, 4};

static void is_hash(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_hash(be, I32(0), CI32(1), c->L, c->orders, (int)c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void is_egather(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_gather(be, F(0), CF(1), CI32(2), c->L, c->orders, (int)c->i[0], (int)c->i[1],
                      (int)c->i[2], (int)c->i[3]);
}

static void is_taps(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_taps(be, F(0), CF(1), CF(2), c->L, (int)c->i[0], (int)c->i[1]);
}

static void is_egate(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_gate(be, F(0), F(1), CF(2), CF(3), CF(4), c->i[0], (int)c->i[1], (int)c->i[2]);
}

/* idx [N, K] of random tokens through the reference hash: an int32
 * input buffer; returns its index */
int bo_engram_idx(bo_case *c, const nd_layout *L, int n_orders, int heads, int slots)
{
    int32_t tok[4096];
    bo_rand_ints(tok, L->N, 50);
    int k = bo_iin(c, L->N * n_orders * heads, NULL);
    bo_ref->engram_hash(bo_ref, bo_i(c, k), tok, L, bo_orders3, n_orders, heads, slots);
    return k;
}

static void cases_engram(void)
{
    /* layout, n_orders, heads, slots, sub */
    static const int v[][5] = {{0, 2, 2, 13, 19}, {3, 3, 1, 8192, 64}, {4, 2, 3, 37, 6},
                               {5, 3, 2, 5, 7},   {2, 1, 1, 3, 33},    {1, 2, 2, 8192, 128}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        const nd_layout *L = bo_layouts(v[k][0]);
        int no = v[k][1], heads = v[k][2], slots = v[k][3], sub = v[k][4], K = no * heads;
        bo_case *c = bo_new("engram_hash", 0, is_hash);
        bo_iout(c, L->N * K);
        bo_rand_ints(bo_i(c, bo_iin(c, L->N, NULL)), L->N, 60000);
        c->L = L;
        c->orders = bo_orders3;
        c->i[0] = no;
        c->i[1] = heads;
        c->i[2] = slots;
        bo_run(c);

        c = bo_new("engram_gather", TOL_EW, is_egather);
        bo_fout(c, L->N * K * sub, 1.0);
        bo_fin(c, (long)K * slots * sub, 1.0);
        bo_engram_idx(c, L, no, heads, slots);
        c->L = L;
        c->orders = bo_orders3;
        c->i[0] = no;
        c->i[1] = heads;
        c->i[2] = slots;
        c->i[3] = sub;
        bo_run(c);
    }
    /* taps: layout, d, dilation */
    static const int t[][3] = {{0, 24, 3}, {3, 512, 3}, {4, 33, 2},
                               {5, 5, 4},  {2, 7, 1},   {6, 24, 3}};
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        const nd_layout *L = bo_layouts(t[k][0]);
        int d = t[k][1];
        bo_case *c = bo_new("engram_taps", TOL_RED, is_taps);
        bo_fout(c, L->N * d, 1.0);
        bo_fin(c, L->N * d, 1.0);
        bo_fin(c, 4L * d, 1.0);
        c->L = L;
        c->i[0] = d;
        c->i[1] = t[k][2];
        bo_run(c);
    }
    /* gate: N, d, accumulate */
    static const int g[][3] = {{1, 24, 0}, {37, 512, 1}, {130, 33, 0}, {7, 512, 0}, {130, 24, 1}};
    for (size_t k = 0; k < sizeof g / sizeof *g; k++) {
        int N = g[k][0], d = g[k][1];
        long n = (long)N * d;
        bo_case *c = bo_new("engram_gate", TOL_RED, is_egate);
        bo_fout(c, n, 1.0);
        bo_fout(c, N, 1.0);
        bo_fin(c, n, 1.0);
        float *kk = bo_f(c, bo_fin(c, n, 0.6));
        const float *u = bo_f(c, 2);
        for (long i = 0; i < n; i++) /* <u, k> of both signs and sizes */
            kk[i] += 0.5f * u[i] * (float)((i / d) % 3 - 1);
        bo_fin(c, n, 1.0);
        c->i[0] = N;
        c->i[1] = d;
        c->i[2] = g[k][2];
        bo_run(c);
    }
}

/* ---- hyper-connections and lanes ---- */

static void is_hc(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->hyper_coeffs(be, F(0), F(1), F(2), CF(3), CF(4), CF(5), c->f[0], c->f[1], c->f[2], CF(6),
                     CF(7), CF(8), (int)c->i[0], c->i[1], (int)c->i[2]);
}

static void is_lanes(const nd_backend *be, const bo_case *c, void *const *p)
{
    long N = c->i[0];
    int n = (int)c->i[1], d = (int)c->i[2];
    /* buffers: u, Xo, Xb, xm outputs; hpre, X, M, hpost, y inputs */
    switch (c->i[3]) {
    case 0: be->lanes_combine(be, F(0), CF(4), CF(5), N, n, d); break;
    case 1: be->lanes_update(be, F(1), CF(6), CF(5), CF(7), CF(8), N, n, d); break;
    case 2: be->lanes_broadcast(be, F(2), CF(8), N, n, d); break;
    default: be->lanes_mean(be, F(3), CF(5), N, n, d); break;
    }
}

static void cases_lanes(void)
{
    static const int h[][3] = {{1, 2, 0}, {37, 3, 2}, {130, 4, 1}, {7, 4, 3}, {37, 2, 1}};
    for (size_t k = 0; k < sizeof h / sizeof *h; k++) {
        int N = h[k][0], n = h[k][1];
        bo_case *c = bo_new("hyper_coeffs", TOL_MM, is_hc);
        bo_fout(c, (long)N * n, 1.0);
        bo_fout(c, (long)N * n, 1.0);
        bo_fout(c, (long)N * n * n, 1.0);
        bo_fin(c, (long)N * n, 1.0);
        bo_fin(c, (long)N * n, 1.0);
        bo_fin(c, (long)N * n * n, 1.5);
        bo_fin(c, n, 1.0);
        bo_fin(c, n, 1.0);
        bo_fin(c, (long)n * n, 1.0);
        c->f[0] = 0.7f;
        c->f[1] = 1.3f;
        c->f[2] = k % 2 ? 0.9f : 2.5f;
        c->i[0] = h[k][2];
        c->i[1] = N;
        c->i[2] = n;
        bo_run(c);
    }
    static const char *names[4] = {"lanes_combine", "lanes_update", "lanes_broadcast",
                                   "lanes_mean"};
    static const int v[][3] = {{1, 2, 24}, {37, 4, 512}, {130, 3, 37}, {7, 4, 33}, {37, 9, 18}};
    for (int op = 0; op < 4; op++)
        for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
            int N = v[k][0], n = v[k][1], d = v[k][2];
            long nd = (long)N * d, nX = nd * n;
            bo_case *c = bo_new(names[op], op == 2 ? TOL_EW : TOL_RED, is_lanes);
            bo_fout(c, nd, 1.0);
            bo_fout(c, nX, 1.0);
            bo_fout(c, nX, 1.0);
            bo_fout(c, nd, 1.0);
            bo_fin(c, (long)N * n, 1.0);
            bo_fin(c, nX, 1.0);
            bo_fin(c, (long)N * n * n, 0.5);
            bo_fin(c, (long)N * n, 1.0);
            bo_fin(c, nd, 1.0);
            c->i[0] = N;
            c->i[1] = n;
            c->i[2] = d;
            c->i[3] = op;
            bo_run(c);
        }
}

/* ---- rope, attention ---- */

static void is_rope(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->rope(be, F(0), CF(1), CF(2), c->L, (int)c->i[0], (int)c->i[1]);
}

static void is_attn(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->attention(be, F(0), F(1), CF(2), CF(3), CF(4), c->L, (int)c->i[0], (int)c->i[1],
                  (int)c->i[2]);
}

/* layout, H, G, hd */
static const int attn_v[][4] = {{0, 4, 2, 16}, {1, 8, 4, 64}, {3, 4, 1, 32}, {4, 8, 4, 64},
                                {2, 2, 2, 16}, {5, 3, 3, 32}, {7, 4, 2, 64}};

static void cases_attention(void)
{
    for (size_t k = 0; k < sizeof attn_v / sizeof *attn_v; k++) {
        const nd_layout *L = bo_layouts(attn_v[k][0]);
        int H = attn_v[k][1], G = attn_v[k][2], hd = attn_v[k][3], T = nd_layout_max_pos(L);
        bo_case *c = bo_new("rope", TOL_EW, is_rope);
        bo_fout(c, L->N * H * hd, 1.0); /* rotated in place */
        int ic, is;
        rope_tables(c, T, hd, &ic, &is);
        c->L = L;
        c->i[0] = H;
        c->i[1] = hd;
        bo_run(c);

        c = bo_new("attention", TOL_MM, is_attn);
        bo_fout(c, L->N * H * hd, 1.0);
        bo_fout(c, L->N * H, 1.0);
        bo_fin(c, L->N * H * hd, 1.0);
        bo_fin(c, L->N * G * hd, 1.0);
        bo_fin(c, L->N * G * hd, 1.0);
        c->L = L;
        c->i[0] = H;
        c->i[1] = G;
        c->i[2] = hd;
        bo_run(c);
    }
}

/* ---- element-wise, Hadamard MLP, copy2d, add ---- */

static void is_ew(const nd_backend *be, const bo_case *c, void *const *p)
{
    long n = c->i[0];
    switch (c->i[1]) {
    case 0: be->gate_sigmoid(be, F(0), CF(1), CF(2), n); break;
    case 1: be->residual_scaled(be, F(0), CF(1), CF(2), c->f[0], n); break;
    default: be->add(be, F(0), CF(1), c->f[0], n); break;
    }
}

static void is_hada(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->hadamard_mlp(be, F(0), F(1), CF(2), CF(3), c->i[3] ? CF(4) : NULL, CF(5), CF(6), CF(7),
                     c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void is_copy2d(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->copy2d(be, F(0), (int)c->i[0], CF(1), (int)c->i[1], c->i[2], (int)c->i[3]);
}

static void cases_misc(void)
{
    static const char *names[3] = {"gate_sigmoid", "residual_scaled", "add"};
    static const long ns[] = {1, 7, 1001, 130L * 512};
    static const float gates[] = {0.3f, -2.0f, 1.0f, -0.75f};
    for (int op = 0; op < 3; op++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            bo_case *c = bo_new(names[op], TOL_EW, is_ew);
            bo_fout(c, ns[k], 1.0);
            bo_fin(c, ns[k], 1.0);
            bo_fin(c, ns[k], 2.0);
            c->i[0] = ns[k];
            c->i[1] = op;
            c->f[0] = gates[k];
            bo_run(c);
        }
    /* N, d, hn, with u */
    static const int h[][4] = {
        {1, 24, 32, 1}, {37, 512, 512, 1}, {7, 33, 64, 0}, {130, 5, 8, 1}, {37, 24, 32, 0}};
    for (size_t k = 0; k < sizeof h / sizeof *h; k++) {
        int N = h[k][0], d = h[k][1], hn = h[k][2];
        bo_case *c = bo_new("hadamard_mlp", TOL_RED, is_hada);
        bo_fout(c, (long)N * d, 1.0);
        bo_fout(c, (long)N * hn, 1.0);
        bo_fin(c, (long)N * d, 1.0);
        bo_fin(c, (long)N * d, 1.0);
        bo_fin(c, (long)N * d, 1.0);
        bo_fin(c, hn, 1.0);
        bo_fin(c, hn, 1.0);
        bo_fin(c, hn, 1.0);
        c->i[0] = N;
        c->i[1] = d;
        c->i[2] = hn;
        c->i[3] = h[k][3];
        bo_run(c);
    }
    /* dst_ld, src_ld, rows, cols */
    static const int cp[][4] = {{7, 7, 1, 7},
                                {24, 3, 130, 3},
                                {5, 24, 37, 5},
                                {40, 37, 37, 33},
                                {2048 * 130, 2048 * 130, 1, 2048 * 130},
                                {19, 16, 7, 16}};
    for (size_t k = 0; k < sizeof cp / sizeof *cp; k++) {
        bo_case *c = bo_new("copy2d", 0, is_copy2d);
        bo_fout(c, (long)cp[k][2] * cp[k][0], 1.0);
        bo_fin(c, (long)cp[k][2] * cp[k][1], 1.0);
        for (int j = 0; j < 4; j++)
            c->i[j] = cp[k][j];
        bo_run(c);
    }
}

void bo_cases_forward(void)
{
    cases_matmul();
    cases_rmsnorm();
    cases_rows();
    cases_engram();
    cases_lanes();
    cases_attention();
    cases_misc();
}
