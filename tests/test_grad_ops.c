/* Finite-difference checks of every backward op of the CPU backend.
 *
 * For each op: random inputs (fixed seed), a random projection R of the
 * outputs, f = sum(R * op(inputs)). The analytic gradient is the backward
 * op fed dy = R; the numeric one is a central difference of f evaluated by
 * a double-precision reference forward written here (float32 differences
 * are too noisy for the Sinkhorn and attention). Each reference is first
 * compared with the backend's float forward, so it is the same function.
 * Also checked: accumulate semantics, NULL parameter gradients, aliasing
 * that the ops allow, and thread-count determinism of row reductions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/rng.h"
#include "model/san.h"
#include "testutil.h"

static nd_rng rng;
static const nd_backend *be;
static double worst_err; /* largest FD error over all checks */

/* ---- allocation arena: each test frees everything at its end ---- */

static void *arena[512];
static int n_arena;

static void *talloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || n_arena == (int)(sizeof arena / sizeof *arena)) {
        fprintf(stderr, "test_grad_ops: out of memory\n");
        exit(2);
    }
    arena[n_arena++] = p;
    return p;
}

static void tfree_all(void)
{
    while (n_arena)
        free(arena[--n_arena]);
}

static float *fvec(long n, double scale)
{
    float *x = talloc(sizeof(float) * (size_t)n);
    for (long i = 0; i < n; i++)
        x[i] = (float)(scale * nd_rng_normal(&rng));
    return x;
}

static float *fzero(long n)
{
    return talloc(sizeof(float) * (size_t)n);
}

static float *fcopy(const float *x, long n)
{
    float *y = talloc(sizeof(float) * (size_t)n);
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

static double *dvec(const float *x, long n)
{
    double *y = talloc(sizeof(double) * (size_t)n);
    for (long i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static double *dzero(long n)
{
    return talloc(sizeof(double) * (size_t)n);
}

static int same_bits(const float *a, const float *b, long n)
{
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* ---- layouts: padded batches and shared prefixes ---- */

/* kind 0: B dense sequences of T; kind 1: a prefix of `a` rows continued
 * by children of lens[] (then a standalone sequence of T rows) */
static nd_layout_buf layb;

static const nd_layout *make_layout(int kind, int B, int T, int a, const int *lens, int nl)
{
    nd_layout_buf_free(&layb);
    if (nd_layout_buf_init(&layb, 4096, 64)) {
        fprintf(stderr, "test_grad_ops: out of memory\n");
        exit(2);
    }
    if (kind == 0) {
        nd_layout_dense(&layb, B, T);
    } else {
        int p = nd_layout_add(&layb, a, -1);
        for (int i = 0; i < nl; i++)
            nd_layout_add(&layb, lens[i], p);
        nd_layout_add(&layb, T, -1);
    }
    return &layb.L;
}

/* The rows of row r's whole sequence up to r, written out from the
 * segment table (independent of nd_layout_back): returns the count. */
static int seq_rows(const nd_layout *L, long r, long *out)
{
    const nd_segment *s = &L->seg[L->row_seg[r]];
    int n = 0;
    if (s->parent >= 0)
        for (int i = 0; i < L->seg[s->parent].len; i++)
            out[n++] = L->seg[s->parent].start + i;
    for (long i = s->start; i <= r; i++)
        out[n++] = i;
    return n;
}

static long seqbuf[4096];

/* ---- the checker ---- */

/* A double reference forward writes all outputs of the op under test. */
typedef void (*ref_fwd)(double *out);

typedef struct {
    const char *op;
    ref_fwd fwd;
    const double *R; /* projection, n_out */
    double *out;
    long n_out;
} objective;

static double obj_eval(const objective *o)
{
    o->fwd(o->out);
    double f = 0;
    for (long i = 0; i < o->n_out; i++)
        f += o->R[i] * o->out[i];
    return f;
}

static objective obj_new(const char *op, ref_fwd fwd, long n_out, const float **R_float)
{
    objective o = {op, fwd, NULL, dzero(n_out), n_out};
    float *R = fvec(n_out, 1.0);
    o.R = dvec(R, n_out);
    *R_float = R;
    return o;
}

/* The reference must agree with the backend's float forward output. */
static void check_ref(const objective *o, const float *fout, double tol)
{
    o->fwd(o->out);
    double md = 0, mb = 1e-6;
    for (long i = 0; i < o->n_out; i++) {
        md = fmax(md, fabs(o->out[i] - fout[i]));
        mb = fmax(mb, fabs(o->out[i]));
    }
    CHECK_MSG(md / mb < tol, "%s: double reference vs float forward err %.3g", o->op, md / mb);
}

/* Central differences of f w.r.t. x at up to 240 random positions against
 * the analytic gradient; error per element |a-n| / max(|a|, |n|, 1e-3). */
static double fd_check(const objective *o, const char *what, double *x, long n, const float *ana)
{
    const int max_probe = 240;
    const double h = 1e-5;
    int probes = n <= max_probe ? (int)n : max_probe;
    double worst = 0, num2 = 0, diff2 = 0;
    for (int p = 0; p < probes; p++) {
        long i = n <= max_probe ? p : (long)nd_rng_below(&rng, (uint64_t)n);
        double save = x[i];
        x[i] = save + h;
        double fp = obj_eval(o);
        x[i] = save - h;
        double fm = obj_eval(o);
        x[i] = save;
        double num = (fp - fm) / (2 * h), a = ana[i];
        double e = fabs(a - num) / fmax(fmax(fabs(a), fabs(num)), 1e-3);
        worst = fmax(worst, e);
        if (e != e)
            worst = INFINITY;
        num2 += num * num;
        diff2 += (a - num) * (a - num);
    }
    double nrm = sqrt(diff2) / fmax(sqrt(num2), 1e-12);
    printf("  %-24s %-8s n=%-6ld probed=%-4d max elem err %.2e  norm err %.2e\n", o->op, what, n,
           probes, worst, nrm);
    CHECK_MSG(worst < 1e-3 && num2 > 0, "%s d%s: FD error %.3g", o->op, what, worst);
    worst_err = fmax(worst_err, worst);
    return worst;
}

/* ================= cross_entropy ================= */

static struct {
    int N, V;
    double *L;
    const int32_t *tgt;
} CE;

static void ce_fwd(double *out)
{
    for (int r = 0; r < CE.N; r++) {
        const double *l = CE.L + (size_t)r * CE.V;
        double mx = l[0], s = 0;
        for (int i = 1; i < CE.V; i++)
            mx = fmax(mx, l[i]);
        for (int i = 0; i < CE.V; i++)
            s += exp(l[i] - mx);
        out[r] = mx + log(s) - l[CE.tgt[r]];
    }
}

/* V 37: one chunk with a tail; 600: the CPU loss's 256-logit chunks */
static void test_cross_entropy(int V)
{
    int N = 5;
    float *L = fvec((long)N * V, 2.0);
    int32_t tgt[5];
    for (int r = 0; r < N; r++)
        tgt[r] = (int32_t)nd_rng_below(&rng, (uint64_t)V);
    CE.N = N;
    CE.V = V;
    CE.L = dvec(L, (long)N * V);
    CE.tgt = tgt;
    const float *R;
    objective o = obj_new("cross_entropy", ce_fwd, N, &R);
    /* the row weights are the projection: f = sum_r w_r * loss_r */
    float *w = (float *)R;
    double *Rd = (double *)o.R;
    for (int r = 0; r < N; r++)
        Rd[r] = w[r] = (float)nd_rng_uniform(&rng) * 2.0f;
    Rd[2] = w[2] = 0.0f; /* a masked row */
    float *loss = fzero(N);
    be->cross_entropy(be, loss, L, tgt, N, V);
    check_ref(&o, loss, 1e-5);
    float *g = fcopy(L, (long)N * V);
    be->cross_entropy_backward(be, g, tgt, w, N, V);
    fd_check(&o, "logits", CE.L, (long)N * V, g);
    /* weight NULL = 1 */
    float *g1 = fcopy(L, (long)N * V), *g2 = fcopy(L, (long)N * V), ones[5];
    for (int r = 0; r < N; r++)
        ones[r] = 1.0f;
    be->cross_entropy_backward(be, g1, tgt, NULL, N, V);
    be->cross_entropy_backward(be, g2, tgt, ones, N, V);
    CHECK(same_bits(g1, g2, (long)N * V));
    tfree_all();
}

/* ================= rmsnorm ================= */

static struct {
    int rows, dim;
    double *x, *s; /* s NULL = no scale */
} RN;

static void rn_fwd(double *out)
{
    for (int r = 0; r < RN.rows; r++) {
        const double *x = RN.x + (size_t)r * RN.dim;
        double ss = 0;
        for (int i = 0; i < RN.dim; i++)
            ss += x[i] * x[i];
        double rs = 1.0 / sqrt(ss / RN.dim + 1e-6);
        for (int i = 0; i < RN.dim; i++)
            out[(size_t)r * RN.dim + i] = x[i] * rs * (1.0 + (RN.s ? RN.s[i] : 0.0));
    }
}

static void test_rmsnorm_case(int rows, int dim, int with_scale)
{
    long n = (long)rows * dim;
    float *x = fvec(n, 1.5), *s = with_scale ? fvec(dim, 0.3) : NULL;
    RN.rows = rows;
    RN.dim = dim;
    RN.x = dvec(x, n);
    RN.s = s ? dvec(s, dim) : NULL;
    const float *R;
    objective o = obj_new(with_scale ? "rmsnorm" : "rmsnorm(no scale)", rn_fwd, n, &R);
    float *y = fzero(n), *rstd = fzero(rows);
    be->rmsnorm(be, y, rstd, x, s, rows, dim);
    check_ref(&o, y, 1e-5);
    float *dx = fzero(n), *ds = fzero(dim);
    be->rmsnorm_backward(be, dx, ds, R, x, rstd, s, rows, dim, 0);
    fd_check(&o, "x", RN.x, n, dx);
    if (with_scale)
        fd_check(&o, "scale", RN.s, dim, ds);

    /* accumulate: dx += ; dscale += (twice = double) */
    float *base = fvec(n, 1.0), *dxa = fcopy(base, n);
    be->rmsnorm_backward(be, dxa, ds, R, x, rstd, s, rows, dim, 1);
    double e = 0;
    for (long i = 0; i < n; i++)
        e = fmax(e, fabs(dxa[i] - (base[i] + dx[i])));
    CHECK_MSG(e < 1e-5, "rmsnorm accumulate err %g", e);
    float *ds1 = fzero(dim);
    be->rmsnorm_backward(be, dxa, ds1, R, x, rstd, s, rows, dim, 0);
    for (int i = 0; i < dim; i++)
        CHECK(ds[i] == 2.0f * ds1[i]);
    /* dscale NULL, rstd NULL and dx aliasing dy give the same dx */
    float *dxn = fzero(n), *dxr = fzero(n), *dxi = fcopy(R, n);
    be->rmsnorm_backward(be, dxn, NULL, R, x, rstd, s, rows, dim, 0);
    be->rmsnorm_backward(be, dxr, NULL, R, x, NULL, s, rows, dim, 0);
    be->rmsnorm_backward(be, dxi, NULL, dxi, x, rstd, s, rows, dim, 0);
    CHECK(same_bits(dxn, dx, n));
    CHECK(tu_rel_err(dxr, dx, n, 1e-3) < 1e-5);
    CHECK(same_bits(dxi, dx, n));
    tfree_all();
}

/* many rows: reduction across threads vs a direct double sum, and the
 * same bits on a second call */
static void test_rmsnorm_reduction(void)
{
    int rows = 3001, dim = 40;
    long n = (long)rows * dim;
    float *x = fvec(n, 1.0), *s = fvec(dim, 0.3), *dy = fvec(n, 1.0);
    float *y = fzero(n), *rstd = fzero(rows), *dx = fzero(n), *ds = fzero(dim), *ds2 = fzero(dim);
    be->rmsnorm(be, y, rstd, x, s, rows, dim);
    be->rmsnorm_backward(be, dx, ds, dy, x, rstd, s, rows, dim, 0);
    be->rmsnorm_backward(be, dx, ds2, dy, x, rstd, s, rows, dim, 0);
    CHECK(same_bits(ds, ds2, dim));
    float *want = fzero(dim);
    for (int i = 0; i < dim; i++) {
        double acc = 0;
        for (int r = 0; r < rows; r++)
            acc += (double)dy[(long)r * dim + i] * x[(long)r * dim + i] * rstd[r];
        want[i] = (float)acc;
    }
    double e = tu_rel_err(ds, want, dim, 1e-3);
    printf("  rmsnorm dscale over %d rows vs double sum: %.2e\n", rows, e);
    CHECK_MSG(e < 1e-5, "rmsnorm dscale reduction err %g", e);
    tfree_all();
}

/* ================= embed ================= */

static struct {
    int N, d;
    double *emb, scale;
    const int32_t *tok;
} EM;

static void em_fwd(double *out)
{
    for (int t = 0; t < EM.N; t++)
        for (int i = 0; i < EM.d; i++)
            out[(size_t)t * EM.d + i] = EM.emb[(size_t)EM.tok[t] * EM.d + i] * EM.scale;
}

static void test_embed(void)
{
    int V = 9, d = 20, N = 15;
    int32_t tok[15];
    for (int t = 0; t < N; t++)
        tok[t] = (int32_t)nd_rng_below(&rng, (uint64_t)V); /* repeats likely */
    tok[3] = tok[0];
    float *emb = fvec((long)V * d, 1.0), scale = sqrtf((float)d);
    EM.N = N;
    EM.d = d;
    EM.emb = dvec(emb, (long)V * d);
    EM.scale = scale;
    EM.tok = tok;
    const float *R;
    objective o = obj_new("embed", em_fwd, (long)N * d, &R);
    float *x0 = fzero((long)N * d);
    be->embed(be, x0, emb, tok, N, d, scale);
    check_ref(&o, x0, 1e-6);
    float *demb = fzero((long)V * d), *demb2 = fzero((long)V * d);
    be->embed_backward(be, demb, R, tok, N, d, scale);
    fd_check(&o, "emb", EM.emb, (long)V * d, demb);
    be->embed_backward(be, demb2, R, tok, N, d, scale);
    be->embed_backward(be, demb2, R, tok, N, d, scale);
    /* repeated tokens sum in a different order on the second call */
    for (long i = 0; i < (long)V * d; i++)
        demb[i] *= 2.0f;
    CHECK(tu_rel_err(demb2, demb, (long)V * d, 1e-3) < 1e-6);
    tfree_all();
}

/* ================= engram gather ================= */

static struct {
    int K, heads, slots, sub;
    const nd_layout *L;
    const int *orders;
    const int32_t *idx;
    double *tab;
} EG;

static void eg_fwd(double *out)
{
    for (long r = 0; r < EG.L->N; r++)
        for (int k = 0; k < EG.K; k++)
            for (int c = 0; c < EG.sub; c++) {
                double v = 0;
                int pos = seq_rows(EG.L, r, seqbuf) - 1;
                if (pos >= EG.orders[k / EG.heads] - 1)
                    v = EG.tab[((size_t)k * EG.slots + EG.idx[r * EG.K + k]) * EG.sub + c];
                out[((size_t)r * EG.K + k) * EG.sub + c] = v;
            }
}

static void test_engram_gather(const nd_layout *L)
{
    static const int orders[2] = {2, 3};
    int heads = 2, K = 4, slots = 5, sub = 19; /* sub > one column chunk */
    long N = L->N;
    int32_t *tok = talloc(sizeof *tok * (size_t)N), *idx = talloc(sizeof *idx * (size_t)N * K);
    for (long i = 0; i < N; i++)
        tok[i] = (int32_t)nd_rng_below(&rng, 50);
    be->engram_hash(be, idx, tok, L, orders, 2, heads, slots);
    /* the hash of each row is that of its whole sequence written out */
    for (long r = 0; r < N; r++) {
        int n = seq_rows(L, r, seqbuf);
        int32_t seq[4096];
        for (int i = 0; i < n; i++)
            seq[i] = tok[seqbuf[i]];
        for (int k = 0; k < K; k++)
            CHECK(idx[r * K + k] ==
                  (int32_t)san_engram_index(seq, n - 1, orders[k / heads], k, slots));
    }
    long nt = (long)K * slots * sub, ne = N * K * sub;
    float *tab = fvec(nt, 1.0);
    EG.L = L;
    EG.K = K;
    EG.heads = heads;
    EG.slots = slots;
    EG.sub = sub;
    EG.orders = orders;
    EG.idx = idx;
    EG.tab = dvec(tab, nt);
    const float *R;
    objective o = obj_new("engram_gather", eg_fwd, ne, &R);
    float *e = fzero(ne);
    be->engram_gather(be, e, tab, idx, L, orders, 2, heads, slots, sub);
    check_ref(&o, e, 1e-7);
    float *dt = fzero(nt);
    be->engram_gather_backward(be, dt, R, idx, L, orders, 2, heads, slots, sub);
    fd_check(&o, "tables", EG.tab, nt, dt);
    be->engram_gather_backward(be, NULL, R, idx, L, orders, 2, heads, slots, sub);
    tfree_all();
}

/* ================= engram taps ================= */

static struct {
    int d, dil;
    const nd_layout *L;
    double *vp, *taps;
} ET;

static void et_fwd(double *out)
{
    for (long r = 0; r < ET.L->N; r++) {
        int n = seq_rows(ET.L, r, seqbuf), t = n - 1;
        for (int i = 0; i < ET.d; i++) {
            double s = 0;
            for (int j = 0; j < 4; j++)
                if (t - j * ET.dil >= 0)
                    s += ET.taps[j * ET.d + i] * ET.vp[(size_t)seqbuf[t - j * ET.dil] * ET.d + i];
            out[(size_t)r * ET.d + i] = s;
        }
    }
}

static void test_engram_taps(const nd_layout *L)
{
    int d = 5, dil = 3;
    long n = L->N * d;
    float *vp = fvec(n, 1.0), *taps = fvec(4 * d, 1.0);
    ET.L = L;
    ET.d = d;
    ET.dil = dil;
    ET.vp = dvec(vp, n);
    ET.taps = dvec(taps, 4 * d);
    const float *R;
    objective o = obj_new("engram_taps", et_fwd, n, &R);
    float *v = fzero(n);
    be->engram_taps(be, v, vp, taps, L, d, dil);
    check_ref(&o, v, 1e-6);
    float *dvp = fvec(n, 1.0), *dtaps = fzero(4 * d); /* dvp is set, not += */
    be->engram_taps_backward(be, dvp, dtaps, R, vp, taps, L, d, dil);
    fd_check(&o, "vp", ET.vp, n, dvp);
    fd_check(&o, "taps", ET.taps, 4 * d, dtaps);
    /* every vp row exactly (the prefix rows that children read are few) */
    if (L->seg[0].len >= 3 * dil && L->n_seg > 1 && L->seg[1].parent == 0) {
        long p_end = (long)L->seg[0].len * d;
        fd_check(&o, "vp[prefix end]", ET.vp + p_end - 3 * dil * d, 3 * dil * d,
                 dvp + p_end - 3 * dil * d);
    }
    float *dvp2 = fzero(n), *dtaps2 = fcopy(dtaps, 4 * d);
    be->engram_taps_backward(be, dvp2, NULL, R, vp, taps, L, d, dil);
    CHECK(same_bits(dvp, dvp2, n));
    be->engram_taps_backward(be, dvp2, dtaps2, R, vp, taps, L, d, dil);
    for (int i = 0; i < 4 * d; i++)
        CHECK(dtaps2[i] == 2.0f * dtaps[i]);
    tfree_all();
}

/* ================= engram gate ================= */

static struct {
    int N, d, accumulate;
    double *u, *k, *v, *bx0;
} GT;

static void gt_fwd(double *out)
{
    int d = GT.d;
    for (int r = 0; r < GT.N; r++) {
        const double *u = GT.u + (size_t)r * d, *k = GT.k + (size_t)r * d,
                     *v = GT.v + (size_t)r * d;
        double uu = 0, kk = 0, uk = 0;
        for (int i = 0; i < d; i++) {
            uu += u[i] * u[i];
            kk += k[i] * k[i];
            uk += u[i] * k[i];
        }
        double ru = 1 / sqrt(uu / d + 1e-6), rk = 1 / sqrt(kk / d + 1e-6);
        double a = 1 / (1 + exp(-uk * ru * rk / sqrt((double)d)));
        for (int i = 0; i < d; i++)
            out[(size_t)r * d + i] = (GT.accumulate ? GT.bx0[(size_t)r * d + i] : u[i]) + a * v[i];
    }
}

static void test_engram_gate(int accumulate)
{
    int N = 6, d = 8;
    long n = (long)N * d;
    float *u = fvec(n, 1.0), *k = fvec(n, 1.0), *v = fvec(n, 1.0), *bx0 = fvec(n, 1.0);
    for (long i = 0; i < n; i++) /* make <u,k> vary in sign and size */
        k[i] = 0.6f * k[i] + 0.5f * u[i] * (float)((i / d) % 3 - 1);
    GT.N = N;
    GT.d = d;
    GT.accumulate = accumulate;
    GT.u = dvec(u, n);
    GT.k = dvec(k, n);
    GT.v = dvec(v, n);
    GT.bx0 = dvec(bx0, n);
    const float *R;
    objective o = obj_new(accumulate ? "engram_gate(accumulate)" : "engram_gate", gt_fwd, n, &R);
    float *bx = fcopy(bx0, n), *alpha = fzero(N);
    be->engram_gate(be, bx, alpha, u, k, v, N, d, accumulate);
    check_ref(&o, bx, 1e-5);
    /* du/dk/dv are +=: start from noise and subtract it */
    float *du0 = fvec(n, 1.0), *dk0 = fvec(n, 1.0), *dv0 = fvec(n, 1.0);
    float *du = fcopy(du0, n), *dk = fcopy(dk0, n), *dv = fcopy(dv0, n);
    be->engram_gate_backward(be, du, dk, dv, R, u, k, v, alpha, N, d);
    for (long i = 0; i < n; i++) {
        du[i] -= du0[i];
        dk[i] -= dk0[i];
        dv[i] -= dv0[i];
        /* the op's du is the alpha path only; the u -> bx identity of the
         * first site is the caller's (see backend.h) */
        if (!accumulate)
            du[i] += R[i];
    }
    fd_check(&o, "u", GT.u, n, du);
    fd_check(&o, "k", GT.k, n, dk);
    fd_check(&o, "v", GT.v, n, dv);
    if (accumulate) /* d bx0 = dbx: the caller's alias */
        fd_check(&o, "bx_in", GT.bx0, n, R);
    tfree_all();
}

/* ================= hyper coeffs ================= */

static struct {
    int N, n, lane;
    double *pre, *post, *res, *a, *b_pre, *b_post, *b_res; /* a = {a_pre, a_post, a_res} */
} HC;

static double sigm(double x)
{
    return 1 / (1 + exp(-x));
}

static void hc_fwd(double *out)
{
    int N = HC.N, n = HC.n, nn = n * n;
    double *hpre = out, *hpost = out + (size_t)N * n, *M = out + (size_t)2 * N * n;
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < n; i++) {
            double on = i == HC.lane;
            hpre[r * n + i] = sigm(HC.a[0] * HC.pre[r * n + i] + HC.b_pre[i] + 8 * on - 4);
            hpost[r * n + i] = 2 * sigm(HC.a[1] * HC.post[r * n + i] + HC.b_post[i] - 4 * (1 - on));
        }
        double *m = M + (size_t)r * nn;
        for (int i = 0; i < nn; i++)
            m[i] = HC.a[2] * HC.res[r * nn + i] + HC.b_res[i];
        for (int it = 0; it < 20; it++) {
            for (int i = 0; i < n; i++) { /* rows */
                double mx = -INFINITY, s = 0;
                for (int j = 0; j < n; j++)
                    mx = fmax(mx, m[i * n + j]);
                for (int j = 0; j < n; j++)
                    s += exp(m[i * n + j] - mx);
                for (int j = 0; j < n; j++)
                    m[i * n + j] -= mx + log(s);
            }
            for (int j = 0; j < n; j++) { /* columns */
                double mx = -INFINITY, s = 0;
                for (int i = 0; i < n; i++)
                    mx = fmax(mx, m[i * n + j]);
                for (int i = 0; i < n; i++)
                    s += exp(m[i * n + j] - mx);
                for (int i = 0; i < n; i++)
                    m[i * n + j] -= mx + log(s);
            }
        }
        for (int i = 0; i < nn; i++)
            m[i] = exp(m[i]);
    }
}

static void test_hyper_coeffs(int N, int n, int lane)
{
    int nn = n * n;
    float *pre = fvec((long)N * n, 1.0), *post = fvec((long)N * n, 1.0);
    float *res = fvec((long)N * nn, 1.0), *bpre = fvec(n, 1.0), *bpost = fvec(n, 1.0);
    float *bres = fvec(nn, 1.0), a[3] = {0.7f, 1.3f, 0.9f};
    HC.N = N;
    HC.n = n;
    HC.lane = lane;
    HC.pre = dvec(pre, (long)N * n);
    HC.post = dvec(post, (long)N * n);
    HC.res = dvec(res, (long)N * nn);
    HC.a = dvec(a, 3);
    HC.b_pre = dvec(bpre, n);
    HC.b_post = dvec(bpost, n);
    HC.b_res = dvec(bres, nn);
    long nout = (long)N * (2 * n + nn);
    const float *R;
    objective o = obj_new(n == 4 ? "hyper_coeffs(n=4)" : "hyper_coeffs(n=3)", hc_fwd, nout, &R);
    float *out = fzero(nout);
    float *hpre = out, *hpost = out + (long)N * n, *M = out + (long)2 * N * n;
    be->hyper_coeffs(be, hpre, hpost, M, pre, post, res, a[0], a[1], a[2], bpre, bpost, bres, lane,
                     N, n);
    check_ref(&o, out, 1e-5);
    float *dpre = fzero((long)N * n), *dpost = fzero((long)N * n), *dres = fzero((long)N * nn);
    float *da = fzero(3), *dbpre = fzero(n), *dbpost = fzero(n), *dbres = fzero(nn);
    const float *dhpre = R, *dhpost = R + (long)N * n, *dM = R + (long)2 * N * n;
    be->hyper_coeffs_backward(be, dpre, dpost, dres, &da[0], &da[1], &da[2], dbpre, dbpost, dbres,
                              dhpre, dhpost, dM, pre, post, res, hpre, hpost, a[0], a[1], a[2],
                              bres, N, n);
    fd_check(&o, "pre", HC.pre, (long)N * n, dpre);
    fd_check(&o, "post", HC.post, (long)N * n, dpost);
    fd_check(&o, "res", HC.res, (long)N * nn, dres);
    fd_check(&o, "a_*", HC.a, 3, da);
    fd_check(&o, "b_pre", HC.b_pre, n, dbpre);
    fd_check(&o, "b_post", HC.b_post, n, dbpost);
    fd_check(&o, "b_res", HC.b_res, nn, dbres);
    /* twice = double; all-NULL parameter grads leave activations alone */
    float *da2 = fcopy(da, 3), *dbres2 = fcopy(dbres, nn), *dres2 = fzero((long)N * nn);
    be->hyper_coeffs_backward(be, dpre, dpost, dres2, &da2[0], &da2[1], &da2[2], NULL, NULL, dbres2,
                              dhpre, dhpost, dM, pre, post, res, hpre, hpost, a[0], a[1], a[2],
                              bres, N, n);
    for (int i = 0; i < 3; i++)
        CHECK(da2[i] == 2.0f * da[i]);
    for (int i = 0; i < nn; i++)
        CHECK(dbres2[i] == 2.0f * dbres[i]);
    be->hyper_coeffs_backward(be, dpre, dpost, dres2, NULL, NULL, NULL, NULL, NULL, NULL, dhpre,
                              dhpost, dM, pre, post, res, hpre, hpost, a[0], a[1], a[2], bres, N,
                              n);
    CHECK(same_bits(dres, dres2, (long)N * nn));
    tfree_all();
}

/* ================= lanes ================= */

static struct {
    int N, n, d;
    double *h, *X, *M, *y, *x0;
} LN;

static void lc_fwd(double *out)
{
    for (int r = 0; r < LN.N; r++)
        for (int c = 0; c < LN.d; c++) {
            double s = 0;
            for (int i = 0; i < LN.n; i++)
                s += LN.h[r * LN.n + i] * LN.X[((size_t)r * LN.n + i) * LN.d + c];
            out[(size_t)r * LN.d + c] = s;
        }
}

static void lu_fwd(double *out)
{
    int n = LN.n, d = LN.d;
    for (int r = 0; r < LN.N; r++)
        for (int i = 0; i < n; i++)
            for (int c = 0; c < d; c++) {
                double s = LN.h[r * n + i] * LN.y[(size_t)r * d + c];
                for (int j = 0; j < n; j++)
                    s += LN.M[((size_t)r * n + i) * n + j] * LN.X[((size_t)r * n + j) * d + c];
                out[((size_t)r * n + i) * d + c] = s;
            }
}

static void lb_fwd(double *out)
{
    for (int r = 0; r < LN.N; r++)
        for (int i = 0; i < LN.n; i++)
            for (int c = 0; c < LN.d; c++)
                out[((size_t)r * LN.n + i) * LN.d + c] = LN.x0[(size_t)r * LN.d + c];
}

static void lm_fwd(double *out)
{
    for (int r = 0; r < LN.N; r++)
        for (int c = 0; c < LN.d; c++) {
            double s = 0;
            for (int i = 0; i < LN.n; i++)
                s += LN.X[((size_t)r * LN.n + i) * LN.d + c];
            out[(size_t)r * LN.d + c] = s / LN.n;
        }
}

static void test_lanes(int N, int n, int d)
{
    long nX = (long)N * n * d, nh = (long)N * n, nd = (long)N * d;
    float *X = fvec(nX, 1.0), *h = fvec(nh, 1.0), *M = fvec((long)N * n * n, 0.5), *y = fvec(nd, 1);
    LN.N = N;
    LN.n = n;
    LN.d = d;
    LN.X = dvec(X, nX);
    LN.M = dvec(M, (long)N * n * n);
    LN.y = dvec(y, nd);
    LN.x0 = dvec(y, nd);
    const float *R;

    /* combine: u = sum_i h_i X_i; dhpre set, dX += */
    LN.h = dvec(h, nh);
    objective o = obj_new("lanes_combine", lc_fwd, nd, &R);
    float *u = fzero(nd);
    be->lanes_combine(be, u, h, X, N, n, d);
    check_ref(&o, u, 1e-6);
    float *dh = fvec(nh, 1.0), *dX0 = fvec(nX, 1.0), *dX = fcopy(dX0, nX);
    be->lanes_combine_backward(be, dh, dX, R, h, X, N, n, d);
    for (long i = 0; i < nX; i++)
        dX[i] -= dX0[i];
    fd_check(&o, "hpre", LN.h, nh, dh);
    fd_check(&o, "X", LN.X, nX, dX);

    /* update: Xo = M X + hpost y; all set */
    o = obj_new("lanes_update", lu_fwd, nX, &R);
    float *Xo = fzero(nX);
    be->lanes_update(be, Xo, M, X, h, y, N, n, d);
    check_ref(&o, Xo, 1e-6);
    float *dXu = fvec(nX, 1.0), *dM = fvec((long)N * n * n, 1), *dhp = fvec(nh, 1);
    float *dy = fvec(nd, 1.0);
    be->lanes_update_backward(be, dXu, dM, dhp, dy, R, M, X, h, y, N, n, d);
    fd_check(&o, "X", LN.X, nX, dXu);
    fd_check(&o, "M", LN.M, (long)N * n * n, dM);
    fd_check(&o, "hpost", LN.h, nh, dhp);
    fd_check(&o, "y", LN.y, nd, dy);
    float *dXa = fcopy(R, nX); /* dX may alias dXo */
    be->lanes_update_backward(be, dXa, dM, dhp, dy, dXa, M, X, h, y, N, n, d);
    CHECK(same_bits(dXa, dXu, nX));

    /* broadcast: X_i = x0 -> dx0 = sum_i dX_i */
    o = obj_new("lanes_broadcast", lb_fwd, nX, &R);
    float *Xb = fzero(nX);
    be->lanes_broadcast(be, Xb, y, N, n, d);
    check_ref(&o, Xb, 1e-7);
    float *dx0 = fvec(nd, 1.0);
    be->lanes_broadcast_backward(be, dx0, R, N, n, d);
    fd_check(&o, "x0", LN.x0, nd, dx0);

    /* mean */
    o = obj_new("lanes_mean", lm_fwd, nd, &R);
    float *xm = fzero(nd);
    be->lanes_mean(be, xm, X, N, n, d);
    check_ref(&o, xm, 1e-6);
    float *dXm = fvec(nX, 1.0);
    be->lanes_mean_backward(be, dXm, R, N, n, d);
    fd_check(&o, "X", LN.X, nX, dXm);
    tfree_all();
}

/* ================= rope ================= */

static struct {
    int heads, hd;
    const nd_layout *L;
    const float *cs, *sn;
    double *x;
} RP;

static void rp_fwd(double *out)
{
    int half = RP.hd / 2;
    for (long r = 0; r < RP.L->N; r++) {
        int t = seq_rows(RP.L, r, seqbuf) - 1;
        for (int h = 0; h < RP.heads; h++)
            for (int i = 0; i < half; i++) {
                size_t o = ((size_t)r * RP.heads + h) * RP.hd;
                double c = RP.cs[t * half + i], s = RP.sn[t * half + i];
                double x1 = RP.x[o + i], x2 = RP.x[o + i + half];
                out[o + i] = x1 * c - x2 * s;
                out[o + i + half] = x2 * c + x1 * s;
            }
    }
}

static void test_rope(const nd_layout *L)
{
    int heads = 3, hd = 8, T = nd_layout_max_pos(L);
    long n = L->N * heads * hd;
    float *cs = fzero((long)T * hd / 2), *sn = fzero((long)T * hd / 2), *x = fvec(n, 1.0);
    san_rope_tables(cs, sn, T, hd, 100.0); /* small theta: large angles */
    RP.L = L;
    RP.heads = heads;
    RP.hd = hd;
    RP.cs = cs;
    RP.sn = sn;
    RP.x = dvec(x, n);
    const float *R;
    objective o = obj_new("rope", rp_fwd, n, &R);
    float *y = fcopy(x, n);
    be->rope(be, y, cs, sn, L, heads, hd);
    check_ref(&o, y, 1e-6);
    float *dx = fcopy(R, n);
    be->rope_backward(be, dx, cs, sn, L, heads, hd);
    fd_check(&o, "x", RP.x, n, dx);
    tfree_all();
}

/* ================= attention ================= */

static struct {
    int H, G, hd;
    const nd_layout *L;
    double *q, *k, *v;
} AT;

static void at_fwd(double *out)
{
    int H = AT.H, G = AT.G, hd = AT.hd, rep = H / G;
    double *s = malloc(sizeof(double) * 4096), sc = 1 / sqrt((double)hd);
    for (long r = 0; r < AT.L->N; r++) {
        int n = seq_rows(AT.L, r, seqbuf);
        for (int h = 0; h < H; h++) {
            const double *q = AT.q + ((size_t)r * H + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const double *k = AT.k + ((size_t)seqbuf[j] * G + h / rep) * hd;
                double dot = 0;
                for (int i = 0; i < hd; i++)
                    dot += q[i] * k[i];
                s[j] = dot * sc;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < n; j++)
                sum += (s[j] = exp(s[j] - mx));
            double *o = out + ((size_t)r * H + h) * hd;
            for (int i = 0; i < hd; i++)
                o[i] = 0;
            for (int j = 0; j < n; j++) {
                const double *v = AT.v + ((size_t)seqbuf[j] * G + h / rep) * hd;
                for (int i = 0; i < hd; i++)
                    o[i] += s[j] / sum * v[i];
            }
        }
    }
    free(s);
}

static void test_attention(const nd_layout *L, int H, int G, int hd)
{
    long N = L->N, nq = N * H * hd, nk = N * G * hd;
    float *q = fvec(nq, 1.0), *k = fvec(nk, 1.0), *v = fvec(nk, 1.0);
    AT.L = L;
    AT.H = H;
    AT.G = G;
    AT.hd = hd;
    AT.q = dvec(q, nq);
    AT.k = dvec(k, nk);
    AT.v = dvec(v, nk);
    const float *R;
    char name[96];
    snprintf(name, sizeof name, "attention(N=%ld,segs=%d,H=%d,G=%d)", N, L->n_seg, H, G);
    objective o = obj_new(name, at_fwd, nq, &R);
    float *out = fzero(nq), *lse = fzero(N * H);
    be->attention(be, out, lse, q, k, v, L, H, G, hd);
    check_ref(&o, out, 1e-5);
    float *dq = fvec(nq, 1.0), *dk = fvec(nk, 1.0), *dv = fvec(nk, 1.0); /* all set */
    be->attention_backward(be, dq, dk, dv, R, q, k, v, out, lse, L, H, G, hd);
    fd_check(&o, "q", AT.q, nq, dq);
    fd_check(&o, "k", AT.k, nk, dk);
    fd_check(&o, "v", AT.v, nk, dv);
    /* the FD probes are random: also check the last query row, the first
     * key row (read by every query of its sequence) and the rows of the
     * last segment's first key exactly */
    long rowq = (N - 1) * H * hd;
    fd_check(&o, "q[last]", AT.q + rowq, H * hd, dq + rowq);
    fd_check(&o, "k[first]", AT.k, G * hd, dk);
    fd_check(&o, "v[first]", AT.v, G * hd, dv);
    long rk = (long)L->seg[L->n_seg - 1].start * G * hd;
    fd_check(&o, "k[last seg]", AT.k + rk, G * hd, dk + rk);
    /* thread count must not change the prefix's summed gradients */
    const nd_backend *b1 = nd_backend_cpu(1);
    float *dq1 = fzero(nq), *dk1 = fzero(nk), *dv1 = fzero(nk);
    b1->attention_backward(b1, dq1, dk1, dv1, R, q, k, v, out, lse, L, H, G, hd);
    CHECK(same_bits(dk, dk1, nk) && same_bits(dv, dv1, nk) && same_bits(dq, dq1, nq));
    tfree_all();
}

/* ================= gate sigmoid / residual ================= */

static struct {
    long n;
    double *att, *g, *r, *gate;
} EW;

static void gs_fwd(double *out)
{
    for (long i = 0; i < EW.n; i++)
        out[i] = EW.att[i] * sigm(EW.g[i]);
}

static void rs_fwd(double *out)
{
    for (long i = 0; i < EW.n; i++)
        out[i] = sigm(EW.gate[0]) * EW.r[i]; /* + x: constant in f */
}

static void test_elementwise(void)
{
    long n = 20;
    float *att = fvec(n, 1.0), *g = fvec(n, 2.0);
    EW.n = n;
    EW.att = dvec(att, n);
    EW.g = dvec(g, n);
    const float *R;
    objective o = obj_new("gate_sigmoid", gs_fwd, n, &R);
    float *out = fzero(n);
    be->gate_sigmoid(be, out, att, g, n);
    check_ref(&o, out, 1e-6);
    float *datt = fzero(n), *dg = fzero(n), *dal = fcopy(R, n);
    be->gate_sigmoid_backward(be, datt, dg, R, att, g, n);
    fd_check(&o, "att", EW.att, n, datt);
    fd_check(&o, "g", EW.g, n, dg);
    be->gate_sigmoid_backward(be, dal, dg, dal, att, g, n); /* datt may alias dout */
    CHECK(same_bits(dal, datt, n));

    /* residual: n spans several threads and 1024-element blocks */
    n = 3000;
    float *x = fvec(n, 1.0), *r = fvec(n, 1.0), gate = 0.3f;
    EW.n = n;
    EW.r = dvec(r, n);
    EW.gate = dvec(&gate, 1);
    o = obj_new("residual_scaled", rs_fwd, n, &R);
    float *y = fzero(n);
    be->residual_scaled(be, y, x, r, gate, n);
    for (long i = 0; i < n; i++)
        y[i] -= x[i];
    check_ref(&o, y, 1e-6);
    float *dr = fzero(n), *dr2 = fzero(n), dgate = 0.0f, dgate2 = 0.0f;
    be->residual_scaled_backward(be, dr, &dgate, R, r, gate, n);
    fd_check(&o, "r", EW.r, n, dr);
    fd_check(&o, "gate", EW.gate, 1, &dgate);
    be->residual_scaled_backward(be, dr2, NULL, R, r, gate, n);
    CHECK(same_bits(dr, dr2, n));
    be->residual_scaled_backward(be, dr2, &dgate2, R, r, gate, n);
    be->residual_scaled_backward(be, dr2, &dgate2, R, r, gate, n);
    CHECK(dgate2 == 2.0f * dgate);
    float *dra = fcopy(R, n), dgate3 = 0.0f; /* dr may alias dy */
    be->residual_scaled_backward(be, dra, &dgate3, dra, r, gate, n);
    CHECK(same_bits(dra, dr, n) && dgate3 == dgate);
    tfree_all();
}

/* ================= hadamard mlp ================= */

static struct {
    int N, d, hn;
    double *z, *d1, *d2, *d3, scale;
} HM;

static void fwht_d(double *x, int n, double scale)
{
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += h << 1)
            for (int j = i; j < i + h; j++) {
                double a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < n; i++)
        x[i] *= scale;
}

static void hm_fwd(double *out)
{
    int d = HM.d, hn = HM.hn;
    double t[64];
    for (int r = 0; r < HM.N; r++) {
        for (int i = 0; i < hn; i++)
            t[i] = i < d ? HM.d1[i] * HM.z[(size_t)r * d + i] : 0.0;
        fwht_d(t, hn, HM.scale);
        for (int i = 0; i < hn; i++) {
            double s = HM.d2[i] * t[i];
            t[i] = s * sigm(s);
        }
        fwht_d(t, hn, HM.scale);
        for (int i = 0; i < d; i++)
            out[(size_t)r * d + i] = HM.d3[i] * t[i];
    }
}

static void test_hadamard(int N, int d, int hn)
{
    long n = (long)N * d;
    float *z = fvec(n, 1.0), *x = fvec(n, 1.0), *d1 = fvec(hn, 1.0), *d2 = fvec(hn, 1.0);
    float *d3 = fvec(hn, 1.0);
    HM.N = N;
    HM.d = d;
    HM.hn = hn;
    HM.z = dvec(z, n);
    HM.d1 = dvec(d1, hn);
    HM.d2 = dvec(d2, hn);
    HM.d3 = dvec(d3, hn);
    HM.scale = san_walsh_scale(hn);
    const float *R;
    char name[64];
    snprintf(name, sizeof name, "hadamard_mlp(d=%d,hn=%d)", d, hn);
    objective o = obj_new(name, hm_fwd, n, &R);
    float *y = fzero(n), *h1 = fzero((long)N * hn);
    be->hadamard_mlp(be, y, h1, x, z, NULL, d1, d2, d3, N, d, hn);
    for (long i = 0; i < n; i++)
        y[i] -= x[i];
    check_ref(&o, y, 1e-5);
    float *dz = fvec(n, 1.0), *dd1 = fzero(hn), *dd2 = fzero(hn), *dd3 = fzero(hn);
    be->hadamard_mlp_backward(be, dz, dd1, dd2, dd3, R, z, h1, d1, d2, d3, N, d, hn);
    fd_check(&o, "z", HM.z, n, dz);
    fd_check(&o, "d1", HM.d1, hn, dd1);
    fd_check(&o, "d2", HM.d2, hn, dd2);
    fd_check(&o, "d3", HM.d3, hn, dd3);
    float *dz2 = fzero(n), *dd2b = fcopy(dd2, hn);
    be->hadamard_mlp_backward(be, dz2, NULL, dd2b, NULL, R, z, h1, d1, d2, d3, N, d, hn);
    CHECK(same_bits(dz, dz2, n));
    for (int i = 0; i < hn; i++)
        CHECK(dd2b[i] == 2.0f * dd2[i]);
    tfree_all();
}

/* ================= add ================= */

/* be->matmul against a double-precision loop for every transpose pair,
 * beta 0 and 1, padded leading dimensions, and shapes that take each of
 * the CPU backend's paths: one GEMV row, one unsplit call, C split by rows
 * (M >= 128) and by columns (few rows, N >= 128). */
static void test_matmul(void)
{
    static const int shapes[][3] = {{1, 40, 33}, {9, 20, 17}, {300, 24, 70}, {16, 260, 50}};
    double worst = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++) {
                    int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
                    float *A = fvec((long)(ta ? K : M) * lda, 1.0);
                    float *B = fvec((long)(tb ? N : K) * ldb, 1.0);
                    float *C = fvec((long)M * ldc, 1.0), *C0 = fcopy(C, (long)M * ldc);
                    float beta = bi ? 1.0f : 0.0f, alpha = 0.5f;
                    be->matmul(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            double acc = 0;
                            for (int k = 0; k < K; k++)
                                acc += (double)(ta ? A[(long)k * lda + i] : A[(long)i * lda + k]) *
                                       (tb ? B[(long)j * ldb + k] : B[(long)k * ldb + j]);
                            double want = alpha * acc + beta * C0[(long)i * ldc + j];
                            double e = fabs(C[(long)i * ldc + j] - want) / fmax(fabs(want), 1.0);
                            worst = fmax(worst, e);
                        }
                    /* the padding between rows of C is never written */
                    int pad_ok = 1;
                    for (int i = 0; i < M; i++)
                        for (int j = N; j < ldc; j++)
                            pad_ok &= C[(long)i * ldc + j] == C0[(long)i * ldc + j];
                    CHECK_MSG(pad_ok, "matmul %dx%dx%d ta=%d tb=%d wrote past N", M, N, K, ta, tb);
                    tfree_all();
                }
    printf("  matmul (all paths)          max rel err %.2e\n", worst);
    CHECK_MSG(worst < 1e-5, "matmul error %g", worst);
}

static void test_add(void)
{
    long n = 1001;
    float *y = fvec(n, 1.0), *x = fvec(n, 1.0), *y0 = fcopy(y, n);
    be->add(be, y, x, -0.75f, n);
    int ok = 1;
    for (long i = 0; i < n; i++)
        ok &= y[i] == y0[i] + -0.75f * x[i];
    CHECK(ok);
    tfree_all();
}

/* ================= thread-count determinism ================= */

/* Row reductions: same thread count -> same bits; other thread counts
 * agree to rounding. Big enough that every thread gets rows. */
static void test_threads(void)
{
    int N = 997, n = 4, nn = 16, d = 6, hn = 8;
    float *pre = fvec((long)N * n, 1.0), *post = fvec((long)N * n, 1.0);
    float *res = fvec((long)N * nn, 1.0), *bres = fvec(nn, 1.0), *bz = fzero(n);
    float *hpre = fzero((long)N * n), *hpost = fzero((long)N * n), *M = fzero((long)N * nn);
    float *dh = fvec((long)N * n, 1.0), *dM = fvec((long)N * nn, 1.0);
    float *z = fvec((long)N * d, 1.0), *dd = fvec((long)N * d, 1.0), *h1 = fzero((long)N * hn);
    float *y = fzero((long)N * d), *dvec1 = fvec(hn, 1.0), *dvec2 = fvec(hn, 1.0);
    float *dvec3 = fvec(hn, 1.0), *s1 = fzero((long)N * nn);
    float *out[3];
    int counts[3] = {3, 3, 1};
    for (int c = 0; c < 3; c++) {
        const nd_backend *b = nd_backend_cpu(counts[c]);
        float *g = out[c] = fzero(3 + nn + 3 * hn);
        b->hyper_coeffs(b, hpre, hpost, M, pre, post, res, 0.5f, 0.5f, 1.0f, bz, bz, bres, 0, N, n);
        b->hyper_coeffs_backward(b, s1, s1, s1, &g[0], &g[1], &g[2], NULL, NULL, g + 3, dh, dh, dM,
                                 pre, post, res, hpre, hpost, 0.5f, 0.5f, 1.0f, bres, N, n);
        b->hadamard_mlp(b, y, h1, z, z, NULL, dvec1, dvec2, dvec3, N, d, hn);
        b->hadamard_mlp_backward(b, s1, g + 3 + nn, g + 3 + nn + hn, g + 3 + nn + 2 * hn, dd, z, h1,
                                 dvec1, dvec2, dvec3, N, d, hn);
    }
    be = nd_backend_cpu(3);
    int m = 3 + nn + 3 * hn;
    CHECK(same_bits(out[0], out[1], m));
    double e = tu_rel_err(out[2], out[0], m, 1e-3);
    printf("  1 vs 3 threads (hyper_coeffs + hadamard param grads): %.2e\n", e);
    CHECK_MSG(e < 1e-5, "thread count changes reductions by %g", e);
    tfree_all();
}

/* ================= Needle 3: attention_ext, qkv_taps, gate_heads ================= */

static struct {
    int H, G, hd, vd, window;
    const nd_layout *L;
    double *q, *k, *v;
} AX;

/* keys of the row's sequence at positions j with pos - j < window */
static void ax_fwd(double *out)
{
    int H = AX.H, G = AX.G, hd = AX.hd, vd = AX.vd, rep = H / G;
    double *s = malloc(sizeof(double) * 4096), sc = 1 / sqrt((double)hd);
    for (long r = 0; r < AX.L->N; r++) {
        int n = seq_rows(AX.L, r, seqbuf);
        int lo = AX.window && n - AX.window > 0 ? n - AX.window : 0;
        for (int h = 0; h < H; h++) {
            const double *q = AX.q + ((size_t)r * H + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = lo; j < n; j++) {
                const double *k = AX.k + ((size_t)seqbuf[j] * G + h / rep) * hd;
                double dot = 0;
                for (int i = 0; i < hd; i++)
                    dot += q[i] * k[i];
                s[j] = dot * sc;
                mx = fmax(mx, s[j]);
            }
            for (int j = lo; j < n; j++)
                sum += (s[j] = exp(s[j] - mx));
            double *o = out + ((size_t)r * H + h) * vd;
            for (int i = 0; i < vd; i++)
                o[i] = 0;
            for (int j = lo; j < n; j++) {
                const double *v = AX.v + ((size_t)seqbuf[j] * G + h / rep) * vd;
                for (int i = 0; i < vd; i++)
                    o[i] += s[j] / sum * v[i];
            }
        }
    }
    free(s);
}

static void test_attention_ext(const nd_layout *L, int H, int G, int hd, int vd, int window)
{
    long N = L->N, nq = N * H * hd, nk = N * G * hd, nv = N * G * vd, no = N * H * vd;
    float *q = fvec(nq, 1.0), *k = fvec(nk, 1.0), *v = fvec(nv, 1.0);
    AX.L = L;
    AX.H = H;
    AX.G = G;
    AX.hd = hd;
    AX.vd = vd;
    AX.window = window;
    AX.q = dvec(q, nq);
    AX.k = dvec(k, nk);
    AX.v = dvec(v, nv);
    const float *R;
    char name[96];
    snprintf(name, sizeof name, "attention_ext(N=%ld,segs=%d,hd=%d,vd=%d,w=%d)", N, L->n_seg, hd,
             vd, window);
    objective o = obj_new(name, ax_fwd, no, &R);
    float *out = fzero(no), *lse = fzero(N * H);
    be->attention_ext(be, out, lse, q, k, v, L, H, G, hd, vd, window);
    check_ref(&o, out, 1e-5);
    float *dq = fvec(nq, 1.0), *dk = fvec(nk, 1.0), *dv = fvec(nv, 1.0); /* all set */
    be->attention_ext_backward(be, dq, dk, dv, R, q, k, v, out, lse, L, H, G, hd, vd, window);
    fd_check(&o, "q", AX.q, nq, dq);
    fd_check(&o, "k", AX.k, nk, dk);
    fd_check(&o, "v", AX.v, nv, dv);
    long rowq = (N - 1) * H * hd;
    fd_check(&o, "q[last]", AX.q + rowq, H * hd, dq + rowq);
    fd_check(&o, "k[first]", AX.k, G * hd, dk);
    fd_check(&o, "v[first]", AX.v, G * vd, dv);
    const nd_backend *b1 = nd_backend_cpu(1);
    float *dq1 = fzero(nq), *dk1 = fzero(nk), *dv1 = fzero(nv);
    b1->attention_ext_backward(b1, dq1, dk1, dv1, R, q, k, v, out, lse, L, H, G, hd, vd, window);
    CHECK(same_bits(dk, dk1, nk) && same_bits(dv, dv1, nv) && same_bits(dq, dq1, nq));
    if (hd == vd && !window) { /* the same function as attention */
        float *o2 = fzero(no), *l2 = fzero(N * H);
        be->attention(be, o2, l2, q, k, v, L, H, G, hd);
        CHECK(same_bits(o2, out, no) && same_bits(l2, lse, N * H));
    }
    tfree_all();
}

static struct {
    int w, nt, window;
    const nd_layout *L;
    double *x, *taps;
} QT;

static void qt_fwd(double *out)
{
    int w = QT.w;
    for (long r = 0; r < QT.L->N; r++) {
        int n = seq_rows(QT.L, r, seqbuf);
        double *y = out + (size_t)r * w;
        for (int i = 0; i < w; i++)
            y[i] = 0;
        for (int j = 0; j < QT.nt; j++) {
            if (n - 1 - j < 0 || (QT.window && j >= QT.window))
                continue;
            const double *x = QT.x + (size_t)seqbuf[n - 1 - j] * w;
            for (int i = 0; i < w; i++)
                y[i] += QT.taps[(size_t)j * w + i] * x[i];
        }
    }
}

static void test_qkv_taps(const nd_layout *L, int w, int nt, int window)
{
    long N = L->N, n = N * w;
    float *x = fvec(n, 1.0), *taps = fvec((long)nt * w, 1.0);
    QT.L = L;
    QT.w = w;
    QT.nt = nt;
    QT.window = window;
    QT.x = dvec(x, n);
    QT.taps = dvec(taps, (long)nt * w);
    const float *R;
    char name[96];
    snprintf(name, sizeof name, "qkv_taps(N=%ld,segs=%d,taps=%d,w=%d)", N, L->n_seg, nt, window);
    objective o = obj_new(name, qt_fwd, n, &R);
    float *y = fzero(n);
    be->qkv_taps(be, y, x, taps, L, w, nt, window);
    check_ref(&o, y, 1e-6);
    float *dx = fvec(n, 1.0), *dt = fzero((long)nt * w);
    be->qkv_taps_backward(be, dx, dt, R, x, taps, L, w, nt, window);
    fd_check(&o, "x", QT.x, n, dx);
    fd_check(&o, "taps", QT.taps, (long)nt * w, dt);
    /* dtaps accumulates; NULL dtaps leaves dx the same */
    float *dt2 = fcopy(dt, (long)nt * w), *dx2 = fzero(n);
    be->qkv_taps_backward(be, dx2, dt2, R, x, taps, L, w, nt, window);
    int acc_ok = 1;
    for (long i = 0; i < (long)nt * w; i++)
        acc_ok &= fabsf(dt2[i] - 2 * dt[i]) <= 1e-5f * (1 + fabsf(dt[i]));
    CHECK_MSG(acc_ok, "qkv_taps_backward: dtaps does not accumulate");
    float *dx3 = fzero(n);
    be->qkv_taps_backward(be, dx3, NULL, R, x, taps, L, w, nt, window);
    CHECK(same_bits(dx3, dx, n));
    tfree_all();
}

static struct {
    long N;
    int H, hd;
    double *att, *g;
} GH;

static void gh_fwd(double *out)
{
    for (long r = 0; r < GH.N; r++)
        for (int h = 0; h < GH.H; h++) {
            double s = 1 / (1 + exp(-GH.g[r * GH.H + h]));
            for (int i = 0; i < GH.hd; i++) {
                size_t k = ((size_t)r * GH.H + h) * GH.hd + i;
                out[k] = GH.att[k] * s;
            }
        }
}

static void test_gate_heads(long N, int H, int hd)
{
    long n = N * H * hd;
    float *att = fvec(n, 1.0), *g = fvec(N * H, 2.0);
    GH.N = N;
    GH.H = H;
    GH.hd = hd;
    GH.att = dvec(att, n);
    GH.g = dvec(g, N * H);
    const float *R;
    objective o = obj_new("gate_heads", gh_fwd, n, &R);
    float *y = fzero(n);
    be->gate_heads(be, y, att, g, N, H, hd);
    check_ref(&o, y, 1e-6);
    float *datt = fzero(n), *dg = fzero(N * H);
    be->gate_heads_backward(be, datt, dg, R, att, g, N, H, hd);
    fd_check(&o, "att", GH.att, n, datt);
    fd_check(&o, "g", GH.g, N * H, dg);
    /* datt may alias dout */
    float *alias = fcopy(R, n), *dg2 = fzero(N * H);
    be->gate_heads_backward(be, alias, dg2, alias, att, g, N, H, hd);
    CHECK(same_bits(alias, datt, n) && same_bits(dg2, dg, N * H));
    tfree_all();
}

int main(void)
{
    nd_rng_seed(&rng, 20240607);
    be = nd_backend_cpu(3); /* uneven row splits even on small machines */
    printf("finite-difference checks (max elem err = max |a-n| / max(|a|,|n|,1e-3)):\n");
    test_cross_entropy(37);
    test_cross_entropy(600);
    test_rmsnorm_case(7, 12, 1);
    test_rmsnorm_case(5, 9, 0);
    test_rmsnorm_case(3, 75, 1); /* dot products past their 32 partial sums */
    test_rmsnorm_reduction();
    test_embed();
    static const int kids[4] = {1, 66, 5, 12};
    test_engram_gather(make_layout(0, 2, 7, 0, NULL, 0));
    test_engram_gather(make_layout(1, 0, 4, 6, kids, 4));
    test_engram_gather(make_layout(1, 0, 3, 1, kids, 1)); /* a one-row prefix */
    test_engram_taps(make_layout(0, 2, 11, 0, NULL, 0));
    test_engram_taps(make_layout(1, 0, 4, 13, kids, 4));
    test_engram_taps(make_layout(1, 0, 2, 2, kids + 2, 2)); /* prefix shorter than the taps */
    test_engram_gate(0);
    test_engram_gate(1);
    test_hyper_coeffs(3, 4, 1);
    test_hyper_coeffs(2, 3, 2);
    /* lanes_update_backward has an unrolled path for n = 4, a runtime-n one
     * up to 8 lanes and a generic one beyond; d covers full column chunks
     * of 16 and a partial one */
    test_lanes(3, 4, 5);
    test_lanes(2, 4, 37);
    test_lanes(2, 3, 20);
    test_lanes(2, 9, 18);
    test_rope(make_layout(0, 2, 5, 0, NULL, 0));
    test_rope(make_layout(1, 0, 3, 4, kids + 2, 2));
    test_attention(make_layout(0, 2, 80, 0, NULL, 0), 4, 2, 8);
    test_attention(make_layout(0, 1, 3, 0, NULL, 0), 2, 1, 4);
    /* a prefix longer than a query block, children of 1, 66 (two blocks),
     * 5 and 12 rows, and a standalone sequence */
    test_attention(make_layout(1, 0, 9, 70, kids, 4), 4, 2, 8);
    /* Needle 3: separate head dims, sliding windows (inside a query
     * block, across a prefix, wider than the sequence) */
    test_attention_ext(make_layout(0, 2, 80, 0, NULL, 0), 4, 2, 8, 6, 5);
    test_attention_ext(make_layout(0, 1, 3, 0, NULL, 0), 2, 1, 4, 4, 0);
    test_attention_ext(make_layout(1, 0, 9, 70, kids, 4), 4, 2, 6, 10, 7);
    test_attention_ext(make_layout(1, 0, 9, 70, kids, 4), 4, 4, 8, 8, 100);
    /* a sequence of four query blocks and a window of 70: blocks whose keys
     * start inside the sequence, not at a block boundary */
    test_attention_ext(make_layout(0, 1, 200, 0, NULL, 0), 2, 1, 4, 6, 70);
    test_qkv_taps(make_layout(0, 2, 11, 0, NULL, 0), 13, 3, 0);
    test_qkv_taps(make_layout(0, 2, 11, 0, NULL, 0), 13, 3, 2);
    test_qkv_taps(make_layout(1, 0, 4, 13, kids, 4), 70, 3, 0);
    test_qkv_taps(make_layout(1, 0, 2, 2, kids + 2, 2), 5, 4, 1);
    test_gate_heads(7, 3, 5);
    test_elementwise();
    test_hadamard(4, 6, 8);
    test_hadamard(3, 12, 16);
    test_add();
    test_matmul();
    test_threads();
    nd_layout_buf_free(&layb);
    printf("worst FD error over all checks: %.2e\n", worst_err);
    return tu_finish("test_grad_ops");
}
