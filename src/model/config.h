/* Model configuration (the checkpoint's `config` dict) and the geometry
 * derived from it. Field names and defaults follow upstream's
 * TransformerConfig. */
#ifndef ND_CONFIG_H
#define ND_CONFIG_H

#include "io/pickle.h"

#define SAN_MAX_ORDERS 4
#define SAN_MAX_SITES 8
#define SAN_CONV_TAPS 4
#define SAN_ENGRAM_SUB 128
#define SAN_MAX_GLOBAL 64  /* global_layers entries (3.x) */
#define SAN_MAX_CLA 32     /* cla_pairs entries (3.x) */
#define SAN_MAX_QKV_TAPS 8 /* qkv_conv_taps (3.x) */
#define SAN_HADA_COND_RANK 8

/* attention_gate / hada_factor_mode (3.x) */
enum { SAN_GATE_ELEMENTWISE = 0, SAN_GATE_HEADWISE = 1 };
enum { SAN_HADA_SHARED = 0, SAN_HADA_BLOCK_UNTIED = 1 };

typedef struct {
    int vocab_size, d_model, attn_dim, num_heads, num_kv_heads, num_layers;
    int max_seq_len, pad_token_id, contrastive_dim;
    double rope_theta;
    int n_orders, engram_orders[SAN_MAX_ORDERS];
    int engram_heads, engram_slots;
    int n_sites, engram_layers[SAN_MAX_SITES];
    int mhc_lanes, kv_window, kv_bits, act_bits;
    char weight_bits[256];
    char dtype[16];
    int flash, remat, scan_unroll;
    /* Needle 3 (cactus-needle 3.x TransformerConfig); generation 2 leaves
     * them zero. Missing keys of a 3.x config mean "feature off". */
    int generation;              /* 2 or 3 */
    int qk_head_dim, v_head_dim; /* 0: legacy d_model / num_heads */
    int sliding_window;          /* 0: every layer global */
    int n_global, global_layers[SAN_MAX_GLOBAL];
    int qkv_conv_taps; /* 0: no q/k/v convolution */
    int out_vocab;     /* 0: logits over the whole vocabulary */
    int engram_seed_heads;
    int attention_gate;   /* SAN_GATE_* */
    int hada_factor_mode; /* SAN_HADA_* */
    int n_bank_ids, engram_bank_ids[SAN_MAX_SITES];
    int n_cla, cla_pairs[SAN_MAX_CLA][2];
    /* ladder_widths: width slicing is not supported, but a non-empty list
     * switches the Hadamard MLP to split permutations (3.x hada_split) */
    int n_ladder_widths, ladder_widths[8];
    /* probe heads (read and preserved, not trained) */
    int embedding_dim, embedding_probes, embedding_queries;
    int confidence_probes, confidence_queries, router_probes, router_queries;
} san_config;

/* Derived sizes used everywhere. */
typedef struct {
    int d, n, L, H, G, hd, q_dim, kv_dim, V;
    int hada_n;                                                /* next power of two >= d */
    int eng_heads, eng_sub, eng_tables, eng_dilation, eng_dim; /* eng_dim = tables*sub */
    /* Generation 3 (equal to the v2 values for generation 2):
     * hd = qk head dim (q/k norms, RoPE), v_hd = value head dim,
     * q_dim = H*hd, kv_dim = k_dim = G*hd, v_dim = G*v_hd, o_dim = H*v_hd
     * (attention output, out_proj input), gate_dim = o_dim (elementwise)
     * or H (headwise), V_out = logit columns (out_vocab or V). */
    int v_hd, k_dim, v_dim, o_dim, gate_dim, V_out;
    int hada_ba, hada_bb; /* 3.x Hadamard blocks: ba * bb = hada_n */
    int n_banks;          /* engram banks (0: one table set per site) */
} san_dims;

void san_config_default(san_config *c);
/* 3.x TransformerConfig defaults (the released Needle 3 shape). */
void san_config_default3(san_config *c);
/* Named presets: "tiny" (upstream tests/conftest.py), "needle2" (the
 * released base: d 512, 8 heads, 4 kv heads, 27 layers, 4 lanes),
 * "needle3" (3.x defaults: d 768, 12 heads, 2 kv heads, 20 layers, qk 48,
 * v 64, window 1024, conv taps 3, 5 engram sites, context 8192), "tiny3"
 * and "tiny3b" (every 3.x feature at a test size; tiny3b: headwise gate,
 * block_untied factors, out_vocab). */
int san_config_preset(san_config *c, const char *name);
/* Which generation a checkpoint config dict describes: 3 when it has any
 * key that only 3.x's TransformerConfig defines (qk_head_dim, v_head_dim,
 * sliding_window, global_layers, qkv_conv_taps, out_vocab,
 * engram_seed_heads, attention_gate, hada_factor_mode, engram_bank_ids,
 * cla_pairs, embedding_dim/probes/queries, confidence_*, router_*,
 * ladder_*), else 2 (Needle 2 configs carry attn_dim and none of those).
 * A file whose tensors are 3.x's (hadamard_mlp/w1a) is generation 3 even
 * with an empty config: san_config_from_pv_gen(c, dict, 3). */
int san_config_generation(const pv *dict);
/* Read a checkpoint config dict; missing keys keep defaults, unknown keys
 * are ignored, wrong types are an error naming the key. The generation is
 * san_config_generation(dict); 3.x semantics apply for generation 3
 * (TransformerConfig.from_saved: defaults of the dataclass, 3.x-only keys
 * that are missing mean "feature off", its validation rules). */
int san_config_from_pv(san_config *c, const pv *dict);
/* The same with the generation given (2 or 3; 0 = detect). */
int san_config_from_pv_gen(san_config *c, const pv *dict, int generation);
/* 3.x's TransformerConfig.__init__ checks (attention_gate and
 * hada_factor_mode values, bank ids, CLA pairs); errors name the key. Also
 * run by san_config_dims for generation 3. */
int san_config_validate3(const san_config *c);
/* Whether layer l attends through the sliding window (a "local" layer). */
int san_layer_is_local(const san_config *c, int l);
/* The CLA producer whose k/v layer l uses, or -1. */
int san_cla_producer(const san_config *c, int l);
/* Whether layer l produces k/v for a consumer. */
int san_cla_is_producer(const san_config *c, int l);
/* Build the dict upstream writes (dict(vars(TransformerConfig))). */
pv *san_config_to_pv(const san_config *c);
/* Check consistency (divisibility, ranges) and fill the derived dims. */
int san_config_dims(const san_config *c, san_dims *dims);
/* upstream effective_kv_window (architecture.py). */
int san_effective_kv_window(const san_config *c);

#endif
