#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "core/status.h"

int nd_trainer_create(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                      int B, int T, int full_grads)
{
    memset(tr, 0, sizeof *tr);
    tr->m = m;
    tr->be = be;
    tr->B = B;
    tr->T = T;
    tr->lora = lora;
    /* keep every layer's activations (no recompute in the backward, about a
     * third less work) when they fit the budget; otherwise recompute layer
     * by layer like upstream's remat */
    const char *env = getenv("NEEDLE_ACT_BUDGET_MB");
    double budget_mb = env && *env ? atof(env) : 3072.0;
    double need_mb = (double)san_layer_acts_bytes(m, B, T) * m->dims.L / 1048576.0;
    tr->kept_layers = need_mb <= budget_mb;
    int rc = san_acts_create(&tr->acts, be, m, B, T, 1, tr->kept_layers);
    if (!rc)
        rc = san_grad_acts_create(&tr->gacts, be, m, B, T, lora ? lora->rank : 0);
    if (rc) {
        nd_trainer_free(tr);
        return rc;
    }
    size_t N = (size_t)B * T, merged = 0;
    tr->w = m->w;
    if (lora)
        for (int t = 0; t < LORA_NTARGETS; t++)
            if (lora->t[t].present)
                merged += (size_t)lora->L * lora->t[t].in * lora->t[t].out;
    tr->merged = nd_calloc_big(merged ? merged : 1, sizeof(float));
    tr->lora_g = lora ? calloc(lora->numel ? lora->numel : 1, sizeof(float)) : NULL;
    tr->row_loss = malloc(sizeof(float) * N);
    tr->row_w = malloc(sizeof(float) * N);
    tr->tgt = malloc(sizeof(int32_t) * N);
    if (full_grads) {
        tr->full_g = nd_calloc_big(m->numel, sizeof(float));
        if (tr->full_g)
            san_weights_bind(m, tr->full_g, &tr->gw);
    }
    if (!tr->merged || (lora && !tr->lora_g) || !tr->row_loss || !tr->row_w || !tr->tgt ||
        (full_grads && !tr->full_g)) {
        nd_trainer_free(tr);
        return nd_error(ND_ENOMEM, "out of memory for training buffers");
    }
    if (lora) {
        size_t off = 0;
        for (int t = 0; t < LORA_NTARGETS; t++) {
            if (!lora->t[t].present)
                continue;
            float **slot = t == LORA_Q      ? &tr->w.wq
                           : t == LORA_K    ? &tr->w.wk
                           : t == LORA_V    ? &tr->w.wv
                           : t == LORA_GATE ? &tr->w.wgate
                                            : &tr->w.wout;
            *slot = tr->merged + off;
            off += (size_t)lora->L * lora->t[t].in * lora->t[t].out;
        }
        nd_trainer_merge(tr);
    }
    return ND_OK;
}

void nd_trainer_free(nd_trainer *tr)
{
    san_acts_free(&tr->acts);
    san_grad_acts_free(&tr->gacts);
    free(tr->merged);
    free(tr->lora_g);
    free(tr->full_g);
    free(tr->row_loss);
    free(tr->row_w);
    free(tr->tgt);
    memset(tr, 0, sizeof *tr);
}

void nd_trainer_merge(nd_trainer *tr)
{
    san_lora *lo = tr->lora;
    if (!lo)
        return;
    san_weights base = tr->m->w;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lo->t[t].present)
            continue;
        int in = lo->t[t].in, out = lo->t[t].out, r = lo->rank;
        const float *W = san_lora_weight_slot(&base, t);
        float *E = san_lora_weight_slot(&tr->w, t);
        memcpy(E, W, sizeof(float) * (size_t)lo->L * in * out);
        for (int l = 0; l < lo->L; l++)
            tr->be->matmul(tr->be, 0, 0, in, out, r, lo->scale,
                           san_lora_A(lo, lo->mem, t) + (size_t)l * in * r, r,
                           san_lora_B(lo, lo->mem, t) + (size_t)l * r * out, out, 1.0f,
                           E + (size_t)l * in * out, out);
    }
}

int nd_trainer_step(nd_trainer *tr, const int32_t *ids, const float *mask, int rows, int grad,
                    double *loss, double *masked)
{
    const nd_backend *be = tr->be;
    int B = tr->B, T = tr->T, V = tr->m->dims.V;
    long N = (long)B * T;
    /* next-token targets; the weight of position t is mask[t+1] / total */
    double total = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            long r = (long)b * T + t;
            float wgt = b < rows && t + 1 < T ? mask[r + 1] : 0.0f;
            tr->row_w[r] = wgt;
            tr->tgt[r] = t + 1 < T ? ids[r + 1] : 0;
            total += wgt;
        }
    double denom = total > 1.0 ? total : 1.0;
    int rc = san_forward(tr->m, &tr->w, &tr->acts, ids);
    if (rc)
        return rc;
    be->cross_entropy(be, tr->row_loss, tr->acts.logits, tr->tgt, N, V);
    double sum = 0;
    for (long r = 0; r < N; r++)
        if (tr->row_w[r] != 0.0f)
            sum += (double)tr->row_w[r] * tr->row_loss[r];
    *loss = sum / denom;
    if (masked)
        *masked = total;
    if (!grad)
        return ND_OK;
    if (!isfinite(*loss))
        return nd_error(ND_ENUMERIC, "loss is not finite (%g)", *loss);
    for (long r = 0; r < N; r++)
        tr->row_w[r] = (float)(tr->row_w[r] / denom);
    be->cross_entropy_backward(be, tr->acts.logits, tr->tgt, tr->row_w, N, V);
    if (tr->lora_g)
        memset(tr->lora_g, 0, sizeof(float) * tr->lora->numel);
    if (tr->full_g)
        memset(tr->full_g, 0, sizeof(float) * tr->m->numel);
    san_grad_target tg = {
        .full = tr->full_g ? &tr->gw : NULL,
        .lora = tr->lora,
        .lora_w = tr->lora ? tr->lora->mem : NULL,
        .lora_g = tr->lora_g,
    };
    return san_backward(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, ids);
}
