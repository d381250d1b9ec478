/* Compares the Vulkan backend's embed / engram / row / cross-entropy ops,
 * forward and backward, with the CPU backend on random inputs, awkward sizes
 * and layouts with shared-prefix segments. Some const inputs are plain host
 * memory (the staging path), accumulated outputs start from the same random
 * values on both sides.
 *
 *   NEEDLE_PLUGIN_DIR=build [NEEDLE_VULKAN_VALIDATE=1] ./vk_check_engram
 *
 * Exit 0: all within tolerance; 1: a mismatch; 77: no Vulkan device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tuning.h"

static const nd_backend *cpu, *vk;
static int failures;

static float frand(void)
{
    return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
}

static float *rand_host(long n, float amp)
{
    float *p = malloc(sizeof *p * (size_t)(n > 0 ? n : 1));
    for (long i = 0; i < n; i++)
        p[i] = amp * frand();
    return p;
}

/* a copy in Vulkan memory */
static void *vdup(const void *src, size_t bytes)
{
    void *p = vk->alloc(vk, bytes ? bytes : 4);
    if (bytes)
        memcpy(p, src, bytes);
    return p;
}

static void *hdup(const void *src, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 4);
    if (bytes)
        memcpy(p, src, bytes);
    return p;
}

/* max |v - c| / (|c| + floor), reported and checked against tol */
static void compare(const char *what, const float *v, const float *c, long n, double floor,
                    double tol)
{
    double worst = 0, worst_abs = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs((double)v[i] - (double)c[i]);
        double rel = e / (fabs((double)c[i]) + floor);
        if (!(rel <= worst)) /* NaN counts as worst */
            worst = isnan(rel) ? INFINITY : rel;
        if (e > worst_abs)
            worst_abs = e;
    }
    int bad = !(worst <= tol);
    printf("%-44s n=%-8ld max rel %.2e  max abs %.2e%s\n", what, n, worst, worst_abs,
           bad ? "  FAIL" : "");
    failures += bad;
}

static void compare_int(const char *what, const int32_t *v, const int32_t *c, long n)
{
    long diff = 0;
    for (long i = 0; i < n; i++)
        diff += v[i] != c[i];
    printf("%-44s n=%-8ld mismatches %ld%s\n", what, n, diff, diff ? "  FAIL" : "");
    failures += diff != 0;
}

/* ---- layouts ---- */

typedef struct {
    const char *name;
    int n;
    int len[8], parent[8];
} layout_spec;

static const layout_spec layouts[] = {
    {"one row", 1, {1}, {-1}},
    {"dense 3x17", 3, {17, 17, 17}, {-1, -1, -1}},
    {"prefix 7 + children 5,1,9 | 13 | prefix 2 + 3,4",
     8,
     {7, 5, 1, 9, 13, 2, 3, 4},
     {-1, 0, 0, 0, -1, -1, 5, 5}},
    {"long prefix 300 + 2 children 200,3", 3, {300, 200, 3}, {-1, 0, 0}},
};

static void make_layout(nd_layout_buf *b, const layout_spec *s)
{
    long N = 0;
    for (int i = 0; i < s->n; i++)
        N += s->len[i];
    if (nd_layout_buf_init(b, N, s->n))
        abort();
    nd_layout_reset(b);
    for (int i = 0; i < s->n; i++)
        if (nd_layout_add(b, s->len[i], s->parent[i]) < 0)
            abort();
}

/* ---- ops ---- */

static void check_embed(long N, int d, int V)
{
    char what[96];
    int32_t *tok = malloc(sizeof *tok * (size_t)N);
    for (long i = 0; i < N; i++) /* repeats: several rows per vocabulary row */
        tok[i] = rand() % (i % 3 || V < 4 ? V : 4);
    float *emb = rand_host((long)V * d, 1.0f), *dx0 = rand_host(N * d, 1.0f);
    float *demb0 = rand_host((long)V * d, 0.5f);
    float scale = sqrtf((float)d);

    float *xc = malloc(sizeof *xc * (size_t)N * d), *xv = vk->alloc(vk, sizeof *xv * N * d);
    float *emb_v = vdup(emb, sizeof *emb * V * d);
    cpu->embed(cpu, xc, emb, tok, N, d, scale);
    vk->embed(vk, xv, emb_v, tok, N, d, scale); /* tokens from host memory */
    float *xv2 = vk->alloc(vk, sizeof *xv2 * N * d);
    vk->embed(vk, xv2, emb, tok, N, d, scale); /* table staged from host */

    float *dc = hdup(demb0, sizeof *dc * V * d), *dv = vdup(demb0, sizeof *dv * V * d);
    int32_t *tok_v = vdup(tok, sizeof *tok * N);
    cpu->embed_backward(cpu, dc, dx0, tok, N, d, scale);
    vk->embed_backward(vk, dv, dx0, tok_v, N, d, scale);
    nd_backend_sync(vk);
    snprintf(what, sizeof what, "embed N=%ld d=%d V=%d", N, d, V);
    compare(what, xv, xc, N * d, 1e-3, 1e-6);
    compare("  embed (host table)", xv2, xc, N * d, 1e-3, 1e-6);
    snprintf(what, sizeof what, "embed_backward N=%ld d=%d V=%d", N, d, V);
    compare(what, dv, dc, (long)V * d, 1e-3, 1e-5);
    vk->free(vk, xv);
    vk->free(vk, xv2);
    vk->free(vk, emb_v);
    vk->free(vk, dv);
    vk->free(vk, tok_v);
    free(tok), free(emb), free(dx0), free(demb0), free(xc), free(dc);
}

static void check_rows(long n, int d, long src_rows)
{
    char what[96];
    int32_t *rows = malloc(sizeof *rows * (size_t)n);
    for (long i = 0; i < n; i++)
        rows[i] = (int32_t)(rand() % (i % 2 || src_rows < 3 ? src_rows : 3));
    float *src = rand_host(src_rows * d, 1.0f), *g = rand_host(n * d, 1.0f);
    float *dst0 = rand_host(src_rows * d, 1.0f);
    float *oc = malloc(sizeof *oc * (size_t)n * d), *ov = vk->alloc(vk, sizeof *ov * n * d);
    cpu->gather_rows(cpu, oc, src, rows, n, d);
    vk->gather_rows(vk, ov, src, rows, n, d);
    float *sc = hdup(dst0, sizeof *sc * src_rows * d), *sv = vdup(dst0, sizeof *sv * src_rows * d);
    float *g_v = vdup(g, sizeof *g * n * d);
    cpu->scatter_add_rows(cpu, sc, g, rows, n, d);
    vk->scatter_add_rows(vk, sv, g_v, rows, n, d);
    nd_backend_sync(vk);
    snprintf(what, sizeof what, "gather_rows n=%ld d=%d", n, d);
    compare(what, ov, oc, n * d, 1e-3, 0);
    snprintf(what, sizeof what, "scatter_add_rows n=%ld d=%d", n, d);
    compare(what, sv, sc, src_rows * d, 1e-3, 1e-6);
    vk->free(vk, ov);
    vk->free(vk, sv);
    vk->free(vk, g_v);
    free(rows), free(src), free(g), free(dst0), free(oc), free(sc);
}

static void check_engram(const layout_spec *spec, int n_orders, int heads, int slots, int sub,
                         int d, int dil)
{
    static const int orders_all[] = {2, 3, 9, 1};
    const int *orders = orders_all;
    char what[160];
    nd_layout_buf lb;
    make_layout(&lb, spec);
    const nd_layout *L = &lb.L;
    long N = L->N;
    int K = n_orders * heads;
    printf("-- layout: %s (N=%ld), orders %d, heads %d, slots %d, sub %d, d %d, dil %d\n",
           spec->name, N, n_orders, heads, slots, sub, d, dil);

    /* hash: few distinct tokens, so table rows repeat within a batch */
    int32_t *tok = malloc(sizeof *tok * (size_t)N);
    for (long i = 0; i < N; i++)
        tok[i] = rand() % 5;
    int32_t *ic = malloc(sizeof *ic * (size_t)N * K), *iv = vk->alloc(vk, sizeof *iv * N * K);
    cpu->engram_hash(cpu, ic, tok, L, orders, n_orders, heads, slots);
    vk->engram_hash(vk, iv, tok, L, orders, n_orders, heads, slots);

    /* gather and its backward, on the device's own indices */
    long tab = (long)K * slots * sub;
    float *tables = rand_host(tab, 1.0f), *tables_v = vdup(tables, sizeof *tables * tab);
    float *ec = malloc(sizeof *ec * (size_t)N * K * sub);
    float *ev = vk->alloc(vk, sizeof *ev * N * K * sub);
    memset(ev, 0x7f, sizeof *ev * N * K * sub); /* zero rows must be written */
    cpu->engram_gather(cpu, ec, tables, ic, L, orders, n_orders, heads, slots, sub);
    vk->engram_gather(vk, ev, tables_v, iv, L, orders, n_orders, heads, slots, sub);
    float *de = rand_host(N * K * sub, 1.0f), *dt0 = rand_host(tab, 0.5f);
    float *dtc = hdup(dt0, sizeof *dtc * tab), *dtv = vdup(dt0, sizeof *dtv * tab);
    cpu->engram_gather_backward(cpu, dtc, de, ic, L, orders, n_orders, heads, slots, sub);
    vk->engram_gather_backward(vk, dtv, de, iv, L, orders, n_orders, heads, slots, sub);
    vk->engram_gather_backward(vk, NULL, de, iv, L, orders, n_orders, heads, slots, sub);

    /* taps */
    float *vp = rand_host(N * d, 1.0f), *taps = rand_host(4L * d, 1.0f);
    float *vp_v = vdup(vp, sizeof *vp * N * d);
    float *vc = malloc(sizeof *vc * (size_t)N * d), *vv = vk->alloc(vk, sizeof *vv * N * d);
    cpu->engram_taps(cpu, vc, vp, taps, L, d, dil);
    vk->engram_taps(vk, vv, vp_v, taps, L, d, dil);
    float *dvv_in = rand_host(N * d, 1.0f), *dtaps0 = rand_host(4L * d, 0.5f);
    float *dvpc = malloc(sizeof *dvpc * (size_t)N * d), *dvpv = vk->alloc(vk, sizeof *dvpv * N * d);
    float *dtapc = hdup(dtaps0, sizeof *dtapc * 4 * d),
          *dtapv = vdup(dtaps0, sizeof *dtapv * 4 * d);
    float *dvpv2 = vk->alloc(vk, sizeof *dvpv2 * N * d);
    cpu->engram_taps_backward(cpu, dvpc, dtapc, dvv_in, vp, taps, L, d, dil);
    vk->engram_taps_backward(vk, dvpv, dtapv, dvv_in, vp_v, taps, L, d, dil);
    vk->engram_taps_backward(vk, dvpv2, NULL, dvv_in, vp_v, taps, L, d, dil);

    nd_backend_sync(vk);
    snprintf(what, sizeof what, "engram_hash N=%ld K=%d", N, K);
    compare_int(what, iv, ic, N * K);
    snprintf(what, sizeof what, "engram_gather sub=%d", sub);
    compare(what, ev, ec, N * K * sub, 1e-3, 0);
    snprintf(what, sizeof what, "engram_gather_backward slots=%d", slots);
    compare(what, dtv, dtc, tab, 1e-3, 1e-6);
    snprintf(what, sizeof what, "engram_taps dil=%d", dil);
    compare(what, vv, vc, N * d, 1e-3, 1e-5);
    compare("engram_taps_backward dvp", dvpv, dvpc, N * d, 1e-3, 1e-5);
    compare("engram_taps_backward dvp (dtaps NULL)", dvpv2, dvpc, N * d, 1e-3, 1e-5);
    compare("engram_taps_backward dtaps (+=)", dtapv, dtapc, 4L * d, 1e-2, 1e-4);

    vk->free(vk, iv);
    vk->free(vk, tables_v);
    vk->free(vk, ev);
    vk->free(vk, dtv);
    vk->free(vk, vp_v);
    vk->free(vk, vv);
    vk->free(vk, dvpv);
    vk->free(vk, dvpv2);
    vk->free(vk, dtapv);
    free(tok), free(ic), free(tables), free(ec), free(de), free(dt0), free(dtc);
    free(vp), free(taps), free(vc), free(dvv_in), free(dtaps0), free(dvpc), free(dtapc);
    nd_layout_buf_free(&lb);
}

static void check_gate(long N, int d)
{
    char what[96];
    size_t nd = (size_t)N * d;
    float *u = rand_host((long)nd, 1.0f), *k = rand_host((long)nd, 1.0f);
    float *v = rand_host((long)nd, 1.0f), *bx0 = rand_host((long)nd, 1.0f);
    for (size_t i = 0; i < nd; i += 3) /* correlated rows: alpha away from 0.5 */
        k[i] = u[i];
    float *u_v = vdup(u, nd * 4), *k_v = vdup(k, nd * 4);
    for (int acc = 0; acc < 2; acc++) {
        float *bc = hdup(bx0, nd * 4), *bv = vdup(bx0, nd * 4);
        float *ac = malloc(sizeof *ac * (size_t)N), *av = vk->alloc(vk, sizeof *av * N);
        cpu->engram_gate(cpu, bc, ac, u, k, v, N, d, acc);
        vk->engram_gate(vk, bv, av, u_v, k_v, v, N, d, acc); /* v from host */
        nd_backend_sync(vk);
        snprintf(what, sizeof what, "engram_gate N=%ld d=%d accumulate=%d bx", N, d, acc);
        compare(what, bv, bc, (long)nd, 1e-2, 1e-4); /* u + alpha*v may cancel */
        compare("  alpha", av, ac, N, 1e-3, 1e-5);
        if (acc) {
            float *dbx = rand_host((long)nd, 1.0f), *g0 = rand_host((long)(3 * nd), 0.5f);
            float *gc = hdup(g0, 3 * nd * 4), *gv = vdup(g0, 3 * nd * 4);
            float *gv2 = vdup(g0, 3 * nd * 4);
            cpu->engram_gate_backward(cpu, gc, gc + nd, gc + 2 * nd, dbx, u, k, v, ac, N, d);
            vk->engram_gate_backward(vk, gv, gv + nd, gv + 2 * nd, dbx, u_v, k_v, v, av, N, d);
            vk->engram_gate_backward(vk, NULL, gv2 + nd, NULL, dbx, u_v, k_v, v, av, N, d);
            nd_backend_sync(vk);
            compare("engram_gate_backward du (+=)", gv, gc, (long)nd, 1e-2, 1e-4);
            compare("engram_gate_backward dk (+=)", gv + nd, gc + nd, (long)nd, 1e-2, 1e-4);
            compare("engram_gate_backward dv (+=)", gv + 2 * nd, gc + 2 * nd, (long)nd, 1e-2, 1e-5);
            compare("  du, dv NULL: dk", gv2 + nd, gc + nd, (long)nd, 1e-2, 1e-4);
            compare("  du, dv NULL: du untouched", gv2, g0, (long)nd, 1e-3, 0);
            vk->free(vk, gv);
            vk->free(vk, gv2);
            free(dbx), free(g0), free(gc);
        }
        vk->free(vk, bv);
        vk->free(vk, av);
        free(bc), free(ac);
    }
    vk->free(vk, u_v);
    vk->free(vk, k_v);
    free(u), free(k), free(v), free(bx0);
}

static void check_cross_entropy(long N, int V, int with_weight)
{
    char what[96];
    size_t nv = (size_t)N * V;
    float *logits = rand_host((long)nv, 8.0f);
    int32_t *tgt = malloc(sizeof *tgt * (size_t)N);
    float *w = malloc(sizeof *w * (size_t)N);
    for (long r = 0; r < N; r++) {
        tgt[r] = rand() % V;
        w[r] = r % 4 == 1 ? 0.0f : 0.25f + (float)(r % 5);
        logits[(size_t)r * V + (size_t)tgt[r]] += (float)(r % 3) * 5.0f; /* some confident rows */
    }
    float *lv = vdup(logits, nv * 4);
    float *loss_c = malloc(sizeof *loss_c * (size_t)N), *loss_v = vk->alloc(vk, sizeof *loss_v * N);
    cpu->cross_entropy(cpu, loss_c, logits, tgt, N, V);
    vk->cross_entropy(vk, loss_v, lv, tgt, N, V);
    float *lc = hdup(logits, nv * 4);
    cpu->cross_entropy_backward(cpu, lc, tgt, with_weight ? w : NULL, N, V);
    vk->cross_entropy_backward(vk, lv, tgt, with_weight ? w : NULL, N, V);
    nd_backend_sync(vk);
    snprintf(what, sizeof what, "cross_entropy N=%ld V=%d", N, V);
    compare(what, loss_v, loss_c, N, 1e-3, 1e-5);
    snprintf(what, sizeof what, "cross_entropy_backward weight=%s", with_weight ? "yes" : "NULL");
    compare(what, lv, lc, (long)nv, 1e-2, 1e-4); /* p*w - w may cancel */
    vk->free(vk, lv);
    vk->free(vk, loss_v);
    free(logits), free(tgt), free(w), free(loss_c), free(lc);
}

int main(void)
{
    nd_tuning_refresh(); /* NEEDLE_PLUGIN_DIR ... (core/tuning.h) */
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a crash */
    cpu = nd_backend_cpu(2);
    vk = nd_backend_get("vulkan:0", 1);
    if (!vk) {
        printf("no Vulkan backend: %s\n", nd_last_error());
        return 77;
    }
    printf("%s | %s\n", vk->name, vk->detail);
    srand(7);

    check_embed(1, 1, 1);
    check_embed(37, 65, 11);
    check_embed(513, 320, 300);

    check_rows(1, 3, 1);
    check_rows(77, 130, 19);
    check_rows(600, 64, 1000);

    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        check_engram(&layouts[i], 2, 2, 17, 8, 33, 1);
        check_engram(&layouts[i], 3, 3, 5, 5, 70, 2);
    }
    check_engram(&layouts[2], 4, 1, 3, 3, 16, 3);
    check_engram(&layouts[3], 2, 4, 97, 64, 129, 1);

    check_gate(1, 1);
    check_gate(9, 257);
    check_gate(130, 64);

    check_cross_entropy(1, 1, 1);
    check_cross_entropy(5, 300, 0);
    check_cross_entropy(17, 8193, 1);
    check_cross_entropy(3, 33000, 0);

    /* more rows (groups) than one grid dimension holds: the shaders loop */
    check_embed(70000, 1, 100000);
    check_rows(140000, 1, 100000);
    check_gate(70000, 2);
    check_cross_entropy(70000, 3, 1);

    printf(failures ? "%d FAILED\n" : "all ops match the CPU backend\n", failures);
    return failures ? 1 : 0;
}
