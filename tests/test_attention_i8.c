/* The integer-score cached attention kernels (ND_ATT_VNNI512, ND_ATT_AVXVNNI,
 * ND_ATT_AVX2I8: int8 query rows . int8 keys) against attention.c's float
 * reference on random int8 caches (keys include -128), every kernel this
 * CPU runs: decode and prefill tasks, windows and sinks, head dims 16 to
 * 128 (48 and 80: the 16-byte and partial-vector tails), 256 and 512,
 * and tasks of more query rows than one pass quantises.
 *
 * Tolerance, from the quantisation of q (and below, of the weights): a
 * query row's int8 rounding moves each element by at most max|q| / 254,
 * so key j's score moves by at most
 * d_j = max|q| / 254 * sum_e |k_je| * ks_j / sqrt(hd); with every
 * score off by at most d = max_j d_j the softmax weights move by at most a
 * factor e^(2d) - 1 of themselves, so an output element may move by
 * (e^(2d) - 1) * sum_j w_j |vs_j v_je| (w: the exact weights), plus 1e-5 of
 * float rounding. The AVX-512 VNNI kernel also rounds the weights (times
 * vs_j) to int16 at max / 32767 of a block of keys: each moves by at most
 * e^(2d) max_j (w_j vs_j) / 65534, so the output by that times
 * sum_j |v_je| more. A kernel that drops the key scale, the query scale or
 * the unsigned offset's correction fails it by orders of magnitude.
 * Exit 77 (skipped) where the CPU runs none of them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "att_case.h"
#include "testutil.h"

#define ML 400

static uint32_t rng = 777u;

static float frand(void) /* in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

static int sees(int p, int j, int kv_window, int n_sink)
{
    int j0 = kv_window && p + 1 > kv_window ? p + 1 - kv_window : 0;
    int pin = n_sink > 0 ? n_sink : 0;
    return j <= p && (j >= j0 || j < pin);
}

/* bound[i * q_dim + h * hd + e]: the tolerance above for each output */
static void tolerance(const nd_kv_state *s, const float *Q, int p0, int n, int kv_window,
                      int n_sink, float *bound)
{
    const san_dims *D = &s->m->dims;
    int rep = D->H / D->G, hd = D->hd;
    double *w = malloc(sizeof(double) * ML);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < D->H; h++) {
            int g = h / rep, p = p0 + i;
            const float *q = Q + (size_t)i * D->q_dim + (size_t)h * hd;
            double qmax = 0.0, mx = -1e300, sum = 0.0, d = 0.0;
            for (int e = 0; e < hd; e++)
                qmax = fabs(q[e]) > qmax ? fabs(q[e]) : qmax;
            for (int j = 0; j <= p; j++) {
                const int8_t *k = nd_kv_row8(s, s->k8, 0, g, j);
                double dot = 0.0, ak = 0.0;
                for (int e = 0; e < hd; e++) {
                    dot += (double)q[e] * k[e];
                    ak += abs(k[e]);
                }
                double ks = s->ks[(size_t)j * D->G + g] / sqrt((double)hd);
                w[j] = dot * ks;
                if (sees(p, j, kv_window, n_sink)) {
                    mx = w[j] > mx ? w[j] : mx;
                    double dj = qmax / 254.0 * ak * ks;
                    d = dj > d ? dj : d;
                }
            }
            for (int j = 0; j <= p; j++) {
                w[j] = sees(p, j, kv_window, n_sink) ? exp(w[j] - mx) : 0.0;
                sum += w[j];
            }
            float *o = bound + (size_t)i * D->q_dim + (size_t)h * hd;
            double wmax = 0.0;
            for (int j = 0; j <= p; j++) {
                double wv = w[j] / sum * s->vs[(size_t)j * D->G + g];
                wmax = wv > wmax ? wv : wmax;
            }
            for (int e = 0; e < hd; e++) {
                double mag = 0.0, av = 0.0;
                for (int j = 0; j <= p; j++) {
                    double v = fabs((double)nd_kv_row8(s, s->v8, 0, g, j)[e]);
                    mag += w[j] / sum * s->vs[(size_t)j * D->G + g] * v;
                    av += sees(p, j, kv_window, n_sink) ? v : 0.0;
                }
                o[e] = (float)((exp(2.0 * d) - 1.0) * mag + exp(2.0 * d) * wmax / 65534.0 * av +
                               1e-5 * mag + 1e-6);
            }
        }
    free(w);
}

static int cases[ND_ATT_KERNELS];
static double worst[ND_ATT_KERNELS], mean_ratio[ND_ATT_KERNELS];

static void run_case(int H, int G, int hd, int n, int p0, int kv_window, int n_sink)
{
    static att_case c;
    att_case_make(&c, H, G, hd, n, ML, kv_window, n_sink, 1, frand);
    nd_kv_state s = c.s;
    const float *q = c.q;
    size_t qn = c.qn;
    float *att = malloc(sizeof(float) * qn), *ref = malloc(sizeof(float) * qn);
    float *bound = malloc(sizeof(float) * qn);
    if (!att || !ref || !bound)
        exit(2);
    nd_kv_attention(&s, 0, p0, n, q, ref, ND_ATT_REF);
    tolerance(&s, q, p0, n, kv_window, n_sink, bound);
    for (int k = ND_ATT_VNNI512; k < ND_ATT_KERNELS; k++) {
        if (!nd_att_supported(k))
            continue;
        memset(att, 0xff, sizeof(float) * qn); /* NaN: every output must be written */
        nd_kv_attention(&s, 0, p0, n, q, att, k);
        double wr = 0.0, sr = 0.0;
        size_t bad = qn;
        for (size_t e = 0; e < qn; e++) {
            double r = fabs((double)att[e] - ref[e]) / bound[e];
            if (!(r <= 1.0) && bad == qn)
                bad = e;
            wr = r > wr || r != r ? r : wr;
            sr += r;
        }
        CHECK_MSG(bad == qn,
                  "%s H %d G %d hd %d n %d p0 %d window %d sinks %d: out[%zu] %.6g, reference "
                  "%.6g, tolerance %.3g",
                  nd_att_kernel_name(k), H, G, hd, n, p0, kv_window, n_sink, bad,
                  bad < qn ? att[bad] : 0.0, bad < qn ? ref[bad] : 0.0,
                  bad < qn ? bound[bad] : 0.0);
        worst[k] = wr > worst[k] ? wr : worst[k];
        mean_ratio[k] += sr / (double)qn;
        cases[k]++;
    }
    free(att);
    free(ref);
    free(bound);
    att_case_free(&c);
}

int main(void)
{
    int any = 0;
    for (int k = ND_ATT_VNNI512; k < ND_ATT_KERNELS; k++)
        any |= nd_att_supported(k);
    if (!any) {
        printf("test_attention_i8: skipped (no integer-score kernel on this CPU)\n");
        return 77;
    }
    static const int heads[][2] = {{8, 4}, {6, 2}};
    static const int hds[] = {16, 48, 64, 80, 128};
    static const int ns[] = {1, 3, 13};
    static const int p0s[] = {0, 9, 300};
    static const int wins[][2] = {{0, -1}, {48, 5}};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 3; c++)
                for (int d = 0; d < 3; d++)
                    for (int w = 0; w < 2; w++)
                        run_case(heads[a][0], heads[a][1], hds[b], ns[c], p0s[d], wins[w][0],
                                 wins[w][1]);
    /* more query rows than one pass quantises (40 heads on one kv head:
     * 120 rows a task), and wide heads */
    run_case(40, 1, 32, 3, 300, 0, -1);
    run_case(40, 1, 32, 13, 200, 48, 5);
    run_case(4, 2, 256, 1, 350, 0, -1);
    run_case(4, 2, 512, 3, 100, 48, 5);
    /* decode tasks shared over two threads */
    int t = nd_get_threads();
    nd_set_threads(2);
    run_case(8, 4, 64, 1, 350, 0, -1);
    nd_set_threads(t);
    for (int k = ND_ATT_VNNI512; k < ND_ATT_KERNELS; k++) {
        if (!nd_att_supported(k)) {
            printf("  %-10s not run by this CPU\n", nd_att_kernel_name(k));
            continue;
        }
        printf("  %-10s %d cases: error / tolerance worst %.3f, mean %.4f\n", nd_att_kernel_name(k),
               cases[k], worst[k], mean_ratio[k] / cases[k]);
    }
    return tu_finish("test_attention_i8");
}
