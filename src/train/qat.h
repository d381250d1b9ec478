/* Quantisation-aware training (needle finetune --qat): the weights the
 * training forward uses go through exactly the numerics `needle build`
 * applies to them, Q = CQ quantise -> dequantise for the matrices it
 * stores as CQ and FP16 rounding for the ones it stores as FP16, so the
 * archive's weights are the ones the fine-tune was trained at. The
 * backward treats Q as the identity (straight-through gradients). */
#ifndef ND_QAT_H
#define ND_QAT_H

#include <stddef.h>

#include "io/cact.h"
#include "model/params.h"

typedef struct {
    cact_model_tensor *t; /* what build exports from the model, in order */
    int n;
    int bits;         /* --bits; 0 = the config's weight_bits map, else 4 */
    char scheme[300]; /* as build prints it: "W2" or "mixed[map]" */
    double seconds;   /* spent requantising in training (nd_trainer_merge) */
    long calls;
} nd_qat;

/* The scheme `needle build --bits bits` (0 = no --bits) writes for this
 * model, as build prints it: "W2", or "mixed[map]" for a config map. */
void nd_qat_scheme(const san_model *m, int bits, char *buf, size_t cap);

/* Tensors and widths exactly as `needle build --bits bits` (0 = no
 * --bits) chooses them for this model. */
int nd_qat_init(nd_qat *q, const san_model *m, int bits);
void nd_qat_free(nd_qat *q);

/* dst[k] = Q(src[k]) for the listed tensors sel[0..count); src[k] and
 * dst[k] point at tensor sel[k]'s first float (its model layout) and may
 * be the same. One parallel loop over row blocks of all of them (a CQ row
 * is quantised on its own, so blocks give build's values bit for bit). */
int nd_qat_run(const nd_qat *q, const int *sel, int count, const float *const *src,
               float *const *dst);

/* The same for one listed tensor. */
int nd_qat_apply_one(const nd_qat *q, int i, const float *src, float *dst);

/* dst_mem = Q(src_mem) over a whole model's mem (model layout), for the
 * listed tensors lying in floats [lo, hi); others are left alone. */
int nd_qat_apply(const nd_qat *q, const float *src_mem, float *dst_mem, size_t lo, size_t hi);

#endif
