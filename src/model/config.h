/* Model configuration (the checkpoint's `config` dict) and the geometry
 * derived from it. Field names and defaults follow upstream's
 * TransformerConfig. */
#ifndef ND_CONFIG_H
#define ND_CONFIG_H

#include "io/pickle.h"

#define SAN_MAX_ORDERS 4
#define SAN_MAX_SITES 4
#define SAN_CONV_TAPS 4
#define SAN_ENGRAM_SUB 128

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
} san_config;

/* Derived sizes used everywhere. */
typedef struct {
    int d, n, L, H, G, hd, q_dim, kv_dim, V;
    int hada_n;                   /* next power of two >= d */
    int eng_heads, eng_sub, eng_tables, eng_dilation, eng_dim; /* eng_dim = tables*sub */
} san_dims;

void san_config_default(san_config *c);
/* Named presets: "tiny" (upstream tests/conftest.py) and "needle2" (the
 * released base: d 512, 8 heads, 4 kv heads, 27 layers, 4 lanes). */
int san_config_preset(san_config *c, const char *name);
/* Read a checkpoint config dict; missing keys keep defaults, unknown keys
 * are ignored, wrong types are an error naming the key. */
int san_config_from_pv(san_config *c, const pv *dict);
/* Build the dict upstream writes (dict(vars(TransformerConfig))). */
pv *san_config_to_pv(const san_config *c);
/* Check consistency (divisibility, ranges) and fill the derived dims. */
int san_config_dims(const san_config *c, san_dims *dims);
/* upstream effective_kv_window (architecture.py). */
int san_effective_kv_window(const san_config *c);

#endif
