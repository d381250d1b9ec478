/* Incremental SAN forward with a KV cache (upstream decode.py's
 * _forward_cached): new tokens attend to every cached key, the engram
 * n-gram hash reads the token history and the taps read cached v' rows. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "backend/cpu/cpu_kernels.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "model/san.h"

static int max_order(const san_model *m)
{
    int mo = 1;
    for (int i = 0; i < m->cfg.n_orders; i++)
        if (m->cfg.engram_orders[i] > mo)
            mo = m->cfg.engram_orders[i];
    return mo;
}

int nd_kv_init(nd_kv_state *s, const san_model *m, const nd_backend *be, int chunk, int kv_window)
{
    memset(s, 0, sizeof *s);
    const san_dims *D = &m->dims;
    if (chunk < 1)
        chunk = 1;
    if (D->hd > ND_ATT_MAX_HD)
        return nd_error(ND_ELIMIT, "head dim %d is over the engine's %d", D->hd, ND_ATT_MAX_HD);
    s->m = m;
    s->be = be;
    s->max_len = m->cfg.max_seq_len;
    s->kv_window = kv_window > 0 ? kv_window : 0;
    s->n_sink = -1;
    s->chunk = chunk;
    size_t N = (size_t)chunk, W = N + (size_t)max_order(m), d = (size_t)D->d, n = (size_t)D->n;
    size_t half = (size_t)D->hd / 2;
    struct plan_e {
        void **p;
        size_t bytes;
    } plan[48];
    int np = 0;
#define P(ptr, cnt) plan[np++] = (struct plan_e){(void **)&(ptr), (size_t)(cnt) * sizeof(*(ptr))}
    P(s->rope_cos, (size_t)s->max_len * half);
    P(s->rope_sin, (size_t)s->max_len * half);
    P(s->rope_far_cos, N * half);
    P(s->rope_far_sin, N * half);
    P(s->x0, N * d);
    P(s->X, N * n * d);
    P(s->Xn, N * n * d);
    P(s->eng_e, W * (size_t)(D->eng_dim ? D->eng_dim : 1));
    P(s->eng_idx, W * (size_t)(D->eng_tables ? D->eng_tables : 1));
    P(s->win_tok, W);
    P(s->eng_k, N * d * (size_t)(m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(s->eng_v, N * d * (size_t)(m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(s->eng_vp, N * d);
    P(s->nx, N * n * d);
    P(s->pre, N * n);
    P(s->post, N * n);
    P(s->res, N * n * n);
    P(s->hpre, N * n);
    P(s->hpost, N * n);
    P(s->M, N * n * n);
    P(s->u, N * d);
    P(s->alpha, N);
    P(s->bx, N * d);
    P(s->a, N * d);
    P(s->q, N * (size_t)D->q_dim);
    P(s->kk, N * (size_t)D->kv_dim);
    P(s->vv, N * (size_t)D->kv_dim);
    P(s->g, N * (size_t)D->q_dim);
    P(s->att, N * (size_t)D->q_dim);
    P(s->o, N * (size_t)D->q_dim);
    P(s->o2, N * d);
    P(s->pn, N * d);
    P(s->x1, N * d);
    P(s->z, N * d);
    P(s->h1, N * (size_t)D->hada_n);
    P(s->y, N * d);
    P(s->xm, N * d);
    P(s->hf, N * d);
    s->att_threads = nd_get_threads();
    P(s->att_s, (size_t)s->att_threads * ND_ATT_ROWS * (size_t)(D->H / D->G) * (size_t)s->max_len);
#undef P
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += (plan[i].bytes + 63) & ~(size_t)63;
    char *blk = calloc(1, total);
    if (!blk)
        return nd_error(ND_ENOMEM, "out of memory: decoder scratch needs %.1f MB",
                        (double)total / 1e6);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        *plan[i].p = blk + off;
        off += (plan[i].bytes + 63) & ~(size_t)63;
    }
    s->scratch = blk;
    s->scratch_bytes = total;
    if (nd_layout_buf_init(&s->lay, (long)W, 1)) {
        nd_kv_free(s);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    san_rope_tables(s->rope_cos, s->rope_sin, s->max_len, D->hd, m->cfg.rope_theta);
    return ND_OK;
}

void nd_kv_use_quant(nd_kv_state *s, const nd_qweights *q)
{
    s->qw = q;
}

void nd_kv_set_bits(nd_kv_state *s, int bits)
{
    if (!s->cap) { /* the rows' format is fixed once any are stored */
        s->kv_int8 = bits == 8;
        s->vp_int8 = s->kv_int8 && s->m->dims.d % ND_VP_GROUP == 0;
    }
}

void nd_kv_slide(nd_kv_state *s, int n_sink)
{
    s->n_sink = n_sink < 0 ? -1 : n_sink;
}

/* bytes of one cached position: token, K and V of every layer, v' rows */
static size_t row_bytes(const nd_kv_state *s)
{
    const san_dims *D = &s->m->dims;
    size_t kvd = (size_t)D->kv_dim, G = (size_t)D->G;
    size_t kv = s->kv_int8 ? kvd + G * sizeof(float) : kvd * sizeof(float);
    size_t vp = s->vp_int8 ? (size_t)D->d + (size_t)D->d / ND_VP_GROUP * sizeof(float)
                           : (size_t)D->d * sizeof(float);
    return sizeof(int32_t) + 2 * (size_t)D->L * kv + (size_t)s->m->cfg.n_sites * vp;
}

/* rows the window keeps at most (before a chunk of up to `chunk` lands):
 * the sinks, the attention window, one chunk and some slack so that rows
 * are dropped in batches rather than on every decoded token */
static int slide_slack(const nd_kv_state *s)
{
    int slack = (s->max_len - s->n_sink) / 8;
    return slack < 1 ? 1 : slack > 64 ? 64 : slack;
}

/* most tokens one forward_chunk adds: with the window on, at most half of
 * the room after the sinks so that a slide always frees enough */
static int chunk_step(const nd_kv_state *s)
{
    int room = (s->max_len - (s->n_sink > 0 ? s->n_sink : 0)) / 2;
    if (s->n_sink < 0 || s->chunk <= room)
        return s->chunk;
    return room > 0 ? room : 1;
}

static int slide_high(const nd_kv_state *s)
{
    if (!s->kv_window)
        return s->max_len;
    long hi = (long)s->n_sink + s->kv_window + chunk_step(s) + slide_slack(s);
    return hi < s->max_len ? (int)hi : s->max_len;
}

/* capacity for `need` rows: all the rows the cache may ever hold, at once.
 * The arrays are large allocations (mmap'd, pages touched as rows are
 * written), so reserving the bound costs no memory and a growing
 * conversation never copies the cache (a copy held old + new resident). */
static int grown_cap(const nd_kv_state *s, int need)
{
    int top = s->n_sink >= 0 ? slide_high(s) : s->max_len;
    return need > top ? need : top;
}

size_t nd_kv_bytes(const nd_kv_state *s)
{
    return s->scratch_bytes + (size_t)s->rows_hw * row_bytes(s);
}

size_t nd_kv_bytes_bound(const nd_kv_state *s)
{
    int rows = s->n_sink >= 0 ? slide_high(s) : s->max_len;
    return s->scratch_bytes + (size_t)(rows > s->rows_hw ? rows : s->rows_hw) * row_bytes(s);
}

void nd_kv_free(nd_kv_state *s)
{
    if (!s)
        return;
    nd_qact_free(&s->qa);
    free(s->scratch);
    nd_layout_buf_free(&s->lay);
    free(s->tokens);
    free(s->k);
    free(s->v);
    free(s->k8);
    free(s->v8);
    free(s->ks);
    free(s->vs);
    for (int i = 0; i < SAN_MAX_SITES; i++) {
        free(s->vp[i]);
        free(s->vp8[i]);
        free(s->vps[i]);
    }
    memset(s, 0, sizeof *s);
}

void nd_kv_rewind(nd_kv_state *s, int len)
{
    if (len < s->len)
        s->len = len < 0 ? 0 : len;
    if (s->len <= (s->n_sink > 0 ? s->n_sink : 0))
        s->evicted = 0; /* back inside the sinks: positions restart */
}

/* The per-position arrays of a state: [layers][cap][row] each, named by
 * the address of their pointer (growing replaces it). One list for
 * growing, sliding, snapshots and restores, so the cache's layout is
 * written down once. */
typedef struct {
    void **slot;
    size_t layers, row;
} kv_array;

#define KV_ARRAYS_MAX (8 + 2 * SAN_MAX_SITES)

static int kv_arrays(nd_kv_state *s, kv_array *a)
{
    const san_dims *D = &s->m->dims;
    size_t L = (size_t)D->L, kvd = (size_t)D->kv_dim, G = (size_t)D->G, d = (size_t)D->d;
    int n = 0;
    a[n++] = (kv_array){(void **)&s->tokens, 1, sizeof(int32_t)};
    if (s->kv_int8) {
        a[n++] = (kv_array){(void **)&s->k8, L * G, (size_t)D->hd};
        a[n++] = (kv_array){(void **)&s->v8, L * G, (size_t)D->hd};
        a[n++] = (kv_array){(void **)&s->ks, L, G * sizeof(float)};
        a[n++] = (kv_array){(void **)&s->vs, L, G * sizeof(float)};
    } else {
        a[n++] = (kv_array){(void **)&s->k, L, kvd * sizeof(float)};
        a[n++] = (kv_array){(void **)&s->v, L, kvd * sizeof(float)};
    }
    for (int i = 0; i < s->m->cfg.n_sites; i++) {
        if (!s->vp_int8) {
            a[n++] = (kv_array){(void **)&s->vp[i], 1, d * sizeof(float)};
            continue;
        }
        a[n++] = (kv_array){(void **)&s->vp8[i], 1, d};
        a[n++] = (kv_array){(void **)&s->vps[i], 1, d / ND_VP_GROUP * sizeof(float)};
    }
    return n;
}

/* Re-allocate a [layers][cap][row] array for a larger cap, keeping the
 * first len rows of every layer. */
static int grow_rows(void **arr, size_t layers, int old_cap, int cap, int len, size_t row)
{
    char *n = malloc(layers * (size_t)cap * row + 1), *o = *arr;
    if (!n)
        return ND_ENOMEM;
    for (size_t l = 0; l < layers && len; l++)
        memcpy(n + l * (size_t)cap * row, o + l * (size_t)old_cap * row, (size_t)len * row);
    free(*arr);
    *arr = n;
    return ND_OK;
}

/* Grow the per-position storage to hold `need` positions. */
static int kv_reserve(nd_kv_state *s, int need)
{
    if (need > s->cap) {
        int cap = grown_cap(s, need), rc = ND_OK;
        kv_array a[KV_ARRAYS_MAX];
        int na = kv_arrays(s, a);
        for (int i = 0; i < na && !rc; i++)
            rc = grow_rows(a[i].slot, a[i].layers, s->cap, cap, s->len, a[i].row);
        if (rc) /* arrays grown so far hold more rows; s->cap stays the safe bound */
            return nd_error(ND_ENOMEM, "out of memory growing the KV cache to %d positions", cap);
        s->cap = cap;
    }
    s->rows_hw = need > s->rows_hw ? need : s->rows_hw;
    return ND_OK;
}

/* Drop rows [pin, pin + drop) of every layer of a [layers][cap][row] array. */
static void drop_rows(void *arr, size_t layers, int cap, int pin, int drop, int len, size_t row)
{
    char *base = arr;
    for (size_t l = 0; l < layers; l++) {
        char *lb = base + l * (size_t)cap * row;
        memmove(lb + (size_t)pin * row, lb + (size_t)(pin + drop) * row,
                (size_t)(len - pin - drop) * row);
    }
}

/* Sliding window: before n new rows land, drop the oldest unpinned rows
 * once the cache would pass its high mark (upstream keeps the sinks and
 * the last kv_window keys visible; nothing else is ever read again). */
static int make_room(nd_kv_state *s, int n)
{
    int pin = s->n_sink, hi = slide_high(s);
    if (s->len + n <= hi)
        return ND_OK;
    int keep_window = s->kv_window ? s->kv_window : s->max_len;
    long keep = (long)pin + keep_window;
    if (keep > (long)hi - n - slide_slack(s))
        keep = (long)hi - n - slide_slack(s);
    if (keep < pin)
        keep = pin;
    if (keep + n > s->max_len)
        return nd_error(ND_ELIMIT, "%d new tokens after %d pinned ones exceed max_seq_len %d", n,
                        pin, s->max_len);
    int drop = s->len - (int)keep;
    if (drop <= 0)
        return ND_OK;
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays(s, a);
    for (int i = 0; i < na; i++)
        drop_rows(*a[i].slot, a[i].layers, s->cap, pin, drop, s->len, a[i].row);
    s->len -= drop;
    s->evicted += drop;
    return ND_OK;
}

int nd_kv_snapshot(const nd_kv_state *s, int len, nd_kv_snap *out)
{
    memset(out, 0, sizeof *out);
    if (len < 0 || len > s->len || (s->evicted && len > s->n_sink))
        return nd_error(ND_EARG, "snapshot of %d rows: the state holds %d from position 0", len,
                        s->evicted ? s->n_sink : s->len);
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays((nd_kv_state *)s, a); /* read through the slots only */
    size_t bytes = 0;
    for (int i = 0; i < na; i++)
        bytes += a[i].layers * (size_t)len * a[i].row;
    if (!(out->data = malloc(bytes + 1)))
        return nd_error(ND_ENOMEM, "out of memory snapshotting %d KV rows", len);
    char *p = out->data;
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) {
            size_t n = (size_t)len * a[i].row;
            memcpy(p, (char *)*a[i].slot + l * (size_t)s->cap * a[i].row, n);
            p += n;
        }
    out->len = len;
    out->kv_int8 = s->kv_int8;
    out->bytes = bytes;
    return ND_OK;
}

int nd_kv_restore(nd_kv_state *s, const nd_kv_snap *snap)
{
    if (snap->kv_int8 != s->kv_int8 || snap->len > s->max_len)
        return nd_error(ND_EARG, "KV snapshot does not fit this state");
    s->len = 0;
    s->evicted = 0;
    int rc = kv_reserve(s, snap->len > 0 ? snap->len : 1);
    if (rc)
        return rc;
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays(s, a);
    const char *p = snap->data;
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) {
            size_t n = (size_t)snap->len * a[i].row;
            memcpy((char *)*a[i].slot + l * (size_t)s->cap * a[i].row, p, n);
            p += n;
        }
    s->len = snap->len;
    return ND_OK;
}

void nd_kv_snap_free(nd_kv_snap *snap)
{
    free(snap->data);
    memset(snap, 0, sizeof *snap);
}

/* base + off, NULL for a matrix the quantised path leaves in the archive */
static const float *slice(const float *base, size_t off)
{
    return base ? base + off : NULL;
}

/* A decode step runs its small operations on this thread only (a fork
 * costs more than they do) but may share the big ones, the projections and
 * the attention, with the other threads: lift the step's serial mode for
 * one of those; returns what nd_set_serial must restore. The three big
 * kinds call it: wmatmul with WM_BIG, the fused q/k/v/gate products and
 * nd_kv_attention. */
static int big_parallel_begin(const nd_kv_state *s)
{
    return s->big_parallel ? nd_set_serial(0) : nd_serial();
}

enum {
    WM_FRESH = 1, /* quantise x (else reuse the previous call's int8 copy of the same x) */
    WM_BIG = 2,   /* a big product: a decode step may share it (big_parallel_begin) */
};

/* y = x @ W for a weight matrix: the archive's CQ matrix w ([out, in]) on
 * the quantised path, else the float kernel wf ((in, out)); flags WM_*. */
static int wmatmul(nd_kv_state *s, const float *x, int n, int in, const float *wf, const nd_qmat *w,
                   int out, float *y, int ldy, int flags)
{
    int fresh = flags & WM_FRESH;
    if (!s->qw) {
        s->be->matmul(s->be, 0, 0, n, out, in, 1.0f, x, in, wf, out, 0.0f, y, ldy);
        return ND_OK;
    }
    int layout = nd_qmat_layout(w);
    if (fresh || s->qa.layout != layout || s->qa.n != n || s->qa.in != in) {
        int rc = nd_qact_prepare(&s->qa, x, n, in, layout);
        if (rc)
            return rc;
    }
    int prev = (flags & WM_BIG) ? big_parallel_begin(s) : nd_serial();
    nd_qgemm(w, &s->qa, y, ldy);
    nd_set_serial(prev);
    return ND_OK;
}

typedef struct {
    nd_kv_state *s;
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

/* tasks [lo, hi): (block of ND_ATT_ROWS new rows, kv head) pairs. The heads
 * sharing a kv head (GQA) and the block's rows read each cached row once,
 * converted from int8 once; keys a row does not see get no weight. */
static void cached_attention_tasks(void *ctx, long lo, long hi, int tid)
{
    const cached_attention_args *a = ctx;
    nd_kv_state *s = a->s;
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
        int i0 = (int)(task / G) * ND_ATT_ROWS, g = (int)(task % G);
        int nr = n - i0 < ND_ATT_ROWS ? n - i0 : ND_ATT_ROWS;
        int se[ND_ATT_ROWS], j0[ND_ATT_ROWS];
        const int8_t *K8 = s->kv_int8 ? nd_kv_row8(s, s->k8, l, g, 0) : NULL;
        const int8_t *V8 = s->kv_int8 ? nd_kv_row8(s, s->v8, l, g, 0) : NULL;
        for (int i = 0; i < nr; i++)
            visible_keys(s, p0 + i0 + i, &se[i], &j0[i]);
        if (a->kernel != ND_ATT_REF) {
            nd_att_block b = {s->q + (size_t)i0 * qd + (size_t)g * rep * hd,
                              s->att + (size_t)i0 * qd + (size_t)g * rep * hd,
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
            if (a->kernel == ND_ATT_AMX && nr * rep >= ND_ATT_AMX_MIN)
                nd_att_block_amx(&b);
            else
                nd_att_block_avx512(&b);
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
                        const float *q = s->q + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd;
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
                float *out = s->att + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd;
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
                        axpy4(s->att + (size_t)(i0 + i) * qd + (size_t)(g * rep + r) * hd, vr, w,
                              hd);
                    }
            }
    }
}

static pthread_once_t att_once = PTHREAD_ONCE_INIT;
static int att_best = ND_ATT_REF;

static void select_att_kernel(void)
{
    const char *want = getenv("NEEDLE_ATT");
    if (nd_att_avx512_supported() && !(want && !strcmp(want, "ref")))
        att_best = want && !strcmp(want, "avx512") ? ND_ATT_AVX512
                   : nd_amx_usable()               ? ND_ATT_AMX
                                                   : ND_ATT_AVX512;
}

int nd_att_kernel(void)
{
    pthread_once(&att_once, select_att_kernel);
    return att_best;
}

/* Causal attention of n new query rows (positions p0..p0+n-1) over the
 * cached keys 0..p (or the last kv_window of them). */
void nd_kv_attention(nd_kv_state *s, int l, int p0, int n, int kernel)
{
    const san_dims *D = &s->m->dims;
    /* the AVX-512 kernel covers the int8 cache with hd a multiple of 16 */
    if (kernel != ND_ATT_REF && !(s->kv_int8 && D->hd % 16 == 0 && nd_att_avx512_supported()))
        kernel = ND_ATT_REF;
    if (kernel == ND_ATT_AMX && !nd_amx_usable())
        kernel = ND_ATT_AVX512;
    long tasks = (long)((n + ND_ATT_ROWS - 1) / ND_ATT_ROWS) * D->G;
    cached_attention_args a = {s, l, p0, n, kernel};
    /* shared above ~128 score entries (a decode step past 128 positions:
     * with the SIMD kernel less is cheaper than a fork); never by more
     * threads than the score rows were sized for */
    long grain = (long)n * (p0 + n) > 128 && nd_get_threads() <= s->att_threads ? 1 : tasks;
    int prev = big_parallel_begin(s);
    nd_parallel_for(tasks, grain, cached_attention_tasks, &a);
    nd_set_serial(prev);
}

/* v' rows p0..p0+n-1 from s->eng_vp into site's int8 rows */
/* q = round(x / scale) with scale = max|x| / 127 (1 for a zero row), as
 * int8; returns the scale. Written so both loops vectorise: the absolute
 * values' bit patterns order as the values do (finite inputs), and adding
 * and removing 1.5 * 2^23 rounds to nearest-even as lrintf does for
 * |x / scale| <= 127. */
static float quant_row_i8(const float *x, int8_t *q, size_t n)
{
    uint32_t mb = 0;
    for (size_t e = 0; e < n; e++) {
        uint32_t b;
        memcpy(&b, x + e, 4);
        b &= 0x7fffffffu;
        mb = b > mb ? b : mb;
    }
    float mx;
    memcpy(&mx, &mb, 4);
    float scale = mx > 0.0f ? mx / 127.0f : 1.0f, inv = 1.0f / scale;
    for (size_t e = 0; e < n; e++)
        q[e] = (int8_t)(int)((x[e] * inv + 12582912.0f) - 12582912.0f);
    return scale;
}

static void store_vp_rows(nd_kv_state *s, int site, int p0, int n)
{
    int d = s->m->dims.d, ng = d / ND_VP_GROUP;
    for (int i = 0; i < n; i++)
        for (int g = 0; g < ng; g++) {
            const float *x = s->eng_vp + (size_t)i * d + (size_t)g * ND_VP_GROUP;
            int8_t *q = s->vp8[site] + (size_t)(p0 + i) * d + (size_t)g * ND_VP_GROUP;
            s->vps[site][(size_t)(p0 + i) * ng + (size_t)g] = quant_row_i8(x, q, ND_VP_GROUP);
        }
}

/* int8 v' row r of a site as floats, in the first row of s->eng_vp (free
 * once the new rows are stored) */
static const float *vp_row(nd_kv_state *s, int site, int r)
{
    int d = s->m->dims.d, ng = d / ND_VP_GROUP;
    const int8_t *q = s->vp8[site] + (size_t)r * d;
    const float *sc = s->vps[site] + (size_t)r * ng;
    for (int x = 0; x < d; x++)
        s->eng_vp[x] = (float)q[x] * sc[x / ND_VP_GROUP];
    return s->eng_vp;
}

/* e rows of the n-gram table lookups, read from the archive's CQ tables */
static void engram_gather_q(nd_kv_state *s, const nd_qmat *tables)
{
    const san_config *c = &s->m->cfg;
    const san_dims *D = &s->m->dims;
    const nd_layout *L = &s->lay.L;
    int K = c->n_orders * D->eng_heads, sub = D->eng_sub;
    for (long r = 0; r < L->N; r++)
        for (int k = 0; k < K; k++) {
            float *dst = s->eng_e + (r * K + k) * sub;
            if (L->pos[r] < c->engram_orders[k / D->eng_heads] - 1)
                memset(dst, 0, (size_t)sub * sizeof *dst);
            else
                nd_qmat_row(tables, (int)((long)k * c->engram_slots + s->eng_idx[r * K + k]), dst);
        }
}

static int engram_chunk(nd_kv_state *s, int p0, int n)
{
    const san_model *m = s->m;
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    const nd_backend *be = s->be;
    if (!c->n_sites)
        return ND_OK;
    int ws = p0 - (max_order(m) - 1);
    if (ws < 0)
        ws = 0;
    int T = p0 + n - ws, off = p0 - ws, d = D->d;
    memcpy(s->win_tok, s->tokens + ws, (size_t)T * sizeof *s->win_tok);
    nd_layout_dense(&s->lay, 1, T);
    be->engram_hash(be, s->eng_idx, s->win_tok, &s->lay.L, c->engram_orders, c->n_orders,
                    D->eng_heads, c->engram_slots);
    for (int site = 0; site < c->n_sites; site++) {
        const san_weights *w = &m->w;
        if (s->qw)
            engram_gather_q(s, &s->qw->eng[site].table);
        else
            be->engram_gather(be, s->eng_e, w->eng[site].table, s->eng_idx, &s->lay.L,
                              c->engram_orders, c->n_orders, D->eng_heads, c->engram_slots,
                              D->eng_sub);
        const float *e = s->eng_e + (size_t)off * D->eng_dim;
        float *ek = s->eng_k + (size_t)site * n * d, *ev = s->eng_v + (size_t)site * n * d;
        /* new v' rows: straight into the float cache, or through scratch
         * into int8 rows (then every tap reads the int8 rows, so results
         * do not depend on how the prompt was split into chunks) */
        float *vp = s->vp[site], *vnew = s->vp_int8 ? s->eng_vp : vp + (size_t)p0 * d;
        const nd_qmat *qk = s->qw ? &s->qw->eng[site].wk : NULL;
        const nd_qmat *qv = s->qw ? &s->qw->eng[site].wv : NULL;
        int rc = wmatmul(s, e, n, D->eng_dim, w->eng[site].wk, qk, d, ek, d, WM_FRESH);
        if (!rc)
            rc = wmatmul(s, e, n, D->eng_dim, w->eng[site].wv, qv, d, vnew, d, 0);
        if (rc)
            return rc;
        if (s->vp_int8)
            store_vp_rows(s, site, p0, n);
        const float *taps = w->eng[site].taps;
        for (int i = 0; i < n; i++) {
            int t = p0 + i;
            float *vr = ev + (size_t)i * d;
            for (int x = 0; x < d; x++)
                vr[x] = 0.0f;
            for (int j = 0; j < SAN_CONV_TAPS; j++) {
                int src = t - j * D->eng_dilation;
                if (src < 0)
                    break;
                const float *pr = s->vp_int8 ? vp_row(s, site, src) : vp + (size_t)src * d;
                const float *tp = taps + (size_t)j * d;
                for (int x = 0; x < d; x++)
                    vr[x] += tp[x] * pr[x];
            }
        }
    }
    return ND_OK;
}

/* cos/sin rows of the n positions from row p0: absolute positions (row +
 * evicted) as upstream's decode.py numbers them; past max_seq_len (only with
 * the window on) computed here the way san_rope_tables does */
static void rope_rows(nd_kv_state *s, int p0, int n, const float **cs, const float **sn)
{
    int hd = s->m->dims.hd;
    size_t half = (size_t)hd / 2;
    long ap0 = p0 + s->evicted;
    if (ap0 + n <= s->max_len) {
        *cs = s->rope_cos + (size_t)ap0 * half;
        *sn = s->rope_sin + (size_t)ap0 * half;
        return;
    }
    for (size_t i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)s->m->cfg.rope_theta, (float)(2 * i) / (float)hd);
        for (int t = 0; t < n; t++) {
            double ang = (double)(ap0 + t) * freq;
            s->rope_far_cos[(size_t)t * half + i] = (float)cos(ang);
            s->rope_far_sin[(size_t)t * half + i] = (float)sin(ang);
        }
    }
    *cs = s->rope_far_cos;
    *sn = s->rope_far_sin;
}

/* Append the chunk's K (after RoPE) and V rows to layer l's cache: float32,
 * or int8 with one absmax scale per (row, kv head) */
static void store_rows(nd_kv_state *s, int l, int p0, int n)
{
    const san_dims *D = &s->m->dims;
    size_t kvd = (size_t)D->kv_dim, G = (size_t)D->G, hd = (size_t)D->hd;
    size_t lc = (size_t)l * s->cap;
    if (!s->kv_int8) {
        memcpy(s->k + (lc + (size_t)p0) * kvd, s->kk, (size_t)n * kvd * sizeof(float));
        memcpy(s->v + (lc + (size_t)p0) * kvd, s->vv, (size_t)n * kvd * sizeof(float));
        return;
    }
    for (int side = 0; side < 2; side++) {
        const float *src = side ? s->vv : s->kk;
        float *sc = (side ? s->vs : s->ks) + (lc + (size_t)p0) * G;
        for (size_t r = 0; r < (size_t)n * G; r++) {
            const float *x = src + r * hd;
            int8_t *dst = nd_kv_row8(s, side ? s->v8 : s->k8, l, (int)(r % G), p0 + (int)(r / G));
            sc[r] = quant_row_i8(x, dst, hd);
        }
    }
}

static int layer_chunk(nd_kv_state *s, int l, int p0, int n)
{
    const san_model *m = s->m;
    const san_dims *D = &m->dims;
    const san_weights *w = &m->w;
    const nd_backend *be = s->be;
    int d = D->d, ln = D->n, nd = ln * d, hd = D->hd, qd = D->q_dim, kvd = D->kv_dim;
    size_t Ld = (size_t)l * d;
    const float *X = s->X;

    be->rmsnorm(be, s->nx, NULL, X, NULL, n, nd);
    const nd_qlayer *ql = s->qw ? &s->qw->layer[l] : NULL;
    nd_qmat qpre = {0}, qpost = {0}, qres = {0};
    if (s->qw) { /* this layer's rows of the stacked (L * k, n * d) matrices */
        qpre = nd_qmat_rows(&s->qw->phi_pre, l * ln, ln);
        qpost = nd_qmat_rows(&s->qw->phi_post, l * ln, ln);
        qres = nd_qmat_rows(&s->qw->phi_res, l * ln * ln, ln * ln);
    }
    int rc = wmatmul(s, s->nx, n, nd, slice(w->phi_pre, (size_t)l * nd * ln), &qpre, ln, s->pre, ln,
                     WM_FRESH);
    if (!rc)
        rc = wmatmul(s, s->nx, n, nd, slice(w->phi_post, (size_t)l * nd * ln), &qpost, ln, s->post,
                     ln, 0);
    if (!rc)
        rc = wmatmul(s, s->nx, n, nd, slice(w->phi_res, (size_t)l * nd * ln * ln), &qres, ln * ln,
                     s->res, ln * ln, 0);
    if (rc)
        return rc;
    be->hyper_coeffs(be, s->hpre, s->hpost, s->M, s->pre, s->post, s->res, w->a_pre[l],
                     w->a_post[l], w->a_res[l], w->b_pre + (size_t)l * ln,
                     w->b_post + (size_t)l * ln, w->b_res + (size_t)l * ln * ln, l % ln, n, ln);
    be->lanes_combine(be, s->u, s->hpre, X, n, ln, d);
    const float *bx = s->u;
    for (int site = 0; site < m->cfg.n_sites; site++)
        if (m->cfg.engram_layers[site] == l) {
            be->engram_gate(be, s->bx, s->alpha, s->u, s->eng_k + (size_t)site * n * d,
                            s->eng_v + (size_t)site * n * d, n, d, bx == s->bx);
            bx = s->bx;
        }

    be->rmsnorm(be, s->a, NULL, bx, w->norm_in + Ld, n, d);
    if (s->qw) { /* one input, four products: one parallel region */
        const nd_qmat *ws[4] = {&ql->wq, &ql->wk, &ql->wv, &ql->wgate};
        float *ys[4] = {s->q, s->kk, s->vv, s->g};
        const int lds[4] = {qd, kvd, kvd, qd};
        rc = nd_qact_prepare(&s->qa, s->a, n, d, nd_qmat_layout(ws[0]));
        if (!rc) {
            int prev = big_parallel_begin(s);
            nd_qgemm_many(ws, 4, &s->qa, ys, lds);
            nd_set_serial(prev);
        }
    } else
        rc = wmatmul(s, s->a, n, d, slice(w->wq, (size_t)l * d * qd), NULL, qd, s->q, qd, WM_FRESH);
    if (!rc && !s->qw)
        rc = wmatmul(s, s->a, n, d, slice(w->wk, (size_t)l * d * kvd), NULL, kvd, s->kk, kvd, 0);
    if (!rc && !s->qw)
        rc = wmatmul(s, s->a, n, d, slice(w->wv, (size_t)l * d * kvd), NULL, kvd, s->vv, kvd, 0);
    if (!rc && !s->qw)
        rc = wmatmul(s, s->a, n, d, slice(w->wgate, (size_t)l * d * qd), NULL, qd, s->g, qd, 0);
    if (rc)
        return rc;
    be->rmsnorm(be, s->q, NULL, s->q, w->q_norm + (size_t)l * hd, (long)n * D->H, hd);
    be->rmsnorm(be, s->kk, NULL, s->kk, w->k_norm + (size_t)l * hd, (long)n * D->G, hd);
    /* rope rows are positions p0.. : offset the tables, one "sequence" of n */
    nd_layout_dense(&s->lay, 1, n);
    const float *cs, *sn;
    rope_rows(s, p0, n, &cs, &sn);
    be->rope(be, s->q, cs, sn, &s->lay.L, D->H, hd);
    be->rope(be, s->kk, cs, sn, &s->lay.L, D->G, hd);
    store_rows(s, l, p0, n);
    nd_kv_attention(s, l, p0, n, s->att_force ? s->att_force - 1 : nd_att_kernel());
    be->gate_sigmoid(be, s->o, s->att, s->g, (long)n * qd);
    rc = wmatmul(s, s->o, n, qd, slice(w->wout, (size_t)l * qd * d), ql ? &ql->wout : NULL, d,
                 s->o2, d, WM_FRESH | WM_BIG);
    if (rc)
        return rc;
    be->rmsnorm(be, s->pn, NULL, s->o2, w->post_norm + Ld, n, d);
    be->residual_scaled(be, s->x1, bx, s->pn, w->attn_gate[l], (long)n * d);
    be->rmsnorm(be, s->z, NULL, s->x1, w->pre_hada + Ld, n, d);
    size_t Lh = (size_t)l * D->hada_n;
    be->hadamard_mlp(be, s->y, s->h1, s->x1, s->z, s->u, w->d1 + Lh, w->d2 + Lh, w->d3 + Lh, n, d,
                     D->hada_n);
    be->lanes_update(be, s->Xn, s->M, X, s->hpost, s->y, n, ln, d);
    float *t = s->X;
    s->X = s->Xn;
    s->Xn = t;
    return ND_OK;
}

static int forward_chunk(nd_kv_state *s, const int32_t *tok, int n, float *logits, int all)
{
    const san_model *m = s->m;
    const san_dims *D = &m->dims;
    const nd_backend *be = s->be;
    int rc = s->n_sink >= 0 ? make_room(s, n) : ND_OK;
    int p0 = s->len, d = D->d;
    if (rc || (rc = kv_reserve(s, p0 + n)))
        return rc;
    memcpy(s->tokens + p0, tok, (size_t)n * sizeof *tok);
    if (s->qw) { /* dequantise just the looked-up rows */
        float scale = (float)sqrt((double)d);
        for (int i = 0; i < n; i++) {
            float *row = s->x0 + (size_t)i * d;
            nd_qmat_row(&s->qw->emb, tok[i], row);
            for (int x = 0; x < d; x++)
                row[x] *= scale;
        }
    } else {
        be->embed(be, s->x0, m->w.emb, tok, n, d, (float)sqrt((double)d));
    }
    if ((rc = engram_chunk(s, p0, n)))
        return rc;
    be->lanes_broadcast(be, s->X, s->x0, n, D->n, d);
    if (s->cells_hook) {
        nd_backend_sync(be);
        s->cells_hook(s->cells_ctx, -1, p0, s->x0, n);
    }
    for (int l = 0; l < D->L && !rc; l++) {
        rc = layer_chunk(s, l, p0, n);
        if (!rc && s->cells_hook) {
            be->lanes_mean(be, s->xm, s->X, n, D->n, d);
            nd_backend_sync(be);
            s->cells_hook(s->cells_ctx, l, p0, s->xm, n);
        }
    }
    if (rc)
        return rc;
    s->len = p0 + n;
    if (!logits)
        return ND_OK;
    int r0 = all ? 0 : n - 1, rows = n - r0;
    const float *X = s->X + (size_t)r0 * D->n * d;
    be->lanes_mean(be, s->xm, X, rows, D->n, d);
    be->rmsnorm(be, s->hf, NULL, s->xm, m->w.final_norm, rows, d);
    if (s->qw)
        return wmatmul(s, s->hf, rows, d, NULL, &s->qw->emb, D->V, logits, D->V, WM_FRESH | WM_BIG);
    be->matmul(be, 0, 1, rows, D->V, d, 1.0f, s->hf, d, m->w.emb, d, 0.0f, logits, D->V);
    return ND_OK;
}

/* $NEEDLE_DECODE_THREADS=0: decode steps entirely on the calling thread
 * (a machine whose cores other jobs hold) */
static int decode_threads(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("NEEDLE_DECODE_THREADS");
        v = !(e && !strcmp(e, "0"));
    }
    return v;
}

int nd_kv_forward(nd_kv_state *s, const int32_t *tok, int n, float *logits, int all_logits)
{
    const san_dims *D = &s->m->dims;
    if (n < 1)
        return nd_error(ND_EARG, "no tokens to run");
    if (s->n_sink < 0 && (long)s->len + n > s->max_len)
        return nd_error(ND_ELIMIT, "%d tokens after %d already in context exceed max_seq_len %d", n,
                        s->len, s->max_len);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= D->V)
            return nd_error(ND_EARG, "token id %d is outside the vocabulary [0, %d)", tok[i], D->V);
    /* small work (a decode step, a tiny model) is not worth sharing: OpenMP
     * a fork/join costs more than it saves (and spins when cores are busy) */
    const san_dims *Dm = &s->m->dims;
    double work = (double)n * Dm->d * Dm->d * Dm->L * 8.0; /* ~multiply-adds */
    int serial = work < 1e8, saved = 0;
    s->big_parallel = 0;
    if (serial) { /* this thread only: other sessions keep their threads */
        s->big_parallel = nd_get_threads() > 1 && decode_threads() && !nd_in_parallel();
        saved = nd_set_serial(1);
    }
    int rc = ND_OK, step = chunk_step(s);
    for (int i = 0; i < n && !rc; i += step) {
        int k = n - i < step ? n - i : step;
        float *lg = NULL;
        if (logits && all_logits)
            lg = logits + (size_t)i * D->V;
        else if (logits && i + k == n)
            lg = logits;
        rc = forward_chunk(s, tok + i, k, lg, all_logits);
    }
    if (serial)
        nd_set_serial(saved);
    return rc;
}
