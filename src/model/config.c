#include "model/config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"

void san_config_default(san_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 8192;
    c->d_model = 512;
    c->attn_dim = 0;
    c->num_heads = 8;
    c->num_kv_heads = 4;
    c->num_layers = 12;
    c->max_seq_len = 2048;
    c->pad_token_id = 0;
    c->contrastive_dim = 128;
    c->rope_theta = 100000.0;
    strcpy(c->dtype, "bfloat16");
    c->flash = 1;
    c->n_orders = 2;
    c->engram_orders[0] = 2;
    c->engram_orders[1] = 3;
    c->engram_heads = 0;
    c->engram_slots = 8192;
    c->n_sites = 2;
    c->engram_layers[0] = 2;
    c->engram_layers[1] = 15;
    c->mhc_lanes = 4;
    c->kv_window = 0;
    c->kv_bits = 8;
    c->act_bits = 8;
    c->weight_bits[0] = 0;
    c->remat = 1;
    c->scan_unroll = 1;
}

int san_config_preset(san_config *c, const char *name)
{
    san_config_default(c);
    if (!strcmp(name, "tiny")) {
        c->vocab_size = 8192;
        c->d_model = 64;
        c->num_heads = 4;
        c->num_kv_heads = 2;
        c->num_layers = 2;
        c->max_seq_len = 128;
        c->n_sites = 1;
        c->engram_layers[0] = 1;
        c->engram_slots = 64;
        c->mhc_lanes = 2;
        c->flash = 0;
    } else if (!strcmp(name, "needle2")) {
        c->d_model = 512;
        c->num_heads = 8;
        c->num_kv_heads = 4;
        c->num_layers = 27;
        c->n_sites = 2;
        c->engram_layers[0] = 2;
        c->engram_layers[1] = 15;
    } else {
        return nd_error(ND_EARG, "unknown preset '%s' (known: tiny, needle2)", name);
    }
    c->attn_dim = c->d_model;
    return ND_OK;
}

static int get_int(const pv *v, const char *key, int lo, int hi, int *out)
{
    int64_t x;
    if (v->kind == PV_INT)
        x = v->u.i;
    else if (v->kind == PV_BOOL)
        x = v->u.b;
    else if (v->kind == PV_FLOAT && v->u.f == (double)(int64_t)v->u.f)
        x = (int64_t)v->u.f;
    else
        return nd_error(ND_EFORMAT, "config['%s']: expected an integer", key);
    if (x < lo || x > hi)
        return nd_error(ND_ELIMIT, "config['%s'] = %lld is outside [%d, %d]", key, (long long)x,
                        lo, hi);
    *out = (int)x;
    return ND_OK;
}

static int get_int_seq(const pv *v, const char *key, int max, int lo, int hi, int *out, int *n)
{
    if (v->kind != PV_LIST && v->kind != PV_TUPLE)
        return nd_error(ND_EFORMAT, "config['%s']: expected a tuple or list of integers", key);
    if (v->u.seq.n > (size_t)max)
        return nd_error(ND_ELIMIT, "config['%s']: %zu entries, at most %d supported", key,
                        v->u.seq.n, max);
    for (size_t i = 0; i < v->u.seq.n; i++) {
        int rc = get_int(v->u.seq.items[i], key, lo, hi, &out[i]);
        if (rc)
            return rc;
    }
    *n = (int)v->u.seq.n;
    return ND_OK;
}

int san_config_from_pv(san_config *c, const pv *dict)
{
    san_config_default(c);
    if (!dict || dict->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "config: expected a dict");
    static const struct {
        const char *key;
        size_t off;
        int lo, hi;
    } ints[] = {
#define F(name, lo, hi) {#name, offsetof(san_config, name), lo, hi}
        F(vocab_size, 1, 1 << 24),   F(d_model, 1, 1 << 16),     F(attn_dim, 0, 1 << 16),
        F(num_heads, 1, 4096),       F(num_kv_heads, 1, 4096),   F(num_layers, 1, 4096),
        F(max_seq_len, 1, 1 << 24),  F(pad_token_id, 0, 1 << 24), F(contrastive_dim, 0, 1 << 16),
        F(engram_heads, 0, 4096),    F(engram_slots, 1, 1 << 28), F(mhc_lanes, 1, 64),
        F(kv_window, 0, 1 << 24),    F(kv_bits, 0, 64),          F(act_bits, 0, 64),
        F(flash, 0, 1),              F(remat, 0, 1),             F(scan_unroll, 0, 1 << 20),
#undef F
    };
    for (size_t i = 0; i < dict->u.dict.n; i++) {
        const pv *k = dict->u.dict.keys[i], *v = dict->u.dict.vals[i];
        if (k->kind != PV_STR)
            continue;
        const char *key = k->u.str.s;
        int rc = ND_OK, done = 0;
        for (size_t j = 0; j < sizeof ints / sizeof ints[0]; j++)
            if (!strcmp(key, ints[j].key)) {
                rc = get_int(v, key, ints[j].lo, ints[j].hi, (int *)((char *)c + ints[j].off));
                done = 1;
                break;
            }
        if (done) {
            if (rc)
                return rc;
            continue;
        }
        if (!strcmp(key, "rope_theta")) {
            if (v->kind == PV_FLOAT)
                c->rope_theta = v->u.f;
            else if (v->kind == PV_INT)
                c->rope_theta = (double)v->u.i;
            else
                return nd_error(ND_EFORMAT, "config['rope_theta']: expected a number");
            if (!(c->rope_theta > 1.0))
                return nd_error(ND_ELIMIT, "config['rope_theta'] must be > 1");
        } else if (!strcmp(key, "engram_orders")) {
            rc = get_int_seq(v, key, SAN_MAX_ORDERS, 1, 64, c->engram_orders, &c->n_orders);
        } else if (!strcmp(key, "engram_layers")) {
            rc = get_int_seq(v, key, SAN_MAX_SITES, 0, 4095, c->engram_layers, &c->n_sites);
        } else if (!strcmp(key, "weight_bits") || !strcmp(key, "dtype")) {
            char *dst = key[0] == 'w' ? c->weight_bits : c->dtype;
            size_t cap = key[0] == 'w' ? sizeof c->weight_bits : sizeof c->dtype;
            if (v->kind == PV_NONE) {
                dst[0] = 0;
            } else if (v->kind != PV_STR || v->u.str.len >= cap) {
                return nd_error(ND_EFORMAT, "config['%s']: expected a string under %zu bytes", key,
                                cap);
            } else {
                memcpy(dst, v->u.str.s, v->u.str.len + 1);
            }
        }
        if (rc)
            return rc;
    }
    if (!c->attn_dim)
        c->attn_dim = c->d_model;
    return ND_OK;
}

pv *san_config_to_pv(const san_config *c)
{
    pv *d = pv_dict();
    pv *orders = pv_tuple(), *layers = pv_tuple();
    if (!d || !orders || !layers) {
        pv_decref(d);
        pv_decref(orders);
        pv_decref(layers);
        return NULL;
    }
    for (int i = 0; i < c->n_orders; i++)
        pv_append(orders, pv_int(c->engram_orders[i]));
    for (int i = 0; i < c->n_sites; i++)
        pv_append(layers, pv_int(c->engram_layers[i]));
    /* same order as upstream's dataclass fields, so dumps look alike */
    pv_dict_set(d, "vocab_size", pv_int(c->vocab_size));
    pv_dict_set(d, "d_model", pv_int(c->d_model));
    pv_dict_set(d, "attn_dim", pv_int(c->attn_dim));
    pv_dict_set(d, "num_heads", pv_int(c->num_heads));
    pv_dict_set(d, "num_kv_heads", pv_int(c->num_kv_heads));
    pv_dict_set(d, "num_layers", pv_int(c->num_layers));
    pv_dict_set(d, "max_seq_len", pv_int(c->max_seq_len));
    pv_dict_set(d, "pad_token_id", pv_int(c->pad_token_id));
    pv_dict_set(d, "contrastive_dim", pv_int(c->contrastive_dim));
    pv_dict_set(d, "rope_theta", pv_float(c->rope_theta));
    pv_dict_set(d, "dtype", pv_str(c->dtype));
    pv_dict_set(d, "flash", pv_bool(c->flash));
    pv_dict_set(d, "engram_orders", orders);
    pv_dict_set(d, "engram_heads", pv_int(c->engram_heads));
    pv_dict_set(d, "engram_slots", pv_int(c->engram_slots));
    pv_dict_set(d, "engram_layers", layers);
    pv_dict_set(d, "mhc_lanes", pv_int(c->mhc_lanes));
    pv_dict_set(d, "kv_window", pv_int(c->kv_window));
    pv_dict_set(d, "kv_bits", pv_int(c->kv_bits));
    pv_dict_set(d, "act_bits", pv_int(c->act_bits));
    pv_dict_set(d, "weight_bits", pv_str(c->weight_bits));
    pv_dict_set(d, "remat", pv_bool(c->remat));
    pv_dict_set(d, "scan_unroll", pv_int(c->scan_unroll));
    return d;
}

int san_config_dims(const san_config *c, san_dims *m)
{
    memset(m, 0, sizeof *m);
    int attn = c->attn_dim ? c->attn_dim : c->d_model;
    if (attn % c->num_heads)
        return nd_error(ND_EFORMAT, "config: attn_dim %d is not divisible by num_heads %d", attn,
                        c->num_heads);
    if (c->num_heads % c->num_kv_heads)
        return nd_error(ND_EFORMAT, "config: num_heads %d is not divisible by num_kv_heads %d",
                        c->num_heads, c->num_kv_heads);
    m->d = c->d_model;
    m->n = c->mhc_lanes;
    m->L = c->num_layers;
    m->H = c->num_heads;
    m->G = c->num_kv_heads;
    m->hd = attn / c->num_heads;
    if (m->hd % 2)
        return nd_error(ND_EFORMAT, "config: head dim %d must be even for RoPE", m->hd);
    m->q_dim = attn;
    m->kv_dim = m->G * m->hd;
    m->V = c->vocab_size;
    m->hada_n = 1;
    while (m->hada_n < m->d)
        m->hada_n <<= 1;
    if (c->pad_token_id >= c->vocab_size)
        return nd_error(ND_EFORMAT, "config: pad_token_id %d >= vocab_size %d", c->pad_token_id,
                        c->vocab_size);
    for (int s = 0; s < c->n_sites; s++)
        if (c->engram_layers[s] >= c->num_layers)
            return nd_error(ND_EFORMAT, "config: engram_layers[%d] = %d but num_layers = %d", s,
                            c->engram_layers[s], c->num_layers);
    if (c->n_sites) {
        if (c->n_orders < 1)
            return nd_error(ND_EFORMAT, "config: engram_layers set but engram_orders is empty");
        m->eng_heads =
            c->engram_heads ? c->engram_heads : (c->d_model / (c->n_orders * SAN_ENGRAM_SUB));
        if (m->eng_heads < 1)
            m->eng_heads = 1;
        m->eng_sub = c->d_model / (c->n_orders * m->eng_heads);
        if (m->eng_sub < 1)
            return nd_error(ND_EFORMAT, "config: engram sub-dimension is zero");
        m->eng_tables = c->n_orders * m->eng_heads;
        m->eng_dim = m->eng_tables * m->eng_sub;
        m->eng_dilation = 0;
        for (int i = 0; i < c->n_orders; i++)
            if (c->engram_orders[i] > m->eng_dilation)
                m->eng_dilation = c->engram_orders[i];
    }
    return ND_OK;
}

int san_effective_kv_window(const san_config *c)
{
    const long budget_bytes = 11L * 1024 * 1024 + 512 * 1024, group = 32, wmin = 160;
    long hd = (c->attn_dim ? c->attn_dim : c->d_model) / c->num_heads;
    long kv = c->num_kv_heads * hd, d = c->d_model, L = c->num_layers;
    long per_pos = L * (2 * kv + 2 * (kv / group) * 4) + c->n_sites * (d + (d / group) * 4);
    long window = (budget_bytes / per_pos) / group * group;
    if (window > c->max_seq_len)
        window = c->max_seq_len;
    if (window < wmin)
        window = wmin;
    if (c->kv_window && c->kv_window < window)
        window = c->kv_window;
    return (int)window;
}
