#include "model/params.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/mem.h"
#include "core/rng.h"
#include "core/status.h"

#define SLOT(field) offsetof(san_weights, field)

static int add(san_model *m, int *cap, size_t slot, san_init_kind init, float val, int ndim,
               const int64_t *shape, const char *fmt, ...)
{
    if (m->n_tensors == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        san_tensor *t = realloc(m->tensors, (size_t)nc * sizeof *t);
        if (!t)
            return nd_error(ND_ENOMEM, "out of memory");
        m->tensors = t;
        *cap = nc;
    }
    san_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= (size_t)shape[i];
    }
    t->offset = m->numel;
    t->slot = slot;
    t->init = init;
    t->init_value = val;
    /* keep every tensor 16-float aligned for vector loads */
    m->numel += (t->numel + 15) & ~(size_t)15;
    return ND_OK;
}

#define S(...) ((const int64_t[]){__VA_ARGS__})

static int layout3(san_model *m, int *cap);

/* The stack's own tensors, the same in both generations: the hyper-
 * connection parameters and the final norm (in the checkpoint's order). */
static int add_stack(san_model *m, int *cap)
{
    const san_dims *D = &m->dims;
    int64_t L = D->L, d = D->d, n = D->n, nd = (int64_t)D->n * D->d;
    float std = 0.02f;
    int rc;
#define ADD(slot, init, val, nd_, shape, ...)                                                      \
    do {                                                                                           \
        rc = add(m, cap, slot, init, val, nd_, shape, __VA_ARGS__);                                \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)
    ADD(SLOT(phi_pre), INIT_NORMAL, std, 3, S(L, nd, n), "stack/mhc_phi_pre");
    ADD(SLOT(phi_post), INIT_NORMAL, std, 3, S(L, nd, n), "stack/mhc_phi_post");
    ADD(SLOT(phi_res), INIT_NORMAL, std, 3, S(L, nd, n * n), "stack/mhc_phi_res");
    ADD(SLOT(b_pre), INIT_ZEROS, 0, 2, S(L, n), "stack/mhc_b_pre");
    ADD(SLOT(b_post), INIT_ZEROS, 0, 2, S(L, n), "stack/mhc_b_post");
    ADD(SLOT(b_res), INIT_RES_EYE, 4, 3, S(L, n, n), "stack/mhc_b_res");
    ADD(SLOT(a_pre), INIT_CONST, 0.01f, 1, S(L), "stack/mhc_a_pre");
    ADD(SLOT(a_post), INIT_CONST, 0.01f, 1, S(L), "stack/mhc_a_post");
    ADD(SLOT(a_res), INIT_CONST, 0.01f, 1, S(L), "stack/mhc_a_res");
    ADD(SLOT(final_norm), INIT_ZEROS, 0, 1, S(d), "stack/final_norm/scale");
#undef ADD
    return ND_OK;
}

int san_model_layout(san_model *m, const san_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    int rc = san_config_dims(cfg, &m->dims);
    if (rc)
        return rc;
    if (cfg->generation == 3) {
        int cap = 0;
        rc = layout3(m, &cap);
        if (rc) {
            free(m->tensors);
            m->tensors = NULL;
        }
        return rc;
    }
    const san_dims *D = &m->dims;
    int64_t L = D->L, d = D->d;
    float std = 0.02f, res_std = (float)(0.02 / sqrt(2.0 * L));
    int cap = 0;
    const char *blk = "stack/layers/block";
#define ADD(slot, init, val, nd_, shape, ...)                                                      \
    do {                                                                                           \
        rc = add(m, &cap, slot, init, val, nd_, shape, __VA_ARGS__);                               \
        if (rc)                                                                                    \
            goto fail;                                                                             \
    } while (0)
    ADD(SLOT(emb), INIT_NORMAL, std, 2, S(D->V, d), "embedding/embedding");
    ADD(SLOT(norm_in), INIT_ZEROS, 0, 2, S(L, d), "%s/ZCRMSNorm_0/scale", blk);
    ADD(SLOT(wq), INIT_NORMAL, std, 3, S(L, d, D->q_dim), "%s/self_attn/q_proj/kernel", blk);
    ADD(SLOT(wk), INIT_NORMAL, std, 3, S(L, d, D->kv_dim), "%s/self_attn/k_proj/kernel", blk);
    ADD(SLOT(wv), INIT_NORMAL, std, 3, S(L, d, D->kv_dim), "%s/self_attn/v_proj/kernel", blk);
    ADD(SLOT(wgate), INIT_NORMAL, std, 3, S(L, d, D->q_dim), "%s/self_attn/gate_proj/kernel", blk);
    ADD(SLOT(wout), INIT_NORMAL, res_std, 3, S(L, D->q_dim, d), "%s/self_attn/out_proj/kernel",
        blk);
    ADD(SLOT(q_norm), INIT_ZEROS, 0, 2, S(L, D->hd), "%s/self_attn/q_norm/scale", blk);
    ADD(SLOT(k_norm), INIT_ZEROS, 0, 2, S(L, D->hd), "%s/self_attn/k_norm/scale", blk);
    ADD(SLOT(post_norm), INIT_ZEROS, 0, 2, S(L, d), "%s/post_attn_norm/scale", blk);
    ADD(SLOT(pre_hada), INIT_ZEROS, 0, 2, S(L, d), "%s/pre_hada_norm/scale", blk);
    ADD(SLOT(attn_gate), INIT_ZEROS, 0, 1, S(L), "%s/attn_gate", blk);
    ADD(SLOT(d1), INIT_ONES, 1, 2, S(L, D->hada_n), "%s/hadamard_mlp/d1", blk);
    ADD(SLOT(d2), INIT_ONES, 1, 2, S(L, D->hada_n), "%s/hadamard_mlp/d2", blk);
    ADD(SLOT(d3), INIT_CONST, 0.02f, 2, S(L, D->hada_n), "%s/hadamard_mlp/d3", blk);
    rc = add_stack(m, &cap);
    if (rc)
        goto fail;
    for (int s = 0; s < cfg->n_sites; s++) {
        ADD(SLOT(eng[s].table), INIT_NORMAL, std, 3,
            S(D->eng_tables, cfg->engram_slots, D->eng_sub), "engrams_%d/embedding", s);
        ADD(SLOT(eng[s].wk), INIT_NORMAL, std, 2, S(D->eng_dim, d), "engrams_%d/key_proj/kernel",
            s);
        ADD(SLOT(eng[s].wv), INIT_NORMAL, res_std, 2, S(D->eng_dim, d),
            "engrams_%d/value_proj/kernel", s);
        ADD(SLOT(eng[s].taps), INIT_TAPS, 0, 2, S(SAN_CONV_TAPS, d), "engrams_%d/taps", s);
    }
#undef ADD
    return ND_OK;
fail:
    free(m->tensors);
    m->tensors = NULL;
    return rc;
}

/* The Needle 3 table (flax paths of 3.x's SimpleAttentionNetwork). */
static int layout3(san_model *m, int *cap)
{
    const san_config *cfg = &m->cfg;
    const san_dims *D = &m->dims;
    int64_t L = D->L, d = D->d, hn = D->hada_n;
    int64_t ba = D->hada_ba, bb = D->hada_bb, T = cfg->qkv_conv_taps;
    float std = 0.02f, res_std = (float)(0.02 / sqrt(2.0 * L));
    int rc;
    const char *blk = "stack/layers/block";
#define ADD(slot, init, val, nd_, shape, ...)                                                      \
    do {                                                                                           \
        rc = add(m, cap, slot, init, val, nd_, shape, __VA_ARGS__);                                \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)
    ADD(SLOT(emb), INIT_NORMAL, std, 2, S(D->V, d), "embedding/embedding");
    ADD(SLOT(norm_in), INIT_ZEROS, 0, 2, S(L, d), "%s/ZCRMSNorm_0/scale", blk);
    ADD(SLOT(wq), INIT_NORMAL, std, 3, S(L, d, D->q_dim), "%s/self_attn/q_proj/kernel", blk);
    ADD(SLOT(wk), INIT_NORMAL, std, 3, S(L, d, D->k_dim), "%s/self_attn/k_proj/kernel", blk);
    ADD(SLOT(wv), INIT_NORMAL, std, 3, S(L, d, D->v_dim), "%s/self_attn/v_proj/kernel", blk);
    if (T) {
        ADD(SLOT(q_taps), INIT_TAPS, 0, 3, S(L, T, D->q_dim), "%s/self_attn/q_taps", blk);
        ADD(SLOT(k_taps), INIT_TAPS, 0, 3, S(L, T, D->k_dim), "%s/self_attn/k_taps", blk);
        ADD(SLOT(v_taps), INIT_TAPS, 0, 3, S(L, T, D->v_dim), "%s/self_attn/v_taps", blk);
    }
    ADD(SLOT(q_norm), INIT_ZEROS, 0, 2, S(L, D->hd), "%s/self_attn/q_norm/scale", blk);
    ADD(SLOT(k_norm), INIT_ZEROS, 0, 2, S(L, D->hd), "%s/self_attn/k_norm/scale", blk);
    ADD(SLOT(wgate), INIT_NORMAL, std, 3, S(L, d, D->gate_dim), "%s/self_attn/gate_proj/kernel",
        blk);
    ADD(SLOT(wout), INIT_NORMAL, res_std, 3, S(L, D->o_dim, d), "%s/self_attn/out_proj/kernel",
        blk);
    ADD(SLOT(post_norm), INIT_ZEROS, 0, 2, S(L, d), "%s/post_attn_norm/scale", blk);
    ADD(SLOT(attn_gate), INIT_ZEROS, 0, 1, S(L), "%s/attn_gate", blk);
    ADD(SLOT(pre_hada), INIT_ZEROS, 0, 2, S(L, d), "%s/pre_hada_norm/scale", blk);
    const size_t fa[3] = {SLOT(w1a), SLOT(w2a), SLOT(w3a)},
                 fb[3] = {SLOT(w1b), SLOT(w2b), SLOT(w3b)};
    for (int k = 0; k < 3; k++) {
        if (cfg->hada_factor_mode == SAN_HADA_BLOCK_UNTIED) {
            ADD(fa[k], INIT_WALSH, 0, 4, S(L, bb, ba, ba), "%s/hadamard_mlp/w%da", blk, k + 1);
            ADD(fb[k], INIT_WALSH, 0, 4, S(L, ba, bb, bb), "%s/hadamard_mlp/w%db", blk, k + 1);
        } else {
            ADD(fa[k], INIT_WALSH, 0, 3, S(L, ba, ba), "%s/hadamard_mlp/w%da", blk, k + 1);
            ADD(fb[k], INIT_WALSH, 0, 3, S(L, bb, bb), "%s/hadamard_mlp/w%db", blk, k + 1);
        }
    }
    ADD(SLOT(d1), INIT_ONES, 1, 2, S(L, hn), "%s/hadamard_mlp/d1", blk);
    ADD(SLOT(d2), INIT_ONES, 1, 2, S(L, hn), "%s/hadamard_mlp/d2", blk);
    ADD(SLOT(b2), INIT_ZEROS, 0, 2, S(L, hn), "%s/hadamard_mlp/b2", blk);
    ADD(SLOT(d3), INIT_ONES, 1, 2, S(L, hn), "%s/hadamard_mlp/d3", blk);
    ADD(SLOT(d4), INIT_CONST, 0.02f, 2, S(L, hn), "%s/hadamard_mlp/d4", blk);
    ADD(SLOT(cond_v), INIT_NORMAL, std, 3, S(L, d, SAN_HADA_COND_RANK), "%s/hadamard_mlp/cond_v",
        blk);
    ADD(SLOT(cond_u), INIT_ZEROS, 0, 3, S(L, SAN_HADA_COND_RANK, hn), "%s/hadamard_mlp/cond_u",
        blk);
    rc = add_stack(m, cap);
    if (rc)
        return rc;
    int64_t K = D->eng_tables, slots = cfg->engram_slots, sub = D->eng_sub;
    if (D->n_banks) {
        for (int b = 0; b < D->n_banks; b++)
            ADD(SLOT(bank[b]), INIT_NORMAL, std, 3, S(K, slots, sub), "engram_banks_%d/embedding",
                b);
        for (int s = 0; s < cfg->n_sites; s++) {
            ADD(SLOT(eng[s].wk), INIT_NORMAL, std, 2, S(D->eng_dim, d),
                "engram_readers_%d/key_proj/kernel", s);
            ADD(SLOT(eng[s].wv), INIT_NORMAL, res_std, 2, S(D->eng_dim, d),
                "engram_readers_%d/value_proj/kernel", s);
            ADD(SLOT(eng[s].taps), INIT_TAPS, 0, 2, S(SAN_CONV_TAPS, d), "engram_readers_%d/taps",
                s);
        }
    } else {
        for (int s = 0; s < cfg->n_sites; s++) {
            ADD(SLOT(eng[s].table), INIT_NORMAL, std, 3, S(K, slots, sub), "engrams_%d/embedding",
                s);
            ADD(SLOT(eng[s].wk), INIT_NORMAL, std, 2, S(D->eng_dim, d),
                "engrams_%d/key_proj/kernel", s);
            ADD(SLOT(eng[s].wv), INIT_NORMAL, res_std, 2, S(D->eng_dim, d),
                "engrams_%d/value_proj/kernel", s);
            ADD(SLOT(eng[s].taps), INIT_TAPS, 0, 2, S(SAN_CONV_TAPS, d), "engrams_%d/taps", s);
        }
    }
#undef ADD
    return ND_OK;
}

int san_model_extra_tensors(const san_model *m, san_tensor *out, int cap)
{
    const san_config *c = &m->cfg;
    if (c->generation != 3)
        return 0;
    int64_t L1 = m->dims.L + 1, d = m->dims.d;
    static const char *const heads[3] = {"embedding_head", "confidence_head", "router_head"};
    int kp[3] = {c->embedding_probes, c->confidence_probes, c->router_probes};
    int qs[3] = {c->embedding_queries, c->confidence_queries, c->router_queries};
    int outs[3] = {c->embedding_dim, 1, 3};
    int n = 0;
#define X(init_, val, nd_, s0, s1, s2, fmt, ...)                                                   \
    do {                                                                                           \
        if (n < cap) {                                                                             \
            san_tensor *t = &out[n];                                                               \
            memset(t, 0, sizeof *t);                                                               \
            snprintf(t->name, sizeof t->name, fmt, __VA_ARGS__);                                   \
            t->ndim = nd_;                                                                         \
            int64_t sh[3] = {s0, s1, s2};                                                          \
            t->numel = 1;                                                                          \
            for (int k_ = 0; k_ < nd_; k_++) {                                                     \
                t->shape[k_] = sh[k_];                                                             \
                t->numel *= (size_t)sh[k_];                                                        \
            }                                                                                      \
            t->init = init_;                                                                       \
            t->init_value = val;                                                                   \
        }                                                                                          \
        n++;                                                                                       \
    } while (0)
    for (int h = 0; h < 3; h++) {
        int64_t k = kp[h], q = qs[h];
        X(INIT_NORMAL, 0.02f, 3, L1, k, d, "%s/probes", heads[h]);
        X(INIT_ONES, 1, 2, L1, k, 0, "%s/gain", heads[h]);
        X(INIT_NORMAL, 0.02f, 2, q, d, 0, "%s/query", heads[h]);
        X(INIT_ZEROS, 0, 3, q, L1, k, "%s/row_bias", heads[h]);
        X(INIT_NORMAL, 0.02f, 2, q * d, outs[h], 0, "%s/proj/kernel", heads[h]);
        if (h == 0) {
            X(INIT_CONST, (float)log(10.0), 0, 0, 0, 0, "%s/log_temp", heads[h]);
            X(INIT_CONST, -10.0f, 0, 0, 0, 0, "%s/bias", heads[h]);
        } else {
            X(INIT_ZEROS, 0, 1, outs[h], 0, 0, "%s/proj/bias", heads[h]);
        }
    }
#undef X
    return n;
}

void san_weights_bind(const san_model *m, float *mem, san_weights *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < m->n_tensors; i++) {
        float **slot = (float **)((char *)w + m->tensors[i].slot);
        *slot = mem + m->tensors[i].offset;
    }
    if (m->dims.n_banks)
        for (int s = 0; s < m->cfg.n_sites; s++)
            w->eng[s].table = w->bank[m->cfg.engram_bank_ids[s]];
}

int san_model_create(san_model *m, const san_config *cfg)
{
    int rc = san_model_layout(m, cfg);
    if (rc)
        return rc;
    m->mem = nd_calloc_big(m->numel, sizeof(float));
    if (!m->mem) {
        rc = nd_error(ND_ENOMEM, "out of memory allocating %zu parameters", m->numel);
        free(m->tensors);
        m->tensors = NULL;
        return rc;
    }
    m->dev = m->mem;
    san_weights_bind(m, m->mem, &m->w);
    return ND_OK;
}

/* the weights back in plain host memory, the device copy freed */
static int model_to_host(san_model *m)
{
    const nd_backend *old = m->mem_be;
    if (!old)
        return ND_OK;
    size_t bytes = m->numel * sizeof(float);
    if (m->dev && m->dev != m->mem) {
        nd_backend_sync(old);
        old->free(old, m->dev);
    } else {
        float *h = nd_calloc_big(m->numel ? m->numel : 1, sizeof(float));
        if (!h)
            return nd_error(ND_ENOMEM, "out of memory for %zu parameters", m->numel);
        nd_backend_download(old, h, m->mem, bytes);
        old->free(old, m->mem);
        m->mem = h;
    }
    m->dev = m->mem;
    m->mem_be = NULL;
    san_weights_bind(m, m->mem, &m->w);
    return ND_OK;
}

int san_model_to_backend(san_model *m, const nd_backend *be)
{
    if (!be->device || m->mem_be == be)
        return ND_OK;
    int rc = model_to_host(m);
    if (rc)
        return rc;
    float *p = be->alloc(be, m->numel * sizeof(float));
    if (!p)
        return nd_error(ND_ENOMEM, "out of %s memory for %zu parameters (%.1f MB)", be->name,
                        m->numel, (double)m->numel * 4 / 1e6);
    nd_backend_upload(be, p, m->mem, m->numel * sizeof(float));
    if (be->host_mem) { /* the host works on it in place */
        free(m->mem);
        m->mem = p;
    }
    m->dev = p;
    m->mem_be = be;
    san_weights_bind(m, m->dev, &m->w);
    return ND_OK;
}

void san_model_upload(san_model *m)
{
    if (m->mem_be && m->dev && m->dev != m->mem)
        nd_backend_upload(m->mem_be, m->dev, m->mem, m->numel * sizeof(float));
}

void san_model_free(san_model *m)
{
    if (!m)
        return;
    if (m->mem_be) {
        nd_backend_sync(m->mem_be);
        if (m->dev && m->dev != m->mem) {
            m->mem_be->free(m->mem_be, m->dev);
            free(m->mem);
        } else
            m->mem_be->free(m->mem_be, m->mem);
    } else
        free(m->mem);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const san_tensor *san_model_find(const san_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

void san_tensor_init(const san_tensor *t, float *x, void *rngp)
{
    nd_rng *rng = rngp;
    size_t n = t->numel;
    switch (t->init) {
    case INIT_ZEROS: memset(x, 0, n * sizeof *x); break;
    case INIT_ONES:
        for (size_t i = 0; i < n; i++)
            x[i] = 1.0f;
        break;
    case INIT_CONST:
        for (size_t i = 0; i < n; i++)
            x[i] = t->init_value;
        break;
    case INIT_NORMAL:
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(t->init_value * nd_rng_normal(rng));
        break;
    case INIT_RES_EYE: {
        int64_t k = t->shape[t->ndim - 1];
        memset(x, 0, n * sizeof *x);
        for (size_t b = 0; b < n / (size_t)(k * k); b++)
            for (int64_t i = 0; i < k; i++)
                x[b * (size_t)(k * k) + (size_t)(i * k + i)] = t->init_value;
        break;
    }
    case INIT_TAPS: {
        /* (taps, cols) or (L, taps, cols): tap 0 of each leading index */
        int64_t cols = t->shape[t->ndim - 1], per = cols * t->shape[t->ndim - 2];
        memset(x, 0, n * sizeof *x);
        for (size_t b = 0; b < n / (size_t)per; b++)
            for (int64_t j = 0; j < cols; j++)
                x[b * (size_t)per + (size_t)j] = 1.0f;
        break;
    }
    case INIT_WALSH: {
        /* Sylvester's construction: H[i][j] = (-1)^popcount(i & j) / sqrt(k) */
        int64_t k = t->shape[t->ndim - 1];
        float v = (float)(1.0 / sqrt((double)k));
        for (size_t b = 0; b < n / (size_t)(k * k); b++)
            for (int64_t i = 0; i < k; i++)
                for (int64_t j = 0; j < k; j++)
                    x[b * (size_t)(k * k) + (size_t)(i * k + j)] =
                        __builtin_popcountll((unsigned long long)(i & j)) & 1 ? -v : v;
        break;
    }
    }
}

void san_model_init_random(san_model *m, uint64_t seed)
{
    nd_rng rng;
    for (int i = 0; i < m->n_tensors; i++) {
        /* one stream per tensor: adding a tensor never shifts the others */
        nd_rng_seed(&rng, seed * 0x100000001B3ull + (uint64_t)i * 0x9E3779B97F4A7C15ull + 1);
        san_tensor_init(&m->tensors[i], m->mem + m->tensors[i].offset, &rng);
    }
}

int san_model_check_finite(const san_model *m, const char *what)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const san_tensor *t = &m->tensors[i];
        const float *x = m->mem + t->offset;
        for (size_t j = 0; j < t->numel; j++)
            if (!isfinite(x[j]))
                return nd_error(ND_ENUMERIC,
                                "%s: tensor %s has a non-finite value (%g at flat index %zu)", what,
                                t->name, (double)x[j], j);
    }
    return ND_OK;
}
