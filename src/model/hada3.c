/* Needle 3's Kronecker-factored Hadamard MLP (see hada3.h for the math).
 *
 * Layouts. A Kronecker product contracts one index of the (ba, bb) view of
 * each row; to run it as a few large matmuls over all N rows at once, the
 * n features of the N rows are kept blocked (feature m = i*bb + j):
 *   layout I: (i, r, j) at i*N*bb + r*bb + j, row stride bb
 *   layout J: (j, r, i) at j*N*ba + r*ba + i, row stride ba
 * Every factor pair F reads its input in layout I (shared) or J (untied)
 * and writes its output in layout I. The element-wise stages (hada3_mix)
 * read and write through per-feature offset tables, which also carry the
 * zero padding of x, the permutations p1 / p2 and the [:d] of y.
 *
 * shared, input I: t = u @ wb as (N*ba, bb) rows, then o = wa^T @ t as a
 * (ba, N*bb) matrix: two matmuls.
 * block_untied, input J: per column j, T1_j (k, r) = wa[j]^T u_j^T; the
 * blocks are regrouped (j, k, r) -> (k, j, r) by copy2d; per row k,
 * o_k (r, l) = T2_k^T wb[k]: 2 * 32 matmuls and 32 copies at n = 1024.
 *
 * Saved per row (forward -> backward): the softmax of the cond logits (8,
 * block of N*8), F1's and F2's outputs (n each, blocks of N*n, layout I).
 * The backward recomputes the F inputs it needs for weight gradients. */
#include "model/hada3.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/np_random.h"
#include "core/status.h"

#define RANK SAN_HADA3_COND_RANK

static const uint32_t perm_seeds[2] = {11, 13};

int san_hada3_geom_init(san_hada3_geom *g, int d, int untied, int split)
{
    memset(g, 0, sizeof *g);
    if (d < 1 || d > (1 << 24))
        return nd_error(ND_EARG, "hada3: d_model %d out of range (1 .. 2^24)", d);
    if (untied != 0 && untied != 1)
        return nd_error(ND_EARG, "hada3: factor mode %d (0 shared, 1 block_untied)", untied);
    int n = 1;
    while (n < d)
        n <<= 1;
    int bits = 0; /* bit_length(n - 1) */
    for (unsigned v = (unsigned)(n - 1); v; v >>= 1)
        bits++;
    g->d = d;
    g->n = n;
    g->ba = 1 << (bits / 2);
    g->bb = n / g->ba;
    g->untied = untied;
    g->perm1 = malloc(sizeof(int32_t) * (size_t)n);
    g->perm2 = malloc(sizeof(int32_t) * (size_t)n);
    if (!g->perm1 || !g->perm2) {
        san_hada3_geom_free(g);
        return nd_error(ND_ENOMEM, "hada3: out of memory for the permutations");
    }
    for (int s = 0; s < 2; s++) {
        int32_t *p = s ? g->perm2 : g->perm1;
        nd_np_random rs;
        if (split && n >= 2) {
            int32_t h = n / 2;
            nd_np_random_seed(&rs, perm_seeds[s]);
            nd_np_random_permutation(&rs, p, h);
            nd_np_random_seed(&rs, perm_seeds[s] + 977);
            nd_np_random_permutation(&rs, p + h, h);
            for (int32_t i = h; i < n; i++)
                p[i] += h;
        } else {
            nd_np_random_seed(&rs, perm_seeds[s]);
            nd_np_random_permutation(&rs, p, n);
        }
    }
    return ND_OK;
}

struct san_hada3_ws {
    const nd_backend *be;
    float *buf; /* be's memory */
    size_t floats;
};

void san_hada3_geom_free(san_hada3_geom *g)
{
    free(g->perm1);
    free(g->perm2);
    g->perm1 = g->perm2 = NULL;
    if (g->ws) {
        if (g->ws->buf)
            g->ws->be->free(g->ws->be, g->ws->buf);
        free(g->ws);
        g->ws = NULL;
    }
}

int san_hada3_keep_scratch(san_hada3_geom *g, const nd_backend *be)
{
    if (g->ws)
        return g->ws->be == be ? ND_OK
                               : nd_error(ND_EARG, "hada3: scratch kept for another backend");
    g->ws = calloc(1, sizeof *g->ws);
    if (!g->ws)
        return nd_error(ND_ENOMEM, "hada3: out of memory");
    g->ws->be = be;
    return ND_OK;
}

size_t san_hada3_scratch_floats(const san_hada3_geom *g)
{
    return g->ws ? g->ws->floats : 0;
}

size_t san_hada3_saved_per_row(const san_hada3_geom *g)
{
    return (size_t)RANK + 2 * (size_t)g->n;
}

/* ---- offset tables ---- */

typedef struct {
    int32_t *x;   /* x / dx / y rows: m (m < d), else -1 */
    int32_t *I;   /* layout I */
    int32_t *in;  /* the F input layout (I or J) */
    int32_t *ip1; /* layout I through p1: feature p1[m] */
    int32_t *ip2;
    int rs_in; /* row stride of the F input layout */
    int32_t *all;
} offs;

static int offs_init(offs *o, const san_hada3_geom *g, long N)
{
    int n = g->n, ba = g->ba, bb = g->bb;
    if (N > INT32_MAX / n)
        return nd_error(ND_ELIMIT, "hada3: %ld rows of %d features exceed 2^31 floats", N, n);
    o->all = malloc(sizeof(int32_t) * 5 * (size_t)n);
    if (!o->all)
        return nd_error(ND_ENOMEM, "hada3: out of memory");
    o->x = o->all;
    o->I = o->x + n;
    o->in = o->I + n;
    o->ip1 = o->in + n;
    o->ip2 = o->ip1 + n;
    for (int m = 0; m < n; m++) {
        int i = m / bb, j = m % bb;
        o->x[m] = m < g->d ? m : -1;
        o->I[m] = (int32_t)((long)i * N * bb + j);
        o->in[m] = g->untied ? (int32_t)((long)j * N * ba + i) : o->I[m];
    }
    for (int m = 0; m < n; m++) {
        o->ip1[m] = o->I[g->perm1[m]];
        o->ip2[m] = o->I[g->perm2[m]];
    }
    o->rs_in = g->untied ? ba : bb;
    return ND_OK;
}

/* ---- the factor pairs ---- */

/* untied: T1 (j, k, r) = per j wa[j]^T u_j^T, regrouped into t2 as (k, j, r) */
static void untied_step1(const nd_backend *be, const san_hada3_geom *g, const float *wa,
                         const float *u, float *t1, float *t2, long N)
{
    int ba = g->ba, bb = g->bb, Ni = (int)N;
    for (int j = 0; j < bb; j++)
        be->matmul(be, 1, 1, ba, Ni, ba, 1.0f, wa + (size_t)j * ba * ba, ba, u + (size_t)j * N * ba,
                   ba, 0.0f, t1 + (size_t)j * ba * N, Ni);
    for (int j = 0; j < bb; j++)
        be->copy2d(be, t2 + (size_t)j * N, bb * Ni, t1 + (size_t)j * ba * N, Ni, ba, Ni);
}

/* o (layout I) = F(u) (layout I shared, J untied); t1, t2: N*n scratch (t2
 * may be u, which is then clobbered; untied only) */
static void factors_fwd(const nd_backend *be, const san_hada3_geom *g, const float *wa,
                        const float *wb, const float *u, float *o, float *t1, float *t2, long N)
{
    int ba = g->ba, bb = g->bb, Ni = (int)N;
    if (!g->untied) {
        be->matmul(be, 0, 0, Ni * ba, bb, bb, 1.0f, u, bb, wb, bb, 0.0f, t1, bb);
        be->matmul(be, 1, 0, ba, Ni * bb, ba, 1.0f, wa, ba, t1, Ni * bb, 0.0f, o, Ni * bb);
        return;
    }
    untied_step1(be, g, wa, u, t1, t2, N);
    for (int k = 0; k < ba; k++)
        be->matmul(be, 1, 0, Ni, bb, bb, 1.0f, t2 + (size_t)k * bb * N, Ni,
                   wb + (size_t)k * bb * bb, bb, 0.0f, o + (size_t)k * N * bb, bb);
}

/* dz (input layout; may be dO) from dO (layout I); ga, gb += (NULL: not
 * wanted); z: the forward input (read only when ga / gb); t1, t2 scratch
 * (neither may be z, dO or dz) */
static void factors_bwd(const nd_backend *be, const san_hada3_geom *g, const float *wa,
                        const float *wb, float *ga, float *gb, const float *z, const float *dO,
                        float *dz, float *t1, float *t2, long N)
{
    int ba = g->ba, bb = g->bb, Ni = (int)N;
    if (!g->untied) {
        if (ga) {
            be->matmul(be, 0, 0, Ni * ba, bb, bb, 1.0f, z, bb, wb, bb, 0.0f, t1, bb);
            be->matmul(be, 0, 1, ba, ba, Ni * bb, 1.0f, t1, Ni * bb, dO, Ni * bb, 1.0f, ga, ba);
        }
        be->matmul(be, 0, 0, ba, Ni * bb, ba, 1.0f, wa, ba, dO, Ni * bb, 0.0f, t2, Ni * bb);
        if (gb)
            be->matmul(be, 1, 0, bb, bb, Ni * ba, 1.0f, z, bb, t2, bb, 1.0f, gb, bb);
        be->matmul(be, 0, 1, Ni * ba, bb, bb, 1.0f, t2, bb, wb, bb, 0.0f, dz, bb);
        return;
    }
    if (gb) {
        untied_step1(be, g, wa, z, t1, t2, N); /* t2 = T2 (k, j, r) */
        for (int k = 0; k < ba; k++)
            be->matmul(be, 0, 0, bb, bb, Ni, 1.0f, t2 + (size_t)k * bb * N, Ni,
                       dO + (size_t)k * N * bb, bb, 1.0f, gb + (size_t)k * bb * bb, bb);
    }
    for (int k = 0; k < ba; k++) /* dT2 (k, j, r) */
        be->matmul(be, 0, 1, bb, Ni, bb, 1.0f, wb + (size_t)k * bb * bb, bb,
                   dO + (size_t)k * N * bb, bb, 0.0f, t1 + (size_t)k * bb * N, Ni);
    for (int k = 0; k < ba; k++) /* dT1 (j, k, r) */
        be->copy2d(be, t2 + (size_t)k * N, ba * Ni, t1 + (size_t)k * bb * N, Ni, bb, Ni);
    for (int j = 0; j < bb; j++) {
        be->matmul(be, 1, 1, Ni, ba, ba, 1.0f, t2 + (size_t)j * ba * N, Ni,
                   wa + (size_t)j * ba * ba, ba, 0.0f, dz + (size_t)j * N * ba, ba);
        if (ga)
            be->matmul(be, 1, 1, ba, ba, Ni, 1.0f, z + (size_t)j * N * ba, ba,
                       t2 + (size_t)j * ba * N, Ni, 1.0f, ga + (size_t)j * ba * ba, ba);
    }
}

/* ---- forward ---- */

static float *alloc_f(const nd_backend *be, size_t n, int *rc)
{
    float *p = be->alloc(be, sizeof(float) * (n ? n : 1));
    if (!p && *rc == ND_OK)
        *rc = nd_error(ND_ENOMEM, "hada3: out of memory (%zu floats)", n);
    return p;
}

static void free_f(const nd_backend *be, float *p)
{
    if (p)
        be->free(be, p);
}

/* nfl floats of scratch whose contents do not matter (every call writes
 * before it reads): the geometry's kept buffer, grown when short, or else
 * a fresh one the caller frees (*own). NULL (and *rc set) when out of
 * memory. */
static float *scratch(const nd_backend *be, const san_hada3_geom *g, size_t nfl, float **own,
                      int *rc)
{
    san_hada3_ws *ws = g->ws;
    *own = NULL;
    if (!ws || ws->be != be)
        return *own = alloc_f(be, nfl, rc);
    if (ws->floats < nfl) {
        free_f(be, ws->buf);
        ws->floats = 0;
        ws->buf = alloc_f(be, nfl, rc);
        if (ws->buf)
            ws->floats = nfl;
    }
    return ws->buf;
}

static int check_args(const san_hada3_geom *g, const san_hada3_w *w, const float *x, long N)
{
    if (!g || !g->perm1 || !w || (N > 0 && !x) || N < 0)
        return nd_error(ND_EARG, "hada3: missing geometry, weights or rows");
    const float *need[] = {w->w1a, w->w1b, w->w2a, w->w2b, w->w3a,    w->w3b,   w->d1,
                           w->d2,  w->b2,  w->d3,  w->d4,  w->cond_v, w->cond_u};
    static const char *names[] = {"w1a", "w1b", "w2a", "w2b", "w3a",    "w3b",   "d1",
                                  "d2",  "b2",  "d3",  "d4",  "cond_v", "cond_u"};
    for (int i = 0; i < 13; i++)
        if (!need[i])
            return nd_error(ND_EARG, "hada3: weight %s missing", names[i]);
    return ND_OK;
}

/* the forward with its offset tables made; p, v1, v2: where the cond
 * softmax and F1 / F2 outputs go (v1 == v2 allowed); S: 3 N n floats of
 * scratch */
static void forward_core(const nd_backend *be, const san_hada3_geom *g, const san_hada3_w *w,
                         const offs *o, const float *x, long N, float *y, float *p, float *v1,
                         float *v2, float *S)
{
    int n = g->n, d = g->d, bb = g->bb;
    size_t nn = (size_t)N * (size_t)n;
    float *U = S, *T1 = S + nn, *W = S + 2 * nn;
    be->matmul(be, 0, 0, (int)N, RANK, d, 1.0f, x, d, w->cond_v, RANK, 0.0f, p, RANK);
    be->softmax_rows(be, p, N, RANK);
    be->hada3_mix(be, U, o->in, o->rs_in, x, o->x, d, w->d1, NULL, NULL, 0, NULL, 0, N, n);
    factors_fwd(be, g, w->w1a, w->w1b, U, v1, T1, U, N);
    be->hada3_mix(be, U, o->in, o->rs_in, v1, o->ip1, bb, w->d2, p, w->cond_u, RANK, w->b2, 1, N,
                  n);
    factors_fwd(be, g, w->w2a, w->w2b, U, v2, T1, U, N);
    be->hada3_mix(be, U, o->in, o->rs_in, v2, o->ip2, bb, w->d3, NULL, NULL, 0, NULL, 0, N, n);
    factors_fwd(be, g, w->w3a, w->w3b, U, W, T1, U, N);
    be->hada3_mix(be, y, o->x, d, W, o->I, bb, w->d4, NULL, NULL, 0, NULL, 0, N, n);
    nd_backend_sync(be);
}

int san_hada3_forward(const nd_backend *be, const san_hada3_geom *g, const san_hada3_w *w,
                      const float *x, long N, float *y, float *saved)
{
    int rc = check_args(g, w, x, N);
    if (rc != ND_OK)
        return rc;
    if (N == 0)
        return ND_OK;
    if (!y)
        return nd_error(ND_EARG, "hada3: no output");
    offs o;
    if ((rc = offs_init(&o, g, N)) != ND_OK)
        return rc;
    size_t nn = (size_t)N * (size_t)g->n;
    float *own = NULL, *p, *v1, *v2, *own_s = NULL;
    if (saved) {
        p = saved;
        v1 = saved + (size_t)N * RANK;
        v2 = v1 + nn;
    } else {
        own = alloc_f(be, (size_t)N * RANK + nn, &rc);
        p = own;
        v1 = v2 = own ? own + (size_t)N * RANK : NULL;
    }
    float *S = rc == ND_OK ? scratch(be, g, 3 * nn, &own_s, &rc) : NULL;
    if (rc == ND_OK)
        forward_core(be, g, w, &o, x, N, y, p, v1, v2, S);
    free_f(be, own_s);
    free_f(be, own);
    free(o.all);
    return rc;
}

/* ---- backward ---- */

int san_hada3_backward(const nd_backend *be, const san_hada3_geom *g, const san_hada3_w *w,
                       const float *x, long N, const float *saved, const float *dy, float *dx,
                       san_hada3_grad *gw)
{
    int rc = check_args(g, w, x, N);
    if (rc != ND_OK)
        return rc;
    if (N == 0)
        return ND_OK;
    if (!dy || !dx)
        return nd_error(ND_EARG, "hada3: no gradient in or out");
    offs o;
    if ((rc = offs_init(&o, g, N)) != ND_OK)
        return rc;
    int n = g->n, d = g->d, bb = g->bb, Ni = (int)N;
    size_t nn = (size_t)N * (size_t)n;
    float *own = NULL, *ytmp = NULL, *own_s = NULL;
    /* B1..B4 (N n each) and Pd (N * RANK); the recompute below uses the
     * first 3 N n before them */
    float *S = scratch(be, g, 4 * nn + (size_t)N * RANK, &own_s, &rc);
    if (!saved) { /* recompute what the forward keeps */
        own = alloc_f(be, (size_t)N * san_hada3_saved_per_row(g), &rc);
        ytmp = alloc_f(be, (size_t)N * (size_t)d, &rc);
        if (rc == ND_OK)
            forward_core(be, g, w, &o, x, N, ytmp, own, own + (size_t)N * RANK,
                         own + (size_t)N * RANK + nn, S);
        saved = own;
    }
    float *B1 = S, *B2 = S ? S + nn : NULL, *B3 = S ? S + 2 * nn : NULL,
          *B4 = S ? S + 3 * nn : NULL, *Pd = S ? S + 4 * nn : NULL;
    if (rc == ND_OK) {
        const float *p = saved, *v1 = saved + (size_t)N * RANK, *v2 = v1 + nn;
        san_hada3_grad none = {0};
        san_hada3_grad *G = gw ? gw : &none;
        int wgrad = gw != NULL;
        const int32_t *in = o.in;
        int rs = o.rs_in;
        /* stage 4 and F3: y = (d4 * F3(u3))[:d], u3 = d3 * v2[p2] */
        if (wgrad) {
            be->hada3_mix(be, B1, in, rs, v2, o.ip2, bb, w->d3, NULL, NULL, 0, NULL, 0, N, n);
            factors_fwd(be, g, w->w3a, w->w3b, B1, B2, B3, B4, N);
        }
        be->hada3_mix_backward(be, B3, NULL, G->d4, NULL, dy, o.x, d, wgrad ? B2 : NULL, o.I, bb,
                               w->d4, NULL, NULL, 0, NULL, 0, N, n);
        factors_bwd(be, g, w->w3a, w->w3b, G->w3a, G->w3b, B1, B3, B3, B2, B4, N);
        /* stage 3 (u3 = d3 * v2[p2]) and F2 */
        be->hada3_mix_backward(be, B1, NULL, G->d3, NULL, B3, in, rs, v2, o.ip2, bb, w->d3, NULL,
                               NULL, 0, NULL, 0, N, n);
        if (wgrad)
            be->hada3_mix(be, B2, in, rs, v1, o.ip1, bb, w->d2, p, w->cond_u, RANK, w->b2, 1, N, n);
        factors_bwd(be, g, w->w2a, w->w2b, G->w2a, G->w2b, B2, B1, B1, B3, B4, N);
        /* stage 2 (u2 = silu(d2 * cond * v1[p1] + b2)); B4 = dcond */
        be->hada3_mix_backward(be, B3, B4, G->d2, G->b2, B1, in, rs, v1, o.ip1, bb, w->d2, p,
                               w->cond_u, RANK, w->b2, 1, N, n);
        be->matmul(be, 0, 1, Ni, RANK, n, 1.0f, B4, n, w->cond_u, n, 0.0f, Pd, RANK);
        if (G->cond_u)
            be->matmul(be, 1, 0, RANK, n, Ni, 1.0f, p, RANK, B4, n, 1.0f, G->cond_u, n);
        /* F1 and stage 1 (u1 = d1 * pad(x)) */
        if (wgrad)
            be->hada3_mix(be, B2, in, rs, x, o.x, d, w->d1, NULL, NULL, 0, NULL, 0, N, n);
        factors_bwd(be, g, w->w1a, w->w1b, G->w1a, G->w1b, B2, B3, B3, B1, B4, N);
        be->hada3_mix_backward(be, dx, NULL, G->d1, NULL, B3, in, rs, x, o.x, d, w->d1, NULL, NULL,
                               0, NULL, 0, N, n);
        /* cond = 1 + softmax(x @ cond_v) @ cond_u */
        be->softmax_rows_backward(be, Pd, Pd, p, N, RANK);
        if (G->cond_v)
            be->matmul(be, 1, 0, d, RANK, Ni, 1.0f, x, d, Pd, RANK, 1.0f, G->cond_v, RANK);
        be->matmul(be, 0, 1, Ni, d, RANK, 1.0f, Pd, RANK, w->cond_v, RANK, 1.0f, dx, d);
        nd_backend_sync(be);
    }
    free_f(be, own_s);
    free_f(be, own);
    free_f(be, ytmp);
    free(o.all);
    return rc;
}
