/* Focused tests of the SAN's parts against plain double-precision
 * definitions, plus `--dump CKPT TOKENS OUT` which writes every
 * intermediate of one forward pass for tests/ref/parts_check.py. */
#include <complex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/rng.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/san.h"
#include "testutil.h"

static nd_rng rng;

static void fill(float *x, long n, double scale)
{
    for (long i = 0; i < n; i++)
        x[i] = (float)(scale * nd_rng_normal(&rng));
}

static void test_fwht(void)
{
    for (int n = 1; n <= 256; n <<= 1) {
        float x[256], y[256];
        fill(x, n, 1.0);
        memcpy(y, x, sizeof(float) * (size_t)n);
        san_fwht(y, n, san_walsh_scale(n));
        /* Sylvester entry H[i][j] = (-1)^popcount(i & j) */
        double err = 0;
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += x[i] * (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0);
            s /= sqrt((double)n);
            err = fmax(err, fabs(s - y[j]));
        }
        CHECK_MSG(err < 1e-5, "fwht n=%d err %g", n, err);
    }
}

/* the one-row SIMD transform (decode's Hadamard MLP) gives san_fwht's bits */
static void test_fwht_row(void)
{
    for (int n = 1; n <= 4096; n <<= 1) {
        float *x = malloc(sizeof *x * (size_t)n), *y = malloc(sizeof *y * (size_t)n);
        fill(x, n, 3.0);
        memcpy(y, x, sizeof *x * (size_t)n);
        san_fwht(x, n, san_walsh_scale(n));
        cpu_fwht_row(y, n, san_walsh_scale(n));
        CHECK_MSG(!memcmp(x, y, sizeof *x * (size_t)n), "cpu_fwht_row n=%d differs from san_fwht",
                  n);
        free(x);
        free(y);
    }
}

static void test_sinkhorn(void)
{
    for (int n = 1; n <= 6; n++) {
        float M[36];
        double P[36];
        fill(M, n * n, 2.0);
        for (int i = 0; i < n * n; i++)
            P[i] = exp((double)M[i]);
        /* exp-space Sinkhorn: normalise rows then columns, 20 rounds */
        for (int it = 0; it < 20; it++) {
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int j = 0; j < n; j++)
                    s += P[i * n + j];
                for (int j = 0; j < n; j++)
                    P[i * n + j] /= s;
            }
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int i = 0; i < n; i++)
                    s += P[i * n + j];
                for (int i = 0; i < n; i++)
                    P[i * n + j] /= s;
            }
        }
        san_sinkhorn(M, n, 20);
        double err = 0, colerr = 0;
        for (int i = 0; i < n * n; i++)
            err = fmax(err, fabs(P[i] - M[i]));
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += M[i * n + j];
            colerr = fmax(colerr, fabs(s - 1));
        }
        CHECK_MSG(err < 1e-5, "sinkhorn n=%d err %g", n, err);
        CHECK_MSG(colerr < 1e-5, "sinkhorn n=%d column sums off by %g", n, colerr);
    }
}

/* The batched Sinkhorn: every matrix of a run (several SK_W groups plus a
 * short tail) equals the one-matrix result bit for bit. */
static void sinkhorn_rows_case(int n, double scale)
{
    int rows = 2 * SK_W + 5, nn = n * n;
    float *M = malloc(sizeof *M * (size_t)rows * nn), *one = malloc(sizeof *one * nn);
    fill(M, rows * nn, scale);
    float *orig = malloc(sizeof *orig * (size_t)rows * nn);
    memcpy(orig, M, sizeof *M * (size_t)rows * nn);
    san_sinkhorn_rows(M, rows, n, 20);
    int same = 1;
    for (int r = 0; r < rows; r++) {
        memcpy(one, orig + (size_t)r * nn, sizeof *one * nn);
        san_sinkhorn(one, n, 20);
        same &= !memcmp(one, M + (size_t)r * nn, sizeof *one * nn);
    }
    CHECK_MSG(same, "sinkhorn_rows n=%d (scale %g) differs from per-matrix sinkhorn", n, scale);
    free(M);
    free(one);
    free(orig);
}

static void test_sinkhorn_rows(void)
{
    for (int n = 1; n <= 5; n++)
        sinkhorn_rows_case(n, 3.0);
    /* n = 4 has its own one-matrix vector path: wide scales reach exp's
     * clamps, narrow ones its polynomial near 0 */
    sinkhorn_rows_case(4, 0.05);
    sinkhorn_rows_case(4, 40.0);
    sinkhorn_rows_case(4, 300.0);
}

/* san_logf (vectorisable log used by Sinkhorn) against libm's double log:
 * within 2 float ulps over sums-of-exponentials' range and beyond. */
static void test_logf(void)
{
    double worst = 0;
    float worst_x = 0;
    for (float x = 1e-30f; x < 1e30f; x *= 1.0009765625f) {
        double ref = log((double)x), got = san_logf(x);
        double ulp = nextafterf((float)ref, INFINITY) - (float)ref;
        double e = fabs(got - ref) / fabs(ulp);
        if (e > worst) {
            worst = e;
            worst_x = x;
        }
    }
    for (float x = 1.0f; x < 64.0f; x = nextafterf(x, 100.0f) + 1e-5f) {
        double ref = log((double)x), got = san_logf(x);
        double ulp = fmax(nextafterf((float)ref, INFINITY) - (float)ref, 1e-45);
        double e = fabs(got - ref) / ulp;
        if (e > worst) {
            worst = e;
            worst_x = x;
        }
    }
    CHECK_MSG(worst <= 2.0, "san_logf worst error %.2f ulp at x=%g", worst, (double)worst_x);
}

static void test_engram_index(void)
{
    /* golden values computed by a separate Python evaluation of docs/model.md §2's
     * hash (acc = 0x9E3779B9*(k+1) mod 2^32; acc = (acc ^ tok[t-j]) *
     * 0x01000193 for j < order; acc ^= acc >> 15; acc % slots) */
    const int32_t seq[] = {5, 6, 7, 5, 6, 7};
    const uint32_t want_t0_o2_s8192[3] = {1637, 6143, 662}, want_t3_o3_s97[3] = {0, 49, 60};
    for (int t = 0; t < 3; t++) {
        CHECK(san_engram_index(seq, t, 2, 0, 8192) == want_t0_o2_s8192[t]);
        CHECK(san_engram_index(seq, t, 3, 3, 97) == want_t3_o3_s97[t]);
    }
    /* identical n-grams hash identically: positions 3 and 0 differ (t=0 sees
     * a zero before it), positions 4 and 1 share (6,5) */
    CHECK(san_engram_index(seq, 4, 2, 1, 8192) == san_engram_index(seq, 1, 2, 1, 8192));
}

static void test_rope(void)
{
    int T = 7, hd = 8, H = 2;
    float cs[7 * 4], sn[7 * 4], x[7 * 2 * 8], y[7 * 2 * 8];
    san_rope_tables(cs, sn, T, hd, 100000.0);
    fill(x, T * H * hd, 1.0);
    memcpy(y, x, sizeof x);
    const nd_backend *be = nd_backend_cpu(0);
    nd_layout_buf lb;
    CHECK(nd_layout_buf_init(&lb, T, 1) == 0 && nd_layout_dense(&lb, 1, T) == 0);
    be->rope(be, y, cs, sn, &lb.L, H, hd);
    nd_layout_buf_free(&lb);
    double err = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < hd / 2; i++) {
                const float *v = x + (t * H + h) * hd;
                double f = pow(100000.0, -2.0 * i / hd);
                double complex z = (v[i] + I * v[i + hd / 2]) * cexp(I * t * f);
                err = fmax(err, fabs(creal(z) - y[(t * H + h) * hd + i]));
                err = fmax(err, fabs(cimag(z) - y[(t * H + h) * hd + i + hd / 2]));
            }
    CHECK_MSG(err < 1e-5, "rope err %g", err);
}

static void test_attention(void)
{
    int B = 2, T = 70, H = 4, G = 2, hd = 8; /* T > one 64-query block */
    long N = (long)B * T;
    float *q = malloc(sizeof(float) * N * H * hd), *k = malloc(sizeof(float) * N * G * hd);
    float *v = malloc(sizeof(float) * N * G * hd), *o = malloc(sizeof(float) * N * H * hd);
    float *lse = malloc(sizeof(float) * B * H * T);
    fill(q, N * H * hd, 1.0);
    fill(k, N * G * hd, 1.0);
    fill(v, N * G * hd, 1.0);
    const nd_backend *be = nd_backend_cpu(0);
    nd_layout_buf lb;
    CHECK(nd_layout_buf_init(&lb, N, B) == 0 && nd_layout_dense(&lb, B, T) == 0);
    be->attention(be, o, lse, q, k, v, &lb.L, H, G, hd);
    nd_layout_buf_free(&lb);
    double err = 0, lerr = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int g = h / (H / G);
                double s[70], mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double dot = 0;
                    for (int i = 0; i < hd; i++)
                        dot += (double)q[((b * T + t) * H + h) * hd + i] *
                               k[((b * T + j) * G + g) * hd + i];
                    s[j] = dot / sqrt((double)hd);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(s[j] - mx);
                lerr = fmax(lerr, fabs(mx + log(sum) - lse[(b * T + t) * H + h]));
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++)
                        acc += exp(s[j] - mx) / sum * v[((b * T + j) * G + g) * hd + i];
                    err = fmax(err, fabs(acc - o[((b * T + t) * H + h) * hd + i]));
                }
            }
    CHECK_MSG(err < 1e-5, "attention err %g", err);
    CHECK_MSG(lerr < 1e-4, "attention lse err %g", lerr);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
}

/* The block (model/block.h) with a weights view and an attention source of
 * the test's own: each layer asks for the products and the attention once,
 * in the block's order (phi, q/k/v/gate, attention, out), and the result
 * equals the trainer's layer (one fused phi product there, three here); a
 * failing product stops the layer with its error before the attention. */
typedef struct {
    san_wview base;
    const san_model *m;
    const nd_backend *be;
    char log[64];
    int nlog, fail_grp; /* fail_grp: the group that fails with ND_ENOMEM, or -1 */
} test_wview;

static void tv_mm(const nd_backend *be, const float *x, int N, int in, const float *w, int out,
                  float *y)
{
    be->matmul(be, 0, 0, N, out, in, 1.0f, x, in, w, out, 0.0f, y, out);
}

static int tv_apply(const san_wview *v, int l, san_wgroup grp, const float *x, int N,
                    float *const *y)
{
    test_wview *t = (test_wview *)v;
    const san_dims *D = &t->m->dims;
    const san_weights *w = &t->m->w;
    int d = D->d, n = D->n, nd = n * d, qd = D->q_dim, kvd = D->kv_dim;
    if (t->nlog < (int)sizeof t->log - 1)
        t->log[t->nlog++] = "PQO"[grp];
    if ((int)grp == t->fail_grp)
        return nd_error(ND_ENOMEM, "test view: group %d fails", (int)grp);
    if (grp == SAN_W_PHI) {
        tv_mm(t->be, x, N, nd, w->phi_pre + (size_t)l * nd * n, n, y[0]);
        tv_mm(t->be, x, N, nd, w->phi_post + (size_t)l * nd * n, n, y[1]);
        tv_mm(t->be, x, N, nd, w->phi_res + (size_t)l * nd * n * n, n * n, y[2]);
    } else if (grp == SAN_W_QKVG) {
        tv_mm(t->be, x, N, d, w->wq + (size_t)l * d * qd, qd, y[0]);
        tv_mm(t->be, x, N, d, w->wk + (size_t)l * d * kvd, kvd, y[1]);
        tv_mm(t->be, x, N, d, w->wv + (size_t)l * d * kvd, kvd, y[2]);
        tv_mm(t->be, x, N, d, w->wgate + (size_t)l * d * qd, qd, y[3]);
    } else {
        tv_mm(t->be, x, N, qd, w->wout + (size_t)l * qd * d, d, y[0]);
    }
    return ND_OK;
}

typedef struct {
    san_attn_src base;
    test_wview *log; /* shares the view's call log */
    const nd_backend *be;
    const san_dims *D;
    int layer_seen;
} test_attn;

static int ta_attend(const san_attn_src *src, int l, const float *q, const float *k, const float *v,
                     float *att, float *lse)
{
    test_attn *t = (test_attn *)src;
    if (t->log->nlog < (int)sizeof t->log->log - 1)
        t->log->log[t->log->nlog++] = 'A';
    t->layer_seen = l;
    t->be->attention(t->be, att, lse, q, k, v, src->L, t->D->H, t->D->G, t->D->hd);
    return ND_OK;
}

static void test_block(void)
{
    const nd_backend *be = nd_backend_cpu(0);
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 256;
    san_model m;
    CHECK(san_model_create(&m, &c) == 0);
    san_model_init_random(&m, 5);
    for (size_t i = 0; i < m.numel; i++) /* every gain and gate matters */
        m.mem[i] += (float)(0.05 * nd_rng_normal(&rng));
    const san_dims *D = &m.dims;
    int B = 2, T = 9, N = B * T;
    size_t lanes = (size_t)N * D->n * D->d;
    san_acts a;
    CHECK(san_acts_create(&a, be, &m, B, T, 0, 0) == 0);
    int32_t tok[18];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % D->V);
    be->embed(be, a.x0, m.w.emb, tok, N, D->d, sqrtf((float)D->d));
    san_engram_forward(&m, &m.w, &a, tok);
    be->lanes_broadcast(be, a.X, a.x0, N, D->n, D->d);
    float *want = malloc(sizeof(float) * lanes);
    test_wview tv = {{tv_apply}, &m, be, {0}, 0, -1};
    test_attn ta = {{&a.lay.L, a.rope_cos, a.rope_sin, ta_attend, NULL}, &tv, be, D, -1};
    san_block blk = {&m, &m.w, be, &tv.base, &ta.base, {0}, {0}, NULL, NULL, NULL, NULL};
    for (int s = 0; s < m.cfg.n_sites; s++) {
        blk.eng_k[s] = a.eng_k[s];
        blk.eng_v[s] = a.eng_v[s];
    }
    CHECK(m.cfg.n_sites > 0 && D->L > 1);
    for (int l = 0; l < D->L; l++) {
        CHECK(san_layer_forward_batch(&m, &m.w, &a, l, a.X, want) == ND_OK);
        tv.nlog = 0;
        memset(tv.log, 0, sizeof tv.log);
        CHECK(san_layer_forward(&blk, &a.l, l, N, a.X, a.Xn) == ND_OK);
        CHECK_MSG(!strcmp(tv.log, "PQAO"), "layer %d: calls %s, want PQAO", l, tv.log);
        CHECK(ta.layer_seen == l);
        double err = tu_rel_err(a.Xn, want, (long)lanes, 1e-3);
        CHECK_MSG(err < 1e-5, "layer %d: block with the test's view vs the trainer's: %g", l, err);
        float *t = a.X; /* the next layer reads this one's output */
        a.X = a.Xn;
        a.Xn = t;
    }
    /* a product that fails ends the layer with its error, before the
     * attention sees anything */
    for (int fail = SAN_W_PHI; fail <= SAN_W_OUT; fail++) {
        tv.fail_grp = fail;
        tv.nlog = 0;
        memset(tv.log, 0, sizeof tv.log);
        CHECK(san_layer_forward(&blk, &a.l, 0, N, a.X, a.Xn) == ND_ENOMEM);
        const char *want_log[] = {"P", "PQ", "PQAO"};
        CHECK_MSG(!strcmp(tv.log, want_log[fail]), "failing group %d: calls %s", fail, tv.log);
    }
    free(want);
    san_acts_free(&a);
    san_model_free(&m);
}

static void test_engram_taps(void)
{
    int B = 2, T = 11, d = 5, dil = 3;
    float vp[2 * 11 * 5], taps[4 * 5], v[2 * 11 * 5];
    fill(vp, B * T * d, 1.0);
    fill(taps, 4 * d, 1.0);
    const nd_backend *be = nd_backend_cpu(0);
    nd_layout_buf lb;
    CHECK(nd_layout_buf_init(&lb, B * T, B) == 0 && nd_layout_dense(&lb, B, T) == 0);
    be->engram_taps(be, v, vp, taps, &lb.L, d, dil);
    nd_layout_buf_free(&lb);
    double err = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < d; i++) {
                double s = 0;
                for (int j = 0; j < 4; j++)
                    if (t - j * dil >= 0)
                        s += taps[j * d + i] * vp[(b * T + t - j * dil) * d + i];
                err = fmax(err, fabs(s - v[(b * T + t) * d + i]));
            }
    CHECK_MSG(err < 1e-5, "engram taps err %g", err);
}

static void test_hadamard_mlp(void)
{
    int N = 3, d = 6, hn = 8;
    float x[18], z[18], u[18], d1[8], d2[8], d3[8], y[18], h1[24];
    fill(x, 18, 1);
    fill(z, 18, 1);
    fill(u, 18, 1);
    fill(d1, 8, 1);
    fill(d2, 8, 1);
    fill(d3, 8, 1);
    const nd_backend *be = nd_backend_cpu(0);
    be->hadamard_mlp(be, y, h1, x, z, u, d1, d2, d3, N, d, hn);
    double err = 0;
    for (int r = 0; r < N; r++) {
        double a[8], b[8];
        for (int j = 0; j < hn; j++) {
            double s = 0;
            for (int i = 0; i < d; i++)
                s += d1[i] * z[r * d + i] * (__builtin_popcount((unsigned)(i & j)) & 1 ? -1 : 1);
            a[j] = s / sqrt(hn);
            a[j] = d2[j] * a[j] / (1 + exp(-d2[j] * a[j]));
        }
        for (int j = 0; j < d; j++) {
            double s = 0;
            for (int i = 0; i < hn; i++)
                s += a[i] * (__builtin_popcount((unsigned)(i & j)) & 1 ? -1 : 1);
            b[j] = d3[j] * s / sqrt(hn);
            err = fmax(err, fabs(x[r * d + j] + b[j] - u[r * d + j] - y[r * d + j]));
        }
    }
    CHECK_MSG(err < 1e-5, "hadamard mlp err %g", err);
}

/* ---- dump mode ---- */

static void dump(FILE *f, const char *name, const float *x, int ndim, const long *shape)
{
    long n = 1;
    fprintf(f, "tensor %s %d", name, ndim);
    for (int i = 0; i < ndim; i++) {
        fprintf(f, " %ld", shape[i]);
        n *= shape[i];
    }
    fputc('\n', f);
    for (long i = 0; i < n; i++)
        fprintf(f, "%.9g%c", x[i], (i + 1) % 8 == 0 || i + 1 == n ? '\n' : ' ');
}

#define DUMP(name, x, ...)                                                                         \
    dump(f, name, x, sizeof((long[]){__VA_ARGS__}) / sizeof(long), (long[]){__VA_ARGS__})

static int dump_mode(const char *ckpt, const char *tokfile, const char *out)
{
    san_model m;
    if (ckpt_load(ckpt, &m, NULL)) {
        fprintf(stderr, "%s\n", nd_last_error());
        return 1;
    }
    token_seqs seqs;
    if (token_file_read(tokfile, m.dims.V, &seqs)) {
        fprintf(stderr, "%s\n", nd_last_error());
        return 1;
    }
    const san_dims *D = &m.dims;
    int T = (int)(seqs.start[1] - seqs.start[0]);
    const nd_backend *be = nd_backend_cpu(0);
    san_acts a;
    if (san_acts_create(&a, be, &m, 1, T, 0, 0))
        return 1;
    FILE *f = fopen(out, "w");
    fprintf(f, "needle-dump 1\ncheckpoint %s\ntokens", ckpt);
    for (int t = 0; t < T; t++)
        fprintf(f, " %d", seqs.ids[t]);
    fputc('\n', f);
    be->embed(be, a.x0, m.w.emb, seqs.ids, T, D->d, sqrtf((float)D->d));
    DUMP("x0", a.x0, T, D->d);
    san_engram_forward(&m, &m.w, &a, seqs.ids);
    if (m.cfg.n_sites) {
        float *idx = malloc(sizeof(float) * (size_t)T * D->eng_tables);
        for (long i = 0; i < (long)T * D->eng_tables; i++)
            idx[i] = (float)a.eng_idx[i];
        DUMP("engram.indices", idx, T, D->eng_tables);
        free(idx);
    }
    char name[64];
    for (int s = 0; s < m.cfg.n_sites; s++) {
        snprintf(name, sizeof name, "site%d.k", s);
        DUMP(name, a.eng_k[s], T, D->d);
        snprintf(name, sizeof name, "site%d.v", s);
        DUMP(name, a.eng_v[s], T, D->d);
    }
    be->lanes_broadcast(be, a.X, a.x0, T, D->n, D->d);
    for (int l = 0; l < D->L; l++) {
        CHECK(san_layer_forward_batch(&m, &m.w, &a, l, a.X, a.Xn) == ND_OK);
        san_layer_acts *A = &a.l;
#define LD(field, buf, ...)                                                                        \
    snprintf(name, sizeof name, "layer%d.%s", l, field);                                           \
    DUMP(name, buf, __VA_ARGS__)
        LD("hpre", A->hpre, T, D->n);
        LD("hpost", A->hpost, T, D->n);
        LD("hres", A->M, T, D->n, D->n);
        LD("u", A->u, T, D->d);
        for (int s = 0; s < m.cfg.n_sites; s++)
            if (m.cfg.engram_layers[s] == l) {
                snprintf(name, sizeof name, "layer%d.alpha%d", l, s);
                DUMP(name, A->alpha + (size_t)s * T, T);
                LD("bx", A->bx, T, D->d);
            }
        LD("a", A->a, T, D->d);
        LD("q", A->qn, T, D->H, D->hd);
        LD("k", A->kn, T, D->G, D->hd);
        LD("v", A->v, T, D->G, D->hd);
        LD("attn", A->att, T, D->q_dim);
        LD("attn_out", A->o2, T, D->d);
        LD("mid", A->x1, T, D->d);
        LD("y", A->y, T, D->d);
        LD("X", a.Xn, T, D->n, D->d);
#undef LD
        float *t = a.X;
        a.X = a.Xn;
        a.Xn = t;
    }
    be->lanes_mean(be, a.xm, a.X, T, D->n, D->d);
    be->rmsnorm(be, a.hf, a.hf_rstd, a.xm, m.w.final_norm, T, D->d);
    DUMP("final.h", a.hf, T, D->d);
    be->matmul(be, 0, 1, T, D->V, D->d, 1.0f, a.hf, D->d, m.w.emb, D->d, 0.0f, a.logits, D->V);
    DUMP("logits", a.logits, T, D->V);
    fclose(f);
    san_acts_free(&a);
    token_seqs_free(&seqs);
    san_model_free(&m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--dump"))
        return dump_mode(argv[2], argv[3], argv[4]);
    nd_rng_seed(&rng, 1234);
    test_fwht();
    test_fwht_row();
    test_sinkhorn();
    test_sinkhorn_rows();
    test_logf();
    test_engram_index();
    test_rope();
    test_attention();
    test_engram_taps();
    test_hadamard_mlp();
    test_block();
    return tu_finish("test_san_parts");
}
