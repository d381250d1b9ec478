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
    unsigned char *blob;
    float *tmp;     /* one [out, in] matrix */
    double seconds; /* spent in nd_qat_apply* (the per-step overhead) */
    long calls;
} nd_qat;

/* The scheme `needle build --bits bits` (0 = no --bits) writes for this
 * model, as build prints it: "W2", or "mixed[map]" for a config map. */
void nd_qat_scheme(const san_model *m, int bits, char *buf, size_t cap);

/* Tensors and widths exactly as `needle build --bits bits` (0 = no
 * --bits) chooses them for this model. */
int nd_qat_init(nd_qat *q, const san_model *m, int bits);
void nd_qat_free(nd_qat *q);

/* dst = Q(src) for listed tensor i; src and dst point at the tensor's
 * first float (its model layout) and may be the same. */
int nd_qat_apply_one(nd_qat *q, int i, const float *src, float *dst);

/* dst_mem = Q(src_mem) over a whole model's mem (model layout), for the
 * listed tensors lying in floats [lo, hi); others are left alone. */
int nd_qat_apply(nd_qat *q, const float *src_mem, float *dst_mem, size_t lo, size_t hi);

#endif
