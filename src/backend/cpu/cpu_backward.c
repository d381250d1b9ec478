/* CPU backward ops (the "---- backward ops ----" half of backend.h).
 *
 * Activation gradients are parallelised over token rows like the forward.
 * Parameter gradients that sum over rows go through per-thread partial
 * buffers (double) that are added in thread order, so a given thread count
 * always gives the same bits; scatter-adds (embedding, engram tables) are
 * instead split over the column axis, which needs no partials at all. */
#include "backend/cpu/blas.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"

/* The op table has no error path; a failed scratch allocation of a few KB
 * per thread leaves nothing sensible to do. */
void *cpu_xalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}

/* ---- deterministic row reductions ---- */

typedef struct {
    double *buf; /* nt slices of len */
    int nt, len;
} partials;

static partials partials_new(int len)
{
    partials p;
    p.nt = nd_get_threads();
    p.len = len;
    p.buf = cpu_xalloc((size_t)p.nt * (size_t)len * sizeof(double));
    return p;
}

/* Thread t's slice and its contiguous share of `rows` (static split, so
 * the row -> slice mapping depends only on the team size). */
static double *partials_mine(const partials *p, long rows, int t, int team, long *r0, long *r1)
{
    if (team > p->nt) /* cannot happen with a team of p->nt; be safe */
        team = p->nt;
    *r0 = t < team ? rows * t / team : rows;
    *r1 = t < team ? rows * (t + 1) / team : rows;
    return p->buf + (size_t)(t < p->nt ? t : 0) * (size_t)p->len;
}

/* dst[i] += sum over threads (in thread order) of slice[i]; dst may be NULL. */
static void partials_reduce(partials *p, float *dst, int off, int n)
{
    if (dst)
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int t = 0; t < p->nt; t++)
                s += p->buf[(size_t)t * p->len + off + i];
            dst[i] += (float)s;
        }
}

static void partials_free(partials *p)
{
    free(p->buf);
    p->buf = NULL;
}

/* Scatter-adds are split into column chunks of this many floats (one cache
 * line): each chunk is owned by one thread and walks the rows in order. */
#define COLCHUNK 16

/* ---- loss, norms, embeddings ---- */

typedef struct {
    float *logits;
    const int32_t *target;
    const float *weight;
    int V;
} ce_bwd_args;

static void ce_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const ce_bwd_args *a = p;
    float *logits = a->logits;
    const int32_t *target = a->target;
    const float *weight = a->weight;
    int V = a->V;
    for (long r = r0; r < r1; r++) {
        float *l = logits + r * (long)V;
        float w = weight ? weight[r] : 1.0f;
        if (w == 0.0f) { /* masked rows (prompt, padding) cost nothing */
            memset(l, 0, (size_t)V * sizeof *l);
            continue;
        }
        /* max, exp and sum as separate passes so each vectorises (the
         * sum in 8 double partials: an in-order sum of one double kept
         * the exp loop scalar) */
        float mx = l[0];
        for (int i = 1; i < V; i++)
            mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < V; i++)
            l[i] = san_expf(l[i] - mx);
        double acc[8] = {0}, s = 0;
        int i = 0;
        for (; i + 8 <= V; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += l[i + j];
        for (; i < V; i++)
            s += l[i];
        s += ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        float c = (float)(w / s);
        for (int i = 0; i < V; i++)
            l[i] *= c;
        l[target[r]] -= w;
    }
}

void cpu_cross_entropy_backward(const nd_backend *be, float *logits, const int32_t *target,
                                const float *weight, long N, int V)
{
    (void)be;
    ce_bwd_args a = {logits, target, weight, V};
    nd_parallel_for(N, 1, ce_bwd_rows, &a);
}

typedef struct {
    float *dx, *dscale;
    const float *dy, *x, *rstd, *scale;
    long rows;
    int dim, accumulate;
    partials *P;
} rmsnorm_bwd_args;

static void rmsnorm_bwd_share(void *p, int tid, int team)
{
    const rmsnorm_bwd_args *a = p;
    float *dx = a->dx;
    const float *dy = a->dy, *x = a->x, *rstd = a->rstd, *scale = a->scale;
    long rows = a->rows;
    int dim = a->dim, accumulate = a->accumulate;
    float inv_dim = 1.0f / (float)dim;
    {
        long r0, r1;
        double *ps = NULL;
        if (a->dscale)
            ps = partials_mine(a->P, rows, tid, team, &r0, &r1);
        else
            nd_share(rows, tid, team, &r0, &r1);
        for (long r = r0; r < r1; r++) {
            const float *xr = x + r * dim, *gr = dy + r * dim;
            float *dr = dx + r * dim;
            float rs;
            if (rstd)
                rs = rstd[r];
            else
                rs = 1.0f / sqrtf(fdot(xr, xr, dim) * inv_dim + 1e-6f);
            /* g = dy*(1+scale); dx = rs*g - x*rs^3*<g,x>/dim */
            float gx = scale ? fdotw(gr, scale, xr, dim) : fdot(gr, xr, dim);
            float c = rs * rs * rs * gx * inv_dim;
            if (ps)
                for (int i = 0; i < dim; i++)
                    ps[i] += (double)(gr[i] * xr[i] * rs);
            /* each dr[i] depends only on element i: dx may alias dy */
            if (accumulate) {
                if (scale)
                    for (int i = 0; i < dim; i++)
                        dr[i] += rs * gr[i] * (1.0f + scale[i]) - c * xr[i];
                else
                    for (int i = 0; i < dim; i++)
                        dr[i] += rs * gr[i] - c * xr[i];
            } else {
                if (scale)
                    for (int i = 0; i < dim; i++)
                        dr[i] = rs * gr[i] * (1.0f + scale[i]) - c * xr[i];
                else
                    for (int i = 0; i < dim; i++)
                        dr[i] = rs * gr[i] - c * xr[i];
            }
        }
    }
}

void cpu_rmsnorm_backward(const nd_backend *be, float *dx, float *dscale, const float *dy,
                          const float *x, const float *rstd, const float *scale, long rows, int dim,
                          int accumulate)
{
    (void)be;
    if (rows <= 0)
        return;
    partials P = {0};
    if (dscale)
        P = partials_new(dim);
    rmsnorm_bwd_args a = {dx, dscale, dy, x, rstd, scale, rows, dim, accumulate, &P};
    nd_parallel_region(dscale ? P.nt : 0, rmsnorm_bwd_share, &a);
    if (dscale) {
        partials_reduce(&P, dscale, 0, dim);
        partials_free(&P);
    }
}

typedef struct {
    float *demb;
    const float *dx0;
    const int32_t *tok;
    long N;
    int d;
    float scale;
} embed_bwd_args;

static void embed_bwd_chunks(void *p, long ch0, long ch1, int tid)
{
    (void)tid;
    const embed_bwd_args *a = p;
    float *demb = a->demb, scale = a->scale;
    const float *dx0 = a->dx0;
    const int32_t *tok = a->tok;
    long N = a->N;
    int d = a->d;
    for (int ch = (int)ch0; ch < ch1; ch++) {
        int c0 = ch * COLCHUNK, c1 = c0 + COLCHUNK < d ? c0 + COLCHUNK : d;
        for (long t = 0; t < N; t++) {
            float *dst = demb + (size_t)tok[t] * d;
            const float *src = dx0 + t * d;
            for (int c = c0; c < c1; c++)
                dst[c] += src[c] * scale;
        }
    }
}

void cpu_embed_backward(const nd_backend *be, float *demb, const float *dx0, const int32_t *tok,
                        long N, int d, float scale)
{
    (void)be;
    embed_bwd_args a = {demb, dx0, tok, N, d, scale};
    nd_parallel_for((d + COLCHUNK - 1) / COLCHUNK, 1, embed_bwd_chunks, &a);
}

/* ---- engram ---- */

typedef struct {
    float *dtables;
    const float *de;
    const int32_t *idx;
    const nd_layout *L;
    const int *orders;
    int heads, slots, sub, K, nch;
} gather_bwd_args;

/* tasks: (table k, column chunk) pairs */
static void gather_bwd_tasks(void *p, long t0, long t1, int tid)
{
    (void)tid;
    const gather_bwd_args *a = p;
    float *dtables = a->dtables;
    const float *de = a->de;
    const int32_t *idx = a->idx;
    const nd_layout *L = a->L;
    const int *orders = a->orders;
    int heads = a->heads, slots = a->slots, sub = a->sub, K = a->K, nch = a->nch;
    long N = L->N;
    for (int task = (int)t0; task < t1; task++) {
        int k = task / nch, c0 = (task % nch) * COLCHUNK;
        int c1 = c0 + COLCHUNK < sub ? c0 + COLCHUNK : sub;
        int first = orders[k / heads] - 1; /* earlier positions were zero rows */
        float *tab = dtables + (size_t)k * slots * sub;
        for (long r = 0; r < N; r++) {
            if (L->pos[r] < first)
                continue;
            float *dst = tab + (size_t)idx[r * K + k] * sub;
            const float *src = de + (r * K + k) * sub;
            for (int c = c0; c < c1; c++)
                dst[c] += src[c];
        }
    }
}

void cpu_engram_gather_backward(const nd_backend *be, float *dtables, const float *de,
                                const int32_t *idx, const nd_layout *L, const int *orders,
                                int n_orders, int heads, int slots, int sub)
{
    (void)be;
    if (!dtables)
        return;
    int K = n_orders * heads, nch = (sub + COLCHUNK - 1) / COLCHUNK;
    gather_bwd_args a = {dtables, de, idx, L, orders, heads, slots, sub, K, nch};
    nd_parallel_for((long)K * nch, 1, gather_bwd_tasks, &a);
}

typedef struct {
    float *dvp;
    const float *dv, *vp, *taps;
    const nd_layout *L;
    int d, dil;
    partials *P; /* NULL: no dtaps */
} taps_bwd_args;

static void taps_bwd_share(void *p, int tid, int team)
{
    const taps_bwd_args *a = p;
    float *dvp = a->dvp;
    const float *dv = a->dv, *vp = a->vp, *taps = a->taps;
    const nd_layout *L = a->L;
    int d = a->d, dil = a->dil;
    long N = L->N;
    {
        long r0, r1;
        double *pt = NULL;
        if (a->P)
            pt = partials_mine(a->P, N, tid, team, &r0, &r1);
        else
            nd_share(N, tid, team, &r0, &r1);
        for (long r = r0; r < r1; r++) {
            const nd_segment *sg = &L->seg[L->row_seg[r]];
            long end = (long)sg->start + sg->len;
            /* dvp[t] = sum_j taps[j] * dv[t + j*dil] (same segment; the
             * segments continuing this one are added below) */
            float *o = dvp + r * d;
            for (int i = 0; i < d; i++)
                o[i] = 0.0f;
            for (int j = 0; j < 4 && r + (long)j * dil < end; j++) {
                const float *g = dv + (r + (long)j * dil) * d, *tj = taps + j * d;
                for (int i = 0; i < d; i++)
                    o[i] += tj[i] * g[i];
            }
            /* dtaps[j] += dv[t] * vp[t - j*dil] */
            if (pt)
                for (int j = 0; j < 4; j++) {
                    long b = nd_layout_back(L, r, j * dil);
                    if (b < 0)
                        break;
                    const float *g = dv + r * d, *src = vp + b * d;
                    double *pj = pt + j * d;
                    for (int i = 0; i < d; i++)
                        pj[i] += (double)(g[i] * src[i]);
                }
        }
    }
}

void cpu_engram_taps_backward(const nd_backend *be, float *dvp, float *dtaps, const float *dv,
                              const float *vp, const float *taps, const nd_layout *L, int d,
                              int dil)
{
    (void)be;
    long N = L->N;
    if (N <= 0)
        return;
    partials P = {0};
    if (dtaps)
        P = partials_new(4 * d);
    taps_bwd_args a = {dvp, dv, vp, taps, L, d, dil, dtaps ? &P : NULL};
    nd_parallel_region(dtaps ? P.nt : 0, taps_bwd_share, &a);
    if (dtaps) {
        partials_reduce(&P, dtaps, 0, 4 * d);
        partials_free(&P);
    }
    /* a prefix's last rows also feed the first rows of each continuation */
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *sg = &L->seg[s];
        if (sg->parent < 0)
            continue;
        for (int off = 0; off < sg->len && off < 3 * dil; off++) {
            long r = (long)sg->start + off;
            for (int j = 1; j < 4; j++) {
                long b = nd_layout_back(L, r, j * dil);
                if (b < 0 || L->row_seg[b] == s)
                    continue;
                const float *g = dv + r * d, *tj = taps + j * d;
                float *o = dvp + b * d;
                for (int i = 0; i < d; i++)
                    o[i] += tj[i] * g[i];
            }
        }
    }
}

typedef struct {
    float *du, *dk, *dv;
    const float *dbx, *u, *k, *v, *alpha;
    int d;
} gate_bwd_args;

static void gate_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const gate_bwd_args *ga = p;
    float *du = ga->du, *dk = ga->dk, *dv = ga->dv;
    const float *dbx = ga->dbx, *u = ga->u, *k = ga->k, *v = ga->v, *alpha = ga->alpha;
    int d = ga->d;
    float inv_d = 1.0f / (float)d, c = 1.0f / sqrtf((float)d);
    for (long r = r0; r < r1; r++) {
        const float *ur = u + r * d, *kr = k + r * d, *vr = v + r * d, *g = dbx + r * d;
        float uu = fdot(ur, ur, d), kk = fdot(kr, kr, d), uk = fdot(ur, kr, d);
        float gv = fdot(g, vr, d);
        float ru = 1.0f / sqrtf(uu * inv_d + 1e-6f), rk = 1.0f / sqrtf(kk * inv_d + 1e-6f);
        float a = alpha[r];
        /* s = c*<u,k>*ru*rk, alpha = sigmoid(s) */
        float ds = gv * a * (1.0f - a) * c * ru * rk;
        float cu = uk * ru * ru * inv_d, ck = uk * rk * rk * inv_d;
        float *dur = du + r * d, *dkr = dk + r * d, *dvr = dv + r * d;
        for (int i = 0; i < d; i++) {
            dur[i] += ds * (kr[i] - cu * ur[i]);
            dkr[i] += ds * (ur[i] - ck * kr[i]);
            dvr[i] += a * g[i];
        }
    }
}

void cpu_engram_gate_backward(const nd_backend *be, float *du, float *dk, float *dv,
                              const float *dbx, const float *u, const float *k, const float *v,
                              const float *alpha, long N, int d)
{
    (void)be;
    gate_bwd_args a = {du, dk, dv, dbx, u, k, v, alpha, d};
    nd_parallel_for(N, 1, gate_bwd_rows, &a);
}

/* ---- hyper-connections ---- */

typedef struct {
    float *dpre, *dpost, *dres;
    const float *dhpre, *dhpost, *dM, *pre, *post, *res, *hpre, *hpost, *b_res;
    float a_pre, a_post, a_res;
    long N;
    int n;
    partials *P;
} hyper_bwd_args;

static void hyper_bwd_share(void *p, int tid, int team)
{
    const hyper_bwd_args *ha = p;
    float *dpre = ha->dpre, *dpost = ha->dpost, *dres = ha->dres;
    const float *dhpre = ha->dhpre, *dhpost = ha->dhpost, *dM = ha->dM, *pre = ha->pre;
    const float *post = ha->post, *res = ha->res, *hpre = ha->hpre, *hpost = ha->hpost;
    const float *b_res = ha->b_res;
    float a_pre = ha->a_pre, a_post = ha->a_post, a_res = ha->a_res;
    long N = ha->N;
    int n = ha->n, nn = n * n, rounds = SAN_SINKHORN_ROUNDS;
    int o_bpre = 3, o_bpost = 3 + n, o_bres = 3 + 2 * n;
    {
        long r0, r1;
        double *pp = partials_mine(ha->P, N, tid, team, &r0, &r1);
        /* Sinkhorn states for SK_W rows at a time, SoA (cpu_sinkhorn.c) */
        float *sm = cpu_xalloc((size_t)(2 * rounds + 1) * nn * SK_W * sizeof *sm);
        double *g = cpu_xalloc((size_t)nn * SK_W * sizeof *g);
        float *Z = sm + (size_t)(2 * rounds) * nn * SK_W;
        for (long g0 = r0; g0 < r1; g0 += SK_W) {
            int w = r1 - g0 < SK_W ? (int)(r1 - g0) : SK_W;
            for (long r = g0; r < g0 + w; r++)
                for (int i = 0; i < n; i++) {
                    long e = r * n + i;
                    float h = hpre[e], dz = dhpre[e] * h * (1.0f - h);
                    dpre[e] = a_pre * dz;
                    pp[0] += (double)(dz * pre[e]);
                    pp[o_bpre + i] += (double)dz;
                    /* hpost = 2*sigmoid(z): dhpost/dz = hpost*(1 - hpost/2) */
                    h = hpost[e];
                    dz = dhpost[e] * h * (1.0f - 0.5f * h);
                    dpost[e] = a_post * dz;
                    pp[1] += (double)(dz * post[e]);
                    pp[o_bpost + i] += (double)dz;
                }
            /* recompute the 20 rounds keeping each half-round's softmax,
             * then walk them back: a log-normalise y = x - lse(x) has
             * dx = dy - exp(y) * sum(dy). Unused lanes run on zeros. */
            memset(Z, 0, (size_t)nn * SK_W * sizeof *Z);
            memset(g, 0, (size_t)nn * SK_W * sizeof *g);
            for (int k = 0; k < w; k++)
                for (int i = 0; i < nn; i++)
                    Z[(size_t)i * SK_W + k] = a_res * res[(g0 + k) * nn + i] + b_res[i];
            for (int st = 0; st < 2 * rounds; st++)
                san_sinkhorn_halfstep(Z, sm + (size_t)st * nn * SK_W, n, !(st & 1));
            for (int k = 0; k < w; k++) /* M = exp(Z) */
                for (int i = 0; i < nn; i++)
                    g[(size_t)i * SK_W + k] =
                        (double)dM[(g0 + k) * nn + i] * (double)san_expf(Z[(size_t)i * SK_W + k]);
            for (int st = 2 * rounds - 1; st >= 0; st--) {
                const float *e = sm + (size_t)st * nn * SK_W;
                int rowstep = !(st & 1), stp = rowstep ? 1 : n;
                for (int a = 0; a < n; a++) {
                    int base = rowstep ? a * n : a;
                    double sum[SK_W] = {0};
                    for (int b = 0; b < n; b++) {
                        const double *gb = g + (size_t)(base + b * stp) * SK_W;
                        for (int k = 0; k < SK_W; k++)
                            sum[k] += gb[k];
                    }
                    for (int b = 0; b < n; b++) {
                        double *gb = g + (size_t)(base + b * stp) * SK_W;
                        const float *eb = e + (size_t)(base + b * stp) * SK_W;
                        for (int k = 0; k < SK_W; k++)
                            gb[k] -= (double)eb[k] * sum[k];
                    }
                }
            }
            for (int k = 0; k < w; k++) {
                long r = g0 + k;
                const float *rr = res + r * nn;
                for (int i = 0; i < nn; i++) {
                    double gi = g[(size_t)i * SK_W + k];
                    dres[r * nn + i] = (float)(a_res * gi);
                    pp[2] += gi * rr[i];
                    pp[o_bres + i] += gi;
                }
            }
        }
        free(g);
        free(sm);
    }
}

void cpu_hyper_coeffs_backward(const nd_backend *be, float *dpre, float *dpost, float *dres,
                               float *da_pre, float *da_post, float *da_res, float *db_pre,
                               float *db_post, float *db_res, const float *dhpre,
                               const float *dhpost, const float *dM, const float *pre,
                               const float *post, const float *res, const float *hpre,
                               const float *hpost, float a_pre, float a_post, float a_res,
                               const float *b_res, long N, int n)
{
    (void)be;
    if (N <= 0)
        return;
    /* partial layout: a_pre, a_post, a_res, b_pre[n], b_post[n], b_res[nn] */
    int nn = n * n, o_bpre = 3, o_bpost = 3 + n, o_bres = 3 + 2 * n;
    partials P = partials_new(3 + 2 * n + nn);
    hyper_bwd_args a = {dpre, dpost, dres,  dhpre, dhpost, dM,    pre, post, res,
                        hpre, hpost, b_res, a_pre, a_post, a_res, N,   n,    &P};
    nd_parallel_region(P.nt, hyper_bwd_share, &a);
    partials_reduce(&P, da_pre, 0, 1);
    partials_reduce(&P, da_post, 1, 1);
    partials_reduce(&P, da_res, 2, 1);
    partials_reduce(&P, db_pre, o_bpre, n);
    partials_reduce(&P, db_post, o_bpost, n);
    partials_reduce(&P, db_res, o_bres, nn);
    partials_free(&P);
}

/* ---- attention block pieces ---- */

typedef struct {
    float *dx;
    const float *cos_t, *sin_t;
    const nd_layout *L;
    int heads, hd;
} rope_bwd_args;

static void rope_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const rope_bwd_args *a = p;
    float *dx = a->dx;
    const float *cos_t = a->cos_t, *sin_t = a->sin_t;
    const nd_layout *L = a->L;
    int heads = a->heads, hd = a->hd, half = hd / 2;
    for (long r = r0; r < r1; r++) {
        int t = L->pos[r];
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < heads; h++) {
            float *v = dx + (r * heads + h) * hd;
            for (int i = 0; i < half; i++) {
                float g1 = v[i], g2 = v[i + half];
                v[i] = g1 * c[i] + g2 * s[i];
                v[i + half] = g2 * c[i] - g1 * s[i];
            }
        }
    }
}

void cpu_rope_backward(const nd_backend *be, float *dx, const float *cos_t, const float *sin_t,
                       const nd_layout *L, int heads, int hd)
{
    (void)be;
    rope_bwd_args a = {dx, cos_t, sin_t, L, heads, hd};
    nd_parallel_for(L->N, 1, rope_bwd_rows, &a);
}

typedef struct {
    float *o1, *o2;
    const float *x1, *x2, *x3;
    float s;
} elementwise_bwd_args;

static void gate_sigmoid_bwd_range(void *p, long i0, long i1, int tid)
{
    (void)tid;
    const elementwise_bwd_args *e = p;
    for (long i = i0; i < i1; i++) {
        float s = san_sigmoid(e->x3[i]), go = e->x1[i], a = e->x2[i];
        e->o1[i] = go * s;
        e->o2[i] = go * a * s * (1.0f - s);
    }
}

void cpu_gate_sigmoid_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                               const float *att, const float *g, long n)
{
    (void)be;
    elementwise_bwd_args a = {datt, dg, dout, att, g, 0.0f};
    nd_parallel_for(n, 1, gate_sigmoid_bwd_range, &a);
}

typedef struct {
    float *dr;
    const float *dy, *r;
    float s;
    long n;
    partials *P; /* NULL: no dgate */
} residual_bwd_args;

static void residual_bwd_share(void *p, int tid, int team)
{
    const residual_bwd_args *a = p;
    float *dr = a->dr, s = a->s;
    const float *dy = a->dy, *r = a->r;
    {
        long i0, i1;
        double *pg = NULL;
        if (a->P)
            pg = partials_mine(a->P, a->n, tid, team, &i0, &i1);
        else
            nd_share(a->n, tid, team, &i0, &i1);
        /* float blocks keep the inner loop vectorisable; double across blocks */
        for (long b = i0; b < i1; b += 1024) {
            long e = b + 1024 < i1 ? b + 1024 : i1;
            /* the sum is taken before dr is written: dr may alias dy */
            if (pg)
                pg[0] += (double)fdot(dy + b, r + b, (int)(e - b));
            for (long i = b; i < e; i++)
                dr[i] = s * dy[i];
        }
    }
}

void cpu_residual_scaled_backward(const nd_backend *be, float *dr, float *dgate, const float *dy,
                                  const float *r, float gate, long n)
{
    (void)be;
    if (n <= 0)
        return;
    float s = san_sigmoid(gate);
    partials P = {0};
    if (dgate)
        P = partials_new(1);
    residual_bwd_args a = {dr, dy, r, s, n, dgate ? &P : NULL};
    nd_parallel_region(dgate ? P.nt : 0, residual_bwd_share, &a);
    if (dgate) {
        double sum = 0;
        for (int t = 0; t < P.nt; t++)
            sum += P.buf[t];
        dgate[0] += (float)(sum * (double)s * (1.0 - (double)s));
        partials_free(&P);
    }
}

typedef struct {
    float *dz;
    const float *dy, *z, *h1, *d1, *d2, *d3;
    long N;
    int d, hn;
    partials *P; /* NULL: no parameter gradients wanted */
} hadamard_bwd_args;

static void hadamard_bwd_share(void *p, int tid, int team)
{
    const hadamard_bwd_args *a = p;
    float *dz = a->dz;
    const float *dy = a->dy, *z = a->z, *h1 = a->h1, *d1 = a->d1, *d2 = a->d2, *d3 = a->d3;
    int d = a->d, hn = a->hn;
    float scale = san_walsh_scale(hn);
    {
        long r0, r1;
        double *pp = NULL;
        if (a->P)
            pp = partials_mine(a->P, a->N, tid, team, &r0, &r1);
        else
            nd_share(a->N, tid, team, &r0, &r1);
        /* SK_W consecutive rows at a time in SoA form (see san_fwht_soa);
         * the partial sums still take rows in order */
        size_t blk = (size_t)hn * SK_W;
        float *H = cpu_xalloc(4 * blk * sizeof *H), *W = H + blk, *SG = H + 2 * blk,
              *Gm = H + 3 * blk;
        for (long g0 = r0; g0 < r1; g0 += SK_W) {
            int wn = r1 - g0 < SK_W ? (int)(r1 - g0) : SK_W;
            memset(H, 0, blk * sizeof *H);   /* idle lanes of a short group */
            memset(Gm, 0, blk * sizeof *Gm); /* and rows d..hn of the gradient */
            for (int k = 0; k < wn; k++) {
                const float *h = h1 + (g0 + k) * hn, *gy = dy + (g0 + k) * d;
                for (int i = 0; i < hn; i++)
                    H[(size_t)i * SK_W + k] = h[i];
                for (int i = 0; i < d; i++)
                    Gm[(size_t)i * SK_W + k] = gy[i] * d3[i];
            }
            /* recompute W = fwht(silu(d2*h1)) */
            for (int i = 0; i < hn; i++)
                for (int k = 0; k < SK_W; k++) {
                    float sv = d2[i] * H[(size_t)i * SK_W + k], sg = san_sigmoid(sv);
                    SG[(size_t)i * SK_W + k] = sg;
                    W[(size_t)i * SK_W + k] = sv * sg;
                }
            san_fwht_soa(W, hn, scale);
            /* out = (d3*W)[:d]; the scaled Walsh matrix is symmetric, so the
             * transpose of each fwht is fwht itself */
            if (pp)
                for (int k = 0; k < wn; k++) {
                    const float *gy = dy + (g0 + k) * d;
                    for (int i = 0; i < d; i++)
                        pp[2 * hn + i] += (double)(gy[i] * W[(size_t)i * SK_W + k]);
                }
            san_fwht_soa(Gm, hn, scale);
            /* silu'(s) = sg*(1 + s*(1-sg)) */
            for (int i = 0; i < hn; i++)
                for (int k = 0; k < SK_W; k++) {
                    size_t e = (size_t)i * SK_W + k;
                    float sv = d2[i] * H[e];
                    Gm[e] *= SG[e] * (1.0f + sv * (1.0f - SG[e]));
                }
            if (pp)
                for (int k = 0; k < wn; k++)
                    for (int i = 0; i < hn; i++)
                        pp[hn + i] += (double)(Gm[(size_t)i * SK_W + k] * H[(size_t)i * SK_W + k]);
            for (int i = 0; i < hn; i++)
                for (int k = 0; k < SK_W; k++)
                    Gm[(size_t)i * SK_W + k] *= d2[i];
            san_fwht_soa(Gm, hn, scale);
            for (int k = 0; k < wn; k++) {
                const float *zr = z + (g0 + k) * d;
                float *dzr = dz + (g0 + k) * d;
                for (int i = 0; i < d; i++) {
                    float gi = Gm[(size_t)i * SK_W + k];
                    if (pp)
                        pp[i] += (double)(gi * zr[i]);
                    dzr[i] = gi * d1[i];
                }
            }
        }
        free(H);
    }
}

void cpu_hadamard_mlp_backward(const nd_backend *be, float *dz, float *dd1, float *dd2, float *dd3,
                               const float *dy, const float *z, const float *h1, const float *d1,
                               const float *d2, const float *d3, long N, int d, int hn)
{
    (void)be;
    if (N <= 0)
        return;
    int want = dd1 || dd2 || dd3;
    partials P = {0};
    if (want)
        P = partials_new(3 * hn);
    hadamard_bwd_args a = {dz, dy, z, h1, d1, d2, d3, N, d, hn, want ? &P : NULL};
    nd_parallel_region(want ? P.nt : 0, hadamard_bwd_share, &a);
    if (want) {
        partials_reduce(&P, dd1, 0, hn);
        partials_reduce(&P, dd2, hn, hn);
        partials_reduce(&P, dd3, 2 * hn, hn);
        partials_free(&P);
    }
}

static void add_range(void *p, long i0, long i1, int tid)
{
    (void)tid;
    const elementwise_bwd_args *e = p;
    for (long i = i0; i < i1; i++)
        e->o1[i] += e->s * e->x1[i];
}

void cpu_add(const nd_backend *be, float *y, const float *x, float alpha, long n)
{
    (void)be;
    elementwise_bwd_args a = {.o1 = y, .x1 = x, .s = alpha};
    nd_parallel_for(n, 1, add_range, &a);
}
