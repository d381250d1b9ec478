/* The engine's incremental SAN forward (upstream decode.py's
 * _forward_cached): new tokens attend to every cached key, the engram
 * n-gram hash reads the token history and the taps read cached v' rows.
 * The layers are the block (model/block.h) with the engine's weights view
 * (quantised matrices from the archive, or float ones) and the KV cache as
 * its attention source; the cache itself is kv.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "core/tuning.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "engine/kv_internal.h"
#include "model/block.h"

/* a logit no token past the model's out_vocab can win with (not -inf: a
 * softmax, entropy or log-probability over the row stays finite) */
#define ND_LOGIT_NEVER (-1e30f)

/* base + off, NULL for a matrix the quantised path leaves in the archive */
static const float *slice(const float *base, size_t off)
{
    return base ? base + off : NULL;
}

/* The three big kinds of work a decode step may share (see
 * nd_kv_big_parallel_begin): wmatmul with WM_BIG, the fused q/k/v/gate
 * products and nd_kv_attention. */
enum {
    WM_FRESH = 1, /* quantise x (else reuse the previous call's int8 copy of the same x) */
    WM_BIG = 2,   /* a big product: a decode step may share it */
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
    int prev = (flags & WM_BIG) ? nd_kv_big_parallel_begin(s) : nd_serial();
    nd_qgemm(w, &s->qa, y, ldy);
    nd_set_serial(prev);
    return ND_OK;
}

/* e rows r0.. of the n-gram table lookups, read from the archive's CQ
 * tables (the window's earlier rows only feed the hash: their lookups are
 * never read) */
static void engram_gather_q(nd_kv_state *s, const nd_qmat *tables, long r0)
{
    const san_config *c = &s->m->cfg;
    const san_dims *D = &s->m->dims;
    const nd_layout *L = &s->lay.L;
    int K = c->n_orders * D->eng_heads, sub = D->eng_sub;
    for (long r = r0; r < L->N; r++)
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
    int ws = p0 - (nd_kv_max_order(m) - 1);
    if (ws < 0)
        ws = 0;
    int T = p0 + n - ws, off = p0 - ws, d = D->d;
    memcpy(s->win_tok, s->tokens + ws, (size_t)T * sizeof *s->win_tok);
    nd_layout_dense(&s->lay, 1, T);
    if (c->engram_seed_heads) /* 3.x: the hash's seed stride */
        be->engram_hash_seeded(be, s->eng_idx, s->win_tok, &s->lay.L, c->engram_orders, c->n_orders,
                               D->eng_heads, c->engram_slots, c->engram_seed_heads);
    else
        be->engram_hash(be, s->eng_idx, s->win_tok, &s->lay.L, c->engram_orders, c->n_orders,
                        D->eng_heads, c->engram_slots);
    for (int site = 0; site < c->n_sites; site++) {
        const san_weights *w = &m->w;
        if (s->qw)
            engram_gather_q(s, &s->qw->eng[site].table, off);
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
            nd_kv_store_vp_rows(s, site, p0, n);
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
                const float *pr = s->vp_int8 ? nd_kv_vp_row(s, site, src) : vp + (size_t)src * d;
                const float *tp = taps + (size_t)j * d;
                for (int x = 0; x < d; x++)
                    vr[x] += tp[x] * pr[x];
            }
        }
    }
    return ND_OK;
}

/* cos/sin rows of the n positions from row p0: absolute positions (row +
 * evicted) as upstream's decode.py numbers them (kv.c makes them) */
static void rope_rows(nd_kv_state *s, int p0, int n, const float **cs, const float **sn)
{
    nd_kv_rope_rows(s, p0 + s->evicted, n);
    *cs = s->rope_far_cos;
    *sn = s->rope_far_sin;
}

/* The engine's weights view: the archive's CQ matrices (s->qw) or the
 * float kernels of m->w, through wmatmul. */
typedef struct {
    san_wview base;
    nd_kv_state *s;
} kv_wview;

static int kv_apply(const san_wview *v, int l, san_wgroup grp, const float *x, int n,
                    float *const *y)
{
    nd_kv_state *s = ((const kv_wview *)v)->s;
    const san_dims *D = &s->m->dims;
    const san_weights *w = &s->m->w;
    /* Needle 2: k_dim = v_dim = kv_dim, gate_dim = o_dim = q_dim */
    int d = D->d, ln = D->n, nd = ln * d, qd = D->q_dim, kd = D->k_dim, vd = D->v_dim, rc;
    int gd = D->gate_dim, od = D->o_dim;
    const nd_qlayer *ql = s->qw ? &s->qw->layer[l] : NULL;
    switch (grp) {
    case SAN_W_PHI: {
        nd_qmat qpre = {0}, qpost = {0}, qres = {0};
        if (s->qw) { /* this layer's rows of the stacked (L * k, n * d) matrices */
            qpre = nd_qmat_rows(&s->qw->phi_pre, l * ln, ln);
            qpost = nd_qmat_rows(&s->qw->phi_post, l * ln, ln);
            qres = nd_qmat_rows(&s->qw->phi_res, l * ln * ln, ln * ln);
        }
        rc = wmatmul(s, x, n, nd, slice(w->phi_pre, (size_t)l * nd * ln), &qpre, ln, y[0], ln,
                     WM_FRESH);
        if (!rc)
            rc = wmatmul(s, x, n, nd, slice(w->phi_post, (size_t)l * nd * ln), &qpost, ln, y[1], ln,
                         0);
        if (!rc)
            rc = wmatmul(s, x, n, nd, slice(w->phi_res, (size_t)l * nd * ln * ln), &qres, ln * ln,
                         y[2], ln * ln, 0);
        return rc;
    }
    case SAN_W_QKVG:
        if (s->qw) { /* one input, four products: one parallel region */
            const nd_qmat *ws[4] = {&ql->wq, &ql->wk, &ql->wv, &ql->wgate};
            float *ys[4] = {y[0], y[1], y[2], y[3]};
            const int lds[4] = {qd, kd, vd, gd};
            rc = nd_qact_prepare(&s->qa, x, n, d, nd_qmat_layout(ws[0]));
            if (!rc) {
                int prev = nd_kv_big_parallel_begin(s);
                nd_qgemm_many(ws, 4, &s->qa, ys, lds);
                nd_set_serial(prev);
            }
            return rc;
        }
        rc = wmatmul(s, x, n, d, slice(w->wq, (size_t)l * d * qd), NULL, qd, y[0], qd, WM_FRESH);
        if (!rc)
            rc = wmatmul(s, x, n, d, slice(w->wk, (size_t)l * d * kd), NULL, kd, y[1], kd, 0);
        if (!rc)
            rc = wmatmul(s, x, n, d, slice(w->wv, (size_t)l * d * vd), NULL, vd, y[2], vd, 0);
        if (!rc)
            rc = wmatmul(s, x, n, d, slice(w->wgate, (size_t)l * d * gd), NULL, gd, y[3], gd, 0);
        return rc;
    case SAN_W_OUT:
        return wmatmul(s, x, n, od, slice(w->wout, (size_t)l * od * d), ql ? &ql->wout : NULL, d,
                       y[0], d, WM_FRESH | WM_BIG);
    }
    return nd_error(ND_EARG, "unknown weight group %d", (int)grp);
}

/* The engine's attention source: the chunk's K/V rows join the cache,
 * then its query rows attend over the cached history. */
typedef struct {
    san_attn_src base;
    nd_kv_state *s;
    int p0, n;
} kv_attn;

typedef struct {
    nd_kv_state *s;
    int l, p0;
    const float *k, *v;
} store_args;

static void store_rows_body(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const store_args *a = ctx;
    const san_dims *D = &a->s->m->dims;
    size_t kd = a->s->gen3 ? (size_t)D->k_dim : (size_t)D->kv_dim;
    size_t vd = a->s->gen3 ? (size_t)D->v_dim : (size_t)D->kv_dim;
    nd_kv_store_rows(a->s, a->l, a->p0 + (int)lo, (int)(hi - lo), a->k + (size_t)lo * kd,
                     a->v + (size_t)lo * vd);
}

/* A prompt chunk's new K/V rows into the cache, the rows shared by the
 * threads as the chunk's other row-wise operations share them (each row's
 * int8 quantisation is its own: the same bytes either way); a decode
 * step's row on this thread. */
static void store_rows(nd_kv_state *s, int l, int p0, int n, const float *k, const float *v)
{
    if (n < 16) {
        nd_kv_store_rows(s, l, p0, n, k, v);
        return;
    }
    store_args a = {s, l, p0, k, v};
    nd_parallel_for(n, 8, store_rows_body, &a);
}

static int kv_attend(const san_attn_src *src, int l, const float *q, const float *k, const float *v,
                     float *att, float *lse)
{
    (void)lse; /* nothing is kept for a backward */
    const kv_attn *ka = (const kv_attn *)src;
    nd_kv_state *s = ka->s;
    if (s->gen3) {
        const san_config *c = &s->m->cfg;
        /* a CLA consumer stores nothing: its slot is its producer's, whose
         * rows of this chunk are already in */
        if (san_cla_producer(c, l) < 0)
            store_rows(s, l, ka->p0, ka->n, k, v);
        int window = 0;
        if (san_layer_is_local(c, l)) {
            window = c->sliding_window;
            if (s->kv_window && s->kv_window < window)
                window = s->kv_window;
        }
        nd_kv_attention3(s, l, ka->p0, ka->n, q, att, window, nd_att3_kernel());
        return ND_OK;
    }
    store_rows(s, l, ka->p0, ka->n, k, v);
    nd_kv_attention(s, l, ka->p0, ka->n, q, att, s->att_force ? s->att_force - 1 : nd_att_kernel());
    return ND_OK;
}

/* Needle 3's causal q/k/v conv over the cache: row t sums taps[j] * row
 * t - j (the trainer's qkv_taps over the whole sequence, one chunk at a
 * time), the rows before the chunk coming from the layer's conv ring (kv.c:
 * the last rows by absolute position); then the chunk's pre-conv rows join
 * the ring. */
static int kv_conv(const san_attn_src *src, int l, int which, float *y, const float *x,
                   const float *taps, int width, int ntaps, int window)
{
    const kv_attn *ka = (const kv_attn *)src;
    nd_kv_state *s = ka->s;
    const san_dims *D = &s->m->dims;
    size_t off = which == 0 ? 0 : which == 1 ? (size_t)D->q_dim : (size_t)D->q_dim + D->k_dim;
    int p0 = ka->p0, n = ka->n;
    long k0 = nd_kv_key(s, p0);
    int nt = window > 0 && window < ntaps ? window : ntaps;
    for (int i = 0; i < n; i++) {
        float *yr = y + (size_t)i * width;
        for (int e = 0; e < width; e++)
            yr[e] = 0.0f;
        for (int j = 0; j < nt && p0 + i - j >= 0; j++) {
            const float *xr = i >= j ? x + (size_t)(i - j) * width
                                     : nd_kv_cv_row(s, l, k0 + i - j) + off,
                        *tj = taps + (size_t)j * width;
            for (int e = 0; e < width; e++)
                yr[e] += tj[e] * xr[e];
        }
    }
    for (int i = n > s->cv_ring ? n - s->cv_ring : 0; i < n; i++)
        memcpy(nd_kv_cv_row(s, l, k0 + i) + off, x + (size_t)i * width, (size_t)width * sizeof *x);
    return ND_OK;
}

static int forward_chunk(nd_kv_state *s, const int32_t *tok, int n, float *logits, int all)
{
    const san_model *m = s->m;
    const san_dims *D = &m->dims;
    const nd_backend *be = s->be;
    int rc = s->n_sink >= 0 ? nd_kv_make_room(s, n) : ND_OK;
    if (!rc) /* a rewind past the kept history (or a slide into it): its rows again */
        rc = nd_kv_prepare(s);
    int p0 = s->len, d = D->d;
    if (rc || (rc = nd_kv_reserve(s, p0 + n)))
        return rc;
    nd_kv_note_write(s, p0, n);
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
    /* the layers: RoPE rows are positions p0.. (offset tables, one
     * "sequence" of n rows) */
    nd_layout_dense(&s->lay, 1, n);
    kv_wview wv = {{kv_apply}, s};
    kv_attn at = {
        {&s->lay.L, NULL, NULL, kv_attend, s->gen3 && m->cfg.qkv_conv_taps ? kv_conv : NULL},
        s,
        p0,
        n};
    rope_rows(s, p0, n, &at.base.rope_cos, &at.base.rope_sin);
    san_block blk = {m, &m->w, be, &wv.base, &at.base, {0}, {0}, s->hada3, NULL, NULL, NULL};
    for (int site = 0; site < m->cfg.n_sites; site++) {
        blk.eng_k[site] = s->eng_k + (size_t)site * n * d;
        blk.eng_v[site] = s->eng_v + (size_t)site * n * d;
    }
    for (int l = 0; l < D->L && !rc; l++) {
        rc = san_layer_forward(&blk, &s->la, l, n, s->X, s->Xn);
        float *t = s->X;
        s->X = s->Xn;
        s->Xn = t;
        if (!rc && s->cells_hook) {
            be->lanes_mean(be, s->xm, s->X, n, D->n, d);
            nd_backend_sync(be);
            s->cells_hook(s->cells_ctx, l, p0, s->xm, n);
        }
    }
    if (rc)
        return rc;
    s->len = p0 + n;
    nd_kv_note_rows(s, p0, n);
    if (!logits)
        return ND_OK;
    int r0 = all ? 0 : n - 1, rows = n - r0;
    const float *X = s->X + (size_t)r0 * D->n * d;
    be->lanes_mean(be, s->xm, X, rows, D->n, d);
    be->rmsnorm(be, s->hf, NULL, s->xm, m->w.final_norm, rows, d);
    /* logits over the first V_out embedding rows (3.x out_vocab; else all);
     * the tokens past them can never be produced */
    int Vo = D->V_out;
    if (s->qw) {
        nd_qmat head = Vo < D->V ? nd_qmat_rows(&s->qw->emb, 0, Vo) : s->qw->emb;
        rc = wmatmul(s, s->hf, rows, d, NULL, &head, Vo, logits, D->V, WM_FRESH | WM_BIG);
    } else {
        be->matmul(be, 0, 1, rows, Vo, d, 1.0f, s->hf, d, m->w.emb, d, 0.0f, logits, D->V);
    }
    for (int r = 0; r < rows && Vo < D->V; r++)
        for (int t = Vo; t < D->V; t++)
            logits[(size_t)r * D->V + t] = ND_LOGIT_NEVER;
    return rc;
}

/* $NEEDLE_DECODE_THREADS=0: decode steps entirely on the calling thread
 * (a machine whose cores other jobs hold) */
static int decode_threads(void)
{
    static int v = -1;
    if (v < 0) {
        v = !nd_tuning_get()->decode_one_thread;
    }
    return v;
}

/* after a crew whose helper kept its caller waiting (nd_crew_run: the
 * machine's cores are busy with other jobs), forwards run on the calling
 * thread alone this long (results are the same) */
#define ND_CREW_BACKOFF_S 0.05

/* one nd_kv_forward call's chunks (run by nd_crew_run or directly) */
typedef struct {
    nd_kv_state *s;
    const int32_t *tok;
    int n, all_logits, serial;
    float *logits;
    int rc;
} forward_job;

static void forward_chunks(void *p)
{
    forward_job *j = p;
    nd_kv_state *s = j->s;
    const san_dims *D = &s->m->dims;
    int saved = j->serial ? nd_set_serial(1) : 0;
    /* the quantised path's BLAS products (Needle 3's Hadamard MLP) split
     * the same at every thread count: one thread's logits, bit for bit */
    int fixed = nd_set_fixed_split(s->qw != NULL);
    int rc = ND_OK, n = j->n;
    for (int i = 0, k = 0; i < n && !rc; i += k) {
        k = nd_kv_next_rows(s, n - i);
        float *lg = NULL;
        if (j->logits && j->all_logits)
            lg = j->logits + (size_t)i * D->V;
        else if (j->logits && i + k == n)
            lg = j->logits;
        rc = forward_chunk(s, j->tok + i, k, lg, j->all_logits);
    }
    if (j->serial)
        nd_set_serial(saved);
    nd_set_fixed_split(fixed);
    j->rc = rc;
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
    int serial = work < 1e8;
    int threads = nd_get_threads() > 1 && !nd_in_parallel();
    s->big_parallel = 0;
    if (serial) /* this thread only: other sessions keep their threads */
        s->big_parallel = threads && decode_threads();
    int rc = nd_kv_map_rows(s, n);
    if (rc)
        return rc;
    /* a full chunk writes the whole scratch (it is sized for one); a
     * shorter call only part of each buffer, so its pages fault in as
     * written: mapping them all would raise a session's peak (100 turns
     * of 12 words: 31.0 -> 32.5 MB at 2 bits) */
    if (n >= s->chunk)
        nd_kv_map_scratch(s);
    forward_job j = {s, tok, n, all_logits, serial, logits, ND_OK};
    /* On the CPU's quantised path (Needle 2 and 3), every parallel call of
     * the step (~3 per layer in a decode step, ~20 in a prompt chunk's,
     * ~30 with Needle 3's Hadamard products) goes to one crew of threads
     * that wait beside this one, instead of a fork/join each. */
    if (threads && !nd_serial() && (!serial || s->big_parallel) && s->qw && !s->be->device &&
        !s->cells_hook) {
        if (nd_wtime() >= s->crew_off_until) {
            if (nd_crew_run(0, forward_chunks, &j))
                s->crew_off_until = nd_wtime() + ND_CREW_BACKOFF_S;
        } else { /* cores busy: this thread alone for a while */
            s->big_parallel = 0;
            j.serial = 1;
            forward_chunks(&j);
        }
    } else {
        forward_chunks(&j);
    }
    if (!j.rc)
        nd_kv_note_call(s, n);
    return j.rc;
}
