/* Cactus-Quants (CQ) weight quantisation as upstream's export writes it
 * (needle/model/quantize.py, export.py):
 *
 *   - a logical [out, in] matrix is cut into groups of `group` (128) along
 *     the input axis, the last one zero-padded;
 *   - each group is rotated by the normalised Walsh-Hadamard matrix
 *     (float32 entries +-1/sqrt(group); each rotated value is the
 *     correctly rounded float32 of the exact product sum: upstream's numpy
 *     float32 matmul rounds per BLAS/CPU, so only near-ties can differ),
 *     its L2 norm (float32, numpy's pairwise order) is stored as FP16 and each unit
 *     coordinate as the index of the nearest Lloyd-Max level of N(0,1)
 *     divided by sqrt(group) (ties go to the lower level);
 *   - indices are packed as one LSB-first bit-stream per row; the blob is
 *     all packed rows followed by all norms.
 *
 * Widths: 2, 3 and 4 bits, and the ternary 1.58-bit form, recorded as
 * bits 5 (CQ_TERNARY), which stores 2-bit crumbs 3, 0, 1 for the levels
 * -c, 0, +c (c = 1.2240064). */
#ifndef ND_CQ_H
#define ND_CQ_H

#include <stddef.h>
#include <stdint.h>

#define CQ_GROUP 128
#define CQ_TERNARY 5 /* record bits of the ternary form */
#define CQ_MAX_LEVELS 16
#define CQ_KV_MAX_LEVELS 128      /* 7-bit KV fake quantisation */
#define CQ_HEADER_CODEBOOK_LEN 28 /* cb2[4] | cb3[8] | cb4[16] */

/* Lloyd-Max levels of N(0, 1) for bits 2, 3, 4, derived exactly as
 * upstream: 400,000 samples of numpy RandomState(0).randn, sorted, 200
 * Lloyd iterations in float64 with numpy's summation order. Computed once
 * per process (thread-safe) into a static table; *levels points into it. */
int cq_lloyd_max(int bits, const double **levels, int *n_levels);

/* upstream _cq_codebook_np(bits, group): the levels / sqrt(group) as
 * float32. bits 2, 3, 4 or CQ_TERNARY. Returns the number of levels
 * (<= CQ_MAX_LEVELS) or a negative ND_E* code. */
int cq_codebook(int bits, int group, float *out);

/* upstream _cq_codebook_np(bits, group) for the KV widths of 3.x's
 * maybe_quant_kv (cq_quantize(x, KV_BITS, group) at KV_BITS 1..7): bits
 * 1 is +-sqrt(2/pi), 2..7 the Lloyd-Max levels of 2^bits (here bits 5 is
 * 32 levels, not CQ_TERNARY). Returns the number of levels (<=
 * CQ_KV_MAX_LEVELS) or a negative ND_E* code. */
int cq_kv_codebook(int bits, int group, float *out);
/* cq_quantize then cq_dequantize of rows x in_dim floats, without a blob,
 * at any of those widths (serial; for bits 2..4 the same values as the
 * blob round trip). */
int cq_kv_roundtrip(const float *w, int64_t rows, int64_t in_dim, int bits, int group, float *out);

/* The header's 28 codebook floats (cb2 | cb3 | cb4) for `group`. */
int cq_header_codebooks(int group, float out[CQ_HEADER_CODEBOOK_LEN]);

/* Index of the nearest level of a sorted codebook, upstream's rule
 * (searchsorted, then |v-left| <= |v-right| picks the left/lower one). */
int cq_nearest_index(float v, const float *cb, int n);

/* 1 if bits is a CQ width we can write (2, 3, 4, CQ_TERNARY). */
int cq_bits_valid(int bits);
/* Input dimension padded up to a multiple of group. */
int64_t cq_in_pad(int64_t in_dim, int group);
/* Packed index bytes per row. */
size_t cq_row_bytes(int64_t in_dim, int bits, int group);
/* Whole blob: packed rows + FP16 norms. 0 if the sizes overflow. */
size_t cq_blob_bytes(int64_t out, int64_t in_dim, int bits, int group);

/* Quantise w ([out, in] row-major float32) into blob (cq_blob_bytes). */
int cq_quantize(const float *w, int64_t out, int64_t in_dim, int bits, int group,
                unsigned char *blob);
/* Inverse: blob of exactly blob_len bytes -> w ([out, in] float32). */
int cq_dequantize(const unsigned char *blob, size_t blob_len, int64_t out, int64_t in_dim, int bits,
                  int group, float *w);

/* Pack / unpack `n` indices (n a multiple of 8) LSB-first at `bits` per
 * index (CQ_TERNARY: trit indices as crumbs 3, 0, 1). */
void cq_pack_indices(const uint8_t *idx, size_t n, int bits, unsigned char *out);
void cq_unpack_indices(const unsigned char *in, size_t n, int bits, uint8_t *idx);

/* ---- mixed precision: config.weight_bits "name=bits,...,default=b" ---- */

/* upstream canonical_tensor_name: "layer03.q_proj" and
 * "stack/layers/block/self_attn/q_proj/kernel" -> "attn.q_proj",
 * "engrams_0/embedding" -> "engram0.tables", ... */
void cq_canonical_name(const char *name, char *out, size_t cap);

typedef struct {
    int n;
    char (*keys)[128]; /* canonical names */
    int *bits;
    int default_bits;
} cq_bits_map;

/* Parse a spec; a default= entry is required; widths must be 2, 3, 4 or
 * 1.58 (stored as CQ_TERNARY). */
int cq_bits_map_parse(const char *spec, cq_bits_map *m);
void cq_bits_map_free(cq_bits_map *m);
/* Width for an export tensor name: the longest key that prefixes the
 * canonical name, else the default. */
int cq_bits_for(const cq_bits_map *m, const char *name);

#endif
