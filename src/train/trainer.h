/* One training step's numerics: merge the adapter, forward, masked
 * token-weighted cross-entropy (SPEC §2), backward into the adapter (and/or
 * full) gradients. Buffers are sized once for a fixed (B, T). */
#ifndef ND_TRAINER_H
#define ND_TRAINER_H

#include "model/lora.h"
#include "model/san_backward.h"

typedef struct {
    const san_model *m;
    const nd_backend *be;
    int B, T;
    int kept_layers;   /* 1: activations of every layer kept; 0: recomputed */
    san_acts acts;
    san_grad_acts gacts;
    san_lora *lora;    /* may be NULL */
    float *lora_g;     /* lora->numel */
    float *merged;     /* merged projection weights */
    san_weights w;     /* effective weights for the forward */
    float *full_g;     /* m->numel when full gradients are on */
    san_weights gw;
    float *row_loss, *row_w;
    int32_t *tgt;
} nd_trainer;

int nd_trainer_create(nd_trainer *tr, const san_model *m, const nd_backend *be, san_lora *lora,
                      int B, int T, int full_grads);
void nd_trainer_free(nd_trainer *tr);
/* Recompute the effective weights after the adapter changed. */
void nd_trainer_merge(nd_trainer *tr);
/* Loss of B rows of T ids with loss mask (row-major [B, T]); rows beyond
 * `rows` are ignored (treated as fully masked). With `grad`, gradients are
 * SET into tr->lora_g / tr->full_g. *masked returns the number of
 * predicted positions that counted. */
int nd_trainer_step(nd_trainer *tr, const int32_t *ids, const float *mask, int rows, int grad,
                    double *loss, double *masked);

#endif
