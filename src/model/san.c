#include "model/san.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

#include "model/hada3.h"

void san_rope_tables(float *cos_t, float *sin_t, int T, int hd, double theta)
{
    int half = hd / 2;
    /* float32 like upstream's precompute_rope_freqs */
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)hd);
        for (int t = 0; t < T; t++) {
            float ang = (float)t * freq;
            cos_t[(size_t)t * half + i] = (float)cos((double)ang);
            sin_t[(size_t)t * half + i] = (float)sin((double)ang);
        }
    }
}

int san_acts_create(san_acts *a, const nd_backend *be, const san_model *m, int B, int T,
                    int save_lanes, int keep_layers)
{
    memset(a, 0, sizeof *a);
    if (B <= 0 || T <= 0)
        return nd_error(ND_EARG, "batch %d x seq %d is empty", B, T);
    int rc = san_acts_create_rows(a, be, m, (long)B * T, B, T, (long)B * T, save_lanes,
                                  keep_layers ? m->dims.L : 0);
    if (rc)
        return rc;
    nd_layout_dense(&a->lay, B, T);
    return san_acts_use_layout(a);
}

int san_acts_use_layout(san_acts *a)
{
    const nd_layout *L = &a->lay.L;
    if (L->N > a->cap_rows || nd_layout_max_pos(L) > a->max_pos)
        return nd_error(ND_EARG,
                        "batch layout of %ld rows (positions < %d) exceeds the %ld rows "
                        "and %d positions sized",
                        L->N, nd_layout_max_pos(L), a->cap_rows, a->max_pos);
    a->N = L->N;
    return ND_OK;
}

/* One activation buffer of san_acts_create_rows' single block: where its
 * pointer lives, how many elements of what size. */
typedef struct {
    void **p;
    size_t count;
    size_t elt;
} act_plan;

typedef struct {
    act_plan e[80 + 2 * SAN_MAX_CLA];
    int n;
} act_plans;

/* a layer field: its pointer lives inside a->l (one copy per layer set) */
static int act_is_layer(const san_acts *a, const act_plan *e)
{
    const char *lo = (const char *)&a->l, *hi = lo + sizeof a->l;
    return (const char *)e->p >= lo && (const char *)e->p < hi;
}

/* bytes of one buffer in the block (copies of it for a layer field),
 * rounded to 64 */
static size_t act_bytes(const san_acts *a, const act_plan *e, size_t copies)
{
    return (e->count * e->elt * (act_is_layer(a, e) ? copies : 1) + 63) & ~(size_t)63;
}

/* The buffers the model's forward and backward use for N rows: the
 * model-wide ones, one san_layer_acts set (the Needle 3 and conv-tap
 * fields only when the model has them), the logits rows and the saved
 * lanes (every `*every`-th layer when save_lanes > 1). */
static void acts_plan_buffers(act_plans *pl, san_acts *a, const san_model *m, long N, int max_pos,
                              long cap_logits, size_t hsaved_row, int save_lanes, int *every_out)
{
    const san_dims *D = &m->dims;
    size_t d = D->d, n = D->n, hn = D->hada_n;
    int gen3 = m->cfg.generation == 3, taps = gen3 && m->cfg.qkv_conv_taps;
    pl->n = 0;
#define P(ptr, cnt) pl->e[pl->n++] = (act_plan){(void **)&(ptr), (size_t)(cnt), sizeof(*(ptr))}
    P(a->rope_cos, (size_t)max_pos * D->hd / 2);
    P(a->rope_sin, (size_t)max_pos * D->hd / 2);
    P(a->x0, N * d);
    P(a->X, N * n * d);
    P(a->Xn, N * n * d);
    if (m->cfg.n_sites) {
        P(a->eng_idx, N * D->eng_tables);
        P(a->eng_e, N * D->eng_dim);
        P(a->eng_vp, N * d);
        for (int s = 0; s < m->cfg.n_sites; s++) {
            P(a->eng_k[s], N * d);
            P(a->eng_v[s], N * d);
        }
    }
    san_layer_acts *l = &a->l;
    P(l->nx, N * n * d);
    P(l->nx_rstd, N);
    P(l->pre, N * n);
    P(l->post, N * n);
    P(l->res, N * n * n);
    P(a->phi_cat, n * d * (2 * n + n * n));
    P(a->proj, N * (2 * n + n * n));
    P(l->hpre, N * n);
    P(l->hpost, N * n);
    P(l->M, N * n * n);
    P(l->u, N * d);
    P(l->alpha, N * (m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(l->bx, N * d);
    P(l->a, N * d);
    P(l->a_rstd, N);
    P(l->q, N * D->q_dim);
    P(l->k, N * D->k_dim);
    P(l->v, N * D->v_dim);
    P(l->g, N * D->gate_dim);
    P(l->qn, N * D->q_dim);
    P(l->kn, N * D->k_dim);
    P(l->q_rstd, N * D->H);
    P(l->k_rstd, N * D->G);
    P(l->att, N * D->o_dim);
    P(l->lse, N * D->H);
    P(l->o, N * D->o_dim);
    if (taps) {
        P(l->qc, N * D->q_dim);
        P(l->kc, N * D->k_dim);
        P(l->vc, N * D->v_dim);
    }
    if (gen3) { /* the MLP writes into y */
        P(l->hsaved, N * hsaved_row);
        for (int i = 0; i < m->cfg.n_cla; i++) {
            P(a->cla_k[i], N * D->k_dim);
            P(a->cla_v[i], N * D->v_dim);
        }
    }
    P(l->o2, N * d);
    P(l->pn, N * d);
    P(l->pn_rstd, N);
    P(l->x1, N * d);
    P(l->z, N * d);
    P(l->z_rstd, N);
    if (!gen3)
        P(l->h1, N * hn);
    P(l->y, N * d);
    P(a->xm, N * d);
    P(a->hf, N * d);
    P(a->hf_rstd, N);
    P(a->logits, (size_t)cap_logits * D->V);
    P(a->hsel, (size_t)cap_logits * d);
    int every = save_lanes > 1 ? (save_lanes < D->L ? save_lanes : D->L) : 1;
    if (every < 1)
        every = 1;
    if (save_lanes)
        P(a->X_saved, (size_t)san_lane_slots(D->L, every) * N * n * d);
#undef P
    *every_out = every;
}

/* Point every planned buffer into blk, in plan order; with keep_layers,
 * nsets copies of the layer fields, one san_layer_acts per set. */
static int acts_carve(san_acts *a, const act_plans *pl, char *blk, size_t copies, int keep_layers,
                      int nsets)
{
    size_t off = 0;
    for (int i = 0; i < pl->n; i++) {
        *pl->e[i].p = blk + off;
        off += act_bytes(a, &pl->e[i], copies);
    }
    if (!keep_layers)
        return ND_OK;
    a->layer_sets = malloc(sizeof *a->layer_sets * (size_t)nsets);
    if (!a->layer_sets)
        return ND_ENOMEM;
    const char *lo = (const char *)&a->l;
    for (int l = 0; l < nsets; l++) {
        a->layer_sets[l] = a->l;
        for (int i = 0; i < pl->n; i++)
            if (act_is_layer(a, &pl->e[i])) {
                size_t fo = (size_t)((const char *)pl->e[i].p - lo);
                float **dst = (float **)((char *)&a->layer_sets[l] + fo);
                *dst = *(float **)pl->e[i].p + (size_t)l * pl->e[i].count;
            }
    }
    return ND_OK;
}

int san_acts_create_rows(san_acts *a, const nd_backend *be, const san_model *m, long cap_rows,
                         int cap_seg, int max_pos, long cap_logits, int save_lanes, int keep_layers)
{
    memset(a, 0, sizeof *a);
    const san_dims *D = &m->dims;
    if (cap_rows <= 0 || max_pos <= 0 || cap_seg <= 0)
        return nd_error(ND_EARG, "activations for %ld rows, %d positions: empty", cap_rows,
                        max_pos);
    if (cap_logits < 1)
        cap_logits = 1;
    int B = cap_seg, T = max_pos; /* for messages */
    long N = cap_rows;
    int gen3 = m->cfg.generation == 3, taps = gen3 && m->cfg.qkv_conv_taps;
    size_t hsaved_row = 0;
    san_hada3_geom *h3 = NULL;
    if (gen3) {
        h3 = calloc(1, sizeof *h3);
        if (!h3 || san_hada3_geom_init(h3, D->d, m->cfg.hada_factor_mode == SAN_HADA_BLOCK_UNTIED,
                                       m->cfg.n_ladder_widths > 0)) {
            free(h3);
            return nd_error(ND_ENOMEM, "out of memory (Hadamard MLP geometry)");
        }
        /* every layer's forward and backward runs the MLP: its scratch is
         * kept from call to call (not allocated and zeroed each time) */
        if (san_hada3_keep_scratch(h3, be)) {
            san_hada3_geom_free(h3);
            free(h3);
            return nd_error(ND_ENOMEM, "out of memory (Hadamard MLP geometry)");
        }
        hsaved_row = san_hada3_saved_per_row(h3);
    }
    /* keep_layers = k: every san_layer_acts field is allocated for layers
     * 0..k-1, plus one scratch set when the others are recomputed */
    if (keep_layers < 0)
        keep_layers = 0;
    if (keep_layers > D->L)
        keep_layers = D->L;
    int nsets = keep_layers == D->L ? D->L : keep_layers + 1;
    size_t copies = (size_t)nsets;
    act_plans pl;
    int every;
    acts_plan_buffers(&pl, a, m, N, max_pos, cap_logits, hsaved_row, save_lanes, &every);
    size_t total = 0;
    for (int i = 0; i < pl.n; i++)
        total += act_bytes(a, &pl.e[i], copies);
    char *blk = be->alloc(be, total);
    if (!blk && h3) {
        san_hada3_geom_free(h3);
        free(h3);
        h3 = NULL;
    }
    a->hada3 = h3;
    if (!blk)
        return nd_error(ND_ENOMEM,
                        "out of memory: activations for %ld rows (%d sequences, positions < %d) "
                        "need %.1f MB",
                        N, B, T, (double)total / 1e6);
    if (acts_carve(a, &pl, blk, copies, keep_layers, nsets)) {
        a->block = blk;
        a->be = be;
        san_acts_free(a);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    if (gen3 && !taps) { /* no conv: its outputs are q, k, v themselves */
        a->l.qc = a->l.q, a->l.kc = a->l.k, a->l.vc = a->l.v;
        for (int l = 0; keep_layers && l < nsets; l++) {
            san_layer_acts *s = &a->layer_sets[l];
            s->qc = s->q, s->kc = s->k, s->vc = s->v;
        }
    }
    a->n_kept = keep_layers;
    a->lane_every = every;
    a->n_lane_cp = (D->L + every - 1) / every;
    if (keep_layers && keep_layers < D->L)
        a->l = a->layer_sets[keep_layers]; /* the scratch set */
    a->l_scratch = a->l;
    a->bytes = total;
    a->block = blk;
    a->be = be;
    a->cap_rows = N;
    a->cap_logits = cap_logits;
    a->max_pos = max_pos;
    if (nd_layout_buf_init(&a->lay, N, cap_seg)) {
        san_acts_free(a);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    /* the tables on the host, then into the backend's memory (in place
     * where the host reaches it) */
    size_t rb = sizeof(float) * (size_t)max_pos * (size_t)(D->hd / 2);
    float *rc_h = nd_backend_map(be, a->rope_cos, rb, 0);
    float *rs_h = rc_h ? nd_backend_map(be, a->rope_sin, rb, 0) : NULL;
    if (!rs_h) {
        nd_backend_unmap(be, a->rope_cos, rc_h, rb, 0);
        san_acts_free(a);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    san_rope_tables(rc_h, rs_h, max_pos, D->hd, m->cfg.rope_theta);
    nd_backend_unmap(be, a->rope_cos, rc_h, rb, 1);
    nd_backend_unmap(be, a->rope_sin, rs_h, rb, 1);
    return ND_OK;
}

int san_lane_slots(int L, int every)
{
    if (every <= 1 || L <= 1)
        return L > 0 ? L : 1;
    if (every > L)
        every = L;
    return (L + every - 1) / every + every - 1;
}

size_t san_layer_acts_bytes(const san_model *m, long rows)
{
    const san_dims *D = &m->dims;
    size_t N = (size_t)rows, d = D->d, n = D->n, s = m->cfg.n_sites ? m->cfg.n_sites : 1;
    size_t per_row = n * d + 1 + 2 * (2 * n + n * n) + 2 * d + s + 3 * d + 2 + 3 * D->q_dim +
                     2 * D->kv_dim + D->q_dim + D->kv_dim + D->H + D->G + D->q_dim + D->H +
                     D->q_dim + 3 * d + 1 + d + d + 1 + D->hada_n + d;
    if (m->cfg.generation == 3) { /* o_dim-sized att/o, conv outputs, the MLP's saves */
        long delta = 2L * (D->o_dim - D->q_dim) + (D->v_dim - D->kv_dim) +
                     (D->gate_dim - D->q_dim) - D->hada_n +
                     (m->cfg.qkv_conv_taps ? D->q_dim + D->k_dim + D->v_dim : 0) + 8 +
                     2L * D->hada_n;
        per_row = (size_t)((long)per_row + delta);
    }
    return N * per_row * sizeof(float);
}

void san_acts_free(san_acts *a)
{
    if (a) {
        free(a->layer_sets);
        nd_layout_buf_free(&a->lay);
        if (a->hada3) {
            san_hada3_geom_free(a->hada3);
            free(a->hada3);
        }
    }
    if (a && a->block)
        a->be->free(a->be, a->block);
    if (a)
        memset(a, 0, sizeof *a);
}

/* 3.x's quant=True rounding of rows x dim floats in place (A8 rule) */
static int quant_act(const san_model *m, san_acts *a, float *x, long rows, int dim)
{
    if (!a->quant || m->cfg.generation != 3)
        return ND_OK;
    size_t bytes = sizeof(float) * (size_t)rows * (size_t)dim;
    float *h = nd_backend_map(a->be, x, bytes, 1); /* the quantiser runs on the host */
    if (!h)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = nd_fq3_act(a->quant, h, h, rows, dim);
    nd_backend_unmap(a->be, x, h, bytes, 1);
    return rc;
}

int san_engram_quant(const san_model *m, san_acts *a)
{
    return quant_act(m, a, a->eng_e, a->N, m->dims.eng_dim);
}

void san_engram_forward(const san_model *m, const san_weights *w, san_acts *a,
                        const int32_t *tokens)
{
    const nd_backend *be = a->be;
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    if (!c->n_sites)
        return;
    const nd_layout *L = &a->lay.L;
    if (c->engram_seed_heads) /* 3.x: the hash's seed stride */
        be->engram_hash_seeded(be, a->eng_idx, tokens, L, c->engram_orders, c->n_orders,
                               D->eng_heads, c->engram_slots, c->engram_seed_heads);
    else
        be->engram_hash(be, a->eng_idx, tokens, L, c->engram_orders, c->n_orders, D->eng_heads,
                        c->engram_slots);
    for (int s = 0; s < c->n_sites; s++) {
        be->engram_gather(be, a->eng_e, w->eng[s].table, a->eng_idx, L, c->engram_orders,
                          c->n_orders, D->eng_heads, c->engram_slots, D->eng_sub);
        san_engram_quant(m, a); /* rows and widths checked by the config: cannot fail */
        be->matmul(be, 0, 0, (int)a->N, D->d, D->eng_dim, 1.0f, a->eng_e, D->eng_dim, w->eng[s].wk,
                   D->d, 0.0f, a->eng_k[s], D->d);
        be->matmul(be, 0, 0, (int)a->N, D->d, D->eng_dim, 1.0f, a->eng_e, D->eng_dim, w->eng[s].wv,
                   D->d, 0.0f, a->eng_vp, D->d);
        be->engram_taps(be, a->eng_v[s], a->eng_vp, w->eng[s].taps, L, D->d, D->eng_dilation);
    }
}

/* The trainer's weights view: float kernels (LoRA already merged into w)
 * through the backend's matmul. */
typedef struct {
    san_wview base;
    const san_model *m;
    const san_weights *w;
    san_acts *a; /* phi_cat, proj scratch */
} batch_wview;

static int batch_apply(const san_wview *v, int l, san_wgroup grp, const float *x, int N,
                       float *const *y)
{
    const batch_wview *bv = (const batch_wview *)v;
    const san_weights *w = bv->w;
    const san_dims *D = &bv->m->dims;
    const nd_backend *be = bv->a->be;
    int d = D->d, n = D->n, nd = n * d, qd = D->q_dim, kd = D->k_dim, vd = D->v_dim;
    int gd = D->gate_dim, od = D->o_dim;
    switch (grp) {
    case SAN_W_PHI: {
        /* the three projections of nx as one GEMM against [phi_pre|phi_post|phi_res] */
        san_acts *a = bv->a;
        int K = 2 * n + n * n;
        be->copy2d(be, a->phi_cat, K, w->phi_pre + (size_t)l * nd * n, n, nd, n);
        be->copy2d(be, a->phi_cat + n, K, w->phi_post + (size_t)l * nd * n, n, nd, n);
        be->copy2d(be, a->phi_cat + 2 * n, K, w->phi_res + (size_t)l * nd * n * n, n * n, nd,
                   n * n);
        be->matmul(be, 0, 0, N, K, nd, 1.0f, x, nd, a->phi_cat, K, 0.0f, a->proj, K);
        be->copy2d(be, y[0], n, a->proj, K, N, n);
        be->copy2d(be, y[1], n, a->proj + n, K, N, n);
        be->copy2d(be, y[2], n * n, a->proj + 2 * n, K, N, n * n);
        return ND_OK;
    }
    case SAN_W_QKVG:
        be->matmul(be, 0, 0, N, qd, d, 1.0f, x, d, w->wq + (size_t)l * d * qd, qd, 0.0f, y[0], qd);
        be->matmul(be, 0, 0, N, kd, d, 1.0f, x, d, w->wk + (size_t)l * d * kd, kd, 0.0f, y[1], kd);
        be->matmul(be, 0, 0, N, vd, d, 1.0f, x, d, w->wv + (size_t)l * d * vd, vd, 0.0f, y[2], vd);
        be->matmul(be, 0, 0, N, gd, d, 1.0f, x, d, w->wgate + (size_t)l * d * gd, gd, 0.0f, y[3],
                   gd);
        return ND_OK;
    case SAN_W_OUT:
        be->matmul(be, 0, 0, N, d, od, 1.0f, x, od, w->wout + (size_t)l * od * d, d, 0.0f, y[0], d);
        return ND_OK;
    }
    return nd_error(ND_EARG, "unknown weight group %d", (int)grp);
}

/* The trainer's attention source: full causal attention over the layout. */
typedef struct {
    san_attn_src base;
    const nd_backend *be;
    const san_model *m;
} batch_attn;

static int batch_attend(const san_attn_src *src, int l, const float *q, const float *k,
                        const float *v, float *att, float *lse)
{
    const batch_attn *ba = (const batch_attn *)src;
    const san_config *c = &ba->m->cfg;
    const san_dims *D = &ba->m->dims;
    if (c->generation == 3) /* separate head dims; local layers see a window */
        ba->be->attention_ext(ba->be, att, lse, q, k, v, src->L, D->H, D->G, D->hd, D->v_hd,
                              san_layer_is_local(c, l) ? c->sliding_window : 0);
    else
        ba->be->attention(ba->be, att, lse, q, k, v, src->L, D->H, D->G, D->hd);
    return ND_OK;
}

int san_layer_forward_batch(const san_model *m, const san_weights *w, san_acts *a, int l,
                            const float *X, float *Xn)
{
    batch_wview wv = {{batch_apply}, m, w, a};
    batch_attn at = {{&a->lay.L, a->rope_cos, a->rope_sin, batch_attend, NULL}, a->be, m};
    san_block b = {m, w, a->be, &wv.base, &at.base, {0}, {0}, a->hada3, NULL, NULL, NULL};
    if (m->cfg.generation == 3)
        b.quant = a->quant;
    for (int s = 0; s < m->cfg.n_sites; s++) {
        b.eng_k[s] = a->eng_k[s];
        b.eng_v[s] = a->eng_v[s];
    }
    const san_config *c = &m->cfg;
    for (int i = 0; i < c->n_cla; i++)
        if (c->cla_pairs[i][1] == l) { /* a consumer reads its producer's k, v */
            b.cla_k = a->cla_k[i];
            b.cla_v = a->cla_v[i];
        }
    int rc = san_layer_forward(&b, &a->l, l, (int)a->N, X, Xn);
    if (rc)
        return rc;
    long N = a->N;
    for (int i = 0; i < c->n_cla; i++)
        if (c->cla_pairs[i][0] == l) { /* a producer hands over its k, v */
            a->be->copy2d(a->be, a->cla_k[i], m->dims.k_dim, a->l.kn, m->dims.k_dim, N,
                          m->dims.k_dim);
            a->be->copy2d(a->be, a->cla_v[i], m->dims.v_dim, a->l.vc, m->dims.v_dim, N,
                          m->dims.v_dim);
        }
    return ND_OK;
}

int san_forward_hidden(const san_model *m, const san_weights *w, san_acts *a, const int32_t *tokens)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    long N = a->N;
    int d = D->d, n = D->n;
    for (long i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= D->V)
            return nd_error(ND_EARG,
                            "token id %d at position %ld is outside the vocabulary [0, %d)",
                            tokens[i], i, D->V);
    be->embed(be, a->x0, w->emb, tokens, N, d, (float)sqrt((double)d));
    san_engram_forward(m, w, a, tokens);
    size_t lane_sz = (size_t)N * n * d;
    int every = a->lane_every > 1 ? a->lane_every : 1;
    /* The lane state entering layer l goes straight into its checkpoint
     * slot when the backward keeps it (l % every == 0; the final state is
     * never kept): the layer before writes there, so no copy. The others
     * alternate between X and Xn. */
    float *X = a->X, *Xn = a->Xn, *cur = a->X_saved ? a->X_saved : X;
    be->lanes_broadcast(be, cur, a->x0, N, n, d);
    for (int l = 0; l < D->L; l++) {
        int cp = a->X_saved && l + 1 < D->L && (l + 1) % every == 0;
        float *out = cp ? a->X_saved + (size_t)((l + 1) / every) * lane_sz : cur == X ? Xn : X;
        a->l = l < a->n_kept ? a->layer_sets[l] : a->l_scratch;
        int rc = san_layer_forward_batch(m, w, a, l, cur, out);
        if (rc)
            return rc;
        cur = out;
    }
    if (cur != X && cur != Xn) { /* no layers: the state is still slot 0 */
        be->copy2d(be, X, (int)lane_sz, cur, (int)lane_sz, 1, (int)lane_sz);
        cur = X;
    }
    a->X = cur; /* the final lane state */
    a->Xn = cur == X ? Xn : X;
    be->lanes_mean(be, a->xm, a->X, N, n, d);
    be->rmsnorm(be, a->hf, a->hf_rstd, a->xm, w->final_norm, N, d);
    return quant_act(m, a, a->hf, N, d); /* the final hidden before the head */
}

int san_forward(const san_model *m, const san_weights *w, san_acts *a, const int32_t *tokens)
{
    const san_dims *D = &m->dims;
    if (a->N > a->cap_logits)
        return nd_error(ND_EARG, "logits of %ld rows asked, %ld sized", a->N, a->cap_logits);
    int rc = san_forward_hidden(m, w, a, tokens);
    if (rc)
        return rc;
    /* logits over the first V_out embedding rows (3.x out_vocab; else all) */
    a->be->matmul(a->be, 0, 1, (int)a->N, D->V_out, D->d, 1.0f, a->hf, D->d, w->emb, D->d, 0.0f,
                  a->logits, D->V_out);
    return ND_OK;
}

int san_logits_rows(const san_model *m, const san_weights *w, san_acts *a, const int32_t *rows,
                    long n)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    if (n > a->cap_logits)
        return nd_error(ND_EARG, "logits of %ld rows asked, %ld sized", n, a->cap_logits);
    for (long i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= a->N)
            return nd_error(ND_EARG, "logit row %d outside the batch's %ld rows", rows[i], a->N);
    if (n == 0)
        return ND_OK;
    be->gather_rows(be, a->hsel, a->hf, rows, n, D->d);
    be->matmul(be, 0, 1, (int)n, D->V_out, D->d, 1.0f, a->hsel, D->d, w->emb, D->d, 0.0f, a->logits,
               D->V_out);
    return ND_OK;
}

int san_logits_range(const san_model *m, const san_weights *w, san_acts *a, long r0, long n)
{
    const san_dims *D = &m->dims;
    if (n > a->cap_logits || r0 < 0 || n < 0 || r0 + n > a->N)
        return nd_error(ND_EARG, "logits of rows [%ld, %ld) asked: %ld rows, %ld sized", r0, r0 + n,
                        a->N, a->cap_logits);
    if (n == 0)
        return ND_OK;
    a->be->matmul(a->be, 0, 1, (int)n, D->V_out, D->d, 1.0f, a->hf + (size_t)r0 * D->d, D->d,
                  w->emb, D->d, 0.0f, a->logits, D->V_out);
    return ND_OK;
}
