/* Conformance cases of the Needle 3 ops (backend/ops.def, "Needle 3"):
 * attention_ext (separate head dims, sliding window), the q/k/v conv taps,
 * the headwise gate and the seeded engram hash, forward and backward. */
#include <string.h>

#include "backend_ops.h"

#define F(k) ((float *)p[k])
#define CF(k) ((const float *)p[k])
#define I32(k) ((int32_t *)p[k])
#define CI32(k) ((const int32_t *)p[k])
#define OPT(flag, k) ((flag) ? F(k) : NULL)

#define TOL_EW 1e-5
#define TOL_RED 1e-4
#define TOL_MM 1e-4

static void is_attn_ext(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->attention_ext(be, F(0), F(1), CF(2), CF(3), CF(4), c->L, (int)c->i[0], (int)c->i[1],
                      (int)c->i[2], (int)c->i[3], (int)c->i[4]);
}

static void is_attn_ext_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->attention_ext_backward(be, F(0), F(1), F(2), CF(3), CF(4), CF(5), CF(6), CF(7), CF(8), c->L,
                               (int)c->i[0], (int)c->i[1], (int)c->i[2], (int)c->i[3],
                               (int)c->i[4]);
}

static void is_qkv_taps(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->qkv_taps(be, F(0), CF(1), CF(2), c->L, (int)c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void is_qkv_taps_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->qkv_taps_backward(be, F(0), OPT(c->i[3], 1), CF(2), CF(3), CF(4), c->L, (int)c->i[0],
                          (int)c->i[1], (int)c->i[2]);
}

static void is_gate_heads(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->gate_heads(be, F(0), CF(1), CF(2), c->i[0], (int)c->i[1], (int)c->i[2]);
}

static void is_gate_heads_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->gate_heads_backward(be, F(0), F(1), CF(2), CF(3), CF(4), c->i[0], (int)c->i[1],
                            (int)c->i[2]);
}

static void is_hash_seeded(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->engram_hash_seeded(be, I32(0), CI32(1), c->L, c->orders, (int)c->i[0], (int)c->i[1],
                           (int)c->i[2], (int)c->i[3]);
}

void bo_cases_v3(void)
{
    /* layout, H, G, hd, vd, window; the last three have sequences much longer
     * than the window, so a query block's keys start past its sequence's
     * first row (the CPU computes only that span): 8 x 300 rows with window
     * 70 (not a multiple of the 64-query block), the shared prefixes with
     * window 100 (a child's span starts inside its 130-row prefix), and a
     * 200-row prefix with a 64-row window */
    static const int a[][6] = {{0, 4, 2, 16, 24, 0}, {1, 8, 4, 48, 64, 5},  {3, 4, 1, 32, 8, 1},
                               {4, 8, 4, 64, 64, 7}, {5, 3, 3, 10, 6, 2},   {7, 4, 2, 48, 64, 33},
                               {6, 4, 2, 16, 8, 70}, {4, 4, 2, 8, 12, 100}, {7, 2, 1, 48, 64, 64}};
    for (size_t k = 0; k < sizeof a / sizeof *a; k++) {
        const nd_layout *L = bo_layouts(a[k][0]);
        int H = a[k][1], G = a[k][2], hd = a[k][3], vd = a[k][4], w = a[k][5];
        long nq = L->N * H * hd, nk = L->N * G * hd, nv = L->N * G * vd, no = L->N * H * vd;
        bo_case *c = bo_new("attention_ext", TOL_MM, is_attn_ext);
        bo_fout(c, no, 1.0);
        bo_fout(c, L->N * H, 1.0);
        bo_fin(c, nq, 1.0);
        bo_fin(c, nk, 1.0);
        bo_fin(c, nv, 1.0);
        c->L = L;
        c->i[0] = H;
        c->i[1] = G;
        c->i[2] = hd;
        c->i[3] = vd;
        c->i[4] = w;
        bo_run(c);

        c = bo_new("attention_ext_backward", TOL_MM, is_attn_ext_bwd);
        bo_fout(c, nq, 1.0);
        bo_fout(c, nk, 1.0);
        bo_fout(c, nv, 1.0);
        bo_fin(c, no, 1.0);
        int iq = bo_fin(c, nq, 1.0), ik = bo_fin(c, nk, 1.0), iv = bo_fin(c, nv, 1.0);
        int io = bo_fin(c, no, 0), il = bo_fin(c, L->N * H, 0);
        bo_ref->attention_ext(bo_ref, bo_f(c, io), bo_f(c, il), bo_f(c, iq), bo_f(c, ik),
                              bo_f(c, iv), L, H, G, hd, vd, w);
        c->L = L;
        c->i[0] = H;
        c->i[1] = G;
        c->i[2] = hd;
        c->i[3] = vd;
        c->i[4] = w;
        bo_run(c);
    }
    /* layout, width, taps, window */
    static const int t[][4] = {{0, 24, 3, 0}, {3, 512, 3, 1024}, {4, 33, 2, 1},
                               {5, 5, 4, 2},  {2, 7, 1, 0},      {6, 96, 3, 2}};
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        const nd_layout *L = bo_layouts(t[k][0]);
        int w = t[k][1], nt = t[k][2];
        bo_case *c = bo_new("qkv_taps", TOL_RED, is_qkv_taps);
        bo_fout(c, L->N * w, 1.0);
        bo_fin(c, L->N * w, 1.0);
        bo_fin(c, (long)nt * w, 1.0);
        c->L = L;
        c->i[0] = w;
        c->i[1] = nt;
        c->i[2] = t[k][3];
        bo_run(c);

        c = bo_new("qkv_taps_backward", TOL_RED, is_qkv_taps_bwd);
        bo_fout(c, L->N * w, 1.0);
        bo_fout(c, (long)nt * w, 1.0);
        bo_fin(c, L->N * w, 1.0);
        bo_fin(c, L->N * w, 1.0);
        bo_fin(c, (long)nt * w, 1.0);
        c->L = L;
        c->i[0] = w;
        c->i[1] = nt;
        c->i[2] = t[k][3];
        c->i[3] = k % 3 != 2; /* sometimes frozen taps */
        bo_run(c);
    }
    /* N, H, hd */
    static const int g[][3] = {{1, 4, 16}, {37, 12, 64}, {130, 3, 5}, {7, 2, 1}};
    for (size_t k = 0; k < sizeof g / sizeof *g; k++) {
        long N = g[k][0];
        int H = g[k][1], hd = g[k][2];
        bo_case *c = bo_new("gate_heads", TOL_EW, is_gate_heads);
        bo_fout(c, N * H * hd, 1.0);
        bo_fin(c, N * H * hd, 1.0);
        bo_fin(c, N * H, 2.0);
        c->i[0] = N;
        c->i[1] = H;
        c->i[2] = hd;
        bo_run(c);

        c = bo_new("gate_heads_backward", TOL_RED, is_gate_heads_bwd);
        bo_fout(c, N * H * hd, 1.0);
        bo_fout(c, N * H, 1.0);
        bo_fin(c, N * H * hd, 1.0);
        bo_fin(c, N * H * hd, 1.0);
        bo_fin(c, N * H, 2.0);
        c->i[0] = N;
        c->i[1] = H;
        c->i[2] = hd;
        bo_run(c);
    }
    /* layout, n_orders, heads, slots, stride */
    static const int h[][5] = {
        {0, 2, 2, 13, 2}, {3, 3, 1, 8192, 4}, {4, 2, 3, 37, 5}, {5, 3, 2, 5, 2}};
    for (size_t k = 0; k < sizeof h / sizeof *h; k++) {
        const nd_layout *L = bo_layouts(h[k][0]);
        int K = h[k][1] * h[k][2];
        bo_case *c = bo_new("engram_hash_seeded", 0, is_hash_seeded);
        bo_iout(c, L->N * K);
        bo_rand_ints(bo_i(c, bo_iin(c, L->N, NULL)), L->N, 60000);
        c->L = L;
        c->orders = bo_orders3;
        c->i[0] = h[k][1];
        c->i[1] = h[k][2];
        c->i[2] = h[k][3];
        c->i[3] = h[k][4];
        bo_run(c);
    }
}
