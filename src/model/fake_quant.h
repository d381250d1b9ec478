/* Needle 3 training numerics: the fake quantisation upstream's 3.x
 * fine-tune runs its forward through (needle/model/quantize.py 3.0.x).
 *
 * Upstream's loss (finetune.py loss_fn) is
 *
 *   configure_deploy(act_bits = config.act_bits, kv_bits = config.kv_bits)
 *   merged = cq_ste_params(merge_lora(params, lora, scale), WEIGHT_BITS = 4)
 *   logits = model.apply({"params": merged}, ids, quant=True)
 *
 * so every CQ-stored weight is trained at its 4-bit CQ value, and the
 * activations at the deployed A8 / KV widths. Every function here is the
 * forward value of one of those quantisers; all of them are written
 * `x + stop_gradient(Q(x) - x)`, so
 *
 *   forward  y = x + (Q(x) - x)   (two float32 roundings, as written; for
 *                                  finite fake_quant this equals Q(x) in
 *                                  value (Sterbenz: Q(x) - x is exact) but
 *                                  gives +0 where Q(x) is -0; for CQ it
 *                                  differs from Q(x) in the last bit of
 *                                  about 3% of the weights)
 *   backward dx = dy              (straight through: no clipping mask, no
 *                                  gradient through the scale or the norms)
 *
 * All arithmetic is IEEE float32 with round-to-nearest-even and no
 * contraction (a*b+c is never fused), element by element as upstream
 * writes it; for 3.x's CPU JAX/XLA these elementwise steps are exact
 * float32 operations too. Where 3.x sums (the CQ rotations and norms), see
 * model/cq.h for the order we use; fake_quant and its absmax involve no sum.
 *
 * Where each call goes in the 3.x forward (architecture.py, quant=True):
 *   _aq(x) = fake_quant_act:  the engram lookup e (B, T, K*sub) before
 *     key_proj/value_proj (once per bank in bank mode); the attention input
 *     (after ZCRMSNorm_0; feeds q/k/v_proj and gate_proj); the gated
 *     attention output before out_proj; the mHC coefficient input
 *     nx = _rms_unit(stream (B, T, lanes*d)) before phi_pre/post/res; the
 *     final hidden (after final_norm, before the tied head).
 *   maybe_quant_query: q per head (B, H, T, qk) after q_norm and RoPE.
 *   maybe_quant_kv: k per head after k_norm and RoPE, v per head after
 *     its conv taps; with cla_pairs the consumer reuses the producer's
 *     quantised k, v.
 *   cq_ste_params: the parameter tree after the LoRA merge (see
 *     nd_fq3_leaf_rule for which leaves).
 * quant=False (our --no-qat) skips all of these: the float forward. */
#ifndef ND_FAKE_QUANT_H
#define ND_FAKE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"

/* configure_deploy's globals as finetune sets them. */
typedef struct {
    int act_bits;    /* ACT_BITS = config.act_bits (3.x default 8) */
    int kv_bits;     /* KV_BITS = config.kv_bits (3.x default 8) */
    int kv_group;    /* _KV_GROUP: configure_deploy's default 64 */
    int weight_bits; /* WEIGHT_BITS = 4 (fixed in 3.x, not the config map) */
} nd_fq3_numerics;

/* 3.x's defaults: act 8, kv 8, kv group 64, weight 4. */
void nd_fq3_defaults(nd_fq3_numerics *n);

/* ND_EARG (message names the config field) for widths 3.x cannot train
 * at or we do not implement: act_bits outside [2, 16] (3.x's fake_quant
 * at act_bits 0 maps a row to its absmax, at 1 to NaN), kv_bits negative
 * (0 is off, 1..7 CQ at that width as 3.x's maybe_quant_kv, >= 8 int8),
 * kv_group not a power of two in [8, 4096], weight_bits not 2, 3, 4. */
int nd_fq3_validate(const nd_fq3_numerics *n);

/* quantize.fake_quant(x, group_size = dim, bits) on `rows` rows of `dim`
 * contiguous floats (group = the whole row, so no padding):
 *
 *   qmax   = 2^(bits-1) - 1
 *   absmax = max_i |x_i|            (NaN if any x_i is NaN: jnp.max)
 *   scale  = absmax > 0 ? absmax / qmax : 1       (float32 division)
 *   q_i    = clip(round_half_even(x_i / scale), -qmax - 1, qmax) * scale
 *   y_i    = x_i + (q_i - x_i)
 *
 * An all-zero row gives zeros. Clipping is reached only when the scale
 * underflows (absmax subnormal, scale 0: x/0 = +-inf clips to qmax or
 * -qmax - 1, 0/0 stays NaN) or absmax is NaN (scale 1). y may equal x.
 * bits in [2, 16]; rows >= 0, dim >= 1. Parallel over rows. */
int nd_fq3_fake_quant(const float *x, float *y, int64_t rows, int64_t dim, int bits);

/* architecture._aq(x, quant=True) = quantize.fake_quant_act(x) =
 * fake_quant(x, x.shape[-1], ACT_BITS): one group per row of `dim`. */
int nd_fq3_act(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows, int64_t dim);

/* quantize.maybe_quant_query(q, True): ACT_BITS == 0 -> y = x; else
 * a8_fake_quant_kv = fake_quant(q, head_dim, 8) (8 bits whatever
 * ACT_BITS is): one group per head vector. */
int nd_fq3_query(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows,
                 int64_t head_dim);

/* quantize.maybe_quant_kv(x, True): KV_BITS == 0 -> y = x; KV_BITS >= 8
 * -> fake_quant(x, head_dim, 8) per head vector; else
 * cq_fake_quant_kv(x, KV_BITS, _KV_GROUP) = x + (cq_quantize(x, KV_BITS,
 * kv_group) - x) along the head vector (zero-padded to a multiple of
 * kv_group: qk_head_dim 48 is one padded group of 64). KV_BITS 1..7 all
 * run (3.x's codebook: +-sqrt(2/pi) at 1 bit, Lloyd-Max of 2^bits levels
 * otherwise), though 3.x exports only 2/3/4 or 8 for the engine. */
int nd_fq3_kv(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows, int64_t head_dim);

/* quantize.cq_ste(w, bits, group) on `rows` rows of `in_dim` (the
 * reduction axis last): y = w + (cq_quantize(w) - w), where cq_quantize is
 * model/cq.c's quantise -> dequantise (the same CQ as Needle 2 and 3.x's
 * export: groups along the row, zero-padded, Walsh rotation, L2 norm
 * stored as FP16, unit coordinates to the nearest Lloyd-Max level of
 * N(0,1)/sqrt(group), ties to the lower level; dequant = (level * norm16)
 * @ H). bits 1..7 (the KV widths, cq_kv_codebook; 2, 3, 4 are the
 * weight widths); y may equal w. Parallel over row blocks. */
int nd_fq3_cq_ste_rows(const float *w, float *y, int64_t rows, int64_t in_dim, int bits, int group);

/* The leaf rule of quantize._is_quant_leaf / _reduces_second_last for a
 * flax path ("stack/layers/block/self_attn/q_proj/kernel"): the last path
 * component is "kernel" or "embedding" or starts with "mhc_phi", and
 * ndim >= 2. Kernels and mhc_phi reduce along their second-last axis
 * (their input axis; 3.x swaps the last two axes, quantises, swaps back),
 * embeddings (token embedding, engram tables) along the last axis. In a
 * 3.x model that selects: embedding/embedding, q/k/v/gate/out_proj
 * kernels, mhc_phi_pre/post/res, engram tables and key/value_proj
 * kernels, and the probe heads' proj/kernel (unused by the LM loss).
 * Norm scales, conv taps, attn_gate, the Hadamard MLP's factors, d*, b2,
 * cond_* and the heads' probes/query stay float (3.x stores most of them
 * FP16 but does not round them in training). */
enum { ND_FQ3_LEAF_FLOAT = 0, ND_FQ3_LEAF_LAST = 1, ND_FQ3_LEAF_SECOND_LAST = 2 };
int nd_fq3_leaf_rule(const char *path, int ndim);

/* quantize.cq_ste_params for one leaf of shape shape[0..ndim): by
 * nd_fq3_leaf_rule, cq_ste along its reduction axis at `bits`, group
 * `group` (3.x: WEIGHT_BITS 4, CQ_GROUP_SIZE 128), leading axes (the
 * scanned layer axis, engram tables) independent; a float leaf is copied
 * (y == w: untouched). Returns the rule (>= 0) or a negative ND_E* code.
 * Not implemented: 3.x's optional params["ab_scales"] sandwich
 * (w -> a * Q(b * w)); a checkpoint with ab_scales must be refused by the
 * caller. */
int nd_fq3_cq_ste_leaf(const char *path, const int64_t *shape, int ndim, const float *w, float *y,
                       int bits, int group);

/* The backward of every function above (straight through): dx = dy, or
 * dx += dy with accumulate. dx may equal dy when not accumulating. */
void nd_fq3_ste_backward(const float *dy, float *dx, size_t n, int accumulate);

/* cq_ste_params over a whole model (model/params.h): dst_mem = every
 * tensor of m through nd_fq3_cq_ste_leaf (by its flax path and shape) at
 * n->weight_bits, group 128 (3.x CQ_GROUP_SIZE), from src_mem (both in
 * m's layout, m->numel floats; they may be the same). */
int nd_fq3_model_weights(const san_model *m, const nd_fq3_numerics *n, const float *src_mem,
                         float *dst_mem);

#define ND_FQ3_WEIGHT_GROUP 128

#endif
