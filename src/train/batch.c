#include "train/batch.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

int nd_batching_parse(const char *s)
{
    if (!strcmp(s, "shared"))
        return ND_BATCH_SHARED;
    if (!strcmp(s, "packed"))
        return ND_BATCH_PACKED;
    if (!strcmp(s, "padded"))
        return ND_BATCH_PADDED;
    return -1;
}

const char *nd_batching_name(int mode)
{
    return mode == ND_BATCH_SHARED ? "shared" : mode == ND_BATCH_PACKED ? "packed" : "padded";
}

/* sum of the k largest of v[0..n) */
static long top_sum(long *v, size_t n, int k)
{
    /* partial selection: k is a batch size, n the dataset */
    long s = 0;
    for (int i = 0; i < k && (size_t)i < n; i++) {
        size_t best = (size_t)i;
        for (size_t j = (size_t)i + 1; j < n; j++)
            if (v[j] > v[best])
                best = j;
        long t = v[i];
        v[i] = v[best];
        v[best] = t;
        s += v[i];
    }
    return s;
}

int nd_batcher_create(nd_batcher *bt, const san_model *m, const nd_backend *be, san_lora *lora,
                      const nd_token_set *ts, int B, int mode, int full_grads)
{
    memset(bt, 0, sizeof *bt);
    bt->ts = ts;
    bt->mode = mode;
    bt->B = B;
    size_t T = ts->max_len;
    if (B < 1 || ts->n == 0)
        return nd_error(ND_EARG, "no examples to batch");
    int rc;
    if (mode == ND_BATCH_PADDED) {
        rc = nd_trainer_create(&bt->tr, m, be, lora, B, (int)T, full_grads);
        if (!rc) {
            bt->ids = malloc(sizeof *bt->ids * (size_t)B * T);
            bt->mask = malloc(sizeof *bt->mask * (size_t)B * T);
            if (!bt->ids || !bt->mask)
                rc = nd_error(ND_ENOMEM, "out of memory");
        }
    } else {
        /* the most rows and loss positions any B examples can need */
        long *v = malloc(sizeof *v * ts->n);
        if (!v)
            return nd_error(ND_ENOMEM, "out of memory");
        for (size_t i = 0; i < ts->n; i++)
            v[i] = ts->len[i];
        long cap_rows = top_sum(v, ts->n, B);
        for (size_t i = 0; i < ts->n; i++) {
            long k = 0;
            for (int t = 1; t < ts->len[i]; t++)
                k += ts->mask[i * T + (size_t)t] != 0.0f;
            v[i] = k;
        }
        long cap_items = top_sum(v, ts->n, B);
        free(v);
        rc = nd_trainer_create_packed(&bt->tr, m, be, lora, B, cap_rows, (int)T, cap_items,
                                      full_grads);
        bt->tr.share = mode == ND_BATCH_SHARED;
        bt->ex = malloc(sizeof *bt->ex * (size_t)B);
        if (!rc && !bt->ex)
            rc = nd_error(ND_ENOMEM, "out of memory");
    }
    if (rc)
        nd_batcher_free(bt);
    return rc;
}

void nd_batcher_free(nd_batcher *bt)
{
    nd_trainer_free(&bt->tr);
    free(bt->ids);
    free(bt->mask);
    free(bt->ex);
    memset(bt, 0, sizeof *bt);
}

static void fill_examples(nd_batcher *bt, const size_t *idx, int rows)
{
    const nd_token_set *ts = bt->ts;
    for (int b = 0; b < rows; b++)
        bt->ex[b] = (nd_seq_example){ts->ids + idx[b] * ts->max_len,
                                     ts->mask + idx[b] * ts->max_len, ts->len[idx[b]]};
}

int nd_batcher_step(nd_batcher *bt, const size_t *idx, int rows, int grad, double *loss,
                    double *masked)
{
    const nd_token_set *ts = bt->ts;
    size_t T = ts->max_len;
    if (rows < 1 || rows > bt->B)
        return nd_error(ND_EARG, "a batch of %d examples (1..%d allowed)", rows, bt->B);
    if (bt->mode != ND_BATCH_PADDED) {
        fill_examples(bt, idx, rows);
        return nd_trainer_step_examples(&bt->tr, bt->ex, rows, grad, loss, masked);
    }
    for (int b = 0; b < bt->B; b++) {
        if (b < rows) {
            memcpy(bt->ids + b * T, ts->ids + idx[b] * T, T * sizeof *bt->ids);
            memcpy(bt->mask + b * T, ts->mask + idx[b] * T, T * sizeof *bt->mask);
        } else {
            memset(bt->ids + b * T, 0, T * sizeof *bt->ids);
            memset(bt->mask + b * T, 0, T * sizeof *bt->mask);
        }
    }
    return nd_trainer_step(&bt->tr, bt->ids, bt->mask, rows, grad, loss, masked);
}

void nd_batcher_example_losses(const nd_batcher *bt, int rows, double *loss_sum, double *positions)
{
    const nd_trainer *tr = &bt->tr;
    for (int b = 0; b < rows; b++)
        loss_sum[b] = positions[b] = 0;
    if (bt->mode != ND_BATCH_PADDED) {
        /* items run example by example, position by position; their
         * weights were rescaled for the backward, so read the raw mask */
        long i = 0;
        for (int b = 0; b < rows; b++)
            for (int t = 0; t + 1 < bt->ex[b].len; t++) {
                float w = bt->ex[b].mask[t + 1];
                if (w == 0.0f)
                    continue;
                loss_sum[b] += (double)w * tr->item_loss[i++];
                positions[b] += w;
            }
        return;
    }
    int T = tr->T;
    for (int b = 0; b < rows; b++)
        for (int t = 0; t + 1 < T; t++) {
            float w = bt->mask[b * T + t + 1];
            if (w != 0.0f) {
                loss_sum[b] += (double)w * tr->row_loss[b * T + t];
                positions[b] += w;
            }
        }
}

long nd_batcher_rows(nd_batcher *bt, const size_t *idx, int rows)
{
    if (bt->mode == ND_BATCH_PADDED)
        return (long)bt->B * (long)bt->ts->max_len;
    fill_examples(bt, idx, rows);
    if (nd_pack_plan_make(&bt->tr.plan, bt->ex, rows, bt->tr.share))
        return -1;
    return bt->tr.plan.rows;
}
