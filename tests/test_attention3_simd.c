/* Needle 3's SIMD cached attention (engine/attention3_x86.c: AVX-512 and
 * AVX2) against attention.c's reference, and all of them against a plain
 * double-precision attention written from the visibility rule: separate
 * q/k and v head dims (the needle3 shape's 48/64 and odd ones that leave
 * vector tails), float and int8 cache rows, decode and prefill chunks,
 * local layers (sliding window, no sinks) and global ones (the session's
 * kv_window and pinned sinks), the tasks shared over threads. A window off
 * by one must show. A cache kept as a ring (row j at j % ring) must give
 * what the same rows stored in order give. Kernels this CPU lacks are
 * skipped (exit 77 when it has neither). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "testutil.h"

#define ML 320

static uint32_t rng = 2024u;

static float frand(void) /* in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

/* whether row p sees key j: a local layer its last `window` keys; a global
 * one the last kv_window (0: all) plus the pinned sinks before them */
static int sees(int p, int j, int window, int kv_window, int n_sink)
{
    if (j > p)
        return 0;
    if (window > 0)
        return j > p - window;
    int j0 = kv_window && p + 1 > kv_window ? p + 1 - kv_window : 0;
    return j >= j0 || j < (n_sink > 0 ? n_sink : 0);
}

typedef struct {
    san_model m;
    nd_kv_state s;
    int slot[1];
} fixture;

static float key(const nd_kv_state *s, int j, int g, int e)
{
    const san_dims *D = &s->m->dims;
    size_t at = (size_t)j * D->k_dim + (size_t)g * D->hd + (size_t)e;
    return s->kv_int8 ? (float)s->k8[at] * s->ks[(size_t)j * D->G + g] : s->k[at];
}

static float value(const nd_kv_state *s, int j, int g, int e)
{
    const san_dims *D = &s->m->dims;
    size_t at = (size_t)j * D->v_dim + (size_t)g * D->v_hd + (size_t)e;
    return s->kv_int8 ? (float)s->v8[at] * s->vs[(size_t)j * D->G + g] : s->v[at];
}

static void naive(const nd_kv_state *s, const float *Q, int p0, int n, int window, float *out)
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
                double dot = 0.0;
                for (int e = 0; e < D->hd; e++)
                    dot += (double)q[e] * key(s, j, g, e);
                w[j] = dot / sqrt((double)D->hd);
                if (sees(p, j, window, s->kv_window, s->n_sink) && w[j] > mx)
                    mx = w[j];
            }
            for (int j = 0; j <= p; j++) {
                w[j] = sees(p, j, window, s->kv_window, s->n_sink) ? exp(w[j] - mx) : 0.0;
                sum += w[j];
            }
            for (int e = 0; e < D->v_hd; e++) {
                double acc = 0.0;
                for (int j = 0; j <= p; j++)
                    acc += w[j] * value(s, j, g, e);
                out[(size_t)i * D->o_dim + (size_t)h * D->v_hd + e] = (float)(acc / sum);
            }
        }
    free(w);
}

static void setup(fixture *f, int H, int G, int hd, int vhd, int int8)
{
    memset(f, 0, sizeof *f);
    san_dims *D = &f->m.dims;
    D->H = H;
    D->G = G;
    D->hd = hd;
    D->v_hd = vhd;
    D->q_dim = H * hd;
    D->k_dim = G * hd;
    D->v_dim = G * vhd;
    D->o_dim = H * vhd;
    nd_kv_state *s = &f->s;
    s->m = &f->m;
    s->cap = s->max_len = ML;
    s->kv_int8 = int8;
    s->n_sink = -1;
    s->gen3 = 1;
    s->kv_slot = f->slot;
    s->att_threads = nd_get_threads();
    size_t kn = (size_t)ML * D->k_dim, vn = (size_t)ML * D->v_dim;
    if (int8) {
        s->k8 = malloc(kn);
        s->v8 = malloc(vn);
        s->ks = malloc(sizeof(float) * ML * G);
        s->vs = malloc(sizeof(float) * ML * G);
        for (size_t e = 0; e < kn; e++)
            s->k8[e] = (int8_t)lrintf(127.0f * frand());
        for (size_t e = 0; e < vn; e++)
            s->v8[e] = (int8_t)lrintf(127.0f * frand());
        for (int e = 0; e < ML * G; e++) {
            s->ks[e] = (1.5f + frand()) * 0.2f / 127.0f * sqrtf((float)hd);
            s->vs[e] = (1.5f + frand()) / 127.0f;
        }
    } else {
        s->k = malloc(sizeof(float) * kn);
        s->v = malloc(sizeof(float) * vn);
        for (size_t e = 0; e < kn; e++)
            s->k[e] = 0.3f * frand();
        for (size_t e = 0; e < vn; e++)
            s->v[e] = frand();
    }
    s->att_s = malloc(sizeof(float) * (size_t)s->att_threads * ND_ATT_ROWS * (H / G) * ML);
}

static void teardown(fixture *f)
{
    free(f->s.k);
    free(f->s.v);
    free(f->s.k8);
    free(f->s.v8);
    free(f->s.ks);
    free(f->s.vs);
    free(f->s.att_s);
}

static int cases, sensitive, simd_cases;

static void run_case(fixture *f, int n, int p0, int window, int kv_window, int n_sink)
{
    nd_kv_state *s = &f->s;
    const san_dims *D = &f->m.dims;
    s->kv_window = kv_window;
    s->n_sink = n_sink;
    size_t qn = (size_t)n * D->q_dim, on = (size_t)n * D->o_dim;
    float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * on);
    float *ref = malloc(sizeof(float) * on), *want = malloc(sizeof(float) * on);
    for (size_t e = 0; e < qn; e++)
        q[e] = 2.0f * frand();
    memset(ref, 0xff, sizeof(float) * on); /* NaN: every output must be written */
    nd_kv_attention3(s, 0, p0, n, q, ref, window, ND_ATT3_REF);
    naive(s, q, p0, n, window, want);
    double e_ref = tu_rel_err(ref, want, (long)on, 1e-3);
    CHECK_MSG(e_ref < 1e-4, "ref: H %d G %d hd %d vhd %d int8 %d n %d p0 %d window %d/%d/%d: %.3g",
              D->H, D->G, D->hd, D->v_hd, s->kv_int8, n, p0, window, kv_window, n_sink, e_ref);
    for (int k = ND_ATT3_AVX2; k <= ND_ATT3_AVX512; k++) {
        if (!nd_att3_supported(k))
            continue;
        memset(out, 0xff, sizeof(float) * on);
        nd_kv_attention3(s, 0, p0, n, q, out, window, k);
        double e = tu_rel_err(out, ref, (long)on, 1e-3), en = tu_rel_err(out, want, (long)on, 1e-3);
#if defined(__GNUC__) && !defined(__clang__)
        /* GCC in ISO C mode contracts nothing: the reference's arithmetic is
         * exactly what the kernels do, so the bits are its bits (clang may
         * fuse the reference's products; then only the tolerance holds) */
        CHECK_MSG(!memcmp(out, ref, sizeof(float) * on),
                  "kernel %d: not the reference's bits (H %d G %d hd %d vhd %d int8 %d n %d p0 %d "
                  "window %d/%d/%d; rel err %.3g)",
                  k, D->H, D->G, D->hd, D->v_hd, s->kv_int8, n, p0, window, kv_window, n_sink, e);
#endif
        CHECK_MSG(e < 1e-5 && en < 1e-4,
                  "kernel %d: H %d G %d hd %d vhd %d int8 %d n %d p0 %d window %d/%d/%d: "
                  "simd-ref %.3g simd-naive %.3g",
                  k, D->H, D->G, D->hd, D->v_hd, s->kv_int8, n, p0, window, kv_window, n_sink, e,
                  en);
        simd_cases++;
        /* each row as a decode step of its own gives the same bits (a
         * prompt's result must not depend on how it was split) */
        float *one = malloc(sizeof(float) * D->o_dim);
        for (int i = 0; i < n && n > 1; i++) {
            nd_kv_attention3(s, 0, p0 + i, 1, q + (size_t)i * D->q_dim, one, window, k);
            CHECK_MSG(!memcmp(one, out + (size_t)i * D->o_dim, sizeof(float) * D->o_dim),
                      "kernel %d: row %d of a chunk (n %d p0 %d window %d/%d/%d) differs from "
                      "its decode step",
                      k, i, n, p0, window, kv_window, n_sink);
        }
        free(one);
    }
    /* a window one key wider must change the result where it adds a key
     * the row does not see anyway */
    int last = p0 + n - 1, w = window > 0 ? window : kv_window;
    if (w && last - w >= (window > 0 || n_sink < 0 ? 0 : n_sink)) {
        if (window > 0)
            naive(s, q, p0, n, window + 1, want);
        else {
            s->kv_window = kv_window + 1;
            naive(s, q, p0, n, 0, want);
            s->kv_window = kv_window;
        }
        CHECK_MSG(tu_rel_err(ref, want, (long)on, 1e-3) > 1e-3,
                  "a window off by one goes unnoticed (n %d p0 %d window %d/%d)", n, p0, window,
                  kv_window);
        sensitive++;
    }
    cases++;
    free(q);
    free(out);
    free(ref);
    free(want);
}

/* The block kernels on a ring of `ring` rows (row of position j at j %
 * ring) equal them on the same rows stored in order: local-window decode
 * and prefill rows whose window fits the ring. */
static void ring_case(fixture *f, int ring, int window, int p0, int n)
{
    nd_kv_state *s = &f->s;
    const san_dims *D = &f->m.dims;
    int G = D->G, g = G - 1, rep = D->H / G, i8 = s->kv_int8;
    size_t kd = (size_t)D->k_dim, vd = (size_t)D->v_dim;
    /* the ring: position j's rows copied to j % ring, the latest last */
    void *rk = malloc((i8 ? 1 : sizeof(float)) * ring * kd);
    void *rv = malloc((i8 ? 1 : sizeof(float)) * ring * vd);
    float *rks = malloc(sizeof(float) * ring * G), *rvs = malloc(sizeof(float) * ring * G);
    for (int j = 0; j < p0 + n; j++) {
        size_t r = (size_t)(j % ring), es = i8 ? 1 : sizeof(float);
        memcpy((char *)rk + r * kd * es, (i8 ? (char *)s->k8 : (char *)s->k) + j * kd * es,
               kd * es);
        memcpy((char *)rv + r * vd * es, (i8 ? (char *)s->v8 : (char *)s->v) + j * vd * es,
               vd * es);
        if (i8) {
            memcpy(rks + r * G, s->ks + (size_t)j * G, sizeof(float) * G);
            memcpy(rvs + r * G, s->vs + (size_t)j * G, sizeof(float) * G);
        }
    }
    size_t qn = (size_t)n * D->q_dim, on = (size_t)n * D->o_dim;
    float *q = malloc(sizeof(float) * qn), *lin = malloc(sizeof(float) * on);
    float *rg = malloc(sizeof(float) * on);
    for (size_t e = 0; e < qn; e++)
        q[e] = 2.0f * frand();
    int se[ND_ATT_ROWS], j0[ND_ATT_ROWS];
    for (int i = 0; i < n; i++) {
        se[i] = 0;
        j0[i] = p0 + i + 1 > window ? p0 + i + 1 - window : 0;
    }
    for (int k = ND_ATT3_REF; k <= ND_ATT3_AVX512; k++) {
        if (!nd_att3_supported(k))
            continue;
        for (int pass = 0; pass < 2; pass++) {
            float *o = pass ? rg : lin;
            memset(o, 0xff, sizeof(float) * on);
            nd_att3_block b = {q + (size_t)g * rep * D->hd,
                               o + (size_t)g * rep * D->v_hd,
                               D->q_dim,
                               D->o_dim,
                               i8 ? NULL : (pass ? (float *)rk : s->k) + (size_t)g * D->hd,
                               i8 ? NULL : (pass ? (float *)rv : s->v) + (size_t)g * D->v_hd,
                               i8 ? (pass ? (int8_t *)rk : s->k8) + (size_t)g * D->hd : NULL,
                               i8 ? (pass ? (int8_t *)rv : s->v8) + (size_t)g * D->v_hd : NULL,
                               i8 ? (pass ? rks : s->ks) + g : NULL,
                               i8 ? (pass ? rvs : s->vs) + g : NULL,
                               kd,
                               vd,
                               G,
                               D->hd,
                               D->v_hd,
                               rep,
                               n,
                               pass ? ring : 0,
                               p0,
                               se,
                               j0,
                               1.0f / sqrtf((float)D->hd),
                               s->att_s,
                               ML,
                               0,
                               0};
            if (k == ND_ATT3_AVX512)
                nd_att3_block_avx512(&b);
            else if (k == ND_ATT3_AVX2)
                nd_att3_block_avx2(&b);
            else
                nd_att3_block_ref(&b);
        }
        /* only kv head g's outputs were written */
        for (int i = 0; i < n; i++) {
            size_t at = (size_t)i * D->o_dim + (size_t)g * rep * D->v_hd;
            CHECK_MSG(tu_rel_err(rg + at, lin + at, (long)rep * D->v_hd, 1e-3) == 0.0,
                      "ring %d kernel %d: row %d differs from the linear cache's", ring, k, i);
        }
    }
    free(rk);
    free(rv);
    free(rks);
    free(rvs);
    free(q);
    free(lin);
    free(rg);
}

int main(void)
{
    if (!nd_att3_supported(ND_ATT3_AVX2) && !nd_att3_supported(ND_ATT3_AVX512)) {
        printf("test_attention3_simd: skipped (no AVX2 or AVX-512 on this CPU)\n");
        return 77;
    }
    /* H, G, hd, v_hd: the needle3 shape, tiny3's and tiny3b's odd dims */
    static const int shapes[][4] = {{12, 2, 48, 64}, {4, 2, 8, 12}, {4, 2, 10, 6}, {6, 3, 16, 40}};
    static const int ns[] = {1, 8, 21};
    static const int p0s[] = {0, 5, 290};
    /* local window; global: kv_window, sinks */
    static const int wins[][3] = {{0, 0, -1}, {4, 0, -1}, {40, 0, -1}, {0, 48, -1}, {0, 48, 5}};
    fixture f;
    for (int a = 0; a < 4; a++)
        for (int i8 = 0; i8 < 2; i8++) {
            setup(&f, shapes[a][0], shapes[a][1], shapes[a][2], shapes[a][3], i8);
            for (int c = 0; c < 3; c++)
                for (int d = 0; d < 3; d++)
                    for (int w = 0; w < 5; w++)
                        if (p0s[d] + ns[c] <= ML)
                            run_case(&f, ns[c], p0s[d], wins[w][0], wins[w][1], wins[w][2]);
            ring_case(&f, 24, 16, 100, 1);
            ring_case(&f, 24, 16, 60, 8);
            teardown(&f);
        }
    /* prefill and decode with the tasks shared over threads */
    int t = nd_get_threads();
    nd_set_threads(2);
    for (int i8 = 0; i8 < 2; i8++) {
        setup(&f, 12, 2, 48, 64, i8);
        run_case(&f, 30, 200, 0, 0, -1);
        run_case(&f, 30, 200, 64, 0, -1);
        run_case(&f, 1, 300, 0, 48, 4);
        teardown(&f);
    }
    nd_set_threads(t);
    printf("%d cases (%d SIMD runs), %d with a window off by one caught\n", cases, simd_cases,
           sensitive);
    CHECK(sensitive > 0 && simd_cases > 0);
    return tu_finish("test_attention3_simd");
}
