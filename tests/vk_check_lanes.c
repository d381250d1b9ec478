/* Checks the Vulkan "lanes" group (hyper-connections, lanes, scaled
 * residual, Hadamard MLP, rmsnorm/gate backwards) against the CPU backend:
 * random inputs, awkward sizes, accumulated outputs prefilled alike on both
 * sides, some inputs in plain host memory (the staging path), the aliasing
 * the op comments allow. Prints the largest error per op and fails when one
 * exceeds its bound.
 *
 * NEEDLE_PLUGIN_DIR=build ./vk_check_lanes   (77 when no Vulkan device) */
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
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = amp * frand();
    return p;
}

/* a device copy of host data */
static float *dev_copy(const float *src, size_t n)
{
    float *p = vk->alloc(vk, (n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "vulkan alloc of %zu floats failed\n", n);
        exit(1);
    }
    memcpy(p, src, n * sizeof *p);
    return p;
}

static float *host_copy(const float *src, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

/* max |a-b| / (|b| + floor + 1e-3 max|b|): relative, except that values
 * far below the array's scale (sums that cancel) count against that scale */
static double rel_err(const float *got, const float *want, size_t n, double floor)
{
    double m = 0, scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)want[i]));
    floor += 1e-3 * scale;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]) / (fabs((double)want[i]) + floor);
        if (!(e <= m)) /* NaN counts as a failure */
            m = isnan(e) ? INFINITY : e;
    }
    return m;
}

static void report(const char *op, const char *what, double err, double bound)
{
    int bad = !(err <= bound);
    failures += bad;
    printf("%-28s %-34s max rel err %.3e%s\n", op, what, err, bad ? "  FAIL" : "");
}

/* ---- hyper_coeffs and its backward ---- */

static void check_hyper(long N, int n, int partial_null)
{
    size_t nN = (size_t)N * n, nn = (size_t)n * n, nnN = nN * n;
    float *pre = host_rand(nN, 2), *post = host_rand(nN, 2), *res = host_rand(nnN, 3);
    float *b_pre = host_rand(n, 1), *b_post = host_rand(n, 1), *b_res = host_rand(nn, 1);
    float a_pre = 0.7f, a_post = -1.3f, a_res = 1.9f;
    int lane = 1 % n;
    float *hpre_c = malloc(nN * 4), *hpost_c = malloc(nN * 4), *M_c = malloc(nnN * 4);
    cpu->hyper_coeffs(cpu, hpre_c, hpost_c, M_c, pre, post, res, a_pre, a_post, a_res, b_pre,
                      b_post, b_res, lane, N, n);
    float *hpre_v = vk->alloc(vk, nN * 4), *hpost_v = vk->alloc(vk, nN * 4),
          *M_v = vk->alloc(vk, nnN * 4);
    float *res_v = dev_copy(res, nnN); /* res on the device, the rest staged */
    vk->hyper_coeffs(vk, hpre_v, hpost_v, M_v, pre, post, res_v, a_pre, a_post, a_res, b_pre,
                     b_post, b_res, lane, N, n);
    nd_backend_sync(vk);
    char what[64];
    snprintf(what, sizeof what, "N=%ld n=%d hpre", N, n);
    report("hyper_coeffs", what, rel_err(hpre_v, hpre_c, nN, 1e-3), 1e-5);
    snprintf(what, sizeof what, "N=%ld n=%d hpost", N, n);
    report("hyper_coeffs", what, rel_err(hpost_v, hpost_c, nN, 1e-3), 1e-5);
    snprintf(what, sizeof what, "N=%ld n=%d M", N, n);
    report("hyper_coeffs", what, rel_err(M_v, M_c, nnN, 1e-3), 1e-4);

    /* backward from the CPU forward's hpre/hpost */
    float *dhpre = host_rand(nN, 1), *dhpost = host_rand(nN, 1), *dM = host_rand(nnN, 1);
    size_t K = 3 + 2 * (size_t)n + nn;
    float *acc0 = host_rand(K, 1); /* prefilled accumulators, same on both sides */
    float *acc_c = host_copy(acc0, K), *acc_v = dev_copy(acc0, K);
    float *dpre_c = malloc(nN * 4), *dpost_c = malloc(nN * 4), *dres_c = malloc(nnN * 4);
    float *dpre_v = vk->alloc(vk, nN * 4), *dpost_v = vk->alloc(vk, nN * 4),
          *dres_v = vk->alloc(vk, nnN * 4);
    float *dhpre_v = dev_copy(dhpre, nN);
#define ACC(base, k) ((partial_null && (k) % 2) ? NULL : (base) + (k))
    cpu->hyper_coeffs_backward(cpu, dpre_c, dpost_c, dres_c, ACC(acc_c, 0), ACC(acc_c, 1),
                               acc_c + 2, acc_c + 3, partial_null ? NULL : acc_c + 3 + n,
                               acc_c + 3 + 2 * n, dhpre, dhpost, dM, pre, post, res, hpre_c,
                               hpost_c, a_pre, a_post, a_res, b_res, N, n);
    vk->hyper_coeffs_backward(vk, dpre_v, dpost_v, dres_v, ACC(acc_v, 0), ACC(acc_v, 1), acc_v + 2,
                              acc_v + 3, partial_null ? NULL : acc_v + 3 + n, acc_v + 3 + 2 * n,
                              dhpre_v, dhpost, dM, pre, post, res_v, hpre_c, hpost_c, a_pre, a_post,
                              a_res, b_res, N, n);
#undef ACC
    nd_backend_sync(vk);
    snprintf(what, sizeof what, "N=%ld n=%d dpre", N, n);
    report("hyper_coeffs_backward", what, rel_err(dpre_v, dpre_c, nN, 1e-3), 1e-5);
    snprintf(what, sizeof what, "N=%ld n=%d dpost", N, n);
    report("hyper_coeffs_backward", what, rel_err(dpost_v, dpost_c, nN, 1e-3), 1e-5);
    snprintf(what, sizeof what, "N=%ld n=%d dres", N, n);
    report("hyper_coeffs_backward", what, rel_err(dres_v, dres_c, nnN, 1e-2), 1e-3);
    snprintf(what, sizeof what, "N=%ld n=%d da/db%s", N, n, partial_null ? " (some NULL)" : "");
    report("hyper_coeffs_backward", what, rel_err(acc_v, acc_c, K, 1e-2), 1e-3);
    vk->free(vk, hpre_v);
    vk->free(vk, hpost_v);
    vk->free(vk, M_v);
    vk->free(vk, res_v);
    vk->free(vk, acc_v);
    vk->free(vk, dpre_v);
    vk->free(vk, dpost_v);
    vk->free(vk, dres_v);
    vk->free(vk, dhpre_v);
    free(pre), free(post), free(res), free(b_pre), free(b_post), free(b_res);
    free(hpre_c), free(hpost_c), free(M_c), free(dhpre), free(dhpost), free(dM);
    free(acc0), free(acc_c), free(dpre_c), free(dpost_c), free(dres_c);
}

/* ---- lanes ---- */

static void check_lanes(long N, int n, int d)
{
    size_t Nd = (size_t)N * d, Nn = (size_t)N * n, Xs = Nd * n;
    char what[64];
    snprintf(what, sizeof what, "N=%ld n=%d d=%d", N, n, d);
    float *X = host_rand(Xs, 1), *hpre = host_rand(Nn, 1), *hpost = host_rand(Nn, 2);
    float *M = host_rand(Nn * n, 1), *y = host_rand(Nd, 1), *x0 = host_rand(Nd, 1);
    float *X_v = dev_copy(X, Xs);

    /* combine */
    float *u_c = malloc(Nd * 4), *u_v = vk->alloc(vk, Nd * 4);
    cpu->lanes_combine(cpu, u_c, hpre, X, N, n, d);
    vk->lanes_combine(vk, u_v, hpre, X_v, N, n, d);
    /* update */
    float *Xo_c = malloc(Xs * 4), *Xo_v = vk->alloc(vk, Xs * 4);
    cpu->lanes_update(cpu, Xo_c, M, X, hpost, y, N, n, d);
    vk->lanes_update(vk, Xo_v, M, X_v, hpost, y, N, n, d);
    /* broadcast, mean */
    float *B_c = malloc(Xs * 4), *B_v = vk->alloc(vk, Xs * 4);
    cpu->lanes_broadcast(cpu, B_c, x0, N, n, d);
    vk->lanes_broadcast(vk, B_v, x0, N, n, d);
    float *m_c = malloc(Nd * 4), *m_v = vk->alloc(vk, Nd * 4);
    cpu->lanes_mean(cpu, m_c, X, N, n, d);
    vk->lanes_mean(vk, m_v, X_v, N, n, d);
    nd_backend_sync(vk);
    report("lanes_combine", what, rel_err(u_v, u_c, Nd, 1e-3), 1e-5);
    report("lanes_update", what, rel_err(Xo_v, Xo_c, Xs, 1e-3), 1e-5);
    report("lanes_broadcast", what, rel_err(B_v, B_c, Xs, 1e-3), 0);
    report("lanes_mean", what, rel_err(m_v, m_c, Nd, 1e-3), 1e-6);

    /* combine backward: dX += (prefilled) */
    float *du = host_rand(Nd, 1), *dX0 = host_rand(Xs, 1);
    float *dX_c = host_copy(dX0, Xs), *dX_v = dev_copy(dX0, Xs);
    float *dh_c = malloc(Nn * 4), *dh_v = vk->alloc(vk, Nn * 4);
    cpu->lanes_combine_backward(cpu, dh_c, dX_c, du, hpre, X, N, n, d);
    vk->lanes_combine_backward(vk, dh_v, dX_v, du, hpre, X_v, N, n, d);
    /* update backward, separate and in place (dX = dXo) */
    float *dXo = host_rand(Xs, 1);
    float *uX_c = malloc(Xs * 4), *udM_c = malloc(Nn * n * 4), *udh_c = malloc(Nn * 4),
          *udy_c = malloc(Nd * 4);
    float *uX_v = vk->alloc(vk, Xs * 4), *udM_v = vk->alloc(vk, Nn * n * 4),
          *udh_v = vk->alloc(vk, Nn * 4), *udy_v = vk->alloc(vk, Nd * 4);
    cpu->lanes_update_backward(cpu, uX_c, udM_c, udh_c, udy_c, dXo, M, X, hpost, y, N, n, d);
    vk->lanes_update_backward(vk, uX_v, udM_v, udh_v, udy_v, dXo, M, X_v, hpost, y, N, n, d);
    float *ip_v = dev_copy(dXo, Xs), *ipdM_v = vk->alloc(vk, Nn * n * 4),
          *ipdh_v = vk->alloc(vk, Nn * 4), *ipdy_v = vk->alloc(vk, Nd * 4);
    vk->lanes_update_backward(vk, ip_v, ipdM_v, ipdh_v, ipdy_v, ip_v, M, X_v, hpost, y, N, n, d);
    /* broadcast / mean backward */
    float *bx_c = malloc(Nd * 4), *bx_v = vk->alloc(vk, Nd * 4);
    cpu->lanes_broadcast_backward(cpu, bx_c, dXo, N, n, d);
    vk->lanes_broadcast_backward(vk, bx_v, dXo, N, n, d);
    float *mX_c = malloc(Xs * 4), *mX_v = vk->alloc(vk, Xs * 4);
    cpu->lanes_mean_backward(cpu, mX_c, du, N, n, d);
    vk->lanes_mean_backward(vk, mX_v, du, N, n, d);
    nd_backend_sync(vk);
    report("lanes_combine_backward", "dX += ", rel_err(dX_v, dX_c, Xs, 1e-3), 1e-5);
    report("lanes_combine_backward", "dhpre", rel_err(dh_v, dh_c, Nn, 1e-3), 1e-4);
    report("lanes_update_backward", "dX", rel_err(uX_v, uX_c, Xs, 1e-3), 1e-5);
    report("lanes_update_backward", "dM", rel_err(udM_v, udM_c, Nn * n, 1e-3), 1e-4);
    report("lanes_update_backward", "dhpost", rel_err(udh_v, udh_c, Nn, 1e-3), 1e-4);
    report("lanes_update_backward", "dy", rel_err(udy_v, udy_c, Nd, 1e-3), 1e-5);
    report("lanes_update_backward", "dX in place (dX = dXo)", rel_err(ip_v, uX_c, Xs, 1e-3), 1e-5);
    report("lanes_update_backward", "dM/dhpost/dy in place",
           fmax(rel_err(ipdM_v, udM_c, Nn * n, 1e-3),
                fmax(rel_err(ipdh_v, udh_c, Nn, 1e-3), rel_err(ipdy_v, udy_c, Nd, 1e-3))),
           1e-4);
    report("lanes_broadcast_backward", what, rel_err(bx_v, bx_c, Nd, 1e-3), 1e-6);
    report("lanes_mean_backward", what, rel_err(mX_v, mX_c, Xs, 1e-3), 0);

    float *vs[] = {X_v,   u_v,   Xo_v, B_v,    m_v,    dX_v,   dh_v, uX_v, udM_v,
                   udh_v, udy_v, ip_v, ipdM_v, ipdh_v, ipdy_v, bx_v, mX_v};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++)
        vk->free(vk, vs[i]);
    float *hs[] = {X,   hpre, hpost, M,   y,    x0,    u_c,   Xo_c,  B_c,  m_c, du,
                   dX0, dX_c, dh_c,  dXo, uX_c, udM_c, udh_c, udy_c, bx_c, mX_c};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        free(hs[i]);
}

/* ---- scaled residual ---- */

static void check_residual(long n, float gate, int with_dgate)
{
    char what[64];
    snprintf(what, sizeof what, "n=%ld gate=%g", n, gate);
    float *x = host_rand(n, 1), *r = host_rand(n, 1), *dy = host_rand(n, 1);
    float *y_c = malloc(n * 4), *y_v = vk->alloc(vk, n * 4), *r_v = dev_copy(r, n);
    cpu->residual_scaled(cpu, y_c, x, r, gate, n);
    vk->residual_scaled(vk, y_v, x, r_v, gate, n);
    /* backward: dr separate, then dr in place over dy */
    float *dr_c = malloc(n * 4), *dr_v = vk->alloc(vk, n * 4), *ip_v = dev_copy(dy, n);
    float g0 = 0.25f, dg_c = g0, *dg_v = dev_copy(&g0, 1), *dg2_v = dev_copy(&g0, 1);
    cpu->residual_scaled_backward(cpu, dr_c, with_dgate ? &dg_c : NULL, dy, r, gate, n);
    vk->residual_scaled_backward(vk, dr_v, with_dgate ? dg_v : NULL, dy, r_v, gate, n);
    vk->residual_scaled_backward(vk, ip_v, with_dgate ? dg2_v : NULL, ip_v, r_v, gate, n);
    nd_backend_sync(vk);
    report("residual_scaled", what, rel_err(y_v, y_c, n, 1e-3), 1e-6);
    report("residual_scaled_backward", "dr", rel_err(dr_v, dr_c, n, 1e-3), 1e-6);
    report("residual_scaled_backward", "dr in place (dr = dy)", rel_err(ip_v, dr_c, n, 1e-3), 1e-6);
    if (with_dgate) {
        report("residual_scaled_backward", "dgate +=", rel_err(dg_v, &dg_c, 1, 1e-2), 1e-4);
        report("residual_scaled_backward", "dgate += (in place run)",
               rel_err(dg2_v, &dg_c, 1, 1e-2), 1e-4);
    } else
        report("residual_scaled_backward", "dgate NULL untouched", fabs(dg_v[0] - g0), 0);
    vk->free(vk, y_v), vk->free(vk, r_v), vk->free(vk, dr_v), vk->free(vk, ip_v);
    vk->free(vk, dg_v), vk->free(vk, dg2_v);
    free(x), free(r), free(dy), free(y_c), free(dr_c);
}

/* ---- Hadamard MLP ---- */

static void check_hadamard(long N, int d, int hn, int with_u, int with_dd)
{
    char what[64];
    snprintf(what, sizeof what, "N=%ld d=%d hn=%d%s", N, d, hn, with_u ? " u" : "");
    size_t Nd = (size_t)N * d, Nh = (size_t)N * hn;
    float *x = host_rand(Nd, 1), *z = host_rand(Nd, 1), *u = host_rand(Nd, 1);
    float *d1 = host_rand(hn, 1), *d2 = host_rand(hn, 2), *d3 = host_rand(hn, 1);
    float *z_v = dev_copy(z, Nd), *d2_v = dev_copy(d2, hn);
    float *y_c = malloc(Nd * 4), *h1_c = malloc(Nh * 4);
    float *y_v = vk->alloc(vk, Nd * 4), *h1_v = vk->alloc(vk, Nh * 4);
    cpu->hadamard_mlp(cpu, y_c, h1_c, x, z, with_u ? u : NULL, d1, d2, d3, N, d, hn);
    vk->hadamard_mlp(vk, y_v, h1_v, x, z_v, with_u ? u : NULL, d1, d2_v, d3, N, d, hn);
    /* backward from the CPU's h1 (device copy) */
    float *dy = host_rand(Nd, 1), *h1c_v = dev_copy(h1_c, Nh);
    float *dd0 = host_rand(3 * (size_t)hn, 1);
    float *dd_c = host_copy(dd0, 3 * (size_t)hn), *dd_v = dev_copy(dd0, 3 * (size_t)hn);
    float *dz_c = malloc(Nd * 4), *dz_v = vk->alloc(vk, Nd * 4);
    cpu->hadamard_mlp_backward(cpu, dz_c, with_dd ? dd_c : NULL, with_dd ? dd_c + hn : NULL,
                               with_dd ? dd_c + 2 * hn : NULL, dy, z, h1_c, d1, d2, d3, N, d, hn);
    vk->hadamard_mlp_backward(vk, dz_v, with_dd ? dd_v : NULL, with_dd ? dd_v + hn : NULL,
                              with_dd ? dd_v + 2 * hn : NULL, dy, z_v, h1c_v, d1, d2_v, d3, N, d,
                              hn);
    nd_backend_sync(vk);
    report("hadamard_mlp", what, rel_err(y_v, y_c, Nd, 1e-2), 1e-4);
    report("hadamard_mlp", "h1", rel_err(h1_v, h1_c, Nh, 1e-2), 1e-4);
    report("hadamard_mlp_backward", "dz", rel_err(dz_v, dz_c, Nd, 1e-2), 1e-4);
    report("hadamard_mlp_backward", with_dd ? "dd1,dd2,dd3 +=" : "dd NULL untouched",
           rel_err(dd_v, dd_c, 3 * (size_t)hn, 1e-2), 1e-4);
    vk->free(vk, z_v), vk->free(vk, d2_v), vk->free(vk, y_v), vk->free(vk, h1_v);
    vk->free(vk, h1c_v), vk->free(vk, dd_v), vk->free(vk, dz_v);
    free(x), free(z), free(u), free(d1), free(d2), free(d3), free(y_c), free(h1_c);
    free(dy), free(dd0), free(dd_c), free(dz_c);
}

/* ---- rmsnorm backward ---- */

static void check_rmsnorm_backward(long rows, int dim, int with_rstd, int with_scale, int acc,
                                   int with_dscale, int in_place)
{
    char what[96];
    snprintf(what, sizeof what, "rows=%ld dim=%d%s%s%s%s%s", rows, dim, with_rstd ? " rstd" : "",
             with_scale ? " scale" : "", acc ? " acc" : "", with_dscale ? " dscale" : "",
             in_place ? " dx=dy" : "");
    size_t nel = (size_t)rows * dim;
    float *x = host_rand(nel, 2), *dy = host_rand(nel, 1), *scale = host_rand(dim, 0.5f);
    float *y = malloc(nel * 4), *rstd = malloc(rows * 4);
    cpu->rmsnorm(cpu, y, rstd, x, scale, rows, dim);
    float *dx0 = host_rand(nel, 1), *ds0 = host_rand(dim, 1);
    float *dx_c = host_copy(in_place ? dy : dx0, nel), *ds_c = host_copy(ds0, dim);
    float *dx_v = dev_copy(in_place ? dy : dx0, nel), *ds_v = dev_copy(ds0, dim);
    float *x_v = dev_copy(x, nel);
    cpu->rmsnorm_backward(cpu, dx_c, with_dscale ? ds_c : NULL, in_place ? dx_c : dy, x,
                          with_rstd ? rstd : NULL, with_scale ? scale : NULL, rows, dim, acc);
    vk->rmsnorm_backward(vk, dx_v, with_dscale ? ds_v : NULL, in_place ? dx_v : dy, x_v,
                         with_rstd ? rstd : NULL, with_scale ? scale : NULL, rows, dim, acc);
    nd_backend_sync(vk);
    report("rmsnorm_backward", what, rel_err(dx_v, dx_c, nel, 1e-2), 1e-4);
    report("rmsnorm_backward", with_dscale ? "dscale +=" : "dscale NULL",
           rel_err(ds_v, ds_c, dim, 1e-2), 1e-4);
    vk->free(vk, dx_v), vk->free(vk, ds_v), vk->free(vk, x_v);
    free(x), free(dy), free(scale), free(y), free(rstd), free(dx0), free(ds0), free(dx_c);
    free(ds_c);
}

/* ---- gate backward ---- */

static void check_gate_backward(long n)
{
    char what[64];
    snprintf(what, sizeof what, "n=%ld", n);
    float *dout = host_rand(n, 1), *att = host_rand(n, 1), *g = host_rand(n, 4);
    float *da_c = malloc(n * 4), *dg_c = malloc(n * 4);
    float *da_v = vk->alloc(vk, n * 4), *dg_v = vk->alloc(vk, n * 4), *g_v = dev_copy(g, n);
    float *ip_v = dev_copy(dout, n), *dg2_v = vk->alloc(vk, n * 4);
    cpu->gate_sigmoid_backward(cpu, da_c, dg_c, dout, att, g, n);
    vk->gate_sigmoid_backward(vk, da_v, dg_v, dout, att, g_v, n);
    vk->gate_sigmoid_backward(vk, ip_v, dg2_v, ip_v, att, g_v, n);
    nd_backend_sync(vk);
    report("gate_sigmoid_backward", what, rel_err(da_v, da_c, n, 1e-3), 1e-6);
    report("gate_sigmoid_backward", "dg", rel_err(dg_v, dg_c, n, 1e-3), 1e-5);
    report("gate_sigmoid_backward", "in place (datt = dout)",
           fmax(rel_err(ip_v, da_c, n, 1e-3), rel_err(dg2_v, dg_c, n, 1e-3)), 1e-5);
    vk->free(vk, da_v), vk->free(vk, dg_v), vk->free(vk, g_v), vk->free(vk, ip_v);
    vk->free(vk, dg2_v);
    free(dout), free(att), free(g), free(da_c), free(dg_c);
}

int main(int argc, char **argv)
{
    nd_tuning_refresh(); /* NEEDLE_PLUGIN_DIR ... (core/tuning.h) */
    int big = argc > 1 && !strcmp(argv[1], "--big"); /* model-sized cases too */
    srand(1234);
    cpu = nd_backend_cpu(1);
    vk = nd_backend_get("vulkan:0", 1);
    if (!vk) {
        printf("no Vulkan backend: %s\n", nd_last_error());
        return 77;
    }
    printf("%s | %s\n", vk->name, vk->detail);

    check_hyper(1, 4, 0);
    check_hyper(37, 4, 0);
    check_hyper(300, 2, 1);
    check_hyper(129, 3, 0);
    check_hyper(70, 5, 1);
    if (big)
        check_hyper(8192, 4, 0);

    check_lanes(1, 1, 1);
    check_lanes(37, 4, 67);
    check_lanes(20, 3, 130);
    check_lanes(5, 9, 33);
    if (big)
        check_lanes(2048, 4, 512);

    check_residual(1, 0.3f, 1);
    check_residual(100003, -0.7f, 1);
    check_residual(4097, 1.5f, 0);
    if (big)
        check_residual(3000000, 0.2f, 1);

    check_hadamard(1, 1, 1, 0, 1);
    check_hadamard(37, 100, 128, 1, 1);
    check_hadamard(17, 3, 4, 0, 1);
    check_hadamard(300, 512, 512, 1, 1);
    check_hadamard(9, 1000, 1024, 0, 0);
    check_hadamard(5, 4000, 4096, 1, 1);
    if (big)
        check_hadamard(4096, 512, 512, 1, 1);

    check_rmsnorm_backward(37, 96, 1, 1, 0, 1, 0);
    check_rmsnorm_backward(37, 96, 0, 1, 1, 1, 0);
    check_rmsnorm_backward(1, 7, 0, 0, 0, 0, 0);
    check_rmsnorm_backward(300, 1000, 1, 1, 1, 1, 1);
    check_rmsnorm_backward(50, 257, 0, 0, 1, 0, 1);
    check_rmsnorm_backward(2000, 64, 0, 1, 0, 1, 1);
    if (big)
        check_rmsnorm_backward(8192, 2048, 1, 0, 1, 0, 0);

    check_gate_backward(1);
    check_gate_backward(70001);

    /* more rows than one grid dimension has workgroups (65535) */
    check_lanes(17000, 4, 5);
    check_rmsnorm_backward(70000, 5, 0, 1, 1, 1, 1);
    check_hadamard(70000, 3, 4, 1, 1);
    check_hyper(70000, 2, 0);

    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
