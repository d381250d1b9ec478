/* .cact archive -> float32 san_model (dequantise at load). */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/engine.h"

int nd_cact_config(const cact_file *f, san_config *c)
{
    const cact_header *h = &f->hdr;
    san_config_default(c);
#define LIM(field, lo, hi)                                                                         \
    do {                                                                                           \
        if ((long long)h->field < (lo) || (long long)h->field > (hi))                              \
            return nd_error(ND_EFORMAT, "cact header: %s = %u is outside [%d, %d]", #field,        \
                            h->field, (int)(lo), (int)(hi));                                       \
    } while (0)
    LIM(vocab, 16, 1 << 20);
    LIM(d_model, 2, 1 << 14);
    LIM(num_heads, 1, 1024);
    LIM(num_kv_heads, 1, 1024);
    LIM(num_layers, 1, 1024);
    LIM(head_dim, 2, 4096);
    LIM(max_seq_len, 2, 1 << 20);
    LIM(mhc_lanes, 1, 64);
    LIM(num_engram_orders, 1, 4);
    LIM(num_engram_sites, 0, 4);
#undef LIM
    c->vocab_size = (int)h->vocab;
    c->d_model = (int)h->d_model;
    c->num_heads = (int)h->num_heads;
    c->num_kv_heads = (int)h->num_kv_heads;
    c->num_layers = (int)h->num_layers;
    c->attn_dim = (int)(h->num_heads * h->head_dim);
    c->max_seq_len = (int)h->max_seq_len;
    c->mhc_lanes = (int)h->mhc_lanes;
    c->rope_theta = h->rope_theta;
    c->kv_window = (int)h->kv_window;
    c->kv_bits = (int)h->kv_bits;
    c->n_orders = (int)h->num_engram_orders;
    for (int i = 0; i < c->n_orders; i++) {
        if (h->engram_orders[i] < 1 || h->engram_orders[i] > 64)
            return nd_error(ND_EFORMAT, "cact header: engram order %u unsupported",
                            h->engram_orders[i]);
        c->engram_orders[i] = (int)h->engram_orders[i];
    }
    c->n_sites = (int)h->num_engram_sites;
    for (int i = 0; i < c->n_sites; i++)
        c->engram_layers[i] = (int)h->engram_sites[i];
    if (c->n_sites) {
        if (h->engram_slots < 1 || h->engram_slots > (1u << 28))
            return nd_error(ND_EFORMAT, "cact header: engram_slots %u unsupported",
                            h->engram_slots);
        c->engram_slots = (int)h->engram_slots;
        if (h->num_engram_tables % h->num_engram_orders || !h->num_engram_tables)
            return nd_error(ND_EFORMAT, "cact header: %u engram tables for %u orders",
                            h->num_engram_tables, h->num_engram_orders);
        c->engram_heads = (int)(h->num_engram_tables / h->num_engram_orders);
    }
    san_dims D;
    int rc = san_config_dims(c, &D);
    if (rc)
        return nd_error_prefix(rc, "cact header");
    if ((uint32_t)D.hada_n != h->hada_n)
        return nd_error(ND_EFORMAT, "cact header: hada_n %u, expected %d for d_model %d", h->hada_n,
                        D.hada_n, D.d);
    if (c->n_sites && ((uint32_t)D.eng_sub != h->engram_sub_dim ||
                       (uint32_t)D.eng_dilation != h->engram_conv_dilation ||
                       h->engram_conv_taps != SAN_CONV_TAPS))
        return nd_error(ND_EFORMAT,
                        "cact header: engram geometry (sub %u, dilation %u, taps %u) does not "
                        "match the model (sub %d, dilation %d, taps %d)",
                        h->engram_sub_dim, h->engram_conv_dilation, h->engram_conv_taps, D.eng_sub,
                        D.eng_dilation, SAN_CONV_TAPS);
    return ND_OK;
}

/* How a tensor's blob maps onto the model. */
enum { MAP_DIRECT, MAP_KERNEL, MAP_PHI };

static int load_one(const cact_file *f, int idx, float *dst, size_t numel, int map, int64_t a,
                    int64_t b, int64_t c, const char *what)
{
    if (idx >= (int)f->hdr.num_tensors)
        return nd_error(ND_EFORMAT, "cact: archive ends before %s (tensor %d)", what, idx);
    const cact_tensor *t = &f->t[idx];
    if (t->dtype == CACT_RAW)
        return nd_error(ND_EFORMAT, "cact: tensor %d (%s) is RAW, expected weights", idx, what);
    if (cact_numel(t) != numel)
        return nd_error(ND_ESHAPE, "cact: tensor %d (%s) has %llu elements, the model needs %zu",
                        idx, what, (unsigned long long)cact_numel(t), numel);
    if (map != MAP_DIRECT && (t->ndim != 2))
        return nd_error(ND_ESHAPE, "cact: tensor %d (%s) must be a 2-D matrix", idx, what);
    float *w;
    size_t n;
    int rc = cact_dequant(f, idx, &w, &n);
    if (rc)
        return nd_error_prefix(rc, "%s", what);
    if (map == MAP_DIRECT) {
        memcpy(dst, w, n * sizeof *w);
    } else if (map == MAP_KERNEL) { /* stored [out=b, in=a] -> (a, b) */
        if (t->shape[0] != (uint32_t)b || t->shape[1] != (uint32_t)a) {
            free(w);
            return nd_error(ND_ESHAPE, "cact: %s is [%u, %u], expected [%lld, %lld]", what,
                            t->shape[0], t->shape[1], (long long)b, (long long)a);
        }
        for (int64_t i = 0; i < a; i++)
            for (int64_t o = 0; o < b; o++)
                dst[i * b + o] = w[o * a + i];
    } else { /* phi: stored (L*k, nC) from (L, nC, k); a = L, b = nC, c = k */
        if (t->shape[0] != (uint32_t)(a * c) || t->shape[1] != (uint32_t)b) {
            free(w);
            return nd_error(ND_ESHAPE, "cact: %s is [%u, %u], expected [%lld, %lld]", what,
                            t->shape[0], t->shape[1], (long long)(a * c), (long long)b);
        }
        for (int64_t l = 0; l < a; l++)
            for (int64_t j = 0; j < c; j++)
                for (int64_t x = 0; x < b; x++)
                    dst[(l * b + x) * c + j] = w[(l * c + j) * b + x];
    }
    free(w);
    return ND_OK;
}

int nd_cact_to_model(const cact_file *f, san_model *m)
{
    san_config c;
    int rc = nd_cact_config(f, &c);
    if (rc)
        return rc;
    if ((rc = san_model_create(m, &c)))
        return rc;
    const san_dims *D = &m->dims;
    const san_weights *w = &m->w;
    size_t d = (size_t)D->d, hd = (size_t)D->hd, hn = (size_t)D->hada_n, qd = (size_t)D->q_dim,
           kvd = (size_t)D->kv_dim, n = (size_t)D->n;
    int idx = 0;
#define LOAD(dst, numel, map, a, b, c_, what)                                                      \
    do {                                                                                           \
        if ((rc = load_one(f, idx++, dst, numel, map, a, b, c_, what)))                            \
            goto fail;                                                                             \
    } while (0)
    LOAD(w->emb, (size_t)D->V * d, MAP_DIRECT, 0, 0, 0, "embedding");
    for (int l = 0; l < D->L; l++) {
        size_t L = (size_t)l;
        LOAD(w->norm_in + L * d, d, MAP_DIRECT, 0, 0, 0, "norm_in");
        LOAD(w->wq + L * d * qd, d * qd, MAP_KERNEL, d, qd, 0, "q_proj");
        LOAD(w->wk + L * d * kvd, d * kvd, MAP_KERNEL, d, kvd, 0, "k_proj");
        LOAD(w->wv + L * d * kvd, d * kvd, MAP_KERNEL, d, kvd, 0, "v_proj");
        LOAD(w->q_norm + L * hd, hd, MAP_DIRECT, 0, 0, 0, "q_norm");
        LOAD(w->k_norm + L * hd, hd, MAP_DIRECT, 0, 0, 0, "k_norm");
        LOAD(w->wgate + L * d * qd, d * qd, MAP_KERNEL, d, qd, 0, "gate_proj");
        LOAD(w->wout + L * qd * d, qd * d, MAP_KERNEL, qd, d, 0, "out_proj");
        LOAD(w->post_norm + L * d, d, MAP_DIRECT, 0, 0, 0, "post_norm");
        LOAD(w->attn_gate + L, 1, MAP_DIRECT, 0, 0, 0, "attn_gate");
        LOAD(w->pre_hada + L * d, d, MAP_DIRECT, 0, 0, 0, "pre_hada");
        LOAD(w->d1 + L * hn, hn, MAP_DIRECT, 0, 0, 0, "d1");
        LOAD(w->d2 + L * hn, hn, MAP_DIRECT, 0, 0, 0, "d2");
        LOAD(w->d3 + L * hn, hn, MAP_DIRECT, 0, 0, 0, "d3");
    }
    size_t Ls = (size_t)D->L;
    LOAD(w->a_pre, Ls, MAP_DIRECT, 0, 0, 0, "mhc_a_pre");
    LOAD(w->a_post, Ls, MAP_DIRECT, 0, 0, 0, "mhc_a_post");
    LOAD(w->a_res, Ls, MAP_DIRECT, 0, 0, 0, "mhc_a_res");
    LOAD(w->b_pre, Ls * n, MAP_DIRECT, 0, 0, 0, "mhc_b_pre");
    LOAD(w->b_post, Ls * n, MAP_DIRECT, 0, 0, 0, "mhc_b_post");
    LOAD(w->b_res, Ls * n * n, MAP_DIRECT, 0, 0, 0, "mhc_b_res");
    LOAD(w->phi_pre, Ls * n * d * n, MAP_PHI, Ls, n * d, n, "mhc_phi_pre");
    LOAD(w->phi_post, Ls * n * d * n, MAP_PHI, Ls, n * d, n, "mhc_phi_post");
    LOAD(w->phi_res, Ls * n * d * n * n, MAP_PHI, Ls, n * d, n * n, "mhc_phi_res");
    for (int s = 0; s < c.n_sites; s++) {
        size_t ed = (size_t)D->eng_dim;
        LOAD(w->eng[s].table, (size_t)D->eng_tables * (size_t)c.engram_slots * (size_t)D->eng_sub,
             MAP_DIRECT, 0, 0, 0, "engram tables");
        LOAD(w->eng[s].wk, ed * d, MAP_KERNEL, ed, d, 0, "engram key_proj");
        LOAD(w->eng[s].wv, ed * d, MAP_KERNEL, ed, d, 0, "engram value_proj");
        LOAD(w->eng[s].taps, SAN_CONV_TAPS * d, MAP_DIRECT, 0, 0, 0, "engram taps");
    }
    LOAD(w->final_norm, d, MAP_DIRECT, 0, 0, 0, "final_norm");
#undef LOAD
    return ND_OK;
fail:
    san_model_free(m);
    return rc;
}

int nd_cact_tokenizer(const cact_file *f, nd_tokenizer **tok)
{
    *tok = NULL;
    uint32_t n = f->hdr.num_tensors;
    if (!n || f->t[n - 1].dtype != CACT_RAW)
        return nd_error(ND_EFORMAT, "cact: the archive has no tokenizer (its last tensor is not "
                                    "a RAW blob); rebuild it with `needle build --tokenizer`");
    const cact_tensor *t = &f->t[n - 1];
    int rc = nd_tokenizer_from_blob(f->data + t->offset, (size_t)t->nbytes, tok);
    if (rc)
        return nd_error_prefix(rc, "cact tokenizer");
    if (nd_tokenizer_vocab_size(*tok) != (int)f->hdr.vocab) {
        int v = nd_tokenizer_vocab_size(*tok);
        nd_tokenizer_free(*tok);
        *tok = NULL;
        return nd_error(ND_ESHAPE, "cact: tokenizer has %d pieces, the model's vocab is %u", v,
                        f->hdr.vocab);
    }
    return ND_OK;
}
