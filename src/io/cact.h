/* The .cact deployment archive (upstream needle/model/export.py), writer
 * and validating reader.
 *
 * Layout, little-endian: a 120-byte header (29 u32 geometry fields and
 * rope_theta as f32), codebook_len float32 codebook levels (cb2 | cb3 |
 * cb4), a directory of 44-byte records (u8 dtype, u8 ndim, u16 0,
 * u32 shape[4], u64 offset, u64 nbytes, u32 group, u32 bits) and the
 * tensor blobs at 64-byte aligned offsets. Tensors are nameless and
 * positional: embedding; per layer norm_in, q, k, v, q_norm, k_norm, gate,
 * out, post_norm, attn_gate, pre_hada, d1, d2, d3; the six mHC gains and
 * biases (FP16) and three mHC phi matrices (CQ); per engram site tables,
 * key_proj, value_proj (CQ) and taps; final_norm; optional probe heads
 * (heads.manifest, then probes, proj, bias per head); the RAW tokenizer
 * blob last. Matrices are CQ (model/cq.h), stored [out, in]. */
#ifndef ND_CACT_H
#define ND_CACT_H

#include <stddef.h>
#include <stdint.h>

#include "io/pickle.h"
#include "model/params.h"

#define CACT_TAG 0x05E12A83u
#define CACT_HEADER_SIZE 120
/* Needle 3 (cactus-needle 3.x export.py): tag 0x05E12A84 and a 196-byte
 * header (48 u32 fields and rope_theta as f32, struct "<48If"); the
 * codebooks, the 44-byte records and the 64-byte alignment are v2's. */
#define CACT3_TAG 0x05E12A84u
#define CACT3_HEADER_SIZE 196
#define CACT3_MAX_SITES 16
#define CACT3_HEAD_BITS 4 /* quantize.py HEAD_BITS: probe-head matrices */
#define CACT_REC_SIZE 44
#define CACT_ALIGN 64

enum { CACT_FP16 = 1, CACT_FP32 = 2, CACT_CQ = 3, CACT_RAW = 4 };

typedef struct {
    uint32_t tag, num_tensors, codebook_len, kv_window, kv_bits;
    uint32_t vocab, d_model, num_heads, num_kv_heads, num_layers, head_dim, max_seq_len;
    uint32_t hada_n, mhc_lanes, engram_slots, engram_sub_dim, num_engram_tables;
    uint32_t engram_conv_taps, engram_conv_dilation;
    uint32_t num_engram_orders, engram_orders[4];
    uint32_t num_engram_sites, engram_sites[4];
    float rope_theta;
} cact_header;

/* The v3 header, fields in file order (offset = 4 * position). */
typedef struct {
    uint32_t tag, num_tensors, codebook_len, kv_window, kv_bits;
    uint32_t vocab, out_vocab, d_model, num_heads, num_kv_heads, num_layers;
    uint32_t qk_head_dim, v_head_dim, max_seq_len, hada_n, mhc_lanes;
    uint32_t sliding_window, global_mask_lo, global_mask_hi, qkv_conv_taps;
    uint32_t engram_slots, engram_sub_dim, num_engram_tables, engram_conv_taps;
    uint32_t engram_conv_dilation, engram_seed_heads;
    uint32_t num_engram_orders, engram_orders[4];
    uint32_t num_engram_sites, engram_sites[CACT3_MAX_SITES];
    float rope_theta;
} cact_header3;

/* Pack / unpack the v3 header (CACT3_HEADER_SIZE bytes). */
void cact3_encode_header(const cact_header3 *h, unsigned char *b);
void cact3_decode_header(const unsigned char *b, cact_header3 *h);

typedef struct {
    uint8_t dtype, ndim;
    uint16_t pad;
    uint32_t shape[4];
    uint64_t offset, nbytes;
    uint32_t group, bits;
    char name[64]; /* not stored: export name derived from the position */
} cact_tensor;

/* ---- writing ---- */

typedef struct {
    int bits;              /* 2, 3, 4 or CQ_TERNARY, used when bits_map is NULL/"" */
    const char *bits_map;  /* "name=bits,...,default=b" (config.weight_bits) */
    int group;             /* 0 = 128 */
    int kv_window;         /* header kv_window (san_effective_kv_window; v3:
                              cact3_effective_kv_window) */
    const void *tokenizer; /* RAW tokenizer blob written last; NULL = none */
    size_t tokenizer_len;
} cact_write_opts;

typedef struct {
    uint64_t bytes;
    int num_tensors;
} cact_write_info;

/* Export `m`. `params` is the checkpoint's params dict (for the probe
 * heads contrastive_head / confidence_head, written when present); NULL
 * means no heads. A generation-3 model is written as the v3 archive
 * (tag 0x05E12A84, export.py of cactus-needle 3.x): its probe heads are
 * embedding_head, confidence_head and router_head (CQ at CACT3_HEAD_BITS),
 * the Hadamard permutations are stored as FP32 tables, bits_map is not
 * used (3.x has none) and `bits` is 2, 3 or 4 (3.x writes 4 only). */
int cact_write_file(const char *path, const san_model *m, const pv *params,
                    const cact_write_opts *o, cact_write_info *info);
/* Same into a malloc'd buffer. */
int cact_write_mem(const san_model *m, const pv *params, const cact_write_opts *o,
                   unsigned char **buf, size_t *len, cact_write_info *info);

/* The model tensors `needle build` exports with options `o` (bits,
 * bits_map, group), in archive order, without the probe heads and the
 * tokenizer: what quantisation-aware training must round (train/qat.h).
 * *list is malloc'd. */
enum { CACT_SRC_FP16, CACT_SRC_DIRECT, CACT_SRC_KERNEL, CACT_SRC_PHI };
typedef struct {
    char name[64];
    int src;              /* CACT_SRC_*: how the [out, in] matrix is read */
    size_t offset, numel; /* floats into the model's mem */
    int64_t a, b, c;      /* source geometry (KERNEL: in, out; PHI: L, nC, lanes) */
    int64_t out, in;      /* the CQ matrix */
    int bits, group;
} cact_model_tensor;
int cact_model_tensors(const san_model *m, const cact_write_opts *o, cact_model_tensor **list,
                       int *n);

/* 3.x architecture.py effective_kv_window (kv_budget_window with the
 * sliding-window rule), the kv_window 3.x's build writes. */
int cact3_effective_kv_window(const san_config *c);

/* ---- reading ---- */

typedef struct {
    const unsigned char *data; /* the whole file (owned when read from disk) */
    size_t len;
    unsigned char *owned;
    void *map; /* read-only file mapping (cact_map_file) */
    size_t map_len;
    int map_fd; /* the mapped file, kept open (for pread) when has_fd */
    int has_fd;
    int generation;  /* 2 (tag 0x05E12A83) or 3 (tag 0x05E12A84) */
    cact_header hdr; /* v2's header; for v3 only tag, num_tensors,
                        codebook_len, kv_window, kv_bits and vocab are set */
    cact_header3 h3; /* generation 3: the whole header */
    float *codebook; /* hdr.codebook_len floats */
    cact_tensor *t;  /* hdr.num_tensors records */
} cact_file;

/* Validate and index an archive held in memory (borrowed; must outlive f).
 * Every count, offset and size is checked against len first. */
int cact_parse(const void *buf, size_t len, cact_file *f);
int cact_read_file(const char *path, cact_file *f);
/* Map the file read-only and shared (processes loading one archive share
 * its pages); falls back to reading it when it cannot be mapped. A mapped
 * file's descriptor stays open (map_fd) until cact_free. */
int cact_map_file(const char *path, cact_file *f);
/* Parse a private copy of buf (for callers whose buffer may go away). */
int cact_own_copy(const void *buf, size_t len, cact_file *f);
void cact_free(cact_file *f);

/* v3 layout facts the reader derives from the header: tensors per layer
 * (24, or 27 with qkv conv taps), the index of final_norm, and the index
 * of the first probe-head tensor (heads.manifest) or -1 without heads. */
typedef struct {
    uint32_t per_layer, first_mhc, first_perm, first_engram, final_norm;
    int64_t manifest; /* -1: no heads */
    int tokenizer;    /* 1 when the last tensor is the RAW tokenizer */
} cact3_layout;
int cact3_layout_of(const cact_file *f, cact3_layout *lay);

/* Index of a tensor by export name ("layer00.q_proj") or "#N", or -1. */
int cact_find(const cact_file *f, const char *name);
const char *cact_dtype_name(int dtype);
/* Logical element count (CQ: out*in; RAW: bytes). */
uint64_t cact_numel(const cact_tensor *t);
/* FP16 / FP32 / CQ tensor -> malloc'd float32 (*n elements). */
int cact_dequant(const cact_file *f, int index, float **out, size_t *n);

#endif
