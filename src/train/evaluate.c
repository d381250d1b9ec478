#include "train/evaluate.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

int nd_eval_masked(nd_batcher *bt, int want_grad, nd_masked_eval *out)
{
    memset(out, 0, sizeof *out);
    nd_trainer *tr = &bt->tr;
    const nd_token_set *ts = bt->ts;
    size_t n = ts->n, T = ts->max_len;
    int B = bt->B;
    size_t lnum = tr->lora ? tr->lora->numel : 0;
    out->n = n;
    out->loss_sum = calloc(n ? n : 1, sizeof(double));
    out->positions = calloc(n ? n : 1, sizeof(double));
    size_t *idx = malloc(sizeof *idx * (size_t)B);
    float *gacc = NULL;
    size_t nchunks = (n + (size_t)B - 1) / (size_t)B;
    if (want_grad && lnum) {
        out->lora_grad = calloc(lnum, sizeof(float));
        gacc = out->lora_grad;
    }
    int rc = ND_OK;
    if (!out->loss_sum || !out->positions || !idx || (want_grad && lnum && !gacc)) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    /* first pass: the global number of masked positions (the denominator) */
    for (size_t i = 0; i < n; i++)
        for (size_t t = 1; t < T; t++)
            out->total_positions += ts->mask[i * T + t];
    for (size_t c = 0; c < nchunks && !rc; c++) {
        size_t r0 = c * (size_t)B;
        int rows = n - r0 < (size_t)B ? (int)(n - r0) : B;
        for (int b = 0; b < rows; b++)
            idx[b] = r0 + (size_t)b;
        double loss, masked;
        rc = nd_batcher_step(bt, idx, rows, gacc != NULL, &loss, &masked);
        if (rc)
            break;
        nd_batcher_example_losses(bt, rows, out->loss_sum + r0, out->positions + r0);
        for (int b = 0; b < rows; b++)
            out->total_loss += out->loss_sum[r0 + b];
        if (gacc) {
            /* the chunk's gradient is of its own mean; reweight to the global mean */
            double denom = out->total_positions > 1 ? out->total_positions : 1;
            float wgt = (float)((masked > 1 ? masked : 1) / denom);
            const float *g = nd_backend_map(tr->be, tr->lora_g, sizeof(float) * lnum, 1);
            if (!g) {
                rc = nd_error(ND_ENOMEM, "out of memory");
                break;
            }
            for (size_t i = 0; i < lnum; i++)
                gacc[i] += wgt * g[i];
            nd_backend_unmap(tr->be, tr->lora_g, (void *)g, sizeof(float) * lnum, 0);
        }
    }
done:
    free(idx);
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
