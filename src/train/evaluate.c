#include "train/evaluate.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

int nd_eval_masked(nd_trainer *tr, const int32_t *ids, const float *mask, size_t n,
                   int want_grad, nd_masked_eval *out)
{
    memset(out, 0, sizeof *out);
    int B = tr->B, T = tr->T;
    size_t lnum = tr->lora ? tr->lora->numel : 0;
    out->n = n;
    out->loss_sum = calloc(n ? n : 1, sizeof(double));
    out->positions = calloc(n ? n : 1, sizeof(double));
    int32_t *bid = malloc(sizeof *bid * (size_t)B * T);
    float *bmask = calloc((size_t)B * T, sizeof *bmask);
    float *gacc = NULL;
    size_t nchunks = (n + (size_t)B - 1) / (size_t)B;
    if (want_grad && lnum) {
        out->lora_grad = calloc(lnum, sizeof(float));
        gacc = out->lora_grad;
    }
    int rc = ND_OK;
    if (!out->loss_sum || !out->positions || !bid || !bmask ||
        (want_grad && lnum && !gacc)) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    /* first pass: the global number of masked positions (the denominator) */
    for (size_t i = 0; i < n; i++)
        for (int t = 1; t < T; t++)
            out->total_positions += mask[i * T + t];
    for (size_t c = 0; c < nchunks && !rc; c++) {
        size_t r0 = c * (size_t)B;
        int rows = n - r0 < (size_t)B ? (int)(n - r0) : B;
        memcpy(bid, ids + r0 * T, sizeof *bid * (size_t)rows * T);
        memcpy(bmask, mask + r0 * T, sizeof *bmask * (size_t)rows * T);
        for (size_t i = (size_t)rows * T; i < (size_t)B * T; i++)
            bid[i] = 0;
        double loss, masked;
        rc = nd_trainer_step(tr, bid, bmask, rows, gacc != NULL, &loss, &masked);
        if (rc)
            break;
        /* row_loss and the raw mask give per-example sums */
        for (int b = 0; b < rows; b++) {
            double s = 0, k = 0;
            for (int t = 0; t + 1 < T; t++) {
                float w = bmask[b * T + t + 1];
                if (w != 0.0f) {
                    s += (double)w * tr->row_loss[b * T + t];
                    k += w;
                }
            }
            out->loss_sum[r0 + b] = s;
            out->positions[r0 + b] = k;
            out->total_loss += s;
        }
        if (gacc) {
            /* the chunk's gradient is of its own mean; reweight to the global mean */
            double denom = out->total_positions > 1 ? out->total_positions : 1;
            float wgt = (float)((masked > 1 ? masked : 1) / denom);
            for (size_t i = 0; i < lnum; i++)
                gacc[i] += wgt * tr->lora_g[i];
        }
    }
done:
    free(bid);
    free(bmask);
    if (rc)
        nd_masked_eval_free(out);
    return rc;
}

void nd_masked_eval_free(nd_masked_eval *e)
{
    free(e->loss_sum);
    free(e->positions);
    free(e->lora_grad);
    memset(e, 0, sizeof *e);
}
