/* The AVX-512 cached attention (engine/attention_x86.c) against attention.c's
 * reference on the int8 cache: decode and prefill chunks, before and after
 * the kv_window slides, with and without sinks, head dims 16 to 128, and
 * the AMX kernel where the CPU has it. All are also checked against a plain
 * double-precision attention written from the visibility rule, and that
 * check must catch a window off by one.
 * Exit 77 (skipped) on CPUs without AVX-512. */
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

#define ML 512

static uint32_t rng = 12345u;

static float frand(void) /* in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

/* row p's visible keys, from the rule itself: the last kv_window
 * positions up to p, plus the pinned sinks before them */
static int sees(int p, int j, int kv_window, int n_sink)
{
    int j0 = kv_window && p + 1 > kv_window ? p + 1 - kv_window : 0;
    int pin = n_sink > 0 ? n_sink : 0;
    return j <= p && (j >= j0 || j < pin);
}

/* plain attention in double precision into out (n rows of q_dim) */
static void naive(const nd_kv_state *s, const float *Q, int p0, int n, int kv_window, int n_sink,
                  float *out)
{
    const san_dims *D = &s->m->dims;
    int rep = D->H / D->G;
    double *w = malloc(sizeof(double) * ML);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < D->H; h++) {
            int g = h / rep, p = p0 + i;
            const float *q = Q + (size_t)i * D->q_dim + (size_t)h * D->hd;
            double mx = -1e300, sum = 0.0;
            for (int j = 0; j <= p; j++) {
                const int8_t *k = nd_kv_row8(s, s->k8, 0, g, j);
                double dot = 0.0;
                for (int e = 0; e < D->hd; e++)
                    dot += (double)q[e] * k[e];
                w[j] = dot * s->ks[(size_t)j * D->G + g] / sqrt((double)D->hd);
                if (sees(p, j, kv_window, n_sink) && w[j] > mx)
                    mx = w[j];
            }
            for (int j = 0; j <= p; j++) {
                w[j] = sees(p, j, kv_window, n_sink) ? exp(w[j] - mx) : 0.0;
                sum += w[j];
            }
            float *o = out + (size_t)i * D->q_dim + (size_t)h * D->hd;
            for (int e = 0; e < D->hd; e++) {
                double acc = 0.0;
                for (int j = 0; j <= p; j++)
                    acc += w[j] * s->vs[(size_t)j * D->G + g] * nd_kv_row8(s, s->v8, 0, g, j)[e];
                o[e] = (float)(acc / sum);
            }
        }
    free(w);
}

static int cases, sensitive;

/* The AMX kernel splits each query row into two int8 rows and each weight
 * into two bf16 parts: against the naive attention it must be nearly as
 * exact as the float kernels and still catch a window off by one. Tasks of
 * fewer rows, and head dims AMX does not take, must use the float kernel
 * bit for bit (every n here is one task's rows or a multiple of them).
 * att is restored from keep. */
#define AMX_TOL 5e-4
static int amx_cases;
static double amx_worst, amx_min_off;
static void check_amx(nd_kv_state *s, const float *q, float *att, int p0, int n, int kv_window,
                      int n_sink, const float *want, float *off, const float *keep)
{
    const san_dims *D = &s->m->dims;
    size_t qn = (size_t)n * D->q_dim;
    memset(att, 0xff, sizeof(float) * qn);
    nd_kv_attention(s, 0, p0, n, q, att, ND_ATT_AMX);
    int rows = (n < ND_ATT_ROWS ? n : ND_ATT_ROWS) * (D->H / D->G);
    if (rows < ND_ATT_AMX_MIN || D->hd % 64) {
        CHECK(tu_rel_err(att, keep, (long)qn, 1e-3) == 0.0);
    } else {
        double e = tu_rel_err(att, want, (long)qn, 1e-3);
        amx_worst = e > amx_worst ? e : amx_worst;
        CHECK_MSG(e < AMX_TOL, "amx H %d G %d hd %d n %d p0 %d window %d sinks %d: err %.3g", D->H,
                  D->G, D->hd, n, p0, kv_window, n_sink, e);
        if (kv_window && p0 + n - 1 - kv_window >= (s->n_sink > 0 ? s->n_sink : 0)) {
            naive(s, q, p0, n, kv_window + 1, n_sink, off);
            double eo = tu_rel_err(att, off, (long)qn, 1e-3);
            amx_min_off = amx_min_off == 0 || eo < amx_min_off ? eo : amx_min_off;
            CHECK_MSG(eo > 10 * AMX_TOL,
                      "amx: a window off by one goes unnoticed (n %d p0 %d window %d)", n, p0,
                      kv_window);
        }
        amx_cases++;
    }
    memcpy(att, keep, sizeof(float) * qn);
}

static void run_case(int H, int G, int hd, int n, int p0, int kv_window, int n_sink)
{
    static att_case c;
    att_case_make(&c, H, G, hd, n, ML, kv_window, n_sink, 0, frand);
    nd_kv_state s = c.s;
    const float *q = c.q;
    size_t qn = c.qn;
    float *att = malloc(sizeof(float) * qn);
    float *ref = malloc(sizeof(float) * qn), *want = malloc(sizeof(float) * qn);
    float *off = malloc(sizeof(float) * qn), *simd = malloc(sizeof(float) * qn);
    if (!att || !ref || !want || !off || !simd)
        exit(2);
    nd_kv_attention(&s, 0, p0, n, q, att, ND_ATT_REF);
    memcpy(ref, att, sizeof(float) * qn);
    memset(att, 0xff, sizeof(float) * qn); /* NaN: every output must be written */
    nd_kv_attention(&s, 0, p0, n, q, att, ND_ATT_AVX512);
    memcpy(simd, att, sizeof(float) * qn);
    naive(&s, q, p0, n, kv_window, n_sink, want);
    if (nd_amx_usable())
        check_amx(&s, q, att, p0, n, kv_window, n_sink, want, off, simd);
    double e_simd = tu_rel_err(att, ref, (long)qn, 1e-3);
    double e_ref = tu_rel_err(ref, want, (long)qn, 1e-3);
    double e_simd_naive = tu_rel_err(att, want, (long)qn, 1e-3);
    CHECK_MSG(e_simd < 1e-5 && e_simd_naive < 1e-4 && e_ref < 1e-4,
              "H %d G %d hd %d n %d p0 %d window %d sinks %d: simd-ref %.3g simd-naive %.3g "
              "ref-naive %.3g",
              H, G, hd, n, p0, kv_window, n_sink, e_simd, e_simd_naive, e_ref);
    /* a window off by one must show up where it adds a key that is not a
     * sink anyway */
    if (kv_window && p0 + n - 1 - kv_window >= (n_sink > 0 ? n_sink : 0)) {
        naive(&s, q, p0, n, kv_window + 1, n_sink, off);
        CHECK_MSG(tu_rel_err(att, off, (long)qn, 1e-3) > 1e-3,
                  "a window off by one goes unnoticed (n %d p0 %d window %d)", n, p0, kv_window);
        sensitive++;
    }
    cases++;
    free(att);
    att_case_free(&c);
    free(ref);
    free(want);
    free(off);
    free(simd);
}

int main(void)
{
    if (!nd_att_avx512_supported()) {
        printf("test_attention_simd: skipped (no AVX-512 on this CPU)\n");
        return 77;
    }
    static const int heads[][2] = {{8, 4}, {4, 4}, {6, 2}};
    static const int hds[] = {16, 32, 64, 128};
    static const int ns[] = {1, 3, 4, 5, 64};
    static const int p0s[] = {0, 7, 40, 61, 300};
    static const int wins[][2] = {{0, -1}, {48, -1}, {48, 0}, {48, 5}, {20, 30}};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 5; c++)
                for (int d = 0; d < 5; d++)
                    for (int w = 0; w < 5; w++) {
                        int n = ns[c], p0 = p0s[d];
                        if (p0 + n > ML)
                            continue;
                        run_case(heads[a][0], heads[a][1], hds[b], n, p0, wins[w][0], wins[w][1]);
                    }
    /* prefill with the tasks shared over threads (n * (p0 + n) over the
     * serial threshold) */
    int t = nd_get_threads();
    nd_set_threads(2);
    run_case(8, 4, 64, 64, 300, 48, 5);
    run_case(8, 4, 64, 1, 450, 0, -1);
    nd_set_threads(t);
    printf("%d cases, %d with a window off by one caught\n", cases, sensitive);
    if (amx_cases)
        printf("amx: %d cases, worst error %.3g; smallest window-off-by-one difference %.3g\n",
               amx_cases, amx_worst, amx_min_off);
    CHECK(sensitive > 0);
    return tu_finish("test_attention_simd");
}
