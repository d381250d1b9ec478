/* One training step's numerics: merge the adapter, forward, masked
 * token-weighted cross-entropy (docs/model.md §4.1), backward into the adapter (and/or
 * full) gradients. Buffers are sized once for a fixed (B, T). */
#ifndef ND_TRAINER_H
#define ND_TRAINER_H

#include "model/lora.h"
#include "model/san_backward.h"
#include "train/pack.h"
#include "train/qat.h"

typedef struct {
    const san_model *m;
    const nd_backend *be;
    int B, T;
    int kept_layers; /* layers whose activations are kept (the rest recomputed) */
    int lane_every;  /* every lane_every-th layer's input lanes saved (san_acts) */
    long logit_rows; /* logits (and the loss) are taken this many rows at a time */
    san_acts acts;
    san_grad_acts gacts;
    san_lora *lora; /* may be NULL */
    float *lora_g;  /* lora->numel, in the backend's memory (nd_backend_download) */
    float *merged;  /* merged projection weights */
    nd_qat *qat;    /* --qat: the forward sees Q(weights) (train/qat.h) */
    float *qmem;    /* --qat / Needle 3 numerics: the quantised model, m->numel floats */
    /* Needle 3 training numerics (nd_trainer_set_quant3): the forward's
     * activations through fq3 (acts.quant), the weights cq_ste'd into qmem */
    int quant3;
    nd_fq3_numerics fq3;
    double quant3_seconds;
    long quant3_calls;
    int full;      /* gradients for every base tensor */
    san_weights w; /* effective weights for the forward */
    float *full_g; /* m->numel when full gradients are on */
    san_weights gw;
    float *row_loss, *row_w, *row_g;
    /* the losses where the host reads them after a step: row_loss and
     * item_loss themselves when the host can reach the backend's memory
     * (be->host_mem), else host copies downloaded at the end of each step */
    float *row_loss_h, *item_loss_h;
    int32_t *tgt;
    /* packed mode (nd_trainer_create_packed) */
    int packed;
    int share;            /* share common prefixes (default 1) */
    long cap_items;       /* most loss positions in one micro-batch (logits rows) */
    long cap_batch_items; /* most loss positions in one batch */
    int n_micro;          /* micro-batches the last batch ran as */
    nd_pack_plan plan;
    int32_t *ptok;   /* packed tokens [cap rows] */
    int32_t *row_of; /* each example position's row [cap rows] */
    long n_items;    /* loss positions of the last batch: */
    int32_t *item_row, *item_tgt, *item_ex, *item_pos;
    float *item_w, *item_loss, *item_g;
    long *ex_off, *group_item0;
    /* > 0: the loss and gradients are divided by this instead of the
     * batch's own loss weight (a rank's share of a batch, divided as the
     * whole batch is, so the ranks' gradients add up to the batch's) */
    double denom;
} nd_trainer;

/* Logits are taken ND_LOGIT_SLICE_MB of them at a time (rows * V_out
 * floats); the environment's NEEDLE_LOGIT_ROWS sets the rows instead. */
#define ND_LOGIT_SLICE_MB 64.0

/* act_budget_mb: memory for kept layer activations. When every layer's
 * fit, all are kept (the lane states come on top). Otherwise it holds the
 * saved lane states first (every layer's if they fit, else every k-th
 * layer's, the rest recomputed a segment at a time in the backward), then
 * as many layers' activations as fit, the rest recomputed layer by layer
 * in the backward. < 0: 3072. The environment's NEEDLE_ACT_BUDGET_MB
 * overrides it, NEEDLE_LANE_EVERY forces k. */
int nd_trainer_create(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                      int B, int T, int full_grads, double act_budget_mb);
void nd_trainer_free(nd_trainer *tr);
/* Packed mode: batches of up to max_examples examples of their own
 * lengths (no padding), common prefixes run once, logits only where the
 * loss is. A batch runs as micro-batches of whole prefix groups of at most
 * cap_rows rows and cap_items loss positions (the gradients add up);
 * max_pos: the longest example; cap_batch_items: the most loss positions
 * in a batch. */
int nd_trainer_create_packed(nd_trainer *tr, const san_model *m, const nd_backend *be,
                             san_lora *lora, int max_examples, long cap_rows, int max_pos,
                             long cap_items, long cap_batch_items, int full_grads,
                             double act_budget_mb);
/* Recompute the effective weights after the adapter (or, with --qat and
 * full gradients, the base weights) changed. */
int nd_trainer_merge(nd_trainer *tr);
/* Quantisation-aware training: from now on the forward (and so the
 * backward) uses Q(weights) at `bits` (0: the config's weight_bits map,
 * else 4), exactly what `needle build` writes; gradients pass straight
 * through Q to the adapter or the base weights. */
int nd_trainer_set_qat(nd_trainer *tr, int bits);
/* Needle 3 training numerics (model/fake_quant.h, 3.x finetune's loss):
 * from now on the forward runs 3.x's quant=True numerics (act_bits and
 * kv_bits from the config, 8-bit q) on cq_ste(merged weights, 4 bits,
 * group 128); the backward passes gradients straight through every
 * quantiser. Refused on a Needle 2 model and together with --qat. */
int nd_trainer_set_quant3(nd_trainer *tr);
/* Loss of B rows of T ids with loss mask (row-major [B, T]); rows beyond
 * `rows` are ignored (treated as fully masked). With `grad`, gradients are
 * SET into tr->lora_g / tr->full_g. *masked returns the number of
 * predicted positions that counted. */
int nd_trainer_step(nd_trainer *tr, const int32_t *ids, const float *mask, int rows, int grad,
                    double *loss, double *masked);
/* The same for `count` examples in packed mode (the loss is the same
 * token-weighted mean). Per-position losses land in item_loss (item_ex
 * says whose); tr->plan says how the batch was packed. */
int nd_trainer_step_examples(nd_trainer *tr, const nd_seq_example *ex, int count, int grad,
                             double *loss, double *masked);

#endif
