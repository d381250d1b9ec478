#include "model/san_backward.h"

#include <math.h>
#include <string.h>

#include "core/status.h"

#include "model/hada3.h"

int san_grad_acts_create(san_grad_acts *g, const nd_backend *be, const san_model *m, long rows,
                         long logit_rows, int lora_rank)
{
    memset(g, 0, sizeof *g);
    const san_dims *D = &m->dims;
    size_t N = (size_t)rows, d = D->d, n = D->n;
    struct grad_plan {
        float **p;
        size_t count;
    } plan[64 + 2 * SAN_MAX_CLA];
    int np = 0;
#define P(ptr, cnt) plan[np++] = (struct grad_plan){&(ptr), (size_t)(cnt)}
    P(g->dX, N * n * d);
    P(g->dXn, N * n * d);
    P(g->dhf, N * d);
    P(g->dhsel, (size_t)(logit_rows > 0 ? logit_rows : 1) * d);
    P(g->dxm, N * d);
    P(g->dy, N * d);
    P(g->dx1, N * d);
    P(g->dz, N * d);
    P(g->dpn, N * d);
    P(g->dbx, N * d);
    P(g->do2, N * d);
    P(g->du, N * d);
    P(g->da, N * d);
    P(g->do_, N * D->o_dim);
    P(g->datt, N * D->o_dim);
    P(g->dg, N * D->gate_dim);
    P(g->dqn, N * D->q_dim);
    P(g->dq, N * D->q_dim);
    P(g->dkn, N * D->k_dim);
    P(g->dk, N * D->k_dim);
    P(g->dv, N * D->v_dim);
    if (m->cfg.generation == 3) {
        P(g->dqc, N * D->q_dim);
        P(g->dkc, N * D->k_dim);
        P(g->dvc, N * D->v_dim);
        for (int i = 0; i < m->cfg.n_cla; i++) {
            P(g->cla_dk[i], N * D->k_dim);
            P(g->cla_dv[i], N * D->v_dim);
        }
    }
    P(g->dhpre, N * n);
    P(g->dhpost, N * n);
    P(g->dM, N * n * n);
    P(g->dpre, N * n);
    P(g->dpost, N * n);
    P(g->dres, N * n * n);
    P(g->dnx, N * n * d);
    P(g->dnx_tmp, n * d * n * n);
    for (int s = 0; s < m->cfg.n_sites; s++) {
        P(g->deng_k[s], N * d);
        P(g->deng_v[s], N * d);
    }
    if (m->cfg.n_sites) {
        P(g->deng_vp, N * d);
        P(g->deng_e, N * D->eng_dim);
    }
    /* single projection: [N, rank]; the four sharing an input
     * (lora_grads_shared_input): two [N, 4 rank] + two [d, 4 rank] */
    if (lora_rank > 0)
        P(g->lora_tmp, (2 * N + 2 * (size_t)d) * 4 * (size_t)lora_rank);
#undef P
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += (plan[i].count * sizeof(float) + 63) & ~(size_t)63;
    char *blk = be->alloc(be, total);
    if (!blk)
        return nd_error(ND_ENOMEM, "out of memory: gradient buffers need %.1f MB",
                        (double)total / 1e6);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        *plan[i].p = (float *)(blk + off);
        off += (plan[i].count * sizeof(float) + 63) & ~(size_t)63;
    }
    g->block = blk;
    g->be = be;
    return ND_OK;
}

void san_grad_acts_free(san_grad_acts *g)
{
    if (g && g->block)
        g->be->free(g->be, g->block);
    if (g)
        memset(g, 0, sizeof *g);
}

/* Gradients of y = x @ W_l (W_l = W + s*A@B) with respect to the weight:
 * full dW and/or the adapter's A, B. */
static void linear_param_grads(const nd_backend *be, const san_grad_target *tgt, san_grad_acts *g,
                               int target, float *dW_full, int l, int N, int in, int out,
                               const float *x, const float *dy)
{
    if (dW_full)
        be->matmul(be, 1, 0, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW_full + (size_t)l * in * out,
                   out);
    const san_lora *lo = tgt->lora;
    if (!lo || !lo->t[target].present)
        return;
    int r = lo->rank;
    float s = lo->scale;
    const float *A = tgt->lora_w + lo->t[target].a_off + (size_t)l * in * r;
    const float *B = tgt->lora_w + lo->t[target].b_off + (size_t)l * r * out;
    float *dA = tgt->lora_g + lo->t[target].a_off + (size_t)l * in * r;
    float *dB = tgt->lora_g + lo->t[target].b_off + (size_t)l * r * out;
    be->matmul(be, 0, 0, N, r, in, 1.0f, x, in, A, r, 0.0f, g->lora_tmp, r);
    be->matmul(be, 1, 0, r, out, N, s, g->lora_tmp, r, dy, out, 1.0f, dB, out);
    be->matmul(be, 0, 1, N, r, out, 1.0f, dy, out, B, out, 0.0f, g->lora_tmp, r);
    be->matmul(be, 1, 0, in, r, N, s, x, in, g->lora_tmp, r, 1.0f, dA, r);
}

/* LoRA gradients of the four projections that read the same input x
 * (q, k, v, gate). Rank-r GEMMs are thin (N x 16) and run far below GEMM
 * speed, so the two that involve x are done once for all four adapters
 * side by side: x @ [A_q|A_k|A_v|A_g] and x^T @ [U_q|U_k|U_v|U_g]. */
static void lora_grads_shared_input(const nd_backend *be, const san_grad_target *tgt,
                                    san_grad_acts *g, const int targets[4],
                                    const float *const dys[4], const int outs[4], int l, int N,
                                    int in, const float *x)
{
    const san_lora *lo = tgt->lora;
    if (!lo)
        return;
    int r = lo->rank, k = 0, tj[4], oj[4];
    const float *dyj[4];
    for (int j = 0; j < 4; j++)
        if (lo->t[targets[j]].present) {
            tj[k] = targets[j];
            oj[k] = outs[j];
            dyj[k++] = dys[j];
        }
    if (!k)
        return;
    int R = k * r;
    float s = lo->scale;
    float *T = g->lora_tmp, *U = T + (size_t)N * R, *Acat = U + (size_t)N * R,
          *dAcat = Acat + (size_t)in * R;
    for (int j = 0; j < k; j++) {
        const float *A = tgt->lora_w + lo->t[tj[j]].a_off + (size_t)l * in * r;
        be->copy2d(be, Acat + (size_t)j * r, R, A, r, in, r);
    }
    be->matmul(be, 0, 0, N, R, in, 1.0f, x, in, Acat, R, 0.0f, T, R);
    for (int j = 0; j < k; j++) {
        const float *B = tgt->lora_w + lo->t[tj[j]].b_off + (size_t)l * r * oj[j];
        float *dB = tgt->lora_g + lo->t[tj[j]].b_off + (size_t)l * r * oj[j];
        be->matmul(be, 1, 0, r, oj[j], N, s, T + (size_t)j * r, R, dyj[j], oj[j], 1.0f, dB, oj[j]);
        be->matmul(be, 0, 1, N, r, oj[j], 1.0f, dyj[j], oj[j], B, oj[j], 0.0f, U + (size_t)j * r,
                   R);
    }
    /* dA_j += s x^T U_j, as one GEMM over the gathered dA blocks */
    for (int j = 0; j < k; j++)
        be->copy2d(be, dAcat + (size_t)j * r, R,
                   tgt->lora_g + lo->t[tj[j]].a_off + (size_t)l * in * r, r, in, r);
    be->matmul(be, 1, 0, in, R, N, s, x, in, U, R, 1.0f, dAcat, R);
    for (int j = 0; j < k; j++)
        be->copy2d(be, tgt->lora_g + lo->t[tj[j]].a_off + (size_t)l * in * r, r,
                   dAcat + (size_t)j * r, R, in, r);
}

#define GP(field, off) (F ? F->field + (off) : NULL)

/* dbx takes dx1's values by trading the two buffers (instead of a copy) */
static void swap_dx1_dbx(san_grad_acts *g)
{
    float *t = g->dbx;
    g->dbx = g->dx1;
    g->dx1 = t;
}

/* The part of a layer's backward that Needle 2 and 3 share: from dbx (the
 * block input's gradient, in g->dbx) and dy through the engram gates and
 * the hyper-connections to dX. */
static void layer_backward_tail(const san_model *m, const san_weights *w, san_acts *a,
                                san_grad_acts *g, const san_grad_target *tgt, int l, const float *X)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    san_layer_acts *A = &a->l;
    san_weights *F = tgt->full;
    int N = (int)a->N, d = D->d, n = D->n, nd = n * d;
    long Nd = (long)N * d;
    const float *phi_pre_l = w->phi_pre + (size_t)l * nd * n;
    const float *phi_post_l = w->phi_post + (size_t)l * nd * n;
    const float *phi_res_l = w->phi_res + (size_t)l * nd * n * n;

    /* bx = u + sum_s alpha_s v_s; y's "- u" term */
    be->copy2d(be, g->du, (int)Nd, g->dbx, (int)Nd, 1, (int)Nd);
    be->add(be, g->du, g->dy, -1.0f, Nd);
    for (int s = 0; s < m->cfg.n_sites; s++)
        if (m->cfg.engram_layers[s] == l)
            be->engram_gate_backward(be, g->du, g->deng_k[s], g->deng_v[s], g->dbx, A->u,
                                     a->eng_k[s], a->eng_v[s], A->alpha + (size_t)s * N, N, d);

    /* u = sum_i hpre_i X_i; hyper-connection coefficients from nx */
    be->lanes_combine_backward(be, g->dhpre, g->dX, g->du, A->hpre, X, N, n, d);
    be->hyper_coeffs_backward(be, g->dpre, g->dpost, g->dres, GP(a_pre, l), GP(a_post, l),
                              GP(a_res, l), GP(b_pre, (size_t)l * n), GP(b_post, (size_t)l * n),
                              GP(b_res, (size_t)l * n * n), g->dhpre, g->dhpost, g->dM, A->pre,
                              A->post, A->res, A->hpre, A->hpost, san_weight_host(m, &w->a_pre[l]),
                              san_weight_host(m, &w->a_post[l]), san_weight_host(m, &w->a_res[l]),
                              w->b_res + (size_t)l * n * n, N, n);
    /* dnx through the fused projection [phi_pre|phi_post|phi_res] */
    int K = 2 * n + n * n;
    be->copy2d(be, a->phi_cat, K, phi_pre_l, n, nd, n);
    be->copy2d(be, a->phi_cat + n, K, phi_post_l, n, nd, n);
    be->copy2d(be, a->phi_cat + 2 * n, K, phi_res_l, n * n, nd, n * n);
    be->copy2d(be, a->proj, K, g->dpre, n, N, n);
    be->copy2d(be, a->proj + n, K, g->dpost, n, N, n);
    be->copy2d(be, a->proj + 2 * n, K, g->dres, n * n, N, n * n);
    be->matmul(be, 0, 1, N, nd, K, 1.0f, a->proj, K, a->phi_cat, K, 0.0f, g->dnx, nd);
    if (F) {
        /* dphi_cat = nx^T dproj, then scatter into the three tensors */
        be->matmul(be, 1, 0, nd, K, N, 1.0f, A->nx, nd, a->proj, K, 0.0f, a->phi_cat, K);
        float *gp = F->phi_pre + (size_t)l * nd * n, *gq = F->phi_post + (size_t)l * nd * n;
        float *gr = F->phi_res + (size_t)l * nd * n * n;
        be->copy2d(be, g->dnx_tmp, n, a->phi_cat, K, nd, n);
        be->add(be, gp, g->dnx_tmp, 1.0f, (long)nd * n);
        be->copy2d(be, g->dnx_tmp, n, a->phi_cat + n, K, nd, n);
        be->add(be, gq, g->dnx_tmp, 1.0f, (long)nd * n);
        be->copy2d(be, g->dnx_tmp, n * n, a->phi_cat + 2 * n, K, nd, n * n);
        be->add(be, gr, g->dnx_tmp, 1.0f, (long)nd * n * n);
    }
    be->rmsnorm_backward(be, g->dX, NULL, g->dnx, X, A->nx_rstd, NULL, N, nd, 1);
}

/* dXn (gradient of the layer's output lanes) -> dX (of its input lanes),
 * with the layer's activations freshly recomputed in a->l. */
static void layer_backward(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                           const san_grad_target *tgt, int l, const float *X)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    san_layer_acts *A = &a->l;
    san_weights *F = tgt->full;
    int N = (int)a->N, d = D->d, n = D->n, hd = D->hd;
    int qd = D->q_dim, kvd = D->kv_dim, hn = D->hada_n;
    size_t Ld = (size_t)l * d, Lh = (size_t)l * hn;
    long Nd = (long)N * d;

    /* X_new = M X + hpost y */
    be->lanes_update_backward(be, g->dX, g->dM, g->dhpost, g->dy, g->dXn, A->M, X, A->hpost, A->y,
                              N, n, d);

    /* y = (x1 + mlp(z)) - u */
    be->hadamard_mlp_backward(be, g->dz, GP(d1, Lh), GP(d2, Lh), GP(d3, Lh), g->dy, A->z, A->h1,
                              w->d1 + Lh, w->d2 + Lh, w->d3 + Lh, N, d, hn);
    be->copy2d(be, g->dx1, (int)Nd, g->dy, (int)Nd, 1, (int)Nd);
    be->rmsnorm_backward(be, g->dx1, GP(pre_hada, Ld), g->dz, A->x1, A->z_rstd, w->pre_hada + Ld, N,
                         d, 1);

    /* x1 = bx + sigmoid(gate) * zcrms(o2, post_norm) */
    const float *bx = A->u;
    for (int s = 0; s < m->cfg.n_sites; s++)
        if (m->cfg.engram_layers[s] == l)
            bx = A->bx;
    be->residual_scaled_backward(be, g->dpn, GP(attn_gate, l), g->dx1, A->pn,
                                 san_weight_host(m, &w->attn_gate[l]), Nd);
    swap_dx1_dbx(g); /* dbx = dx1 (dx1 is not read again in this layer) */
    be->rmsnorm_backward(be, g->do2, GP(post_norm, Ld), g->dpn, A->o2, A->pn_rstd,
                         w->post_norm + Ld, N, d, 0);

    /* o2 = o @ Wout */
    be->matmul(be, 0, 1, N, qd, d, 1.0f, g->do2, d, w->wout + (size_t)l * qd * d, d, 0.0f, g->do_,
               qd);
    linear_param_grads(be, tgt, g, LORA_OUT, F ? F->wout : NULL, l, N, qd, d, A->o, g->do2);

    /* o = att * sigmoid(g); attention; rope; q/k norms */
    be->gate_sigmoid_backward(be, g->datt, g->dg, g->do_, A->att, A->g, (long)N * qd);
    be->attention_backward(be, g->dqn, g->dkn, g->dv, g->datt, A->qn, A->kn, A->v, A->att, A->lse,
                           &a->lay.L, D->H, D->G, hd);
    be->rope_backward(be, g->dqn, a->rope_cos, a->rope_sin, &a->lay.L, D->H, hd);
    be->rope_backward(be, g->dkn, a->rope_cos, a->rope_sin, &a->lay.L, D->G, hd);
    be->rmsnorm_backward(be, g->dq, GP(q_norm, (size_t)l * hd), g->dqn, A->q, A->q_rstd,
                         w->q_norm + (size_t)l * hd, (long)N * D->H, hd, 0);
    be->rmsnorm_backward(be, g->dk, GP(k_norm, (size_t)l * hd), g->dkn, A->k, A->k_rstd,
                         w->k_norm + (size_t)l * hd, (long)N * D->G, hd, 0);

    /* the four projections of a = zcrms(bx, norm_in) */
    be->matmul(be, 0, 1, N, d, qd, 1.0f, g->dq, qd, w->wq + (size_t)l * d * qd, qd, 0.0f, g->da, d);
    be->matmul(be, 0, 1, N, d, kvd, 1.0f, g->dk, kvd, w->wk + (size_t)l * d * kvd, kvd, 1.0f, g->da,
               d);
    be->matmul(be, 0, 1, N, d, kvd, 1.0f, g->dv, kvd, w->wv + (size_t)l * d * kvd, kvd, 1.0f, g->da,
               d);
    be->matmul(be, 0, 1, N, d, qd, 1.0f, g->dg, qd, w->wgate + (size_t)l * d * qd, qd, 1.0f, g->da,
               d);
    if (F) {
        linear_param_grads(be, tgt, g, LORA_Q, F->wq, l, N, d, qd, A->a, g->dq);
        linear_param_grads(be, tgt, g, LORA_K, F->wk, l, N, d, kvd, A->a, g->dk);
        linear_param_grads(be, tgt, g, LORA_V, F->wv, l, N, d, kvd, A->a, g->dv);
        linear_param_grads(be, tgt, g, LORA_GATE, F->wgate, l, N, d, qd, A->a, g->dg);
    } else {
        const int targets[4] = {LORA_Q, LORA_K, LORA_V, LORA_GATE}, outs[4] = {qd, kvd, kvd, qd};
        const float *dys[4] = {g->dq, g->dk, g->dv, g->dg};
        lora_grads_shared_input(be, tgt, g, targets, dys, outs, l, N, d, A->a);
    }
    be->rmsnorm_backward(be, g->dbx, GP(norm_in, Ld), g->da, bx, A->a_rstd, w->norm_in + Ld, N, d,
                         1);

    layer_backward_tail(m, w, a, g, tgt, l, X);
}

/* Needle 3's layer (model/block.c layer_forward3), backward. */
static void layer_backward3(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                            const san_grad_target *tgt, int l, const float *X)
{
    const nd_backend *be = a->be;
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    const nd_layout *Lay = &a->lay.L;
    san_layer_acts *A = &a->l;
    san_weights *F = tgt->full;
    int N = (int)a->N, d = D->d, n = D->n, hd = D->hd, T = c->qkv_conv_taps;
    int qd = D->q_dim, kd = D->k_dim, vd = D->v_dim, gd = D->gate_dim, od = D->o_dim;
    size_t Ld = (size_t)l * d;
    long Nd = (long)N * d;
    int window = san_layer_is_local(c, l) ? c->sliding_window : 0;
    int cons = -1, prod = -1; /* CLA pair index where l consumes / produces */
    for (int i = 0; i < c->n_cla; i++) {
        if (c->cla_pairs[i][1] == l)
            cons = i;
        if (c->cla_pairs[i][0] == l)
            prod = i;
    }

    be->lanes_update_backward(be, g->dX, g->dM, g->dhpost, g->dy, g->dXn, A->M, X, A->hpost, A->y,
                              N, n, d);

    /* y = (x1 + HadamardMLP(z)) - u */
    san_hada3_w hw;
    san_hada3_grad hg;
    san_hada3_slices(m, w, l, &hw);
    if (F)
        san_hada3_grad_slices(m, F, l, &hg);
    san_hada3_backward(be, a->hada3, &hw, A->z, N, A->hsaved, g->dy, g->dz, F ? &hg : NULL);
    be->copy2d(be, g->dx1, (int)Nd, g->dy, (int)Nd, 1, (int)Nd);
    be->rmsnorm_backward(be, g->dx1, GP(pre_hada, Ld), g->dz, A->x1, A->z_rstd, w->pre_hada + Ld, N,
                         d, 1);

    /* x1 = bx + sigmoid(gate) * zcrms(o2, post_norm) */
    const float *bx = A->u;
    for (int s = 0; s < c->n_sites; s++)
        if (c->engram_layers[s] == l)
            bx = A->bx;
    be->residual_scaled_backward(be, g->dpn, GP(attn_gate, l), g->dx1, A->pn,
                                 san_weight_host(m, &w->attn_gate[l]), Nd);
    swap_dx1_dbx(g); /* dbx = dx1 (dx1 is not read again in this layer) */
    be->rmsnorm_backward(be, g->do2, GP(post_norm, Ld), g->dpn, A->o2, A->pn_rstd,
                         w->post_norm + Ld, N, d, 0);

    /* o2 = o @ Wout; o = gate(att, g) */
    be->matmul(be, 0, 1, N, od, d, 1.0f, g->do2, d, w->wout + (size_t)l * od * d, d, 0.0f, g->do_,
               od);
    linear_param_grads(be, tgt, g, LORA_OUT, F ? F->wout : NULL, l, N, od, d, A->o, g->do2);
    if (c->attention_gate == SAN_GATE_HEADWISE)
        be->gate_heads_backward(be, g->datt, g->dg, g->do_, A->att, A->g, N, D->H, D->v_hd);
    else
        be->gate_sigmoid_backward(be, g->datt, g->dg, g->do_, A->att, A->g, (long)N * od);

    /* attention over this layer's k/v, or a consumer's producer's */
    const float *ku = cons >= 0 ? a->cla_k[cons] : A->kn, *vu = cons >= 0 ? a->cla_v[cons] : A->vc;
    float *dku = cons >= 0 ? g->cla_dk[cons] : g->dkn, *dvu = cons >= 0 ? g->cla_dv[cons] : g->dvc;
    be->attention_ext_backward(be, g->dqn, dku, dvu, g->datt, A->qn, ku, vu, A->att, A->lse, Lay,
                               D->H, D->G, hd, D->v_hd, window);
    be->rope_backward(be, g->dqn, a->rope_cos, a->rope_sin, Lay, D->H, hd);
    float *dqc = T ? g->dqc : g->dq;
    be->rmsnorm_backward(be, dqc, GP(q_norm, (size_t)l * hd), g->dqn, A->qc, A->q_rstd,
                         w->q_norm + (size_t)l * hd, (long)N * D->H, hd, 0);
    if (T)
        be->qkv_taps_backward(be, g->dq, GP(q_taps, (size_t)l * T * qd), dqc, A->q,
                              w->q_taps + (size_t)l * T * qd, Lay, qd, T, window);
    if (cons >= 0) {
        /* the layer's own k and v feed nothing */
        nd_backend_zero(be, g->dk, sizeof(float) * (size_t)N * kd);
        nd_backend_zero(be, g->dv, sizeof(float) * (size_t)N * vd);
    } else {
        if (prod >= 0) { /* plus what the consumer's attention sent */
            be->add(be, g->dkn, g->cla_dk[prod], 1.0f, (long)N * kd);
            be->add(be, g->dvc, g->cla_dv[prod], 1.0f, (long)N * vd);
        }
        be->rope_backward(be, g->dkn, a->rope_cos, a->rope_sin, Lay, D->G, hd);
        float *dkc = T ? g->dkc : g->dk;
        be->rmsnorm_backward(be, dkc, GP(k_norm, (size_t)l * hd), g->dkn, A->kc, A->k_rstd,
                             w->k_norm + (size_t)l * hd, (long)N * D->G, hd, 0);
        if (T) {
            be->qkv_taps_backward(be, g->dk, GP(k_taps, (size_t)l * T * kd), dkc, A->k,
                                  w->k_taps + (size_t)l * T * kd, Lay, kd, T, window);
            be->qkv_taps_backward(be, g->dv, GP(v_taps, (size_t)l * T * vd), g->dvc, A->v,
                                  w->v_taps + (size_t)l * T * vd, Lay, vd, T, window);
        } else {
            be->copy2d(be, g->dv, vd, g->dvc, vd, N, vd);
        }
    }

    /* the four projections of a = zcrms(bx, norm_in) */
    be->matmul(be, 0, 1, N, d, qd, 1.0f, g->dq, qd, w->wq + (size_t)l * d * qd, qd, 0.0f, g->da, d);
    be->matmul(be, 0, 1, N, d, kd, 1.0f, g->dk, kd, w->wk + (size_t)l * d * kd, kd, 1.0f, g->da, d);
    be->matmul(be, 0, 1, N, d, vd, 1.0f, g->dv, vd, w->wv + (size_t)l * d * vd, vd, 1.0f, g->da, d);
    be->matmul(be, 0, 1, N, d, gd, 1.0f, g->dg, gd, w->wgate + (size_t)l * d * gd, gd, 1.0f, g->da,
               d);
    if (F) {
        linear_param_grads(be, tgt, g, LORA_Q, F->wq, l, N, d, qd, A->a, g->dq);
        linear_param_grads(be, tgt, g, LORA_K, F->wk, l, N, d, kd, A->a, g->dk);
        linear_param_grads(be, tgt, g, LORA_V, F->wv, l, N, d, vd, A->a, g->dv);
        linear_param_grads(be, tgt, g, LORA_GATE, F->wgate, l, N, d, gd, A->a, g->dg);
    } else {
        const int targets[4] = {LORA_Q, LORA_K, LORA_V, LORA_GATE}, outs[4] = {qd, kd, vd, gd};
        const float *dys[4] = {g->dq, g->dk, g->dv, g->dg};
        lora_grads_shared_input(be, tgt, g, targets, dys, outs, l, N, d, A->a);
    }
    be->rmsnorm_backward(be, g->dbx, GP(norm_in, Ld), g->da, bx, A->a_rstd, w->norm_in + Ld, N, d,
                         1);
    layer_backward_tail(m, w, a, g, tgt, l, X);
}

void san_backward_logits_range(const san_model *m, const san_weights *w, san_acts *a,
                               san_grad_acts *g, const san_grad_target *tgt, long r0, long n)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    san_weights *F = tgt->full;
    int d = D->d, V = D->V_out;
    if (n <= 0)
        return;
    /* logits = hf @ E^T (tied; the first V_out rows) */
    be->matmul(be, 0, 0, (int)n, d, V, 1.0f, a->logits, V, w->emb, d, 0.0f, g->dhf + (size_t)r0 * d,
               d);
    if (F)
        be->matmul(be, 1, 0, V, d, (int)n, 1.0f, a->logits, V, a->hf + (size_t)r0 * d, d, 1.0f,
                   F->emb, d);
}

void san_backward_begin(san_acts *a, san_grad_acts *g, int d)
{
    nd_backend_zero(a->be, g->dhf, sizeof(float) * (size_t)a->N * d);
}

void san_backward_logits_rows(const san_model *m, const san_weights *w, san_acts *a,
                              san_grad_acts *g, const san_grad_target *tgt, const int32_t *rows,
                              long n)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    san_weights *F = tgt->full;
    int d = D->d, V = D->V_out;
    if (n <= 0)
        return;
    be->matmul(be, 0, 0, (int)n, d, V, 1.0f, a->logits, V, w->emb, d, 0.0f, g->dhsel, d);
    if (F)
        be->matmul(be, 1, 0, V, d, (int)n, 1.0f, a->logits, V, a->hsel, d, 1.0f, F->emb, d);
    be->scatter_add_rows(be, g->dhf, g->dhsel, rows, n, d);
}

int san_backward(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                 const san_grad_target *tgt, const int32_t *tokens)
{
    san_backward_logits_range(m, w, a, g, tgt, 0, a->N);
    return san_backward_finish(m, w, a, g, tgt, tokens);
}

int san_backward_rows(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                      const san_grad_target *tgt, const int32_t *tokens, const int32_t *rows,
                      long n)
{
    san_backward_begin(a, g, m->dims.d);
    san_backward_logits_rows(m, w, a, g, tgt, rows, n);
    return san_backward_finish(m, w, a, g, tgt, tokens);
}

/* The input lanes of layer l for the backward: a saved checkpoint, or a
 * slot of the segment recomputed from the checkpoint below it (when l is
 * the segment's top layer, the backward's first visit). */
static const float *lanes_for(const san_model *m, const san_weights *w, san_acts *a, int l,
                              size_t lane_sz, int *rc)
{
    int k = a->lane_every > 1 ? a->lane_every : 1, L = m->dims.L;
    *rc = ND_OK;
    if (k == 1)
        return a->X_saved + (size_t)l * lane_sz;
    int base = l / k * k;
    const float *cp = a->X_saved + (size_t)(l / k) * lane_sz;
    if (l == base)
        return cp;
    float *seg = a->X_saved + (size_t)a->n_lane_cp * lane_sz; /* k - 1 slots */
    int top = base + k - 1 < L - 1 ? base + k - 1 : L - 1;
    if (l == top) { /* the forward again from the checkpoint: inputs of base+1..top */
        const float *in = cp;
        for (int j = base; j < top && !*rc; j++) {
            float *out = seg + (size_t)(j - base) * lane_sz;
            a->l = j < a->n_kept ? a->layer_sets[j] : a->l_scratch;
            *rc = san_layer_forward_batch(m, w, a, j, in, out);
            in = out;
        }
    }
    return seg + (size_t)(l - base - 1) * lane_sz;
}

int san_backward_finish(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                        const san_grad_target *tgt, const int32_t *tokens)
{
    const nd_backend *be = a->be;
    const san_dims *D = &m->dims;
    san_weights *F = tgt->full;
    int N = (int)a->N, d = D->d, n = D->n;
    if (!a->X_saved)
        return nd_error(ND_EARG, "san_backward needs activations created with save_lanes");
    size_t lane_sz = (size_t)N * n * d;
    const nd_layout *Lay = &a->lay.L;

    be->rmsnorm_backward(be, g->dxm, GP(final_norm, 0), g->dhf, a->xm, a->hf_rstd, w->final_norm, N,
                         d, 0);
    be->lanes_mean_backward(be, g->dXn, g->dxm, N, n, d);

    for (int s = 0; s < m->cfg.n_sites; s++) {
        nd_backend_zero(be, g->deng_k[s], sizeof(float) * (size_t)N * d);
        nd_backend_zero(be, g->deng_v[s], sizeof(float) * (size_t)N * d);
    }
    for (int i = 0; i < m->cfg.n_cla; i++) {
        nd_backend_zero(be, g->cla_dk[i], sizeof(float) * (size_t)N * D->k_dim);
        nd_backend_zero(be, g->cla_dv[i], sizeof(float) * (size_t)N * D->v_dim);
    }
    for (int l = D->L - 1; l >= 0; l--) {
        int rc = ND_OK;
        const float *X = lanes_for(m, w, a, l, lane_sz, &rc);
        if (rc)
            return rc;
        if (l < a->n_kept) {
            a->l = a->layer_sets[l]; /* kept by the forward */
        } else {
            a->l = a->l_scratch;
            rc = san_layer_forward_batch(m, w, a, l, X, a->Xn); /* recompute this layer */
            if (rc)
                return rc;
        }
        if (m->cfg.generation == 3)
            layer_backward3(m, w, a, g, tgt, l, X);
        else
            layer_backward(m, w, a, g, tgt, l, X);
        float *t = g->dX;
        g->dX = g->dXn;
        g->dXn = t;
    }
    /* g->dXn now holds the gradient of the initial lanes */
    if (!F)
        return ND_OK; /* embeddings and engrams are frozen */
    float *dx0 = g->dhf;
    be->lanes_broadcast_backward(be, dx0, g->dXn, N, n, d);
    be->embed_backward(be, F->emb, dx0, tokens, N, d, (float)sqrt((double)d));
    const san_config *c = &m->cfg;
    for (int s = 0; s < c->n_sites; s++) {
        be->engram_gather(be, a->eng_e, w->eng[s].table, a->eng_idx, Lay, c->engram_orders,
                          c->n_orders, D->eng_heads, c->engram_slots, D->eng_sub);
        int qrc = san_engram_quant(m, a); /* the lookup the forward used (STE) */
        if (qrc)
            return qrc;
        be->matmul(be, 0, 0, N, d, D->eng_dim, 1.0f, a->eng_e, D->eng_dim, w->eng[s].wv, d, 0.0f,
                   a->eng_vp, d);
        be->engram_taps_backward(be, g->deng_vp, F->eng[s].taps, g->deng_v[s], a->eng_vp,
                                 w->eng[s].taps, Lay, d, D->eng_dilation);
        be->matmul(be, 1, 0, D->eng_dim, d, N, 1.0f, a->eng_e, D->eng_dim, g->deng_vp, d, 1.0f,
                   F->eng[s].wv, d);
        be->matmul(be, 1, 0, D->eng_dim, d, N, 1.0f, a->eng_e, D->eng_dim, g->deng_k[s], d, 1.0f,
                   F->eng[s].wk, d);
        be->matmul(be, 0, 1, N, D->eng_dim, d, 1.0f, g->deng_vp, d, w->eng[s].wv, d, 0.0f,
                   g->deng_e, D->eng_dim);
        be->matmul(be, 0, 1, N, D->eng_dim, d, 1.0f, g->deng_k[s], d, w->eng[s].wk, d, 1.0f,
                   g->deng_e, D->eng_dim);
        be->engram_gather_backward(be, F->eng[s].table, g->deng_e, a->eng_idx, Lay,
                                   c->engram_orders, c->n_orders, D->eng_heads, c->engram_slots,
                                   D->eng_sub);
    }
    return ND_OK;
}
