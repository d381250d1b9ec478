#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "core/status.h"

/* Buffers common to both modes; the activations hold cap_rows rows. */
static int trainer_init(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                        long cap_rows, int cap_seg, int max_pos, long cap_logits, int full_grads)
{
    tr->m = m;
    tr->be = be;
    tr->lora = lora;
    tr->share = 1;
    /* keep every layer's activations (no recompute in the backward, about
     * a third less work) when they fit the budget; otherwise recompute
     * layer by layer like upstream's remat */
    const char *env = getenv("NEEDLE_ACT_BUDGET_MB");
    double budget_mb = env && *env ? atof(env) : 3072.0;
    double need_mb = (double)san_layer_acts_bytes(m, cap_rows) * m->dims.L / 1048576.0;
    tr->kept_layers = need_mb <= budget_mb;
    int rc = san_acts_create_rows(&tr->acts, be, m, cap_rows, cap_seg, max_pos, cap_logits, 1,
                                  tr->kept_layers);
    if (!rc)
        rc = san_grad_acts_create(&tr->gacts, be, m, cap_rows, tr->packed ? cap_logits : 0,
                                  lora ? lora->rank : 0);
    if (rc)
        return rc;
    size_t N = (size_t)cap_rows, merged = 0;
    tr->w = m->w;
    if (lora)
        for (int t = 0; t < LORA_NTARGETS; t++)
            if (lora->t[t].present)
                merged += (size_t)lora->L * lora->t[t].in * lora->t[t].out;
    tr->merged = nd_calloc_big(merged ? merged : 1, sizeof(float));
    tr->lora_g = lora ? calloc(lora->numel ? lora->numel : 1, sizeof(float)) : NULL;
    size_t NL = tr->packed ? 1 : N;
    tr->row_loss = malloc(sizeof(float) * NL);
    tr->row_w = malloc(sizeof(float) * NL);
    tr->tgt = malloc(sizeof(int32_t) * NL);
    if (full_grads) {
        tr->full_g = nd_calloc_big(m->numel, sizeof(float));
        if (tr->full_g)
            san_weights_bind(m, tr->full_g, &tr->gw);
    }
    if (!tr->merged || (lora && !tr->lora_g) || !tr->row_loss || !tr->row_w || !tr->tgt ||
        (full_grads && !tr->full_g))
        return nd_error(ND_ENOMEM, "out of memory for training buffers");
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

int nd_trainer_create(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                      int B, int T, int full_grads)
{
    memset(tr, 0, sizeof *tr);
    if (B <= 0 || T <= 0)
        return nd_error(ND_EARG, "batch %d x seq %d is empty", B, T);
    tr->B = B;
    tr->T = T;
    int rc = trainer_init(tr, m, be, lora, (long)B * T, B, T, (long)B * T, full_grads);
    if (!rc) {
        nd_layout_dense(&tr->acts.lay, B, T);
        rc = san_acts_use_layout(&tr->acts);
    }
    if (rc)
        nd_trainer_free(tr);
    return rc;
}

int nd_trainer_create_packed(nd_trainer *tr, const san_model *m, const nd_backend *be,
                             san_lora *lora, int max_examples, long cap_rows, int max_pos,
                             long cap_items, int full_grads)
{
    memset(tr, 0, sizeof *tr);
    if (max_examples <= 0 || cap_rows <= 0 || max_pos <= 0)
        return nd_error(ND_EARG, "packed batches of %d examples, %ld rows: empty", max_examples,
                        cap_rows);
    tr->packed = 1;
    tr->B = max_examples;
    tr->T = max_pos;
    tr->cap_items = cap_items > 0 ? cap_items : 1;
    int rc = trainer_init(tr, m, be, lora, cap_rows, 2 * max_examples, max_pos, tr->cap_items,
                          full_grads);
    if (!rc) {
        size_t ci = (size_t)tr->cap_items, cr = (size_t)cap_rows;
        tr->ptok = malloc(sizeof *tr->ptok * cr);
        tr->row_of = malloc(sizeof *tr->row_of * cr);
        tr->item_row = malloc(sizeof *tr->item_row * ci);
        tr->item_tgt = malloc(sizeof *tr->item_tgt * ci);
        tr->item_ex = malloc(sizeof *tr->item_ex * ci);
        tr->item_w = malloc(sizeof *tr->item_w * ci);
        tr->item_loss = malloc(sizeof *tr->item_loss * ci);
        if (nd_pack_plan_init(&tr->plan, max_examples) || !tr->ptok || !tr->row_of ||
            !tr->item_row || !tr->item_tgt || !tr->item_ex || !tr->item_w || !tr->item_loss)
            rc = nd_error(ND_ENOMEM, "out of memory for training buffers");
    }
    if (rc)
        nd_trainer_free(tr);
    return rc;
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
    nd_pack_plan_free(&tr->plan);
    free(tr->ptok);
    free(tr->row_of);
    free(tr->item_row);
    free(tr->item_tgt);
    free(tr->item_ex);
    free(tr->item_w);
    free(tr->item_loss);
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
    if (tr->packed)
        return nd_error(ND_EARG, "nd_trainer_step on a packed trainer");
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

static void zero_grads(nd_trainer *tr)
{
    if (tr->lora_g)
        memset(tr->lora_g, 0, sizeof(float) * tr->lora->numel);
    if (tr->full_g)
        memset(tr->full_g, 0, sizeof(float) * tr->m->numel);
}

int nd_trainer_step_examples(nd_trainer *tr, const nd_seq_example *ex, int count, int grad,
                             double *loss, double *masked)
{
    const nd_backend *be = tr->be;
    int V = tr->m->dims.V;
    if (!tr->packed)
        return nd_error(ND_EARG, "nd_trainer_step_examples needs a packed trainer");
    long real = 0, items = 0;
    for (int b = 0; b < count; b++) {
        if (ex[b].len < 1 || ex[b].len > tr->T)
            return nd_error(ND_EARG, "example %d has %d tokens (1..%d allowed)", b, ex[b].len,
                            tr->T);
        real += ex[b].len;
        for (int t = 0; t + 1 < ex[b].len; t++)
            items += ex[b].mask[t + 1] != 0.0f;
    }
    if (count > tr->B || real > tr->acts.cap_rows || items > tr->cap_items)
        return nd_error(ND_EARG,
                        "batch of %d examples, %ld tokens, %ld loss positions exceeds the %d, "
                        "%ld, %ld sized",
                        count, real, items, tr->B, tr->acts.cap_rows, tr->cap_items);
    if (nd_pack_plan_make(&tr->plan, ex, count, tr->share) ||
        nd_pack_layout(&tr->plan, ex, &tr->acts.lay, tr->ptok, tr->row_of))
        return nd_error(ND_ENOMEM, "packing a batch of %d examples failed", count);
    int rc = san_acts_use_layout(&tr->acts);
    if (rc)
        return rc;
    /* loss positions: the row of position t predicts ids[t+1] */
    double total = 0;
    long n = 0, off = 0;
    for (int b = 0; b < count; off += ex[b].len, b++)
        for (int t = 0; t + 1 < ex[b].len; t++) {
            float w = ex[b].mask[t + 1];
            if (w == 0.0f)
                continue;
            tr->item_row[n] = tr->row_of[off + t];
            tr->item_tgt[n] = ex[b].ids[t + 1];
            tr->item_ex[n] = b;
            tr->item_w[n] = w;
            total += w;
            n++;
        }
    tr->n_items = n;
    double denom = total > 1.0 ? total : 1.0;
    if ((rc = san_forward_hidden(tr->m, &tr->w, &tr->acts, tr->ptok)) ||
        (rc = san_logits_rows(tr->m, &tr->w, &tr->acts, tr->item_row, n)))
        return rc;
    be->cross_entropy(be, tr->item_loss, tr->acts.logits, tr->item_tgt, n, V);
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += (double)tr->item_w[i] * tr->item_loss[i];
    *loss = sum / denom;
    if (masked)
        *masked = total;
    if (!grad)
        return ND_OK;
    if (!isfinite(*loss))
        return nd_error(ND_ENUMERIC, "loss is not finite (%g)", *loss);
    for (long i = 0; i < n; i++)
        tr->item_w[i] = (float)(tr->item_w[i] / denom);
    be->cross_entropy_backward(be, tr->acts.logits, tr->item_tgt, tr->item_w, n, V);
    zero_grads(tr);
    san_grad_target tg = {
        .full = tr->full_g ? &tr->gw : NULL,
        .lora = tr->lora,
        .lora_w = tr->lora ? tr->lora->mem : NULL,
        .lora_g = tr->lora_g,
    };
    return san_backward_rows(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, tr->ptok, tr->item_row, n);
}
