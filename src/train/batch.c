#include "train/batch.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/jsonl.h"

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

static long example_items(const nd_token_set *ts, size_t i)
{
    long k = 0;
    for (int t = 1; t < ts->len[i]; t++)
        k += ts->mask[i * ts->max_len + (size_t)t] != 0.0f;
    return k;
}

int nd_batch_caps(const nd_token_set *ts, int mode, const size_t *idx, size_t n, int B, long *rows,
                  long *items, long *group_rows, double *total_rows)
{
    nd_pack_plan p;
    nd_seq_example *ex = malloc(sizeof *ex * (size_t)B);
    if (!ex || nd_pack_plan_init(&p, B)) {
        free(ex);
        return -1;
    }
    for (size_t s0 = 0; s0 < n; s0 += (size_t)B) {
        int cnt = n - s0 < (size_t)B ? (int)(n - s0) : B;
        long it = 0;
        for (int b = 0; b < cnt; b++) {
            size_t i = idx[s0 + (size_t)b];
            ex[b] =
                (nd_seq_example){ts->ids + i * ts->max_len, ts->mask + i * ts->max_len, ts->len[i]};
            it += example_items(ts, i);
        }
        nd_pack_plan_make(&p, ex, cnt, mode == ND_BATCH_SHARED);
        long r = mode == ND_BATCH_PADDED ? (long)B * (long)ts->max_len : p.rows;
        *rows = r > *rows ? r : *rows;
        if (total_rows)
            *total_rows += (double)r;
        for (int g = 0; g < p.n_groups && group_rows; g++) {
            long gr = nd_pack_group_rows(&p, ex, g, g + 1);
            *group_rows = gr > *group_rows ? gr : *group_rows;
        }
        *items = it > *items ? it : *items;
    }
    nd_pack_plan_free(&p);
    free(ex);
    return 0;
}

int nd_batcher_create(nd_batcher *bt, const san_model *m, const nd_backend *be, san_lora *lora,
                      const nd_token_set *ts, int B, int mode, int full_grads, long max_rows,
                      long max_items, long max_group_rows, double act_budget_mb)
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
        rc = nd_trainer_create(&bt->tr, m, be, lora, B, (int)T, full_grads, act_budget_mb);
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
        for (size_t i = 0; i < ts->n; i++)
            v[i] = example_items(ts, i);
        long cap_items = top_sum(v, ts->n, B);
        free(v);
        if (max_rows > 0 && max_rows < cap_rows)
            cap_rows = max_rows;
        if (max_rows > 0 && max_items < cap_items)
            cap_items = max_items > 0 ? max_items : 1;
        /* micro-batches of whole prefix groups up to ND_MICRO_ROWS rows: memory
         * does not grow with the batch; a single larger group gets its own */
        long micro = cap_rows < ND_MICRO_ROWS ? cap_rows : ND_MICRO_ROWS;
        if (max_group_rows > micro)
            micro = max_group_rows;
        if (max_rows <= 0 && (long)T > micro)
            micro = (long)T; /* no plan given: any one example must fit */
        rc = nd_trainer_create_packed(&bt->tr, m, be, lora, B, micro, (int)T, cap_items, cap_items,
                                      full_grads, act_budget_mb);
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
    for (int b = 0; b < rows; b++) {
        memcpy(bt->ids + b * T, ts->ids + idx[b] * T, T * sizeof *bt->ids);
        memcpy(bt->mask + b * T, ts->mask + idx[b] * T, T * sizeof *bt->mask);
    }
    return nd_trainer_step(&bt->tr, bt->ids, bt->mask, rows, grad, loss, masked);
}

void nd_batcher_example_losses(const nd_batcher *bt, int rows, double *loss_sum, double *positions)
{
    const nd_trainer *tr = &bt->tr;
    for (int b = 0; b < rows; b++)
        loss_sum[b] = positions[b] = 0;
    if (bt->mode != ND_BATCH_PADDED) {
        for (long i = 0; i < tr->n_items; i++) {
            int b = tr->item_ex[i];
            loss_sum[b] += (double)tr->item_w[i] * tr->item_loss_h[i];
            positions[b] += tr->item_w[i];
        }
        return;
    }
    int T = tr->T;
    for (int b = 0; b < rows; b++)
        for (int t = 0; t + 1 < T; t++) {
            float w = bt->mask[b * T + t + 1];
            if (w != 0.0f) {
                loss_sum[b] += (double)w * tr->row_loss_h[b * T + t];
                positions[b] += w;
            }
        }
}

void nd_shuffle_indices(size_t *idx, size_t n, nd_rng *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)nd_rng_below(rng, i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* --group-by-tools: order the epoch's (shuffled) examples by tool set so
 * batches hold one set and share its long prefix, then shuffle the
 * batches themselves so training does not walk the sets one by one. */
void nd_group_by_tools(size_t *idx, size_t n, int B, const int32_t *set_of, nd_rng *rng,
                       size_t *tmp)
{
    /* stable counting by set id (ids are dense 0..n-1) */
    size_t *count = calloc(n + 1, sizeof *count);
    if (!count)
        return; /* keep the plain shuffle */
    for (size_t i = 0; i < n; i++)
        count[set_of[idx[i]] + 1]++;
    for (size_t k = 1; k <= n; k++)
        count[k] += count[k - 1];
    for (size_t i = 0; i < n; i++)
        tmp[count[set_of[idx[i]]]++] = idx[i];
    free(count);
    size_t nb = (n + (size_t)B - 1) / (size_t)B;
    size_t *perm = malloc(sizeof *perm * (nb ? nb : 1));
    if (!perm) {
        memcpy(idx, tmp, sizeof *idx * n);
        return;
    }
    for (size_t i = 0; i < nb; i++)
        perm[i] = i;
    /* the short last batch stays last, as in the plain order */
    if (nb > 1)
        nd_shuffle_indices(perm, n % (size_t)B ? nb - 1 : nb, rng);
    size_t o = 0;
    for (size_t i = 0; i < nb; i++) {
        size_t s0 = perm[i] * (size_t)B, s1 = s0 + (size_t)B < n ? s0 + (size_t)B : n;
        for (size_t j = s0; j < s1; j++)
            idx[o++] = tmp[j];
    }
    free(perm);
}

typedef struct {
    uint64_t h;
    size_t i;
} keyed;

static int by_key(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Each example's tool set as a dense id: examples whose prompts agree up to
 * the end of the tools block (system prompt + tools) share one. Grouping
 * only decides batches, never the math, so a 64-bit hash will do. */
int32_t *nd_tool_set_ids(const nd_dataset *ds, size_t n)
{
    int32_t *id = malloc(sizeof *id * (n ? n : 1));
    keyed *k = malloc(sizeof *k * (n ? n : 1));
    if (!id || !k) {
        free(id);
        free(k);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const char *p = ds->ex[i].prompt, *end = strstr(p, "</tools>");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        uint64_t h = 1469598103934665603ull;
        for (size_t j = 0; j < len; j++)
            h = (h ^ (unsigned char)p[j]) * 1099511628211ull;
        k[i] = (keyed){h, i};
    }
    qsort(k, n, sizeof *k, by_key);
    int32_t next = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || k[i].h != k[i - 1].h)
            next++;
        id[k[i].i] = next;
    }
    free(k);
    return id;
}

void nd_epoch_order(size_t *idx, size_t n, int B, uint64_t seed, int epoch, const int32_t *set_of,
                    size_t *tmp)
{
    nd_rng er;
    nd_rng_seed(&er, seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 17);
    nd_shuffle_indices(idx, n, &er);
    if (set_of)
        nd_group_by_tools(idx, n, B, set_of, &er, tmp);
}
