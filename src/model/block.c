#include "model/block.h"

#include <stddef.h>

#include "core/status.h"

#include "model/hada3.h"

/* One layer's slices of the Needle 3 Hadamard MLP weights. */
static void hada3_slices(const san_model *m, const san_weights *w, int l, san_hada3_w *hw)
{
    const san_dims *D = &m->dims;
    size_t ba = (size_t)D->hada_ba, bb = (size_t)D->hada_bb, hn = (size_t)D->hada_n;
    int untied = m->cfg.hada_factor_mode == SAN_HADA_BLOCK_UNTIED;
    size_t fa = untied ? bb * ba * ba : ba * ba, fb = untied ? ba * bb * bb : bb * bb;
    hw->w1a = w->w1a + l * fa;
    hw->w2a = w->w2a + l * fa;
    hw->w3a = w->w3a + l * fa;
    hw->w1b = w->w1b + l * fb;
    hw->w2b = w->w2b + l * fb;
    hw->w3b = w->w3b + l * fb;
    hw->d1 = w->d1 + l * hn;
    hw->d2 = w->d2 + l * hn;
    hw->b2 = w->b2 + l * hn;
    hw->d3 = w->d3 + l * hn;
    hw->d4 = w->d4 + l * hn;
    hw->cond_v = w->cond_v + (size_t)l * D->d * SAN_HADA_COND_RANK;
    hw->cond_u = w->cond_u + (size_t)l * SAN_HADA_COND_RANK * hn;
}

void san_hada3_slices(const san_model *m, const san_weights *w, int l, void *hw)
{
    hada3_slices(m, w, l, hw);
}

void san_hada3_grad_slices(const san_model *m, san_weights *g, int l, void *hg)
{
    san_hada3_w s;
    hada3_slices(m, g, l, &s);
    san_hada3_grad *o = hg;
    /* the same offsets into the gradient buffer (which is writable) */
    o->w1a = (float *)s.w1a;
    o->w1b = (float *)s.w1b;
    o->w2a = (float *)s.w2a;
    o->w2b = (float *)s.w2b;
    o->w3a = (float *)s.w3a;
    o->w3b = (float *)s.w3b;
    o->d1 = (float *)s.d1;
    o->d2 = (float *)s.d2;
    o->b2 = (float *)s.b2;
    o->d3 = (float *)s.d3;
    o->d4 = (float *)s.d4;
    o->cond_v = (float *)s.cond_v;
    o->cond_u = (float *)s.cond_u;
}

/* 3.x's quant=True rounding of rows x rows of dim floats in place (kind
 * 0 the A8 activation rule, 1 the query rule, 2 the k/v rule); a no-op
 * in the float forward. The quantisers run on the host. */
static int fq(const san_block *b, int kind, float *x, long rows, int dim)
{
    if (!b->quant)
        return ND_OK;
    size_t bytes = sizeof(float) * (size_t)rows * (size_t)dim;
    float *h = nd_backend_map(b->be, x, bytes, 1); /* where the host reaches it */
    if (!h)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = kind == 0   ? nd_fq3_act(b->quant, h, h, rows, dim)
             : kind == 1 ? nd_fq3_query(b->quant, h, h, rows, dim)
                         : nd_fq3_kv(b->quant, h, h, rows, dim);
    nd_backend_unmap(b->be, x, h, bytes, 1);
    return rc;
}

/* Needle 3's layer: the v2 skeleton with separate q/k and v head dims,
 * the causal q/k/v conv (masked like the layer's attention), a sliding
 * window on local layers, cross-layer k/v sharing, the headwise or
 * elementwise gate and the Kronecker-factored Hadamard MLP. */
static int layer_forward3(const san_block *b, san_layer_acts *A, int l, int N, const float *X,
                          float *Xn)
{
    const san_model *m = b->m;
    const san_config *c = &m->cfg;
    const san_weights *w = b->w;
    const nd_backend *be = b->be;
    const san_dims *D = &m->dims;
    int d = D->d, n = D->n, nd = n * d, hd = D->hd, T = c->qkv_conv_taps;
    size_t Ld = (size_t)l * d;
    const nd_layout *Lay = b->attn->L;
    int window = san_layer_is_local(c, l) ? c->sliding_window : 0;

    be->rmsnorm(be, A->nx, A->nx_rstd, X, NULL, N, nd);
    int rc = fq(b, 0, A->nx, N, nd); /* mHC input before phi_* */
    if (rc)
        return rc;
    float *const phi_out[3] = {A->pre, A->post, A->res};
    if ((rc = b->wv->apply(b->wv, l, SAN_W_PHI, A->nx, N, phi_out)))
        return rc;
    be->hyper_coeffs(be, A->hpre, A->hpost, A->M, A->pre, A->post, A->res,
                     san_weight_host(b->m, &w->a_pre[l]), san_weight_host(b->m, &w->a_post[l]),
                     san_weight_host(b->m, &w->a_res[l]), w->b_pre + (size_t)l * n,
                     w->b_post + (size_t)l * n, w->b_res + (size_t)l * n * n, l % n, N, n);
    be->lanes_combine(be, A->u, A->hpre, X, N, n, d);
    const float *bx = A->u;
    for (int s = 0; s < c->n_sites; s++)
        if (c->engram_layers[s] == l) {
            be->engram_gate(be, A->bx, A->alpha + (size_t)s * N, A->u, b->eng_k[s], b->eng_v[s], N,
                            d, bx == A->bx);
            bx = A->bx;
        }

    be->rmsnorm(be, A->a, A->a_rstd, bx, w->norm_in + Ld, N, d);
    if ((rc = fq(b, 0, A->a, N, d))) /* attention input */
        return rc;
    float *const qkvg[4] = {A->q, A->k, A->v, A->g};
    if ((rc = b->wv->apply(b->wv, l, SAN_W_QKVG, A->a, N, qkvg)))
        return rc;
    if (T && b->attn->conv) { /* the source carries earlier rows */
        const san_attn_src *cs = b->attn;
        if ((rc = cs->conv(cs, l, 0, A->qc, A->q, w->q_taps + (size_t)l * T * D->q_dim, D->q_dim, T,
                           window)) ||
            (rc = cs->conv(cs, l, 1, A->kc, A->k, w->k_taps + (size_t)l * T * D->k_dim, D->k_dim, T,
                           window)) ||
            (rc = cs->conv(cs, l, 2, A->vc, A->v, w->v_taps + (size_t)l * T * D->v_dim, D->v_dim, T,
                           window)))
            return rc;
    } else if (T) {
        be->qkv_taps(be, A->qc, A->q, w->q_taps + (size_t)l * T * D->q_dim, Lay, D->q_dim, T,
                     window);
        be->qkv_taps(be, A->kc, A->k, w->k_taps + (size_t)l * T * D->k_dim, Lay, D->k_dim, T,
                     window);
        be->qkv_taps(be, A->vc, A->v, w->v_taps + (size_t)l * T * D->v_dim, Lay, D->v_dim, T,
                     window);
    }
    be->rmsnorm(be, A->qn, A->q_rstd, A->qc, w->q_norm + (size_t)l * hd, (long)N * D->H, hd);
    be->rmsnorm(be, A->kn, A->k_rstd, A->kc, w->k_norm + (size_t)l * hd, (long)N * D->G, hd);
    const san_attn_src *src = b->attn;
    be->rope(be, A->qn, src->rope_cos, src->rope_sin, src->L, D->H, hd);
    be->rope(be, A->kn, src->rope_cos, src->rope_sin, src->L, D->G, hd);
    /* q after q_norm + RoPE, k after k_norm + RoPE, v after its taps (a
     * CLA consumer reads its producer's, quantised there) */
    if ((rc = fq(b, 1, A->qn, (long)N * D->H, hd)) || (rc = fq(b, 2, A->kn, (long)N * D->G, hd)) ||
        (rc = fq(b, 2, A->vc, (long)N * (D->v_dim / D->v_hd), D->v_hd)))
        return rc;
    const float *ku = b->cla_k ? b->cla_k : A->kn, *vu = b->cla_v ? b->cla_v : A->vc;
    if ((rc = src->attend(src, l, A->qn, ku, vu, A->att, A->lse)))
        return rc;
    if (c->attention_gate == SAN_GATE_HEADWISE)
        be->gate_heads(be, A->o, A->att, A->g, N, D->H, D->v_hd);
    else
        be->gate_sigmoid(be, A->o, A->att, A->g, (long)N * D->o_dim);
    if ((rc = fq(b, 0, A->o, N, D->o_dim))) /* gated output before out_proj */
        return rc;
    float *const out[1] = {A->o2};
    if ((rc = b->wv->apply(b->wv, l, SAN_W_OUT, A->o, N, out)))
        return rc;
    be->rmsnorm(be, A->pn, A->pn_rstd, A->o2, w->post_norm + Ld, N, d);
    be->residual_scaled(be, A->x1, bx, A->pn, san_weight_host(b->m, &w->attn_gate[l]), (long)N * d);

    /* y = (x1 + HadamardMLP(z)) - u */
    be->rmsnorm(be, A->z, A->z_rstd, A->x1, w->pre_hada + Ld, N, d);
    san_hada3_w hw;
    hada3_slices(m, w, l, &hw);
    /* the MLP's output straight into y, then + x1 (the same bits as x1 +
     * MLP: one rounded addition either way), then - u */
    if ((rc = san_hada3_forward(be, b->hada3, &hw, A->z, N, A->y, A->hsaved)))
        return rc;
    long Nd = (long)N * d;
    be->add(be, A->y, A->x1, 1.0f, Nd);
    be->add(be, A->y, A->u, -1.0f, Nd);

    be->lanes_update(be, Xn, A->M, X, A->hpost, A->y, N, n, d);
    return ND_OK;
}

int san_layer_forward(const san_block *b, san_layer_acts *A, int l, int N, const float *X,
                      float *Xn)
{
    if (b->m->cfg.generation == 3)
        return layer_forward3(b, A, l, N, X, Xn);
    const san_model *m = b->m;
    const san_weights *w = b->w;
    const nd_backend *be = b->be;
    const san_dims *D = &m->dims;
    int d = D->d, n = D->n, nd = n * d, hd = D->hd, qd = D->q_dim;
    size_t Ld = (size_t)l * d;

    /* hyper-connections: mix lanes into the block input */
    be->rmsnorm(be, A->nx, A->nx_rstd, X, NULL, N, nd);
    float *const phi_out[3] = {A->pre, A->post, A->res};
    int rc = b->wv->apply(b->wv, l, SAN_W_PHI, A->nx, N, phi_out);
    if (rc)
        return rc;
    be->hyper_coeffs(be, A->hpre, A->hpost, A->M, A->pre, A->post, A->res,
                     san_weight_host(b->m, &w->a_pre[l]), san_weight_host(b->m, &w->a_post[l]),
                     san_weight_host(b->m, &w->a_res[l]), w->b_pre + (size_t)l * n,
                     w->b_post + (size_t)l * n, w->b_res + (size_t)l * n * n, l % n, N, n);
    be->lanes_combine(be, A->u, A->hpre, X, N, n, d);

    /* engram sites reading at this layer (upstream allows several) */
    const float *bx = A->u;
    for (int s = 0; s < m->cfg.n_sites; s++)
        if (m->cfg.engram_layers[s] == l) {
            be->engram_gate(be, A->bx, A->alpha + (size_t)s * N, A->u, b->eng_k[s], b->eng_v[s], N,
                            d, bx == A->bx);
            bx = A->bx;
        }

    /* attention */
    be->rmsnorm(be, A->a, A->a_rstd, bx, w->norm_in + Ld, N, d);
    float *const qkvg[4] = {A->q, A->k, A->v, A->g};
    if ((rc = b->wv->apply(b->wv, l, SAN_W_QKVG, A->a, N, qkvg)))
        return rc;
    be->rmsnorm(be, A->qn, A->q_rstd, A->q, w->q_norm + (size_t)l * hd, (long)N * D->H, hd);
    be->rmsnorm(be, A->kn, A->k_rstd, A->k, w->k_norm + (size_t)l * hd, (long)N * D->G, hd);
    const san_attn_src *src = b->attn;
    be->rope(be, A->qn, src->rope_cos, src->rope_sin, src->L, D->H, hd);
    be->rope(be, A->kn, src->rope_cos, src->rope_sin, src->L, D->G, hd);
    if ((rc = src->attend(src, l, A->qn, A->kn, A->v, A->att, A->lse)))
        return rc;
    be->gate_sigmoid(be, A->o, A->att, A->g, (long)N * qd);
    float *const out[1] = {A->o2};
    if ((rc = b->wv->apply(b->wv, l, SAN_W_OUT, A->o, N, out)))
        return rc;
    be->rmsnorm(be, A->pn, A->pn_rstd, A->o2, w->post_norm + Ld, N, d);
    be->residual_scaled(be, A->x1, bx, A->pn, san_weight_host(b->m, &w->attn_gate[l]), (long)N * d);

    /* Hadamard MLP; y = Block(bx) - u */
    be->rmsnorm(be, A->z, A->z_rstd, A->x1, w->pre_hada + Ld, N, d);
    size_t Lh = (size_t)l * D->hada_n;
    be->hadamard_mlp(be, A->y, A->h1, A->x1, A->z, A->u, w->d1 + Lh, w->d2 + Lh, w->d3 + Lh, N, d,
                     D->hada_n);

    be->lanes_update(be, Xn, A->M, X, A->hpost, A->y, N, n, d);
    return ND_OK;
}
