/* Checks the Vulkan backend's rope, rope_backward, attention and
 * attention_backward against the CPU backend on random inputs: dense
 * layouts and shared-prefix layouts, H != G, several head sizes. Some
 * inputs are plain host memory (the staging path), outputs start as NaN
 * (they must be set, not accumulated), and the backward runs twice to
 * check that it is deterministic. Exit 0 when every error is within
 * tolerance, 1 otherwise, 77 when no Vulkan device can be opened.
 *
 * Run with NEEDLE_PLUGIN_DIR=<build dir> (NEEDLE_VULKAN_VALIDATE=1 for the
 * validation layer). */
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

static float *host_rand(size_t n, float amp)
{
    float *p = malloc(n * sizeof *p);
    if (!p)
        abort();
    for (size_t i = 0; i < n; i++)
        p[i] = amp * frand();
    return p;
}

/* a copy of host data in the Vulkan backend's memory */
static float *vk_copy(const float *src, size_t n)
{
    float *p = vk->alloc(vk, n * sizeof *p);
    if (!p)
        abort();
    memcpy(p, src, n * sizeof *p);
    return p;
}

/* Vulkan output memory filled with NaN: whatever the op does not set shows */
static float *vk_nan(size_t n)
{
    float *p = vk->alloc(vk, n * sizeof *p);
    if (!p)
        abort();
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* max |got - want| over max |want|; NaN anywhere counts as failure */
static double rel_err(const float *got, const float *want, size_t n)
{
    double m = 0.0, ref = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e == e))
            return INFINITY;
        m = e > m ? e : m;
        ref = fabs(want[i]) > ref ? fabs(want[i]) : ref;
    }
    return m / ref;
}

static double worst[6]; /* rope, rope_bwd, out, lse, dq, dk/dv */

static void report(const char *what, const char *name, double err, double tol, int slot)
{
    int ok = err <= tol;
    if (!ok)
        failures++;
    worst[slot] = err > worst[slot] ? err : worst[slot];
    printf("  %-8s %-28s err %.2e %s\n", what, name, err, ok ? "ok" : "FAIL");
}

static void check_rope(const char *name, const nd_layout *L, int heads, int hd)
{
    int half = hd / 2, max_pos = nd_layout_max_pos(L);
    size_t n = (size_t)L->N * heads * hd, nt = (size_t)(max_pos + 1) * half;
    float *x = host_rand(n, 1.0f), *cs = malloc(nt * 4), *sn = malloc(nt * 4);
    for (int t = 0; t <= max_pos; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * pow(10000.0, -2.0 * i / hd);
            cs[(size_t)t * half + i] = (float)cos(ang);
            sn[(size_t)t * half + i] = (float)sin(ang);
        }
    float *sn_vk = vk_copy(sn, nt); /* cos from host memory, sin from device memory */
    for (int bwd = 0; bwd < 2; bwd++) {
        float *xc = malloc(n * 4), *xv = vk_copy(x, n);
        memcpy(xc, x, n * 4);
        if (bwd) {
            cpu->rope_backward(cpu, xc, cs, sn, L, heads, hd);
            vk->rope_backward(vk, xv, cs, sn_vk, L, heads, hd);
        } else {
            cpu->rope(cpu, xc, cs, sn, L, heads, hd);
            vk->rope(vk, xv, cs, sn_vk, L, heads, hd);
        }
        nd_backend_sync(vk);
        report(bwd ? "rope_bwd" : "rope", name, rel_err(xv, xc, n), 1e-6, bwd);
        free(xc);
        vk->free(vk, xv);
    }
    vk->free(vk, sn_vk);
    free(x);
    free(cs);
    free(sn);
}

static void check_attention(const char *name, const nd_layout *L, int H, int G, int hd)
{
    size_t N = (size_t)L->N, nq = N * H * hd, nk = N * G * hd, nl = N * H;
    float *q = host_rand(nq, 2.0f), *k = host_rand(nk, 2.0f), *v = host_rand(nk, 1.0f);
    float *dout = host_rand(nq, 1.0f);
    /* CPU reference */
    float *out_c = malloc(nq * 4), *lse_c = malloc(nl * 4);
    float *dq_c = malloc(nq * 4), *dk_c = malloc(nk * 4), *dv_c = malloc(nk * 4);
    cpu->attention(cpu, out_c, lse_c, q, k, v, L, H, G, hd);
    cpu->attention_backward(cpu, dq_c, dk_c, dv_c, dout, q, k, v, out_c, lse_c, L, H, G, hd);

    /* forward: q and v from host memory (staged), k from device memory */
    float *k_vk = vk_copy(k, nk), *out_v = vk_nan(nq), *lse_v = vk_nan(nl);
    vk->attention(vk, out_v, lse_v, q, k_vk, v, L, H, G, hd);
    nd_backend_sync(vk);
    report("out", name, rel_err(out_v, out_c, nq), 2e-5, 2);
    report("lse", name, rel_err(lse_v, lse_c, nl), 2e-6, 3);
    /* lse NULL: out alone */
    float *out_v2 = vk_nan(nq);
    vk->attention(vk, out_v2, NULL, q, k_vk, v, L, H, G, hd);
    nd_backend_sync(vk);
    if (memcmp(out_v2, out_v, nq * 4)) {
        printf("  out with lse NULL differs from out with lse\n");
        failures++;
    }

    /* backward from the CPU's out/lse: dout and q in device memory, k/v
     * host memory, out/lse device memory */
    float *dout_vk = vk_copy(dout, nq), *q_vk = vk_copy(q, nq);
    float *outc_vk = vk_copy(out_c, nq), *lsec_vk = vk_copy(lse_c, nl);
    float *dq_v = vk_nan(nq), *dk_v = vk_nan(nk), *dv_v = vk_nan(nk);
    vk->attention_backward(vk, dq_v, dk_v, dv_v, dout_vk, q_vk, k, v, outc_vk, lsec_vk, L, H, G,
                           hd);
    nd_backend_sync(vk);
    report("dq", name, rel_err(dq_v, dq_c, nq), 5e-5, 4);
    report("dk", name, rel_err(dk_v, dk_c, nk), 5e-5, 5);
    report("dv", name, rel_err(dv_v, dv_c, nk), 5e-5, 5);
    /* deterministic: a second run (over NaN again) gives the same bits */
    float *dq_2 = vk_nan(nq), *dk_2 = vk_nan(nk), *dv_2 = vk_nan(nk);
    vk->attention_backward(vk, dq_2, dk_2, dv_2, dout_vk, q_vk, k, v, outc_vk, lsec_vk, L, H, G,
                           hd);
    nd_backend_sync(vk);
    if (memcmp(dq_2, dq_v, nq * 4) || memcmp(dk_2, dk_v, nk * 4) || memcmp(dv_2, dv_v, nk * 4)) {
        printf("  backward is not deterministic\n");
        failures++;
    }

    float *vkbufs[] = {k_vk,    out_v, lse_v, out_v2, dout_vk, q_vk, outc_vk,
                       lsec_vk, dq_v,  dk_v,  dv_v,   dq_2,    dk_2, dv_2};
    for (size_t i = 0; i < sizeof vkbufs / sizeof *vkbufs; i++)
        vk->free(vk, vkbufs[i]);
    float *hbufs[] = {q, k, v, dout, out_c, lse_c, dq_c, dk_c, dv_c};
    for (size_t i = 0; i < sizeof hbufs / sizeof *hbufs; i++)
        free(hbufs[i]);
}

/* layouts: len/parent pairs, parent as an index into the list or -1 */
typedef struct {
    const char *name;
    int n;
    int len[16], parent[16];
} layout_spec;

static const layout_spec layouts[] = {
    {"dense 1,5,70,130", 4, {1, 5, 70, 130}, {-1, -1, -1, -1}},
    {"dense 3x33", 3, {33, 33, 33}, {-1, -1, -1}},
    {"prefix 100 + 1,66,12", 4, {100, 1, 66, 12}, {-1, 0, 0, 0}},
    {"two prefix groups + plain",
     9,
     {7, 97, 1, 66, 12, 40, 17, 0, 3},
     {-1, -1, 1, 1, 1, -1, 5, 5, -1}},
    {"prefix 16 exact + 16,17", 3, {16, 16, 17}, {-1, 0, 0}},
    {"prefix without children", 3, {20, 30, 5}, {-1, -1, 1}},
};

static const int heads[][3] = {/* H, G, hd */
                               {8, 4, 64}, {4, 2, 16},  {6, 2, 32},
                               {3, 3, 24}, {2, 1, 128}, {4, 1, 18}};

int main(void)
{
    nd_tuning_refresh(); /* NEEDLE_PLUGIN_DIR ... (core/tuning.h) */
    cpu = nd_backend_cpu(1);
    vk = nd_backend_get("vulkan:0", 1);
    if (!vk) {
        printf("no Vulkan backend: %s\n", nd_last_error());
        return 77;
    }
    printf("%s | %s\n", vk->name, vk->detail);
    srand(1234);
    nd_layout_buf lb;
    if (nd_layout_buf_init(&lb, 4096, 64))
        abort();
    for (size_t li = 0; li < sizeof layouts / sizeof *layouts; li++) {
        const layout_spec *ls = &layouts[li];
        nd_layout_reset(&lb);
        for (int i = 0; i < ls->n; i++)
            if (nd_layout_add(&lb, ls->len[i], ls->parent[i]) < 0)
                abort();
        for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++) {
            int H = heads[hi][0], G = heads[hi][1], hd = heads[hi][2];
            char name[96];
            snprintf(name, sizeof name, "%s H%d G%d hd%d", ls->name, H, G, hd);
            printf("%s (N=%ld)\n", name, lb.L.N);
            check_rope(ls->name, &lb.L, H, hd);
            check_attention(ls->name, &lb.L, H, G, hd);
        }
    }
    nd_layout_buf_free(&lb);
    printf("worst: rope %.2e rope_bwd %.2e out %.2e lse %.2e dq %.2e dk/dv %.2e\n", worst[0],
           worst[1], worst[2], worst[3], worst[4], worst[5]);
    printf("%s (%d failures)\n", failures ? "FAIL" : "all ok", failures);
    return failures ? 1 : 0;
}
