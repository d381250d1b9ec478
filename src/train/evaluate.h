/* Masked next-token loss of a dataset exactly as upstream's loss_fn over
 * all examples as one batch (sum of masked CE / masked positions), with
 * per-example numbers and, optionally, the gradient of that loss with
 * respect to the adapter. */
#ifndef ND_EVALUATE_H
#define ND_EVALUATE_H

#include <stddef.h>
#include <stdint.h>

#include "train/batch.h"

typedef struct {
    size_t n;          /* examples */
    double *loss_sum;  /* per example: summed CE over its masked positions */
    double *positions; /* per example: masked positions */
    double total_loss, total_positions;
    float *lora_grad; /* d(mean loss)/d(A, B) when requested (lora->numel) */
} nd_masked_eval;

/* Every example of the batcher's token set, bt->B at a time (in the
 * batcher's mode: padded, packed or shared prefixes). */
int nd_eval_masked(nd_batcher *bt, int want_grad, nd_masked_eval *out);
void nd_masked_eval_free(nd_masked_eval *e);

#endif
