#include "model/block.h"

#include <stddef.h>

#include "core/status.h"

int san_layer_forward(const san_block *b, san_layer_acts *A, int l, int N, const float *X,
                      float *Xn)
{
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
    be->hyper_coeffs(be, A->hpre, A->hpost, A->M, A->pre, A->post, A->res, w->a_pre[l],
                     w->a_post[l], w->a_res[l], w->b_pre + (size_t)l * n, w->b_post + (size_t)l * n,
                     w->b_res + (size_t)l * n * n, l % n, N, n);
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
    be->residual_scaled(be, A->x1, bx, A->pn, w->attn_gate[l], (long)N * d);

    /* Hadamard MLP; y = Block(bx) - u */
    be->rmsnorm(be, A->z, A->z_rstd, A->x1, w->pre_hada + Ld, N, d);
    size_t Lh = (size_t)l * D->hada_n;
    be->hadamard_mlp(be, A->y, A->h1, A->x1, A->z, A->u, w->d1 + Lh, w->d2 + Lh, w->d3 + Lh, N, d,
                     D->hada_n);

    be->lanes_update(be, Xn, A->M, X, A->hpost, A->y, N, n, d);
    return ND_OK;
}
