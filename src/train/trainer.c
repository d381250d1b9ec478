#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "core/tuning.h"

static float *merged_slot(const nd_trainer *tr, int t);
static size_t merged_floats(const nd_trainer *tr);
static void zero_grads(nd_trainer *tr);

/* Buffers common to both modes; the activations hold cap_rows rows. */
static int trainer_init(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                        long cap_rows, int cap_seg, int max_pos, long cap_logits, int full_grads,
                        double act_budget_mb)
{
    tr->m = m;
    tr->be = be;
    tr->lora = lora;
    tr->full = full_grads;
    tr->share = 1;
    /* When every layer's activations fit the budget they are all kept (no
     * recompute in the backward, about a third less work; the lane states
     * come on top). Otherwise the budget holds the lane states the
     * backward starts each layer from first (a lane state is a small share
     * of a layer's activations): every layer's when they fit, else every
     * k-th layer's with the smallest k that fits (the backward recomputes
     * a segment of k - 1 layers' lanes from each), else the k that needs
     * the fewest; then as many layers' activations as fit in the rest (the
     * first ones); the others are recomputed layer by layer like
     * upstream's remat. */
    const char *env = nd_tuning_get()->act_budget_mb;
    double budget_mb = env && *env ? atof(env) : act_budget_mb >= 0 ? act_budget_mb : 3072.0;
    int L = m->dims.L;
    double layer_mb = (double)san_layer_acts_bytes(m, cap_rows) / 1048576.0;
    double lane_mb = (double)cap_rows * m->dims.n * m->dims.d * sizeof(float) / 1048576.0;
    int all_kept = layer_mb * L <= budget_mb, every = 1;
    for (int k = 1; !all_kept && k <= L; k++) {
        if (san_lane_slots(L, k) < san_lane_slots(L, every))
            every = k;
        if (san_lane_slots(L, k) * lane_mb <= budget_mb) {
            every = k;
            break;
        }
    }
    const char *env_every = nd_tuning_get()->lane_every; /* tests: force k */
    if (env_every && *env_every && atoi(env_every) >= 1)
        every = atoi(env_every) < L ? atoi(env_every) : L;
    tr->lane_every = every;
    if (all_kept) {
        tr->kept_layers = L;
    } else {
        budget_mb -= san_lane_slots(L, every) * lane_mb;
        int k = budget_mb <= 0 ? 0 : layer_mb > 0 ? (int)(budget_mb / layer_mb) : L;
        tr->kept_layers = k > L ? L : k < 0 ? 0 : k;
    }
    /* logits a slice of rows at a time (never [rows, V] at once) */
    long slice = (long)(ND_LOGIT_SLICE_MB * 1048576.0 / ((double)m->dims.V_out * sizeof(float)));
    const char *env_rows = nd_tuning_get()->logit_rows; /* tests: force the slice */
    if (env_rows && *env_rows && atol(env_rows) >= 1)
        slice = atol(env_rows);
    if (slice < 1)
        slice = 1;
    tr->logit_rows = cap_logits < slice ? cap_logits : slice;
    int rc = san_acts_create_rows(&tr->acts, be, m, cap_rows, cap_seg, max_pos, tr->logit_rows,
                                  every, tr->kept_layers);
    if (!rc)
        rc = san_grad_acts_create(&tr->gacts, be, m, cap_rows, tr->packed ? tr->logit_rows : 0,
                                  lora ? lora->rank : 0);
    if (rc)
        return rc;
    size_t N = (size_t)cap_rows, merged = 0;
    tr->w = m->w;
    if (lora)
        for (int t = 0; t < LORA_NTARGETS; t++)
            if (lora->t[t].present)
                merged += (size_t)lora->L * lora->t[t].in * lora->t[t].out;
    /* what ops write lives in the backend's memory */
    tr->merged = be->alloc(be, (merged ? merged : 1) * sizeof(float));
    tr->lora_g = lora ? be->alloc(be, (lora->numel ? lora->numel : 1) * sizeof(float)) : NULL;
    size_t NL = tr->packed ? 1 : N;
    tr->row_loss = be->alloc(be, sizeof(float) * NL);
    tr->row_loss_h = be->host_mem ? tr->row_loss : malloc(sizeof(float) * NL);
    tr->row_w = malloc(sizeof(float) * NL);
    tr->row_g = malloc(sizeof(float) * NL);
    tr->tgt = malloc(sizeof(int32_t) * NL);
    if (full_grads) {
        tr->full_g = be->alloc(be, m->numel * sizeof(float));
        if (tr->full_g)
            san_weights_bind(m, tr->full_g, &tr->gw);
    }
    if (!tr->merged || (lora && !tr->lora_g) || !tr->row_loss || !tr->row_loss_h || !tr->row_w ||
        !tr->row_g || !tr->tgt || (full_grads && !tr->full_g))
        return nd_error(ND_ENOMEM, "out of memory for training buffers");
    if (lora) {
        for (int t = 0; t < LORA_NTARGETS; t++)
            if (lora->t[t].present)
                *(t == LORA_Q      ? &tr->w.wq
                  : t == LORA_K    ? &tr->w.wk
                  : t == LORA_V    ? &tr->w.wv
                  : t == LORA_GATE ? &tr->w.wgate
                                   : &tr->w.wout) = merged_slot(tr, t);
        nd_trainer_merge(tr);
    }
    return ND_OK;
}

int nd_trainer_create(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                      int B, int T, int full_grads, double act_budget_mb)
{
    memset(tr, 0, sizeof *tr);
    if (B <= 0 || T <= 0)
        return nd_error(ND_EARG, "batch %d x seq %d is empty", B, T);
    tr->B = B;
    tr->T = T;
    int rc =
        trainer_init(tr, m, be, lora, (long)B * T, B, T, (long)B * T, full_grads, act_budget_mb);
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
                             long cap_items, long cap_batch_items, int full_grads,
                             double act_budget_mb)
{
    memset(tr, 0, sizeof *tr);
    if (max_examples <= 0 || cap_rows <= 0 || max_pos <= 0)
        return nd_error(ND_EARG, "packed batches of %d examples, %ld rows: empty", max_examples,
                        cap_rows);
    tr->packed = 1;
    tr->B = max_examples;
    tr->T = max_pos;
    tr->cap_items = cap_items > 0 ? cap_items : 1;
    tr->cap_batch_items = cap_batch_items > tr->cap_items ? cap_batch_items : tr->cap_items;
    int rc = trainer_init(tr, m, be, lora, cap_rows, 2 * max_examples, max_pos, tr->cap_items,
                          full_grads, act_budget_mb);
    if (!rc) {
        size_t ci = (size_t)tr->cap_batch_items, cr = (size_t)cap_rows;
        tr->ptok = malloc(sizeof *tr->ptok * cr);
        tr->row_of = malloc(sizeof *tr->row_of * (size_t)max_examples * (size_t)max_pos);
        tr->item_row = malloc(sizeof *tr->item_row * ci);
        tr->item_tgt = malloc(sizeof *tr->item_tgt * ci);
        tr->item_ex = malloc(sizeof *tr->item_ex * ci);
        tr->item_w = malloc(sizeof *tr->item_w * ci);
        tr->item_loss = be->alloc(be, sizeof *tr->item_loss * ci);
        tr->item_loss_h = be->host_mem ? tr->item_loss : malloc(sizeof *tr->item_loss * ci);
        tr->item_g = malloc(sizeof *tr->item_g * ci);
        tr->item_pos = malloc(sizeof *tr->item_pos * ci);
        tr->ex_off = malloc(sizeof *tr->ex_off * (size_t)max_examples);
        tr->group_item0 = malloc(sizeof *tr->group_item0 * ((size_t)max_examples + 1));
        if (nd_pack_plan_init(&tr->plan, max_examples) || !tr->ptok || !tr->row_of ||
            !tr->item_row || !tr->item_tgt || !tr->item_ex || !tr->item_w || !tr->item_loss ||
            !tr->item_loss_h || !tr->item_g || !tr->item_pos || !tr->ex_off || !tr->group_item0)
            rc = nd_error(ND_ENOMEM, "out of memory for training buffers");
    }
    if (rc)
        nd_trainer_free(tr);
    return rc;
}

void nd_trainer_free(nd_trainer *tr)
{
    const nd_backend *be = tr->be;
    if (be)
        nd_backend_sync(be);
    san_acts_free(&tr->acts);
    san_grad_acts_free(&tr->gacts);
    if (be) {
        be->free(be, tr->merged);
        be->free(be, tr->qmem);
        be->free(be, tr->lora_g);
        be->free(be, tr->full_g);
        be->free(be, tr->row_loss);
        be->free(be, tr->item_loss);
        if (!be->host_mem) {
            free(tr->row_loss_h);
            free(tr->item_loss_h);
        }
    }
    if (tr->qat) {
        nd_qat_free(tr->qat);
        free(tr->qat);
    }
    free(tr->row_w);
    free(tr->row_g);
    free(tr->tgt);
    nd_pack_plan_free(&tr->plan);
    free(tr->ptok);
    free(tr->row_of);
    free(tr->item_row);
    free(tr->item_tgt);
    free(tr->item_ex);
    free(tr->item_w);
    free(tr->item_g);
    free(tr->item_pos);
    free(tr->ex_off);
    free(tr->group_item0);
    memset(tr, 0, sizeof *tr);
}

/* floats of tr->merged: every adapted target's stacked kernels */
static size_t merged_floats(const nd_trainer *tr)
{
    size_t n = 0;
    for (int t = 0; tr->lora && t < LORA_NTARGETS; t++)
        if (tr->lora->t[t].present)
            n += (size_t)tr->lora->L * tr->lora->t[t].in * tr->lora->t[t].out;
    return n;
}

/* where target t's merged weights live in tr->merged */
static float *merged_slot(const nd_trainer *tr, int t)
{
    const san_lora *lo = tr->lora;
    size_t off = 0;
    for (int u = 0; u < t; u++)
        if (lo->t[u].present)
            off += (size_t)lo->L * lo->t[u].in * lo->t[u].out;
    return tr->merged + off;
}

/* --qat: Q of the merged targets (LoRA) or of every weight (full) */
static int qat_requantise(nd_trainer *tr)
{
    const san_model *m = tr->m;
    const nd_backend *be = tr->be;
    size_t mb = m->numel * sizeof(float);
    if (!tr->lora) {
        /* the host's weights (m->mem) -> Q -> qmem */
        float *q = nd_backend_map(be, tr->qmem, mb, 0);
        if (!q)
            return nd_error(ND_ENOMEM, "out of memory");
        memcpy(q, m->mem, mb);
        int rc = nd_qat_apply(tr->qat, m->mem, q, 0, m->numel);
        nd_backend_unmap(be, tr->qmem, q, mb, 1);
        return rc;
    }
    /* every adapted projection's listed tensors in one parallel loop */
    san_weights base = m->w;
    int n = 0, *sel = malloc(sizeof *sel * (size_t)(tr->qat->n ? tr->qat->n : 1));
    const float **src = malloc(sizeof *src * (size_t)(tr->qat->n ? tr->qat->n : 1));
    float **dst = malloc(sizeof *dst * (size_t)(tr->qat->n ? tr->qat->n : 1));
    /* the merged targets and the quantised model, where the host reads them */
    size_t gb = merged_floats(tr) * sizeof(float);
    float *merged = nd_backend_map(be, tr->merged, gb, 1);
    float *qmem = merged ? nd_backend_map(be, tr->qmem, mb, 1) : NULL;
    int rc = !sel || !src || !dst || !qmem ? nd_error(ND_ENOMEM, "out of memory") : ND_OK;
    for (int t = 0; !rc && t < LORA_NTARGETS; t++) {
        if (!tr->lora->t[t].present)
            continue;
        size_t lo = (size_t)(san_lora_weight_slot(&base, t) - san_model_dev(m));
        size_t len = (size_t)tr->lora->L * tr->lora->t[t].in * tr->lora->t[t].out;
        for (int i = 0; i < tr->qat->n; i++) {
            const cact_model_tensor *q = &tr->qat->t[i];
            if (q->offset < lo || q->offset + q->numel > lo + len)
                continue;
            /* the merged target sits at merged_slot(t) instead of lo */
            sel[n] = i;
            src[n] = merged + (merged_slot(tr, t) - tr->merged) + (q->offset - lo);
            dst[n++] = qmem + q->offset;
        }
    }
    if (!rc)
        rc = nd_qat_run(tr->qat, sel, n, (const float *const *)src, (float *const *)dst);
    nd_backend_unmap(be, tr->qmem, qmem, mb, 1);
    nd_backend_unmap(be, tr->merged, merged, gb, 0);
    free(sel);
    free(src);
    free(dst);
    return rc;
}

/* the tensor that starts at float offset off, or NULL */
static const san_tensor *tensor_at(const san_model *m, size_t off)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].offset == off)
            return &m->tensors[i];
    return NULL;
}

/* Needle 3: qmem = cq_ste_params(weights): every tensor (base, or with
 * LoRA the merged targets only, read from their merged slots) */
static int quant3_requantise(nd_trainer *tr, int all)
{
    const san_model *m = tr->m;
    const nd_backend *be = tr->be;
    int bits = tr->fq3.weight_bits;
    size_t mb = m->numel * sizeof(float), gb = merged_floats(tr) * sizeof(float);
    /* the quantised model where the host writes it: all of it, or (LoRA,
     * after the first time) only the merged targets' tensors */
    int whole = all || !tr->lora;
    float *qmem = nd_backend_map(be, tr->qmem, mb, !whole);
    if (!qmem)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = ND_OK;
    if (whole)
        rc = nd_fq3_model_weights(m, &tr->fq3, m->mem, qmem);
    if (rc || !tr->lora) {
        nd_backend_unmap(be, tr->qmem, qmem, mb, 1);
        return rc;
    }
    float *merged = nd_backend_map(be, tr->merged, gb, 1);
    if (!merged) {
        nd_backend_unmap(be, tr->qmem, qmem, mb, 0);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    san_weights base = m->w;
    for (int t = 0; t < LORA_NTARGETS && !rc; t++) {
        if (!tr->lora->t[t].present)
            continue;
        size_t off = (size_t)(san_lora_weight_slot(&base, t) - san_model_dev(m));
        const san_tensor *ten = tensor_at(m, off);
        if (!ten) {
            rc = nd_error(ND_ESHAPE, "LoRA target %d: no tensor at its offset", t);
            break;
        }
        int r = nd_fq3_cq_ste_leaf(ten->name, ten->shape, ten->ndim,
                                   merged + (merged_slot(tr, t) - tr->merged), qmem + off, bits,
                                   ND_FQ3_WEIGHT_GROUP);
        if (r < 0)
            rc = r;
    }
    nd_backend_unmap(be, tr->merged, merged, gb, 0);
    nd_backend_unmap(be, tr->qmem, qmem, mb, !rc);
    return rc;
}

static int quant3_merge(nd_trainer *tr, int all)
{
    double t0 = nd_wtime();
    int rc = quant3_requantise(tr, all);
    tr->quant3_seconds += nd_wtime() - t0;
    tr->quant3_calls++;
    return rc;
}

int nd_trainer_merge(nd_trainer *tr)
{
    san_lora *lo = tr->lora;
    if (!lo && tr->quant3)
        return quant3_merge(tr, 1);
    if (!lo && tr->qat) {
        double t0 = nd_wtime();
        int rc = qat_requantise(tr);
        tr->qat->seconds += nd_wtime() - t0;
        tr->qat->calls++;
        return rc;
    }
    if (!lo)
        return ND_OK;
    san_weights base = tr->m->w;
    float *ad = san_lora_dev(lo); /* the adapter as the ops read it */
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lo->t[t].present)
            continue;
        int in = lo->t[t].in, out = lo->t[t].out, r = lo->rank;
        const float *W = san_lora_weight_slot(&base, t);
        float *E = merged_slot(tr, t);
        /* E = W (an op: both lie in the backend's memory), then += A B */
        tr->be->copy2d(tr->be, E, out, W, out, (long)lo->L * in, out);
        for (int l = 0; l < lo->L; l++)
            tr->be->matmul(tr->be, 0, 0, in, out, r, lo->scale,
                           san_lora_A(lo, ad, t) + (size_t)l * in * r, r,
                           san_lora_B(lo, ad, t) + (size_t)l * r * out, out, 1.0f,
                           E + (size_t)l * in * out, out);
    }
    if (tr->quant3)
        return quant3_merge(tr, 0);
    if (!tr->qat)
        return ND_OK;
    double t0 = nd_wtime();
    int rc = qat_requantise(tr);
    tr->qat->seconds += nd_wtime() - t0;
    tr->qat->calls++;
    return rc;
}

int nd_trainer_set_qat(nd_trainer *tr, int bits)
{
    const san_model *m = tr->m;
    if (tr->qat)
        return nd_error(ND_EARG, "--qat is already on");
    tr->qat = malloc(sizeof *tr->qat);
    if (!tr->qat)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = nd_qat_init(tr->qat, m, bits);
    if (rc) {
        free(tr->qat);
        tr->qat = NULL;
        return rc;
    }
    tr->qmem = tr->be->alloc(tr->be, (m->numel ? m->numel : 1) * sizeof(float));
    if (!tr->qmem)
        return nd_error(ND_ENOMEM, "out of memory for the --qat weights");
    san_weights_bind(m, tr->qmem, &tr->w);
    if (!tr->lora) /* everything is requantised on each merge */
        return nd_trainer_merge(tr);
    /* the base once (in LoRA training only the targets change) */
    size_t mb = m->numel * sizeof(float);
    float *q = nd_backend_map(tr->be, tr->qmem, mb, 0);
    if (!q)
        return nd_error(ND_ENOMEM, "out of memory for the --qat weights");
    memcpy(q, m->mem, mb);
    rc = nd_qat_apply(tr->qat, m->mem, q, 0, m->numel);
    nd_backend_unmap(tr->be, tr->qmem, q, mb, 1);
    if (rc)
        return rc;
    return nd_trainer_merge(tr);
}

int nd_trainer_set_quant3(nd_trainer *tr)
{
    const san_model *m = tr->m;
    if (m->cfg.generation != 3)
        return nd_error(ND_EARG, "the Needle 3 training numerics need a Needle 3 model");
    if (tr->qat || tr->quant3)
        return nd_error(ND_EARG, "quantised training is already on");
    nd_fq3_defaults(&tr->fq3);
    tr->fq3.act_bits = m->cfg.act_bits;
    tr->fq3.kv_bits = m->cfg.kv_bits;
    int rc = nd_fq3_validate(&tr->fq3);
    if (rc)
        return rc;
    tr->qmem = tr->be->alloc(tr->be, (m->numel ? m->numel : 1) * sizeof(float));
    if (!tr->qmem)
        return nd_error(ND_ENOMEM, "out of memory for the quantised weights");
    san_weights_bind(m, tr->qmem, &tr->w);
    tr->quant3 = 1;
    tr->acts.quant = &tr->fq3;
    /* the base once (in LoRA training only the targets change after) */
    if ((rc = quant3_requantise(tr, 1)))
        return rc;
    return nd_trainer_merge(tr);
}

int nd_trainer_step(nd_trainer *tr, const int32_t *ids, const float *mask, int rows, int grad,
                    double *loss, double *masked)
{
    const nd_backend *be = tr->be;
    int T = tr->T, V = tr->m->dims.V_out; /* logit columns (3.x out_vocab) */
    long N = (long)rows * T;
    if (tr->packed)
        return nd_error(ND_EARG, "nd_trainer_step on a packed trainer");
    if (rows < 1 || rows > tr->B)
        return nd_error(ND_EARG, "a batch of %d rows (1..%d sized)", rows, tr->B);
    /* only the batch's own rows are computed: a short last batch, or a
     * rank's share of one, costs its rows, not the B the trainer was sized for */
    if (tr->acts.N != N) {
        if (nd_layout_dense(&tr->acts.lay, rows, T))
            return nd_error(ND_ENOMEM, "out of memory");
        int rc = san_acts_use_layout(&tr->acts);
        if (rc)
            return rc;
    }
    /* next-token targets; the weight of position t is mask[t+1] / total */
    double total = 0;
    for (int b = 0; b < rows; b++)
        for (int t = 0; t < T; t++) {
            long r = (long)b * T + t;
            float wgt = t + 1 < T ? mask[r + 1] : 0.0f;
            tr->row_w[r] = wgt;
            tr->tgt[r] = t + 1 < T ? ids[r + 1] : 0;
            if (tr->tgt[r] >= V) {
                if (wgt != 0.0f)
                    return nd_error(ND_EARG,
                                    "row %d, position %d: target token %d has no logit "
                                    "(out_vocab %d)",
                                    b, t + 1, tr->tgt[r], V);
                tr->tgt[r] = 0; /* weight 0: any valid column */
            }
            total += wgt;
        }
    double denom = tr->denom > 0 ? tr->denom : total > 1.0 ? total : 1.0;
    int rc = san_forward_hidden(tr->m, &tr->w, &tr->acts, ids);
    if (rc)
        return rc;
    san_grad_target tg = {
        .full = tr->full_g ? &tr->gw : NULL,
        .lora = tr->lora,
        .lora_w = tr->lora ? san_lora_dev(tr->lora) : NULL,
        .lora_g = tr->lora_g,
    };
    if (grad) {
        zero_grads(tr);
        for (long r = 0; r < N; r++)
            tr->row_g[r] = (float)(tr->row_w[r] / denom);
    }
    /* the loss and dLoss/dlogits -> dhf a slice of rows at a time */
    for (long r0 = 0; r0 < N; r0 += tr->logit_rows) {
        long n = N - r0 < tr->logit_rows ? N - r0 : tr->logit_rows;
        if ((rc = san_logits_range(tr->m, &tr->w, &tr->acts, r0, n)))
            return rc;
        be->cross_entropy(be, tr->row_loss + r0, tr->acts.logits, tr->tgt + r0, n, V);
        if (!grad)
            continue;
        be->cross_entropy_backward(be, tr->acts.logits, tr->tgt + r0, tr->row_g + r0, n, V);
        san_backward_logits_range(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, r0, n);
    }
    nd_backend_download(be, tr->row_loss_h, tr->row_loss, sizeof(float) * (size_t)N);
    double sum = 0;
    for (long r = 0; r < N; r++)
        if (tr->row_w[r] != 0.0f)
            sum += (double)tr->row_w[r] * tr->row_loss_h[r];
    *loss = sum / denom;
    if (masked)
        *masked = total;
    if (!grad)
        return ND_OK;
    if (!isfinite(*loss))
        return nd_error(ND_ENUMERIC, "loss is not finite (%g)", *loss);
    rc = san_backward_finish(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, ids);
    nd_backend_sync(be); /* gradients readable on return */
    return rc;
}

static void zero_grads(nd_trainer *tr)
{
    if (tr->lora_g)
        nd_backend_zero(tr->be, tr->lora_g, sizeof(float) * tr->lora->numel);
    if (tr->full_g)
        nd_backend_zero(tr->be, tr->full_g, sizeof(float) * tr->m->numel);
}

/* One micro-batch: groups [g0, g1) of the plan, their items [i0, i1). */
static int micro_step(nd_trainer *tr, const nd_seq_example *ex, int g0, int g1, long i0, long i1,
                      int grad, double denom, double *sum)
{
    const nd_backend *be = tr->be;
    int V = tr->m->dims.V_out;
    if (nd_pack_layout(&tr->plan, ex, g0, g1, &tr->acts.lay, tr->ptok, tr->row_of))
        return nd_error(ND_ENOMEM, "packing a batch failed");
    int rc = san_acts_use_layout(&tr->acts);
    if (rc)
        return rc;
    for (long i = i0; i < i1; i++)
        tr->item_row[i] = tr->row_of[tr->item_pos[i]];
    if ((rc = san_forward_hidden(tr->m, &tr->w, &tr->acts, tr->ptok)))
        return rc;
    san_grad_target tg = {
        .full = tr->full_g ? &tr->gw : NULL,
        .lora = tr->lora,
        .lora_w = tr->lora ? san_lora_dev(tr->lora) : NULL,
        .lora_g = tr->lora_g,
    };
    if (grad) {
        for (long i = i0; i < i1; i++)
            tr->item_g[i] = (float)(tr->item_w[i] / denom);
        san_backward_begin(&tr->acts, &tr->gacts, tr->m->dims.d);
    }
    /* the loss and dLoss/dlogits -> dhf a slice of loss positions at a time */
    for (long c0 = i0; c0 < i1; c0 += tr->logit_rows) {
        long c = i1 - c0 < tr->logit_rows ? i1 - c0 : tr->logit_rows;
        if ((rc = san_logits_rows(tr->m, &tr->w, &tr->acts, tr->item_row + c0, c)))
            return rc;
        be->cross_entropy(be, tr->item_loss + c0, tr->acts.logits, tr->item_tgt + c0, c, V);
        if (!grad)
            continue;
        be->cross_entropy_backward(be, tr->acts.logits, tr->item_tgt + c0, tr->item_g + c0, c, V);
        san_backward_logits_rows(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, tr->item_row + c0, c);
    }
    nd_backend_download(be, tr->item_loss_h + i0, tr->item_loss + i0,
                        sizeof(float) * (size_t)(i1 - i0));
    for (long i = i0; i < i1; i++)
        *sum += (double)tr->item_w[i] * tr->item_loss_h[i];
    if (!grad)
        return ND_OK;
    return san_backward_finish(tr->m, &tr->w, &tr->acts, &tr->gacts, &tg, tr->ptok);
}

int nd_trainer_step_examples(nd_trainer *tr, const nd_seq_example *ex, int count, int grad,
                             double *loss, double *masked)
{
    if (!tr->packed)
        return nd_error(ND_EARG, "nd_trainer_step_examples needs a packed trainer");
    long items = 0;
    for (int b = 0; b < count; b++) {
        if (ex[b].len < 1 || ex[b].len > tr->T)
            return nd_error(ND_EARG, "example %d has %d tokens (1..%d allowed)", b, ex[b].len,
                            tr->T);
        for (int t = 0; t + 1 < ex[b].len; t++)
            items += ex[b].mask[t + 1] != 0.0f;
    }
    if (count > tr->B || items > tr->cap_batch_items ||
        nd_pack_plan_make(&tr->plan, ex, count, tr->share))
        return nd_error(ND_EARG,
                        "batch of %d examples, %ld loss positions exceeds the %d, %ld sized", count,
                        items, tr->B, tr->cap_batch_items);
    const nd_pack_plan *p = &tr->plan;
    /* loss positions group by group (a micro-batch is a run of groups):
     * position t of example b predicts ids[t+1] */
    for (int b = 0, o = 0; b < count; o += ex[b].len, b++)
        tr->ex_off[b] = o;
    double total = 0;
    long n = 0;
    for (int g = 0; g < p->n_groups; g++) {
        tr->group_item0[g] = n;
        for (int i = p->gstart[g]; i < p->gstart[g + 1]; i++) {
            int b = p->order[i];
            for (int t = 0; t + 1 < ex[b].len; t++) {
                float w = ex[b].mask[t + 1];
                if (w == 0.0f)
                    continue;
                tr->item_pos[n] = (int32_t)(tr->ex_off[b] + t);
                tr->item_tgt[n] = ex[b].ids[t + 1];
                if (tr->item_tgt[n] >= tr->m->dims.V_out)
                    return nd_error(ND_EARG,
                                    "example %d, position %d: target token %d has no logit "
                                    "(out_vocab %d)",
                                    b, t + 1, tr->item_tgt[n], tr->m->dims.V_out);
                tr->item_ex[n] = b;
                tr->item_w[n] = w;
                total += w;
                n++;
            }
        }
    }
    tr->group_item0[p->n_groups] = n;
    tr->n_items = n;
    double denom = tr->denom > 0 ? tr->denom : total > 1.0 ? total : 1.0, sum = 0;
    if (grad)
        zero_grads(tr);
    /* micro-batches: as many whole groups as fit the activations; the
     * gradients of the token-weighted mean add up across them */
    int rc = ND_OK;
    tr->n_micro = 0;
    for (int g0 = 0; g0 < p->n_groups && !rc;) {
        int g1 = g0 + 1;
        long rows = nd_pack_group_rows(p, ex, g0, g1);
        while (g1 < p->n_groups) {
            long more = nd_pack_group_rows(p, ex, g1, g1 + 1);
            if (rows + more > tr->acts.cap_rows ||
                tr->group_item0[g1 + 1] - tr->group_item0[g0] > tr->cap_items)
                break;
            rows += more;
            g1++;
        }
        long i0 = tr->group_item0[g0], i1 = tr->group_item0[g1];
        if (rows > tr->acts.cap_rows || i1 - i0 > tr->cap_items)
            return nd_error(ND_EARG,
                            "a prefix group of %ld rows and %ld loss positions exceeds the %ld "
                            "rows and %ld positions sized",
                            rows, i1 - i0, tr->acts.cap_rows, tr->cap_items);
        rc = micro_step(tr, ex, g0, g1, i0, i1, grad, denom, &sum);
        tr->n_micro++;
        g0 = g1;
    }
    nd_backend_sync(tr->be); /* gradients readable on return */
    if (rc)
        return rc;
    *loss = sum / denom;
    if (masked)
        *masked = total;
    if (grad && !isfinite(*loss))
        return nd_error(ND_ENUMERIC, "loss is not finite (%g)", *loss);
    return ND_OK;
}
