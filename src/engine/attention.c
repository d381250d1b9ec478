/* Causal attention of a chunk's query rows over the KV cache: the
 * reference kernel (float or int8 rows, any head dim), the dispatch to
 * attention_x86.c's AVX-512/AMX kernels, and the split into tasks. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/threadpool.h"
#include "core/tuning.h"
#include "engine/attention.h"
#include "engine/kv_internal.h"

typedef struct {
    const nd_kv_state *s;
    const float *q; /* [n, q_dim] */
    float *out;     /* [n, q_dim] */
    int l, p0, n, kernel;
} cached_attention_args;

/* row j of a cache layer's kv head g as floats: F is the float layer
 * ([cap][kvd]), Q the int8 head's rows ([cap][hd]; converted into buf, its
 * scale applied by the caller) */
static inline const float *kv_row(const float *F, const int8_t *Q, size_t kvd, int j, int g, int hd,
                                  float *buf)
{
    if (!Q)
        return F + (size_t)j * kvd + (size_t)g * hd;
    const int8_t *r = Q + (size_t)j * hd;
    for (int e = 0; e < hd; e++)
        buf[e] = (float)r[e];
    return buf;
}

/* a * b + c, fused where the target has FMA (C11 mode does not contract
 * a * b + c by itself; a libm fmaf without hardware FMA would be slow) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define KV_MADD(a, b, c) fmaf(a, b, c)
#else
#define KV_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* q . k for four rows at once: four independent sums keep the vector unit
 * busy where one sum would wait on its own additions (plain multiply-adds:
 * clang cannot vectorise an fmaf reduction and fails -Wpass-failed) */
static inline void dot4(const float *q, const float *const k[4], int hd, float out[4])
{
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int e = 0; e < hd; e++) {
        a0 += q[e] * k0[e];
        a1 += q[e] * k1[e];
        a2 += q[e] * k2[e];
        a3 += q[e] * k3[e];
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

/* out += sum of w[c] v[c] over four rows (one pass over out) */
static inline void axpy4(float *out, const float *const v[4], const float w[4], int hd)
{
    const float *v0 = v[0], *v1 = v[1], *v2 = v[2], *v3 = v[3];
    float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    for (int e = 0; e < hd; e++)
        out[e] =
            KV_MADD(w3, v3[e], KV_MADD(w2, v2[e], KV_MADD(w1, v1[e], KV_MADD(w0, v0[e], out[e]))));
}

/* the keys query row p sees: [0, sink_end) and [j0, p] (unpinned rows are
 * consecutive positions, so the window is a row range; the sinks before it
 * stay visible, upstream's sink mask) */
static void visible_keys(const nd_kv_state *s, int p, int *sink_end, int *j0)
{
    int pin = s->n_sink > 0 ? s->n_sink : 0;
    *j0 = s->kv_window && p + 1 > s->kv_window ? p + 1 - s->kv_window : 0;
    *sink_end = pin < *j0 ? pin : *j0;
}

/* The first row of task's block. Causal rows see more keys the later they
 * are, so blocks go in pairs from both ends (0, nb-1, 1, nb-2, ...): any
 * run of whole pairs costs about the same, and the threads' equal shares
 * of the tasks do equal work (in order, the last share of a chunk had the
 * most keys: ~30% more than the first's over a 256-token prompt). */
static int task_row0(long task, int G, int n)
{
    int nb = (n + ND_ATT_ROWS - 1) / ND_ATT_ROWS, k = (int)(task / G);
    int block = k % 2 == 0 ? k / 2 : nb - 1 - k / 2;
    return block * ND_ATT_ROWS;
}

/* tasks [lo, hi): (block of ND_ATT_ROWS new rows, kv head) pairs. The heads
 * sharing a kv head (GQA) and the block's rows read each cached row once,
 * converted from int8 once; keys a row does not see get no weight. */
static void cached_attention_tasks(void *ctx, long lo, long hi, int tid)
{
    const cached_attention_args *a = ctx;
    const nd_kv_state *s = a->s;
    const float *Qr = a->q;
    float *Out = a->out;
    int l = a->l, p0 = a->p0, n = a->n;
    const san_dims *D = &s->m->dims;
    int H = D->H, G = D->G, hd = D->hd, rep = H / G, qd = D->q_dim, kvd = D->kv_dim;
    size_t lc = (size_t)l * s->cap, ml = (size_t)s->max_len;
    const float *K = s->k ? s->k + lc * kvd : NULL, *V = s->v ? s->v + lc * kvd : NULL;
    const float *KS = s->kv_int8 ? s->ks + lc * G : NULL, *VS = s->kv_int8 ? s->vs + lc * G : NULL;
    float scale = 1.0f / sqrtf((float)hd), buf[4][ND_ATT_MAX_HD];
    /* this thread's scores: ND_ATT_ROWS * rep rows of max_len */
    float *sc0 = s->att_s + (size_t)tid * ND_ATT_ROWS * rep * ml;
    for (long task = lo; task < hi; task++) {
        int i0 = task_row0(task, G, n), g = (int)(task % G);
        int nr = n - i0 < ND_ATT_ROWS ? n - i0 : ND_ATT_ROWS;
        int se[ND_ATT_ROWS], j0[ND_ATT_ROWS];
        const int8_t *K8 = s->kv_int8 ? nd_kv_row8(s, s->k8, l, g, 0) : NULL;
        const int8_t *V8 = s->kv_int8 ? nd_kv_row8(s, s->v8, l, g, 0) : NULL;
        for (int i = 0; i < nr; i++)
            visible_keys(s, p0 + i0 + i, &se[i], &j0[i]);
        if (a->kernel != ND_ATT_REF) {
            nd_att_block b = {Qr + (size_t)i0 * qd + (size_t)g * rep * hd,
                              Out + (size_t)i0 * qd + (size_t)g * rep * hd,
                              qd,
                              K8,
                              V8,
                              KS + g,
                              VS + g,
                              hd,
                              G,
                              hd,
                              rep,
                              nr,
                              p0 + i0,
                              se,
                              j0,
                              scale,
                              sc0,
                              ml};
            switch (a->kernel) {
            case ND_ATT_AMX:
                if (nr * rep >= ND_ATT_AMX_MIN)
                    nd_att_block_amx(&b);
                else
                    nd_att_block_avx512(&b);
                break;
            case ND_ATT_VNNI512: nd_att_block_vnni512(&b); break;
            case ND_ATT_AVXVNNI: nd_att_block_avxvnni(&b); break;
            case ND_ATT_AVX2I8: nd_att_block_avx2i8(&b); break;
            default: nd_att_block_avx512(&b); break;
            }
            continue;
        }
        /* the keys any row of the block sees: [0, se_max) and [lo2, p_max] */
        int se_max = se[nr - 1], lo2 = j0[0] > se_max ? j0[0] : se_max;
        int ranges[2][2] = {{0, se_max}, {lo2, p0 + i0 + nr}};
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += 4) {
                int nb = ranges[rr][1] - j < 4 ? ranges[rr][1] - j : 4;
                const float *kr[4];
                for (int c = 0; c < 4; c++) /* a short block repeats its last row */
                    kr[c] = kv_row(K, K8, kvd, j + (c < nb ? c : nb - 1), g, hd, buf[c]);
                float ks[4];
                for (int c = 0; c < nb; c++)
                    ks[c] = (KS ? KS[(size_t)(j + c) * G + g] : 1.0f) * scale;
                for (int i = 0; i < nr; i++)
                    for (int r = 0; r < rep; r++) {
                        const float *q = Qr + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd;
                        float dots[4], *sc = sc0 + ((size_t)i * rep + r) * ml + j;
                        dot4(q, kr, hd, dots);
                        for (int c = 0; c < nb; c++)
                            sc[c] = dots[c] * ks[c];
                    }
            }
        for (int i = 0; i < nr; i++) {
            int own[2][2] = {{0, se[i]}, {j0[i], p0 + i0 + i + 1}};
            for (int r = 0; r < rep; r++) {
                float *sc = sc0 + ((size_t)i * rep + r) * ml, mx = -FLT_MAX, sum = 0.0f;
                for (int rr = 0; rr < 2; rr++)
                    for (int j = own[rr][0]; j < own[rr][1]; j++)
                        mx = sc[j] > mx ? sc[j] : mx;
                for (int rr = 0; rr < 2; rr++) {
                    for (int j = own[rr][0]; j < own[rr][1]; j++)
                        sc[j] = san_expf(sc[j] - mx);
                    for (int j = own[rr][0]; j < own[rr][1]; j++)
                        sum += sc[j];
                }
                float inv = 1.0f / sum;
                float *out = Out + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd;
                for (int e = 0; e < hd; e++)
                    out[e] = 0.0f;
                /* fold the normaliser (and the int8 rows' scale) into the
                 * weights; keys this row does not see weigh nothing */
                for (int j = 0; j < ranges[1][1]; j++) {
                    int seen = (j < se[i] || j >= j0[i]) && j <= p0 + i0 + i;
                    sc[j] = seen ? sc[j] * (inv * (VS ? VS[(size_t)j * G + g] : 1.0f)) : 0.0f;
                }
            }
        }
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += 4) {
                int nb = ranges[rr][1] - j < 4 ? ranges[rr][1] - j : 4;
                const float *vr[4];
                for (int c = 0; c < 4; c++)
                    vr[c] = kv_row(V, V8, kvd, j + (c < nb ? c : nb - 1), g, hd, buf[c]);
                for (int i = 0; i < nr; i++)
                    for (int r = 0; r < rep; r++) {
                        const float *sc = sc0 + ((size_t)i * rep + r) * ml + j;
                        float w[4];
                        for (int c = 0; c < 4; c++) /* padding rows weigh nothing */
                            w[c] = c < nb ? sc[c] : 0.0f;
                        axpy4(Out + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd, vr, w, hd);
                    }
            }
    }
}

float nd_att_quant_q(const float *q, int hd, int8_t *qi, int32_t *sum)
{
    float mx = 0.0f;
    for (int e = 0; e < hd; e++) {
        float a = fabsf(q[e]);
        mx = a > mx ? a : mx;
    }
    int32_t s = 0;
    if (!(mx > 0.0f)) {
        memset(qi, 0, (size_t)hd);
        *sum = 0;
        return 0.0f;
    }
    float inv = 127.0f / mx;
    for (int e = 0; e < hd; e++) {
        /* nearest, ties to even (the 1.5 * 2^23 trick); |q / s| <= 127 */
        int v = (int)((q[e] * inv + 12582912.0f) - 12582912.0f);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        qi[e] = (int8_t)v;
        s += v;
    }
    *sum = s;
    return mx / 127.0f;
}

static const char *const att_names[ND_ATT_KERNELS] = {"ref",        "avx512",  "amx",
                                                      "avx512vnni", "avxvnni", "avx2"};

const char *nd_att_kernel_name(int kernel)
{
    return kernel >= 0 && kernel < ND_ATT_KERNELS ? att_names[kernel] : "?";
}

/* the CPU checks, asked once (a cpuid traps to the hypervisor in a VM) */
static pthread_once_t att_ok_once = PTHREAD_ONCE_INIT;
static int att_ok[ND_ATT_KERNELS];

static int att_check(int k)
{
    switch (k) {
    case ND_ATT_REF: return 1;
    case ND_ATT_AVX512: return nd_att_avx512_supported();
    case ND_ATT_AMX: return nd_att_avx512_supported() && nd_amx_usable();
    case ND_ATT_VNNI512: return nd_att_vnni512_supported();
    case ND_ATT_AVXVNNI: return nd_att_avxvnni_supported();
    case ND_ATT_AVX2I8: return nd_att_avx2i8_supported();
    default: return 0;
    }
}

static void att_check_all(void)
{
    for (int k = 0; k < ND_ATT_KERNELS; k++)
        att_ok[k] = att_check(k);
}

int nd_att_supported(int k)
{
    pthread_once(&att_ok_once, att_check_all);
    return k >= 0 && k < ND_ATT_KERNELS && att_ok[k];
}

static pthread_once_t att_once = PTHREAD_ONCE_INIT;
static int att_best = ND_ATT_REF;

/* NEEDLE_ATT names a kernel the CPU runs, else the fastest it runs, in
 * this order: AMX, the integer-score AVX-512 VNNI one, the float AVX-512
 * one, AVX-VNNI, AVX2 (docs/performance.md) */
static void select_att_kernel(void)
{
    const char *want = nd_tuning_get()->att;
    if (want && *want)
        for (int k = 0; k < ND_ATT_KERNELS; k++)
            if (!strcmp(want, att_names[k]) && nd_att_supported(k)) {
                att_best = k;
                return;
            }
    static const int order[] = {ND_ATT_AMX, ND_ATT_VNNI512, ND_ATT_AVX512, ND_ATT_AVXVNNI,
                                ND_ATT_AVX2I8};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (nd_att_supported(order[i])) {
            att_best = order[i];
            return;
        }
}

int nd_att_kernel(void)
{
    pthread_once(&att_once, select_att_kernel);
    return att_best;
}

/* Causal attention of n new query rows (positions p0..p0+n-1) over the
 * cached keys 0..p (or the last kv_window of them). */
void nd_kv_attention(const nd_kv_state *s, int l, int p0, int n, const float *q, float *out,
                     int kernel)
{
    const san_dims *D = &s->m->dims;
    /* the SIMD kernels cover the int8 cache with hd a multiple of 16; one
     * the CPU does not run falls back to its float or 256-bit neighbour */
    if (kernel < 0 || kernel >= ND_ATT_KERNELS || !s->kv_int8 || D->hd % 16)
        kernel = ND_ATT_REF;
    if (kernel == ND_ATT_AMX && !nd_att_supported(ND_ATT_AMX))
        kernel = ND_ATT_AVX512;
    if (kernel == ND_ATT_VNNI512 && !nd_att_supported(ND_ATT_VNNI512))
        kernel = ND_ATT_AVX512;
    if (kernel == ND_ATT_AVXVNNI && !nd_att_supported(ND_ATT_AVXVNNI))
        kernel = ND_ATT_AVX2I8;
    if (!nd_att_supported(kernel))
        kernel = ND_ATT_REF;
    long tasks = (long)((n + ND_ATT_ROWS - 1) / ND_ATT_ROWS) * D->G;
    cached_attention_args a = {s, q, out, l, p0, n, kernel};
    /* shared above ~128 score entries (a decode step past 128 positions:
     * with the SIMD kernel less is cheaper than a fork); never by more
     * threads than the score rows were sized for */
    long grain = (long)n * (p0 + n) > 128 && nd_get_threads() <= s->att_threads ? 1 : tasks;
    int prev = nd_kv_big_parallel_begin(s);
    nd_parallel_for(tasks, grain, cached_attention_tasks, &a);
    nd_set_serial(prev);
}

/* The reference v3 task: each query row and head scores the keys it sees,
 * then sums their value rows with the softmax weights (one pass each) */
void nd_att3_block_ref(const nd_att3_block *b)
{
    int G = b->G, hd = b->hd, vhd = b->vhd;
    for (int i = 0; i < b->nr; i++) {
        int p = b->pos0 + i;
        int rng[2][2] = {{0, b->se[i]}, {b->j0[i], p + 1}};
        for (int r = 0; r < b->rep; r++) {
            const float *q = b->q + (size_t)i * b->qd + (size_t)r * hd;
            float *w = b->scores + ((size_t)i * b->rep + r) * b->ml, mx = -FLT_MAX, sum = 0.0f;
            for (int rr = 0; rr < 2; rr++)
                for (int j = rng[rr][0]; j < rng[rr][1]; j++) {
                    size_t pr = (size_t)nd_att3_row(b, j);
                    float dot = 0.0f;
                    if (b->k8) {
                        const int8_t *k = b->k8 + pr * b->kstride;
                        for (int e = 0; e < hd; e++)
                            dot += q[e] * (float)k[e];
                        dot *= b->ks[pr * (size_t)G];
                    } else {
                        const float *k = b->kf + pr * b->kstride;
                        for (int e = 0; e < hd; e++)
                            dot += q[e] * k[e];
                    }
                    w[j] = dot * b->scale;
                    mx = w[j] > mx ? w[j] : mx;
                }
            for (int rr = 0; rr < 2; rr++)
                for (int j = rng[rr][0]; j < rng[rr][1]; j++) {
                    w[j] = san_expf(w[j] - mx);
                    sum += w[j];
                }
            float inv = 1.0f / sum, *o = b->out + (size_t)i * b->od + (size_t)r * vhd;
            for (int e = 0; e < vhd; e++)
                o[e] = 0.0f;
            for (int rr = 0; rr < 2; rr++)
                for (int j = rng[rr][0]; j < rng[rr][1]; j++) {
                    size_t pr = (size_t)nd_att3_row(b, j);
                    float wj = w[j] * inv;
                    if (b->v8) {
                        const int8_t *v = b->v8 + pr * b->vstride;
                        wj *= b->vs[pr * (size_t)G];
                        for (int e = 0; e < vhd; e++)
                            o[e] = KV_MADD(wj, (float)v[e], o[e]);
                    } else {
                        const float *v = b->vf + pr * b->vstride;
                        for (int e = 0; e < vhd; e++)
                            o[e] = KV_MADD(wj, v[e], o[e]);
                    }
                }
        }
    }
}

static pthread_once_t att3_once = PTHREAD_ONCE_INIT;
static int att3_best = ND_ATT3_REF, att3_ok[3];

static void select_att3_kernel(void)
{
    for (int k = 0; k < 3; k++)
        att3_ok[k] = nd_att3_supported(k);
    const char *want = nd_tuning_get()->att;
    if (want && !strcmp(want, "ref"))
        return;
    if (want && !strcmp(want, "avx2") && nd_att3_supported(ND_ATT3_AVX2))
        att3_best = ND_ATT3_AVX2;
    else if (nd_att3_supported(ND_ATT3_AVX512))
        att3_best = ND_ATT3_AVX512;
    else if (nd_att3_supported(ND_ATT3_AVX2))
        att3_best = ND_ATT3_AVX2;
}

int nd_att3_kernel(void)
{
    pthread_once(&att3_once, select_att3_kernel);
    return att3_best;
}

typedef struct {
    const nd_kv_state *s;
    const float *q; /* [n, q_dim] */
    float *out;     /* [n, o_dim] */
    int slot, p0, n, window, kernel;
} attention3_args;

/* tasks [lo, hi): (block of ND_ATT_ROWS new rows, kv head) pairs */
static void attention3_tasks(void *ctx, long lo, long hi, int tid)
{
    const attention3_args *a = ctx;
    const nd_kv_state *s = a->s;
    const san_dims *D = &s->m->dims;
    int G = D->G, hd = D->hd, vhd = D->v_hd, rep = D->H / D->G;
    size_t kd = (size_t)D->k_dim, vd = (size_t)D->v_dim, sc = (size_t)a->slot * s->cap;
    size_t ml = (size_t)s->max_len;
    int i8 = s->kv_int8;
    for (long task = lo; task < hi; task++) {
        int i0 = task_row0(task, G, a->n), g = (int)(task % G);
        int nr = a->n - i0 < ND_ATT_ROWS ? a->n - i0 : ND_ATT_ROWS;
        int se[ND_ATT_ROWS], j0[ND_ATT_ROWS];
        for (int i = 0; i < nr; i++) {
            int p = a->p0 + i0 + i;
            if (a->window > 0) { /* a local layer: its window, no sinks */
                se[i] = 0;
                j0[i] = p + 1 > a->window ? p + 1 - a->window : 0;
            } else {
                visible_keys(s, p, &se[i], &j0[i]);
            }
        }
        /* float rows, or int8 rows whose (row, kv head) scale multiplies
         * the dot product (keys) and the weight (values) */
        nd_att3_block b = {a->q + (size_t)i0 * D->q_dim + (size_t)g * rep * hd,
                           a->out + (size_t)i0 * D->o_dim + (size_t)g * rep * vhd,
                           D->q_dim,
                           D->o_dim,
                           i8 ? NULL : s->k + sc * kd + (size_t)g * hd,
                           i8 ? NULL : s->v + sc * vd + (size_t)g * vhd,
                           i8 ? s->k8 + sc * kd + (size_t)g * hd : NULL,
                           i8 ? s->v8 + sc * vd + (size_t)g * vhd : NULL,
                           i8 ? s->ks + sc * G + g : NULL,
                           i8 ? s->vs + sc * G + g : NULL,
                           kd,
                           vd,
                           G,
                           hd,
                           vhd,
                           rep,
                           nr,
                           0,
                           a->p0 + i0,
                           se,
                           j0,
                           1.0f / sqrtf((float)hd),
                           s->att_s + (size_t)tid * ND_ATT_ROWS * rep * ml,
                           ml,
                           0,
                           0};
        nd_kv_att3_ring(s, a->slot, &b); /* a local layer's ring (kv.c) */
        if (a->kernel == ND_ATT3_AVX512)
            nd_att3_block_avx512(&b);
        else if (a->kernel == ND_ATT3_AVX2)
            nd_att3_block_avx2(&b);
        else
            nd_att3_block_ref(&b);
    }
}

void nd_kv_attention3(const nd_kv_state *s, int l, int p0, int n, const float *q, float *out,
                      int window, int kernel)
{
    const san_dims *D = &s->m->dims;
    pthread_once(&att3_once, select_att3_kernel);
    if (kernel < 0 || kernel > 2 || !att3_ok[kernel] ||
        !nd_att3_simd_fits(D->hd, D->v_hd, D->H / D->G))
        kernel = ND_ATT3_REF;
    long tasks = (long)((n + ND_ATT_ROWS - 1) / ND_ATT_ROWS) * D->G;
    attention3_args a = {s, q, out, s->kv_slot[l], p0, n, window, kernel};
    long grain = (long)n * (p0 + n) > 128 && nd_get_threads() <= s->att_threads ? 1 : tasks;
    int prev = nd_kv_big_parallel_begin(s);
    nd_parallel_for(tasks, grain, attention3_tasks, &a);
    nd_set_serial(prev);
}
