#include "model/eval.h"

#include "core/threadpool.h"
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/san.h"

int san_eval(const san_model *m, const nd_backend *be, const token_seqs *seqs, int batch,
             san_logits_sink sink, void *sink_ctx, san_eval_result *res)
{
    return san_eval_quant(m, &m->w, NULL, be, seqs, batch, sink, sink_ctx, res);
}

int san_eval_quant(const san_model *m, const san_weights *w, const nd_fq3_numerics *quant,
                   const nd_backend *be, const token_seqs *seqs, int batch, san_logits_sink sink,
                   void *sink_ctx, san_eval_result *res)
{
    memset(res, 0, sizeof *res);
    int V = m->dims.V_out, count = seqs->count, maxT = 0; /* logit columns (3.x out_vocab) */
    for (int i = 0; i < count; i++) {
        int len = (int)(seqs->start[i + 1] - seqs->start[i]);
        if (len > maxT)
            maxT = len;
    }
    if (batch < 1)
        batch = 1;
    if (batch > count)
        batch = count;
    res->loss_sum = calloc((size_t)count, sizeof *res->loss_sum);
    res->positions = calloc((size_t)count, sizeof *res->positions);
    int32_t *tok = malloc((size_t)batch * maxT * sizeof *tok);
    int32_t *tgt = malloc((size_t)batch * maxT * sizeof *tgt);
    float *loss = be->alloc(be, (size_t)batch * maxT * sizeof *loss);
    san_acts acts = {0};
    int rc = ND_OK, acts_T = 0, acts_B = 0;
    if (!res->loss_sum || !res->positions || !tok || !tgt || !loss) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    for (int s0 = 0; s0 < count; s0 += batch) {
        int B = count - s0 < batch ? count - s0 : batch, T = 1;
        for (int b = 0; b < B; b++) {
            int len = (int)(seqs->start[s0 + b + 1] - seqs->start[s0 + b]);
            T = len > T ? len : T;
        }
        /* re-size activations only when the padded shape changes */
        if (T != acts_T || B != acts_B) {
            san_acts_free(&acts);
            rc = san_acts_create(&acts, be, m, B, T, 0, 0);
            if (rc)
                goto done;
            acts.quant = quant;
            acts_T = T;
            acts_B = B;
        }
        for (int b = 0; b < B; b++) {
            const int32_t *ids = seqs->ids + seqs->start[s0 + b];
            int len = (int)(seqs->start[s0 + b + 1] - seqs->start[s0 + b]);
            for (int t = 0; t < T; t++) {
                tok[b * T + t] = t < len ? ids[t] : m->cfg.pad_token_id;
                tgt[b * T + t] = t + 1 < len ? ids[t + 1] : 0;
                if (tgt[b * T + t] >= V) {
                    rc = nd_error(ND_EARG,
                                  "sequence %d, position %d: token %d has no logit (the model's "
                                  "out_vocab is %d)",
                                  s0 + b, t + 1, tgt[b * T + t], V);
                    goto done;
                }
            }
        }
        double t0 = nd_wtime();
        rc = san_forward(m, w, &acts, tok);
        if (rc)
            goto done;
        be->cross_entropy(be, loss, acts.logits, tgt, (long)B * T, V);
        /* the losses (and for the sink the logits) where the host reads them */
        size_t lb = sizeof *loss * (size_t)B * T, gb = sizeof(float) * (size_t)B * T * V;
        float *lh = nd_backend_map(be, loss, lb, 1);
        float *lg = lh && sink ? nd_backend_map(be, acts.logits, gb, 1) : NULL;
        res->seconds += nd_wtime() - t0;
        res->tokens += (long)B * T;
        if (!lh || (sink && !lg)) {
            nd_backend_unmap(be, loss, lh, lb, 0);
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto done;
        }
        for (int b = 0; b < B && !rc; b++) {
            int s = s0 + b, len = (int)(seqs->start[s + 1] - seqs->start[s]);
            double sum = 0;
            for (int t = 0; t + 1 < len; t++)
                sum += lh[b * T + t];
            res->loss_sum[s] = sum;
            res->positions[s] = len - 1;
            res->total_loss += sum;
            res->total_positions += len - 1;
            if (sink)
                rc = sink(sink_ctx, s, lg + (size_t)b * T * V, len, V);
        }
        nd_backend_unmap(be, acts.logits, lg, gb, 0);
        nd_backend_unmap(be, loss, lh, lb, 0);
        if (rc)
            goto done;
    }
done:
    san_acts_free(&acts);
    free(tok);
    free(tgt);
    if (loss)
        be->free(be, loss);
    if (rc)
        san_eval_result_free(res);
    return rc;
}

void san_eval_result_free(san_eval_result *r)
{
    free(r->loss_sum);
    free(r->positions);
    memset(r, 0, sizeof *r);
}
