/* Needle 3's Hadamard MLP (src/model/hada3.c) against a plain double
 * reference written here: every factor pair as the full n x n operator
 * (kron(wa, wb) for shared, the block_untied coefficients wa[j,i,k] wb[k,j,l]
 * otherwise) multiplied row by row.
 *
 * - forward: shared and block_untied, d a power of two or not (padding),
 *   split permutations or not, against the reference;
 * - backward: dx and every weight gradient against central differences of
 *   the double reference (loss = sum(y * R)); accumulation (+=), frozen
 *   weights (gw NULL), saved NULL (recomputed);
 * - permutations: numpy RandomState(s).permutation(n) values quoted from
 *   numpy 1.24 (tests/test_hada3_numpy.py compares many more directly).
 *
 * `test_hada3 DEVICE` runs the checks on another backend (vulkan:0, cuda;
 * exit 77 when it is absent). Modes for tests/test_hada3_numpy.py:
 *   test_hada3 perm SEED N        one line: RandomState(SEED).permutation(N)
 *   test_hada3 geom D SPLIT       n ba bb, then perm1 and perm2 lines
 *   test_hada3 dump FILE D UNTIED SPLIT N SEED
 *       int32 d n ba bb untied split N, then float32 x, w1a, w1b, w2a, w2b,
 *       w3a, w3b, d1, d2, b2, d3, d4, cond_v, cond_u, y (our forward) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/np_random.h"
#include "core/rng.h"
#include "core/status.h"
#include "model/hada3.h"
#include "testutil.h"

enum {
    T_X,
    T_W1A,
    T_W1B,
    T_W2A,
    T_W2B,
    T_W3A,
    T_W3B,
    T_D1,
    T_D2,
    T_B2,
    T_D3,
    T_D4,
    T_CV,
    T_CU,
    T_N
};
static const char *tname[T_N] = {"x",  "w1a", "w1b", "w2a", "w2b", "w3a",    "w3b",
                                 "d1", "d2",  "b2",  "d3",  "d4",  "cond_v", "cond_u"};

typedef struct {
    san_hada3_geom g;
    long N;
    size_t off[T_N + 1]; /* tensor t is P[off[t] .. off[t+1]) */
    double *P;           /* every tensor, x first */
} prob;

static void *xmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_hada3: out of memory\n");
        exit(2);
    }
    return p;
}

static int prob_init(prob *pr, int d, int untied, int split, long N, uint64_t seed)
{
    memset(pr, 0, sizeof *pr);
    int rc = san_hada3_geom_init(&pr->g, d, untied, split);
    if (rc != ND_OK)
        return rc;
    const san_hada3_geom *g = &pr->g;
    size_t n = (size_t)g->n, ba = (size_t)g->ba, bb = (size_t)g->bb;
    size_t len[T_N];
    len[T_X] = (size_t)N * (size_t)d;
    for (int s = 0; s < 3; s++) {
        len[T_W1A + 2 * s] = untied ? bb * ba * ba : ba * ba;
        len[T_W1B + 2 * s] = untied ? ba * bb * bb : bb * bb;
    }
    len[T_D1] = len[T_D2] = len[T_B2] = len[T_D3] = len[T_D4] = n;
    len[T_CV] = (size_t)d * SAN_HADA3_COND_RANK;
    len[T_CU] = SAN_HADA3_COND_RANK * n;
    pr->off[0] = 0;
    for (int t = 0; t < T_N; t++)
        pr->off[t + 1] = pr->off[t] + len[t];
    pr->N = N;
    pr->P = xmalloc(sizeof(double) * pr->off[T_N]);
    nd_rng r;
    nd_rng_seed(&r, seed);
    for (int t = 0; t < T_N; t++) {
        /* factor entries ~ 1/sqrt(block) keep the products O(1) */
        double sc = 1.0;
        if (t >= T_W1A && t <= T_W3B)
            sc = 1.0 / sqrt((double)((t - T_W1A) % 2 == 0 ? ba : bb));
        for (size_t i = pr->off[t]; i < pr->off[t + 1]; i++) {
            double v = nd_rng_normal(&r) * sc;
            if (t == T_D1 || t == T_D2 || t == T_D3)
                v = 1.0 + 0.3 * v;
            else if (t == T_B2 || t == T_D4)
                v *= 0.5;
            pr->P[i] = v;
        }
    }
    return ND_OK;
}

static void prob_free(prob *pr)
{
    san_hada3_geom_free(&pr->g);
    free(pr->P);
}

/* ---- the double reference ---- */

/* op[(i*bb+j)*n + k*bb+l]: the coefficient of input feature (i,j) in output (k,l) */
static void dense_op(const san_hada3_geom *g, const double *wa, const double *wb, double *op)
{
    int n = g->n, ba = g->ba, bb = g->bb;
    for (int i = 0; i < ba; i++)
        for (int j = 0; j < bb; j++)
            for (int k = 0; k < ba; k++)
                for (int l = 0; l < bb; l++) {
                    double a = g->untied ? wa[((size_t)j * ba + i) * ba + k] : wa[i * ba + k];
                    double b = g->untied ? wb[((size_t)k * bb + j) * bb + l] : wb[j * bb + l];
                    op[(size_t)(i * bb + j) * n + (k * bb + l)] = a * b;
                }
}

static void vec_op(const double *z, const double *op, int n, double *out)
{
    for (int o = 0; o < n; o++)
        out[o] = 0.0;
    for (int m = 0; m < n; m++)
        for (int o = 0; o < n; o++)
            out[o] += z[m] * op[(size_t)m * n + o];
}

/* y [N, d] = HadamardMLP(x) in double */
static void ref_forward(const prob *pr, const double *P, double *y)
{
    const san_hada3_geom *g = &pr->g;
    int n = g->n, d = g->d, R = SAN_HADA3_COND_RANK;
    double *ops = xmalloc(sizeof(double) * 3 * (size_t)n * n);
    for (int s = 0; s < 3; s++)
        dense_op(g, P + pr->off[T_W1A + 2 * s], P + pr->off[T_W1B + 2 * s],
                 ops + (size_t)s * n * n);
    double *z = xmalloc(sizeof(double) * n), *t = xmalloc(sizeof(double) * n),
           *cond = xmalloc(sizeof(double) * n);
    const double *d1 = P + pr->off[T_D1], *d2 = P + pr->off[T_D2], *b2 = P + pr->off[T_B2],
                 *d3 = P + pr->off[T_D3], *d4 = P + pr->off[T_D4], *cv = P + pr->off[T_CV],
                 *cu = P + pr->off[T_CU];
    for (long r = 0; r < pr->N; r++) {
        const double *x = P + pr->off[T_X] + r * d;
        double lg[SAN_HADA3_COND_RANK], mx = -INFINITY, sum = 0.0;
        for (int q = 0; q < R; q++) {
            lg[q] = 0.0;
            for (int k = 0; k < d; k++)
                lg[q] += x[k] * cv[k * R + q];
            mx = lg[q] > mx ? lg[q] : mx;
        }
        for (int q = 0; q < R; q++)
            sum += (lg[q] = exp(lg[q] - mx));
        for (int m = 0; m < n; m++) {
            cond[m] = 1.0;
            for (int q = 0; q < R; q++)
                cond[m] += lg[q] / sum * cu[q * n + m];
        }
        for (int m = 0; m < n; m++)
            z[m] = d1[m] * (m < d ? x[m] : 0.0);
        vec_op(z, ops, n, t);
        for (int m = 0; m < n; m++) {
            double h = d2[m] * cond[m] * t[g->perm1[m]] + b2[m];
            z[m] = h / (1.0 + exp(-h));
        }
        vec_op(z, ops + (size_t)n * n, n, t);
        for (int m = 0; m < n; m++)
            z[m] = d3[m] * t[g->perm2[m]];
        vec_op(z, ops + 2 * (size_t)n * n, n, t);
        for (int m = 0; m < d; m++)
            y[r * d + m] = d4[m] * t[m];
    }
    free(ops);
    free(z);
    free(t);
    free(cond);
}

/* ---- the module under test ---- */

static const nd_backend *be;

/* memory handed to the module: the backend's (a device backend's ops write
 * only there); filled and read on the host, which the module's sync allows */
static float *balloc(size_t n)
{
    float *p = be->alloc(be, sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "test_hada3: out of backend memory\n");
        exit(2);
    }
    return p;
}

static void bfree(void *p)
{
    be->free(be, p);
}

typedef struct {
    float *f; /* float copies of every tensor, same offsets */
    san_hada3_w w;
} fparams;

static void to_float(const prob *pr, fparams *fp)
{
    fp->f = balloc(pr->off[T_N]);
    for (size_t i = 0; i < pr->off[T_N]; i++)
        fp->f[i] = (float)pr->P[i];
    const float *b = fp->f;
    fp->w = (san_hada3_w){b + pr->off[T_W1A], b + pr->off[T_W1B], b + pr->off[T_W2A],
                          b + pr->off[T_W2B], b + pr->off[T_W3A], b + pr->off[T_W3B],
                          b + pr->off[T_D1],  b + pr->off[T_D2],  b + pr->off[T_B2],
                          b + pr->off[T_D3],  b + pr->off[T_D4],  b + pr->off[T_CV],
                          b + pr->off[T_CU]};
}

static san_hada3_grad grad_view(const prob *pr, float *G)
{
    return (san_hada3_grad){G + pr->off[T_W1A], G + pr->off[T_W1B], G + pr->off[T_W2A],
                            G + pr->off[T_W2B], G + pr->off[T_W3A], G + pr->off[T_W3B],
                            G + pr->off[T_D1],  G + pr->off[T_D2],  G + pr->off[T_B2],
                            G + pr->off[T_D3],  G + pr->off[T_D4],  G + pr->off[T_CV],
                            G + pr->off[T_CU]};
}

static double max_abs_d(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

static void check_forward(int d, int untied, int split, long N)
{
    prob pr;
    CHECK(prob_init(&pr, d, untied, split, N, 1000 + (uint64_t)d * 7 + untied * 3 + split) ==
          ND_OK);
    fparams fp;
    to_float(&pr, &fp);
    size_t nd = (size_t)N * d;
    double *yr = xmalloc(sizeof(double) * nd);
    float *y = balloc(nd), *y2 = balloc(nd);
    float *saved = balloc((size_t)N * san_hada3_saved_per_row(&pr.g));
    ref_forward(&pr, pr.P, yr);
    CHECK(san_hada3_forward(be, &pr.g, &fp.w, fp.f + pr.off[T_X], N, y, saved) == ND_OK);
    CHECK(san_hada3_forward(be, &pr.g, &fp.w, fp.f + pr.off[T_X], N, y2, NULL) == ND_OK);
    double scale = max_abs_d(yr, nd), err = 0.0;
    for (size_t i = 0; i < nd; i++)
        err = fmax(err, fabs((double)y[i] - yr[i]));
    err /= scale;
    CHECK_MSG(err < 2e-5 && scale > 1e-3,
              "forward d %d (n %d ba %d bb %d) %s%s: rel err %.3g (max |y| %.3g)", d, pr.g.n,
              pr.g.ba, pr.g.bb, untied ? "block_untied" : "shared", split ? " split" : "", err,
              scale);
    CHECK_MSG(!memcmp(y, y2, sizeof(float) * nd), "forward with and without saved differ");
    printf("forward  d %4d n %4d (%2d x %2d) %-12s %-5s rel err %.2e\n", d, pr.g.n, pr.g.ba,
           pr.g.bb, untied ? "block_untied" : "shared", split ? "split" : "", err);
    free(yr);
    bfree(y);
    bfree(y2);
    bfree(saved);
    bfree(fp.f);
    prob_free(&pr);
}

/* loss(P) = sum(ref_forward(P) * R) */
static double ref_loss(const prob *pr, const double *P, const double *R, double *y)
{
    ref_forward(pr, P, y);
    double s = 0.0;
    for (long i = 0; i < pr->N * pr->g.d; i++)
        s += y[i] * R[i];
    return s;
}

static void check_backward(int d, int untied, int split, long N)
{
    prob pr;
    CHECK(prob_init(&pr, d, untied, split, N, 2000 + (uint64_t)d * 7 + untied * 3 + split) ==
          ND_OK);
    fparams fp;
    to_float(&pr, &fp);
    /* the forward in double at the float-rounded point, so FD and the float
     * backward see the same function */
    for (size_t i = 0; i < pr.off[T_N]; i++)
        pr.P[i] = (double)fp.f[i];
    size_t nd = (size_t)N * d, np = pr.off[T_N];
    nd_rng r;
    nd_rng_seed(&r, 77 + (uint64_t)d);
    double *R = xmalloc(sizeof(double) * nd), *yb = xmalloc(sizeof(double) * nd);
    float *dy = balloc(nd), *y = balloc(nd);
    for (size_t i = 0; i < nd; i++)
        dy[i] = (float)(R[i] = nd_rng_normal(&r));
    float *saved = balloc((size_t)N * san_hada3_saved_per_row(&pr.g));
    CHECK(san_hada3_forward(be, &pr.g, &fp.w, fp.f + pr.off[T_X], N, y, saved) == ND_OK);
    /* gradients land in G at the tensors' offsets (dx at x's): pre-filled
     * with 0.25 to check that they accumulate */
    float *G = balloc(np), *dx2 = balloc(nd), *dx3 = balloc(nd);
    float *G3 = balloc(np);
    for (size_t i = 0; i < np; i++)
        G[i] = G3[i] = 0.25f;
    san_hada3_grad gw = grad_view(&pr, G), gw3 = grad_view(&pr, G3);
    float *dx = G + pr.off[T_X];
    const float *x = fp.f + pr.off[T_X];
    CHECK(san_hada3_backward(be, &pr.g, &fp.w, x, N, saved, dy, dx, &gw) == ND_OK);
    CHECK(san_hada3_backward(be, &pr.g, &fp.w, x, N, NULL, dy, dx2, NULL) == ND_OK);
    CHECK(san_hada3_backward(be, &pr.g, &fp.w, x, N, NULL, dy, dx3, &gw3) == ND_OK);
    CHECK_MSG(!memcmp(dx, dx2, sizeof(float) * nd), "dx with frozen weights differs");
    CHECK_MSG(!memcmp(dx, dx3, sizeof(float) * nd), "dx without saved differs");
    CHECK_MSG(!memcmp(G + pr.off[T_W1A], G3 + pr.off[T_W1A], sizeof(float) * (np - pr.off[T_W1A])),
              "weight gradients without saved differ");
    double worst = 0.0;
    for (int t = 0; t < T_N; t++) {
        size_t n = pr.off[t + 1] - pr.off[t];
        double *num = xmalloc(sizeof(double) * n);
        for (size_t i = 0; i < n; i++) {
            double *p = pr.P + pr.off[t] + i, keep = *p, h = 1e-5 * fmax(1.0, fabs(keep));
            *p = keep + h;
            double lp = ref_loss(&pr, pr.P, R, yb);
            *p = keep - h;
            double lm = ref_loss(&pr, pr.P, R, yb);
            *p = keep;
            num[i] = (lp - lm) / (2 * h);
        }
        double sc = max_abs_d(num, n), err = 0.0;
        for (size_t i = 0; i < n; i++) {
            double an = (double)G[pr.off[t] + i] - (t == T_X ? 0.0 : 0.25);
            err = fmax(err, fabs(an - num[i]));
        }
        err /= fmax(sc, 1e-6);
        worst = fmax(worst, err);
        CHECK_MSG(err < 2e-4 && sc > 1e-6, "backward d %d %s%s: d%s rel err %.3g (max %.3g)", d,
                  untied ? "block_untied" : "shared", split ? " split" : "", tname[t], err, sc);
        free(num);
    }
    printf("backward d %4d n %4d (%2d x %2d) %-12s %-5s worst rel err %.2e\n", d, pr.g.n, pr.g.ba,
           pr.g.bb, untied ? "block_untied" : "shared", split ? "split" : "", worst);
    free(R);
    free(yb);
    bfree(dy);
    bfree(y);
    bfree(saved);
    bfree(G);
    bfree(G3);
    bfree(dx2);
    bfree(dx3);
    bfree(fp.f);
    prob_free(&pr);
}

/* One forward and two backwards (saved with weight gradients; recomputed,
 * frozen) of the first N rows of pr's x: y, saved, dx, G (dx at x's
 * offset, weight gradients from 0), dx2. */
typedef struct {
    float *y, *saved, *G, *dx2;
} run_out;

static void run_fb(prob *pr, const fparams *fp, long N, const float *dy, run_out *o)
{
    size_t nd = (size_t)N * pr->g.d, np = pr->off[T_N];
    o->y = balloc(nd);
    o->saved = balloc((size_t)N * san_hada3_saved_per_row(&pr->g));
    o->G = balloc(np);
    o->dx2 = balloc(nd);
    san_hada3_grad gw = grad_view(pr, o->G);
    const float *x = fp->f + pr->off[T_X];
    CHECK(san_hada3_forward(be, &pr->g, &fp->w, x, N, o->y, o->saved) == ND_OK);
    CHECK(san_hada3_backward(be, &pr->g, &fp->w, x, N, o->saved, dy, o->G + pr->off[T_X], &gw) ==
          ND_OK);
    CHECK(san_hada3_backward(be, &pr->g, &fp->w, x, N, NULL, dy, o->dx2, NULL) == ND_OK);
}

static void run_free(run_out *o)
{
    bfree(o->y);
    bfree(o->saved);
    bfree(o->G);
    bfree(o->dx2);
}

/* san_hada3_keep_scratch: calls that reuse the kept scratch (grown for
 * more rows, then reused, stale, by fewer) give the same bits as calls
 * that allocate their own, forward and backward. */
static void check_kept_scratch(int d, int untied)
{
    enum { NS = 12, NB = 40 }; /* both above the mix op's few-row path */
    prob pr;
    CHECK(prob_init(&pr, d, untied, 1, NB, 3000 + (uint64_t)d + untied) == ND_OK);
    fparams fp;
    to_float(&pr, &fp);
    nd_rng r;
    nd_rng_seed(&r, 5);
    float *dy = balloc((size_t)NB * d);
    for (long i = 0; i < (long)NB * d; i++)
        dy[i] = (float)nd_rng_normal(&r);
    size_t np = pr.off[T_N], ps = san_hada3_saved_per_row(&pr.g);
    run_out ref[2];
    const long rows[3] = {NS, NB, NS};
    for (int i = 0; i < 2; i++)
        run_fb(&pr, &fp, rows[i], dy, &ref[i]);
    CHECK(san_hada3_scratch_floats(&pr.g) == 0);
    CHECK(san_hada3_keep_scratch(&pr.g, be) == ND_OK);
    CHECK(san_hada3_keep_scratch(&pr.g, be) == ND_OK); /* again: a no-op */
    for (int k = 0; k < 3; k++) {
        long N = rows[k];
        const run_out *R = &ref[N == NB];
        run_out o;
        run_fb(&pr, &fp, N, dy, &o);
        size_t nd = (size_t)N * d;
        CHECK_MSG(!memcmp(o.y, R->y, sizeof(float) * nd) &&
                      !memcmp(o.saved, R->saved, sizeof(float) * (size_t)N * ps),
                  "kept scratch d %d %s, call %d (%ld rows): forward differs", d,
                  untied ? "block_untied" : "shared", k, N);
        CHECK_MSG(!memcmp(o.G + pr.off[T_X], R->G + pr.off[T_X], sizeof(float) * nd) &&
                      !memcmp(o.G + pr.off[T_W1A], R->G + pr.off[T_W1A],
                              sizeof(float) * (np - pr.off[T_W1A])) &&
                      !memcmp(o.dx2, R->dx2, sizeof(float) * nd),
                  "kept scratch d %d %s, call %d (%ld rows): backward differs", d,
                  untied ? "block_untied" : "shared", k, N);
        /* kept at the largest call's size: 4 N n + 8 N floats */
        size_t want = (size_t)NB * (4 * (size_t)pr.g.n + SAN_HADA3_COND_RANK);
        CHECK_MSG(san_hada3_scratch_floats(&pr.g) == (k ? want : (size_t)NS * (want / NB)),
                  "kept scratch after call %d: %zu floats", k, san_hada3_scratch_floats(&pr.g));
        run_free(&o);
    }
    printf("kept scratch d %d n %d %s: same bits as per-call scratch\n", d, pr.g.n,
           untied ? "block_untied" : "shared");
    for (int i = 0; i < 2; i++)
        run_free(&ref[i]);
    bfree(dy);
    bfree(fp.f);
    prob_free(&pr); /* frees the kept scratch too (ASan: no leak) */
}

static void check_geometry(void)
{
    /* n, ba, bb of upstream's _hada_blocks for a few d */
    static const int cases[][4] = {{1, 1, 1, 1},      {2, 2, 1, 2},        {3, 4, 2, 2},
                                   {12, 16, 4, 4},    {24, 32, 4, 8},      {32, 32, 4, 8},
                                   {100, 128, 8, 16}, {768, 1024, 32, 32}, {1000, 1024, 32, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        san_hada3_geom g;
        CHECK(san_hada3_geom_init(&g, cases[c][0], 0, 0) == ND_OK);
        CHECK_MSG(g.n == cases[c][1] && g.ba == cases[c][2] && g.bb == cases[c][3],
                  "d %d: n %d ba %d bb %d", cases[c][0], g.n, g.ba, g.bb);
        san_hada3_geom_free(&g);
    }
    san_hada3_geom g;
    CHECK(san_hada3_geom_init(&g, 0, 0, 0) == ND_EARG);
    CHECK(san_hada3_geom_init(&g, 8, 2, 0) == ND_EARG);
    /* numpy 1.24: RandomState(11).permutation(16), RandomState(13).permutation(8) */
    static const int32_t p11[16] = {8, 3, 6, 10, 15, 4, 5, 14, 2, 13, 12, 7, 1, 11, 0, 9};
    static const int32_t p13[8] = {1, 4, 3, 5, 6, 7, 0, 2};
    CHECK(san_hada3_geom_init(&g, 16, 0, 0) == ND_OK);
    CHECK(!memcmp(g.perm1, p11, sizeof p11));
    san_hada3_geom_free(&g);
    CHECK(san_hada3_geom_init(&g, 8, 1, 0) == ND_OK);
    CHECK(!memcmp(g.perm2, p13, sizeof p13));
    san_hada3_geom_free(&g);
    /* split halves are permutations of their own half */
    CHECK(san_hada3_geom_init(&g, 700, 0, 1) == ND_OK);
    int seen[1024] = {0};
    for (int m = 0; m < g.n; m++) {
        int half = m >= g.n / 2;
        CHECK(g.perm1[m] >= half * g.n / 2 && g.perm1[m] < (half + 1) * g.n / 2);
        seen[g.perm1[m]]++;
    }
    for (int m = 0; m < g.n; m++)
        CHECK(seen[m] == 1);
    san_hada3_geom_free(&g);
}

/* ---- modes for tests/test_hada3_numpy.py ---- */

static int mode_perm(long seed, long n)
{
    if (seed < 0 || seed > 0xffffffffL || n < 0 || n > (1L << 24))
        return 2;
    int32_t *p = xmalloc(sizeof(int32_t) * (size_t)n);
    nd_np_random rs;
    nd_np_random_seed(&rs, (uint32_t)seed);
    nd_np_random_permutation(&rs, p, (int32_t)n);
    for (long i = 0; i < n; i++)
        printf("%s%d", i ? " " : "", p[i]);
    printf("\n");
    free(p);
    return 0;
}

static int mode_geom(int d, int split)
{
    san_hada3_geom g;
    if (san_hada3_geom_init(&g, d, 0, split) != ND_OK)
        return 2;
    printf("%d %d %d\n", g.n, g.ba, g.bb);
    for (int s = 0; s < 2; s++) {
        const int32_t *p = s ? g.perm2 : g.perm1;
        for (int i = 0; i < g.n; i++)
            printf("%s%d", i ? " " : "", p[i]);
        printf("\n");
    }
    san_hada3_geom_free(&g);
    return 0;
}

static int mode_dump(const char *path, int d, int untied, int split, long N, long seed)
{
    prob pr;
    if (N < 1 || prob_init(&pr, d, untied, split, N, (uint64_t)seed) != ND_OK)
        return 2;
    fparams fp;
    to_float(&pr, &fp);
    float *y = balloc((size_t)N * d);
    int rc = san_hada3_forward(be, &pr.g, &fp.w, fp.f + pr.off[T_X], N, y, NULL);
    FILE *f = rc == ND_OK ? fopen(path, "wb") : NULL;
    int ok = f != NULL;
    if (f) {
        int32_t hdr[7] = {d, pr.g.n, pr.g.ba, pr.g.bb, untied, split, (int32_t)N};
        ok = fwrite(hdr, sizeof hdr, 1, f) == 1 &&
             fwrite(fp.f, sizeof(float), pr.off[T_N], f) == pr.off[T_N] &&
             fwrite(y, sizeof(float), (size_t)N * d, f) == (size_t)N * d;
        ok = (fclose(f) == 0) && ok;
    }
    bfree(y);
    bfree(fp.f);
    prob_free(&pr);
    if (!ok)
        fprintf(stderr, "test_hada3: dump to %s failed\n", path);
    return ok ? 0 : 1;
}

/* The CPU's hada3_mix and hada3_mix_backward ops (which stage each row
 * through its places in address order) against the plain loops of
 * backend/ops.def: permuted, padded (-1) and repeated source places,
 * unwritten destination places, row strides of the blocked layouts, cond
 * and silu on and off. */
static double ref_silu_d(double h, double *dact)
{
    double s = 1.0 / (1.0 + exp(-h));
    *dact = s * (1.0 + h * (1.0 - s));
    return h * s;
}

static void check_mix_ops(void)
{
    enum { N = 37, BA = 4, BB = 8, C = BA * BB, RANK = 8 };
    nd_rng rng;
    nd_rng_seed(&rng, 31);
    int32_t so[C], dso[C];
    for (int m = 0; m < C; m++) { /* src: layout I permuted; dst: layout J */
        so[m] = (int32_t)((m / BB) * N * BB + m % BB);
        dso[m] = (int32_t)((m % BB) * N * BA + m / BB);
    }
    for (int m = C - 1; m > 0; m--) {
        int k = (int)nd_rng_below(&rng, (uint64_t)m + 1);
        int32_t t = so[m];
        so[m] = so[k];
        so[k] = t;
    }
    so[3] = -1;     /* padding */
    so[9] = so[20]; /* read twice (dsrc there: the later feature's value) */
    dso[5] = dso[17] = -1;
    long nsrc = (long)N * C, ndst = (long)N * C;
    float *src = malloc(sizeof(float) * nsrc), *ddst = malloc(sizeof(float) * ndst);
    float *scale = malloc(sizeof(float) * C), *bias = malloc(sizeof(float) * C);
    float *p = malloc(sizeof(float) * N * RANK), *cu = malloc(sizeof(float) * RANK * C);
    float *dst = malloc(sizeof(float) * ndst), *rdst = malloc(sizeof(float) * ndst);
    float *dsrc = malloc(sizeof(float) * nsrc), *rdsrc = malloc(sizeof(float) * nsrc);
    float *dcond = malloc(sizeof(float) * N * C), *rdcond = malloc(sizeof(float) * N * C);
    float dscale[C], dbias[C], rdscale[C], rdbias[C];
    if (!src || !ddst || !scale || !bias || !p || !cu || !dst || !rdst || !dsrc || !rdsrc ||
        !dcond || !rdcond)
        exit(2);
    for (long i = 0; i < nsrc; i++)
        src[i] = (float)nd_rng_normal(&rng);
    for (long i = 0; i < ndst; i++)
        ddst[i] = (float)nd_rng_normal(&rng);
    for (int m = 0; m < C; m++) {
        scale[m] = (float)nd_rng_normal(&rng);
        bias[m] = 0.5f * (float)nd_rng_normal(&rng);
    }
    for (long i = 0; i < (long)N * RANK; i++)
        p[i] = 0.2f * (float)nd_rng_normal(&rng);
    for (long i = 0; i < (long)RANK * C; i++)
        cu[i] = 0.5f * (float)nd_rng_normal(&rng);
    /* the forward on all rows, and on the first 1 and 5 (a decode step's
     * few rows take the direct path) */
    for (int pass = 0; pass < 6; pass++) {
        int variant = pass % 2; /* 0 plain, 1 cond + bias + silu */
        long rows = pass < 2 ? N : pass < 4 ? 1 : 5;
        const float *pp = variant ? p : NULL, *cc = variant ? cu : NULL,
                    *bb = variant ? bias : NULL;
        int rank = variant ? RANK : 0, silu = variant;
        for (long i = 0; i < ndst; i++)
            dst[i] = rdst[i] = 7.0f; /* places not written keep it */
        for (long i = 0; i < nsrc; i++)
            dsrc[i] = rdsrc[i] = 7.0f;
        for (int m = 0; m < C; m++)
            dscale[m] = rdscale[m] = dbias[m] = rdbias[m] = 1.0f;
        for (int r = 0; r < N; r++)
            for (int m = 0; m < C; m++) {
                double v = so[m] < 0 ? 0.0 : src[so[m] + r * BB], g = 1.0;
                for (int q = 0; q < rank; q++)
                    g += (double)pp[r * RANK + q] * cc[q * C + m];
                double h = scale[m] * g * v + (bb ? bb[m] : 0.0), da = 1.0;
                double y = silu ? ref_silu_d(h, &da) : h;
                if (dso[m] >= 0 && r < rows)
                    rdst[dso[m] + r * BA] = (float)y;
                double e = dso[m] < 0 ? 0.0 : ddst[dso[m] + r * BA] * da;
                if (so[m] >= 0)
                    rdsrc[so[m] + r * BB] = (float)(e * scale[m] * g);
                rdcond[r * C + m] = (float)(e * scale[m] * v);
                rdscale[m] += (float)(e * g * v);
                rdbias[m] += (float)e;
            }
        be->hada3_mix(be, dst, dso, BA, src, so, BB, scale, pp, cc, rank, bb, silu, rows, C);
        be->hada3_mix_backward(be, dsrc, dcond, dscale, dbias, ddst, dso, BA, src, so, BB, scale,
                               pp, cc, rank, bb, silu, N, C);
        nd_backend_sync(be);
        double e1 = tu_rel_err(dst, rdst, ndst, 1.0), e2 = tu_rel_err(dsrc, rdsrc, nsrc, 1.0);
        double e3 = tu_rel_err(dcond, rdcond, (long)N * C, 1.0);
        double e4 = tu_rel_err(dscale, rdscale, C, 1.0), e5 = tu_rel_err(dbias, rdbias, C, 1.0);
        CHECK_MSG(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-4 && e5 < 1e-4,
                  "hada3_mix ops variant %d, %ld rows: dst %.3g dsrc %.3g dcond %.3g dscale %.3g "
                  "dbias %.3g",
                  variant, rows, e1, e2, e3, e4, e5);
    }
    free(src);
    free(ddst);
    free(scale);
    free(bias);
    free(p);
    free(cu);
    free(dst);
    free(rdst);
    free(dsrc);
    free(rdsrc);
    free(dcond);
    free(rdcond);
}

/* The CPU's mix ops keep the plans of the offset tables they were given:
 * more tables than the cache holds, used again in another order, give the
 * same rows; a table used twice in a row is planned once. */
static void check_mix_cache(void)
{
    enum { N = 24, C = 64, NT = 12 };
    nd_rng rng;
    nd_rng_seed(&rng, 41);
    static float src[N * C], out[NT][N * C], again[N * C], scale[C];
    static int32_t tab[NT][C], id[C];
    for (int i = 0; i < N * C; i++)
        src[i] = (float)nd_rng_normal(&rng);
    for (int m = 0; m < C; m++) {
        scale[m] = (float)nd_rng_normal(&rng);
        id[m] = m;
    }
    for (int t = 0; t < NT; t++) { /* a permutation each, one place padded */
        for (int m = 0; m < C; m++)
            tab[t][m] = m;
        for (int m = C - 1; m > 0; m--) {
            int k = (int)nd_rng_below(&rng, (uint64_t)m + 1);
            int32_t x = tab[t][m];
            tab[t][m] = tab[t][k];
            tab[t][k] = x;
        }
        tab[t][t] = -1;
    }
    long made0 = cpu_hada3_plans_made();
    for (int t = 0; t < NT; t++) {
        be->hada3_mix(be, out[t], id, C, src, tab[t], C, scale, NULL, NULL, 0, NULL, 0, N, C);
        int bad = 0;
        for (int r = 0; r < N; r++)
            for (int m = 0; m < C; m++) {
                float v = tab[t][m] < 0 ? 0.0f : src[r * C + tab[t][m]];
                bad += out[t][r * C + m] != v * scale[m];
            }
        CHECK_MSG(!bad, "hada3_mix, table %d: %d values differ from the plain loop", t, bad);
    }
    CHECK_MSG(cpu_hada3_plans_made() - made0 >= NT, "%ld plans for %d new tables",
              cpu_hada3_plans_made() - made0, NT);
    for (int t = NT - 1; t >= 0; t--) { /* evicted and cached plans alike */
        be->hada3_mix(be, again, id, C, src, tab[t], C, scale, NULL, NULL, 0, NULL, 0, N, C);
        CHECK_MSG(!memcmp(again, out[t], sizeof again), "hada3_mix, table %d again: differs", t);
    }
    be->hada3_mix(be, again, id, C, src, tab[3], C, scale, NULL, NULL, 0, NULL, 0, N, C);
    long made1 = cpu_hada3_plans_made();
    be->hada3_mix(be, again, id, C, src, tab[3], C, scale, NULL, NULL, 0, NULL, 0, N, C);
    be->hada3_mix_backward(be, out[0], NULL, NULL, NULL, again, id, C, src, tab[3], C, scale, NULL,
                           NULL, 0, NULL, 0, N, C);
    CHECK_MSG(cpu_hada3_plans_made() == made1, "tables used again were planned again (%ld plans)",
              cpu_hada3_plans_made() - made1);
}

int main(int argc, char **argv)
{
    /* test_hada3 DEVICE: the same checks on another backend (77: absent) */
    const char *dev = argc == 2 ? argv[1] : "cpu";
    be = nd_backend_get(dev, 0);
    if (!be) {
        fprintf(stderr, "test_hada3: no %s backend: %s\n", dev, nd_last_error());
        return strcmp(dev, "cpu") ? 77 : 1;
    }
    if (argc == 4 && !strcmp(argv[1], "perm"))
        return mode_perm(atol(argv[2]), atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "geom"))
        return mode_geom(atoi(argv[2]), atoi(argv[3]));
    if (argc == 8 && !strcmp(argv[1], "dump"))
        return mode_dump(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atol(argv[6]),
                         atol(argv[7]));
    if (argc > 2) {
        fprintf(stderr, "usage: test_hada3 [DEVICE | perm SEED N | geom D SPLIT | dump FILE D "
                        "UNTIED SPLIT N SEED]\n");
        return 2;
    }
    printf("backend: %s\n", be->name);
    check_geometry();
    if (!be->device) /* host pointers into the op: the CPU's */
        check_mix_ops();
    if (!strcmp(be->name, "cpu"))
        check_mix_cache();
    static const int dims[] = {2, 3, 12, 16, 24, 32, 100};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        for (int untied = 0; untied < 2; untied++)
            for (int split = 0; split < 2; split++)
                check_forward(dims[i], untied, split, 7);
    static const int bdims[] = {3, 12, 24, 32};
    for (size_t i = 0; i < sizeof bdims / sizeof *bdims; i++)
        for (int untied = 0; untied < 2; untied++)
            for (int split = 0; split < 2; split++)
                check_backward(bdims[i], untied, split, 5);
    for (int untied = 0; untied < 2; untied++)
        check_kept_scratch(100, untied);
    return tu_finish("test_hada3");
}
