/* .cact archive -> san_model: float32 (dequantise at load) or, for the
 * quantised path, small tensors in float and CQ matrices read in place. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/fp16.h"
#include "core/status.h"
#include "core/tuning.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "io/cact_bytes.h"
#include "model/hada3.h"

int nd_cact_config(const cact_file *f, san_config *c)
{
    const cact_header *h = &f->hdr;
    if (f->generation == 3)
        return nd_error(ND_EUNSUPPORTED,
                        "cact: a Needle 3 archive (tag 0x%08X) read as Needle 2's: use the v3 "
                        "loader (nd_cact3_config)",
                        h->tag);
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

/* A matrix the quantised path keeps in the archive: check its stored
 * [rows, in] shape and point q at its CQ blob. */
static int qmat_one(const cact_file *f, int idx, nd_qmat *q, int64_t rows, int64_t in,
                    const char *what)
{
    if (idx >= (int)f->hdr.num_tensors)
        return nd_error(ND_EFORMAT, "cact: archive ends before %s (tensor %d)", what, idx);
    const cact_tensor *t = &f->t[idx];
    if (t->dtype != CACT_CQ || t->ndim != 2 || t->group != ND_QGROUP)
        return nd_error(ND_EFORMAT,
                        "cact: tensor %d (%s) is not a 2-D CQ matrix of group %d (dtype %s, "
                        "group %u): load it with NEEDLE_FLOAT=1",
                        idx, what, ND_QGROUP, cact_dtype_name(t->dtype), t->group);
    if (t->shape[0] != (uint32_t)rows || t->shape[1] != (uint32_t)in)
        return nd_error(ND_ESHAPE, "cact: %s is [%u, %u], expected [%lld, %lld]", what, t->shape[0],
                        t->shape[1], (long long)rows, (long long)in);
    int rc =
        nd_qmat_init(q, f->data + t->offset, (size_t)t->nbytes, (int)rows, (int)in, (int)t->bits);
    return rc ? nd_error_prefix(rc, "%s", what) : ND_OK;
}

/* Tensors the quantised path reads from the archive in place. */
static int is_archive_matrix(const char *name)
{
    size_t n = strlen(name);
    return (n > 7 && !strcmp(name + n - 7, "/kernel")) || strstr(name, "embedding") ||
           strstr(name, "mhc_phi");
}

/* Layout of m with memory only for the small tensors (norms, gains, the
 * Hadamard MLP diagonals, taps): the matrices stay NULL. */
static int create_small(san_model *m, const san_config *c)
{
    int rc = san_model_layout(m, c);
    if (rc)
        return rc;
    size_t total = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!is_archive_matrix(m->tensors[i].name))
            total += m->tensors[i].numel;
    m->mem = calloc(total ? total : 1, sizeof(float));
    if (!m->mem) {
        free(m->tensors);
        m->tensors = NULL;
        return nd_error(ND_ENOMEM, "out of memory");
    }
    memset(&m->w, 0, sizeof m->w);
    size_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        san_tensor *t = &m->tensors[i];
        if (is_archive_matrix(t->name))
            continue;
        t->offset = off;
        *(float **)((char *)&m->w + t->slot) = m->mem + off;
        off += t->numel;
    }
    m->numel = total;
    return ND_OK;
}

void nd_qweights_free(nd_qweights *q)
{
    if (!q)
        return;
    free(q->layer);
    memset(q, 0, sizeof *q);
}

/* Walk the archive in its tensor order. q == NULL: dequantise everything
 * into m (float path); else matrices become views into f (quantised path)
 * and only the small tensors are converted into m. */
static int cact_load(const cact_file *f, san_model *m, nd_qweights *q)
{
    san_config c;
    int rc = nd_cact_config(f, &c);
    if (rc)
        return rc;
    if ((rc = q ? create_small(m, &c) : san_model_create(m, &c)))
        return rc;
    const san_dims *D = &m->dims;
    const san_weights *w = &m->w;
    size_t d = (size_t)D->d, hd = (size_t)D->hd, hn = (size_t)D->hada_n, qd = (size_t)D->q_dim,
           kvd = (size_t)D->kv_dim, n = (size_t)D->n;
    if (q) {
        memset(q, 0, sizeof *q);
        q->layer = calloc((size_t)D->L, sizeof *q->layer);
        if (!q->layer) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto fail;
        }
    }
    int idx = 0;
#define LOAD(dst, numel, map, a, b, c_, what)                                                      \
    do {                                                                                           \
        if ((rc = load_one(f, idx++, dst, numel, map, a, b, c_, what)))                            \
            goto fail;                                                                             \
    } while (0)
    /* a matrix stored [rows, in]: a view when quantised, else float `dst` */
#define MATRIX(dst, qdst, rows, in, numel, map, a, b, c_, what)                                    \
    do {                                                                                           \
        if (q)                                                                                     \
            rc = qmat_one(f, idx++, qdst, rows, in, what);                                         \
        else                                                                                       \
            rc = load_one(f, idx++, dst, numel, map, a, b, c_, what);                              \
        if (rc)                                                                                    \
            goto fail;                                                                             \
    } while (0)
    MATRIX(w->emb, &q->emb, D->V, d, (size_t)D->V * d, MAP_DIRECT, 0, 0, 0, "embedding");
    for (int l = 0; l < D->L; l++) {
        size_t L = (size_t)l;
        nd_qlayer *ql = q ? &q->layer[l] : NULL;
        LOAD(w->norm_in + L * d, d, MAP_DIRECT, 0, 0, 0, "norm_in");
        MATRIX(w->wq + L * d * qd, &ql->wq, qd, d, d * qd, MAP_KERNEL, d, qd, 0, "q_proj");
        MATRIX(w->wk + L * d * kvd, &ql->wk, kvd, d, d * kvd, MAP_KERNEL, d, kvd, 0, "k_proj");
        MATRIX(w->wv + L * d * kvd, &ql->wv, kvd, d, d * kvd, MAP_KERNEL, d, kvd, 0, "v_proj");
        LOAD(w->q_norm + L * hd, hd, MAP_DIRECT, 0, 0, 0, "q_norm");
        LOAD(w->k_norm + L * hd, hd, MAP_DIRECT, 0, 0, 0, "k_norm");
        MATRIX(w->wgate + L * d * qd, &ql->wgate, qd, d, d * qd, MAP_KERNEL, d, qd, 0, "gate_proj");
        MATRIX(w->wout + L * qd * d, &ql->wout, d, qd, qd * d, MAP_KERNEL, qd, d, 0, "out_proj");
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
    MATRIX(w->phi_pre, &q->phi_pre, Ls * n, n * d, Ls * n * d * n, MAP_PHI, Ls, n * d, n,
           "mhc_phi_pre");
    MATRIX(w->phi_post, &q->phi_post, Ls * n, n * d, Ls * n * d * n, MAP_PHI, Ls, n * d, n,
           "mhc_phi_post");
    MATRIX(w->phi_res, &q->phi_res, Ls * n * n, n * d, Ls * n * d * n * n, MAP_PHI, Ls, n * d,
           n * n, "mhc_phi_res");
    for (int s = 0; s < c.n_sites; s++) {
        size_t ed = (size_t)D->eng_dim;
        size_t rows = (size_t)D->eng_tables * (size_t)c.engram_slots;
        MATRIX(w->eng[s].table, &q->eng[s].table, rows, D->eng_sub, rows * (size_t)D->eng_sub,
               MAP_DIRECT, 0, 0, 0, "engram tables");
        /* a few rows a token at hashed places: read, not mapped (qmat.h) */
        if (q && f->has_fd)
            nd_qmat_read_rows(&q->eng[s].table, f->map_fd,
                              (long long)(q->eng[s].table.codes - f->data));
        MATRIX(w->eng[s].wk, &q->eng[s].wk, d, ed, ed * d, MAP_KERNEL, ed, d, 0, "engram key_proj");
        MATRIX(w->eng[s].wv, &q->eng[s].wv, d, ed, ed * d, MAP_KERNEL, ed, d, 0,
               "engram value_proj");
        LOAD(w->eng[s].taps, SAN_CONV_TAPS * d, MAP_DIRECT, 0, 0, 0, "engram taps");
    }
    LOAD(w->final_norm, d, MAP_DIRECT, 0, 0, 0, "final_norm");
#undef LOAD
#undef MATRIX
    return ND_OK;
fail:
    san_model_free(m);
    nd_qweights_free(q);
    return rc;
}

void nd_cact_release_pages(const cact_file *f)
{
#ifdef MADV_DONTNEED
    if (f->map)
        madvise(f->map, f->map_len, MADV_DONTNEED); /* advice: failure only costs memory */
#else
    (void)f;
#endif
}

int nd_engine_float_path(void)
{
    return nd_tuning_get()->float_path;
}

int nd_cact_to_model(const cact_file *f, san_model *m)
{
    return cact_load(f, m, NULL);
}

int nd_cact_to_qmodel(const cact_file *f, san_model *m, nd_qweights *q)
{
    return cact_load(f, m, q);
}

size_t nd_qweights_bytes_per_token(const nd_qweights *q, const san_model *m)
{
    const san_dims *D = &m->dims;
    size_t b = nd_qmat_bytes(&q->emb) + nd_qmat_bytes(&q->phi_pre) + nd_qmat_bytes(&q->phi_post) +
               nd_qmat_bytes(&q->phi_res);
    for (int l = 0; l < D->L; l++) {
        const nd_qlayer *ql = &q->layer[l];
        b += nd_qmat_bytes(&ql->wq) + nd_qmat_bytes(&ql->wk) + nd_qmat_bytes(&ql->wv) +
             nd_qmat_bytes(&ql->wgate) + nd_qmat_bytes(&ql->wout);
    }
    for (int s = 0; s < m->cfg.n_sites; s++) {
        const nd_qmat *t = &q->eng[s].table;
        /* one row per table per token */
        b += nd_qmat_bytes(&q->eng[s].wk) + nd_qmat_bytes(&q->eng[s].wv) +
             (size_t)D->eng_tables * (t->row_bytes + (size_t)t->ng * 2);
    }
    return b;
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
    /* 3.x's exporter allows fewer pieces than the vocabulary (code rows) */
    int v = nd_tokenizer_vocab_size(*tok);
    if (f->generation == 3 ? v > (int)f->hdr.vocab : v != (int)f->hdr.vocab) {
        nd_tokenizer_free(*tok);
        *tok = NULL;
        return nd_error(ND_ESHAPE, "cact: tokenizer has %d pieces, the model's vocab is %u", v,
                        f->hdr.vocab);
    }
    return ND_OK;
}

/* ------------------------------------------------------------------ */
/* Needle 3 archives (tag 0x05E12A84): 3.x export.py's layout          */

/* index of layer l's tensor k in the per-layer order (k as with taps) */
enum {
    L3_NORM_IN,
    L3_Q,
    L3_K,
    L3_V,
    L3_QT,
    L3_KT,
    L3_VT,
    L3_Q_NORM,
    L3_K_NORM,
    L3_GATE,
    L3_OUT,
    L3_POST,
    L3_ATTN_GATE,
    L3_PRE_HADA,
    L3_D1,
    L3_D2,
    L3_B2,
    L3_D3,
    L3_D4,
    L3_W1A,
    L3_W1B,
    L3_W2A,
    L3_W2B,
    L3_W3A,
    L3_W3B,
    L3_COND_V,
    L3_COND_U,
};

static uint32_t l3_index(const cact3_layout *lay, int l, int k)
{
    if (lay->per_layer == 24 && k > L3_V)
        k -= 3;
    return 1 + lay->per_layer * (uint32_t)l + (uint32_t)k;
}

static int shape_is(const cact_tensor *t, int ndim, const int64_t *s)
{
    if (t->ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if ((int64_t)t->shape[i] != s[i])
            return 0;
    return 1;
}

static void shape_str(char *b, size_t cap, int ndim, const int64_t *s)
{
    size_t n = (size_t)snprintf(b, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(b + n, cap - n, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (n < cap)
        snprintf(b + n, cap - n, ")");
}

/* tensor idx must be `dtype` of exactly this shape */
static int expect3(const cact_file *f, uint32_t idx, int dtype, int ndim, const int64_t *s)
{
    if (idx >= f->hdr.num_tensors)
        return nd_error(ND_EFORMAT, "cact: the archive ends before tensor %u", idx);
    const cact_tensor *t = &f->t[idx];
    if (t->dtype != dtype || !shape_is(t, ndim, s)) {
        char want[96], got[96];
        int64_t g[4];
        for (int i = 0; i < 4; i++)
            g[i] = t->shape[i];
        shape_str(want, sizeof want, ndim, s);
        shape_str(got, sizeof got, t->ndim < 4 ? t->ndim : 4, g);
        return nd_error(ND_ESHAPE,
                        "cact: tensor %u (%s) is %s %s, the header's geometry needs %s %s", idx,
                        t->name, cact_dtype_name(t->dtype), got, cact_dtype_name(dtype), want);
    }
    return ND_OK;
}

#define S3(...) ((const int64_t[]){__VA_ARGS__})

static void fp16_into(const cact_file *f, uint32_t idx, float *dst)
{
    const cact_tensor *t = &f->t[idx];
    const unsigned char *p = f->data + t->offset;
    for (uint64_t i = 0; i < t->nbytes / 2; i++)
        dst[i] = nd_half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
}

int nd_cact3_config(const cact_file *f, san_config *c)
{
    if (f->generation != 3)
        return nd_error(ND_EFORMAT, "cact: not a Needle 3 archive (tag 0x%08X)", f->hdr.tag);
    const cact_header3 *h = &f->h3;
    san_config_default3(c);
#define LIM(field, lo, hi)                                                                         \
    do {                                                                                           \
        if ((long long)h->field < (lo) || (long long)h->field > (hi))                              \
            return nd_error(ND_EFORMAT, "cact header: %s = %u is outside [%lld, %lld]", #field,    \
                            h->field, (long long)(lo), (long long)(hi));                           \
    } while (0)
    LIM(vocab, 16, 1 << 20);
    LIM(out_vocab, 0, h->vocab);
    LIM(d_model, 2, 1 << 14);
    LIM(num_heads, 1, 1024);
    LIM(num_kv_heads, 1, h->num_heads);
    LIM(num_layers, 1, 64);
    LIM(qk_head_dim, 2, 4096);
    LIM(v_head_dim, 1, 4096);
    LIM(max_seq_len, 2, 1 << 20);
    LIM(mhc_lanes, 1, 64);
    LIM(sliding_window, 0, 1 << 20);
    LIM(qkv_conv_taps, 0, SAN_MAX_QKV_TAPS);
    LIM(num_engram_orders, 1, 4);
    LIM(num_engram_sites, 0, SAN_MAX_SITES);
    LIM(engram_seed_heads, 0, 1 << 16);
    LIM(kv_bits, 1, 8);
    LIM(engram_conv_taps, SAN_CONV_TAPS, SAN_CONV_TAPS);
#undef LIM
    if (h->qk_head_dim % 2)
        return nd_error(ND_EFORMAT, "cact header: qk_head_dim %u must be even for RoPE",
                        h->qk_head_dim);
    c->vocab_size = (int)h->vocab;
    c->out_vocab = (int)h->out_vocab;
    c->d_model = (int)h->d_model;
    c->num_heads = (int)h->num_heads;
    c->num_kv_heads = (int)h->num_kv_heads;
    c->num_layers = (int)h->num_layers;
    c->qk_head_dim = (int)h->qk_head_dim;
    c->v_head_dim = (int)h->v_head_dim;
    c->max_seq_len = (int)h->max_seq_len;
    c->mhc_lanes = (int)h->mhc_lanes;
    c->sliding_window = (int)h->sliding_window;
    c->qkv_conv_taps = (int)h->qkv_conv_taps;
    c->engram_seed_heads = (int)h->engram_seed_heads;
    c->rope_theta = h->rope_theta;
    c->kv_window = (int)h->kv_window;
    c->kv_bits = (int)h->kv_bits;
    uint64_t gm = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo;
    if (h->num_layers < 64 && gm >> h->num_layers)
        return nd_error(ND_EFORMAT, "cact header: global_mask 0x%016llX marks layers past %u",
                        (unsigned long long)gm, h->num_layers);
    c->n_global = 0;
    for (int i = 0; i < 64; i++)
        if (gm >> i & 1)
            c->global_layers[c->n_global++] = i;
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
    if (h->engram_slots < 1 || h->engram_slots > (1u << 28))
        return nd_error(ND_EFORMAT, "cact header: engram_slots %u unsupported", h->engram_slots);
    c->engram_slots = (int)h->engram_slots;
    if (!h->num_engram_tables || h->num_engram_tables % h->num_engram_orders ||
        h->num_engram_tables > 4096)
        return nd_error(ND_EFORMAT, "cact header: %u engram tables for %u orders",
                        h->num_engram_tables, h->num_engram_orders);
    c->engram_heads = (int)(h->num_engram_tables / h->num_engram_orders);
    c->n_cla = 0;
    c->n_bank_ids = 0;
    c->n_ladder_widths = 0;

    /* what the header does not carry, the tensors say */
    cact3_layout lay;
    int rc = cact3_layout_of(f, &lay);
    if (rc)
        return rc;
    int64_t H = c->num_heads, vhd = c->v_head_dim, d = c->d_model;
    const cact_tensor *gate = &f->t[l3_index(&lay, 0, L3_GATE)];
    if (gate->dtype == CACT_CQ && gate->ndim == 2 && gate->shape[0] == (uint32_t)(H * vhd))
        c->attention_gate = SAN_GATE_ELEMENTWISE;
    else if (gate->dtype == CACT_CQ && gate->ndim == 2 && gate->shape[0] == (uint32_t)H)
        c->attention_gate = SAN_GATE_HEADWISE;
    else
        return nd_error(ND_ESHAPE,
                        "cact: layer00.gate_proj (tensor %u) has %u rows: neither H * v_head_dim "
                        "= %lld (elementwise gate) nor H = %lld (headwise)",
                        l3_index(&lay, 0, L3_GATE), gate->shape[0], (long long)(H * vhd),
                        (long long)H);
    const cact_tensor *w1a = &f->t[l3_index(&lay, 0, L3_W1A)];
    c->hada_factor_mode = w1a->ndim == 3 ? SAN_HADA_BLOCK_UNTIED : SAN_HADA_SHARED;
    san_dims D;
    if ((rc = san_config_dims(c, &D)))
        return nd_error_prefix(rc, "cact header");
    if ((uint32_t)D.hada_n != h->hada_n)
        return nd_error(ND_EFORMAT, "cact header: hada_n %u, expected %d for d_model %lld",
                        h->hada_n, D.hada_n, (long long)d);
    if ((uint32_t)D.eng_sub != h->engram_sub_dim && c->n_sites)
        return nd_error(ND_EFORMAT, "cact header: engram_sub_dim %u, the geometry gives %d",
                        h->engram_sub_dim, D.eng_sub);
    if ((uint32_t)D.eng_dilation != h->engram_conv_dilation && c->n_sites)
        return nd_error(ND_EFORMAT, "cact header: engram_conv_dilation %u, max(orders) is %d",
                        h->engram_conv_dilation, D.eng_dilation);
    /* the Hadamard tables: 3.x's permutations, plain or split (ladder_widths) */
    if ((rc = expect3(f, lay.first_perm, CACT_FP32, 1, S3(D.hada_n))) ||
        (rc = expect3(f, lay.first_perm + 1, CACT_FP32, 1, S3(D.hada_n))))
        return rc;
    for (int split = 0; split < 2; split++) {
        san_hada3_geom g;
        if ((rc = san_hada3_geom_init(&g, c->d_model, c->hada_factor_mode == SAN_HADA_BLOCK_UNTIED,
                                      split)))
            return rc;
        int same = 1;
        for (int k = 0; k < 2 && same; k++) {
            const unsigned char *p = f->data + f->t[lay.first_perm + (uint32_t)k].offset;
            const int32_t *perm = k ? g.perm2 : g.perm1;
            for (int i = 0; i < D.hada_n && same; i++)
                same = get_f32(p + 4 * (size_t)i) == (float)perm[i];
        }
        san_hada3_geom_free(&g);
        if (same) {
            c->n_ladder_widths = split; /* split permutations: 3.x's hada_split */
            if (split)
                c->ladder_widths[0] = c->d_model / 2;
            return ND_OK;
        }
    }
    return nd_error(ND_EFORMAT,
                    "cact: hada_p1 / hada_p2 (tensors %u, %u) are not the permutations 3.x's "
                    "HadamardMLP derives for hada_n %d (RandomState(11 / 13), plain or split)",
                    lay.first_perm, lay.first_perm + 1, D.hada_n);
}

void nd_qweights3_free(nd_qweights3 *q)
{
    if (!q)
        return;
    nd_qweights_free(&q->q);
    free(q->perm1);
    free(q->perm2);
    for (int i = 0; i < 3; i++) {
        free(q->head[i].gain);
        free(q->head[i].row_bias);
        free(q->head[i].bias);
        free(q->head[i].probes_f);
        free(q->head[i].query_f);
        free(q->head[i].proj_f);
    }
    memset(q, 0, sizeof *q);
}

static float *fp16_copy(const cact_file *f, uint32_t idx)
{
    float *w = malloc((size_t)(f->t[idx].nbytes / 2) * sizeof *w + 1);
    if (w)
        fp16_into(f, idx, w);
    return w;
}

/* the probe heads after final_norm: heads.manifest, then per head probes,
 * gain, query, row_bias, proj, bias (+ calibration for the router); the
 * walk must use exactly the tensors before the tokenizer */
static int heads3(const cact_file *f, const cact3_layout *lay, const san_dims *D, nd_qweights3 *q,
                  int floats)
{
    if (lay->manifest < 0)
        return ND_OK;
    uint32_t n = f->hdr.num_tensors - (uint32_t)lay->tokenizer, i = (uint32_t)lay->manifest;
    const cact_tensor *man = &f->t[i];
    if (man->dtype != CACT_FP16 || man->ndim != 1 || man->shape[0] < 1 || man->shape[0] > 3)
        return nd_error(ND_EFORMAT,
                        "cact: tensor %u after final_norm must be heads.manifest, an FP16 list "
                        "of 1 to 3 head codes",
                        i);
    int nh = (int)man->shape[0], seen = 0;
    int64_t L1 = D->L + 1, d = D->d;
    float codes[3];
    fp16_into(f, i++, codes);
    for (int h = 0; h < nh; h++) {
        int code = (int)codes[h];
        if ((float)code != codes[h] || code < 1 || code > 3 || (seen >> code & 1))
            return nd_error(ND_EFORMAT,
                            "cact: heads.manifest entry %d is %g, not a new head code "
                            "1 (embedding), 2 (confidence) or 3 (router)",
                            h, (double)codes[h]);
        seen |= 1 << code;
        nd_qhead3 *hd = &q->head[h];
        hd->code = code;
        uint32_t need = code == 3 ? 7 : 6;
        if (i + need > n)
            return nd_error(ND_EFORMAT, "cact: head %d (code %d) needs %u tensors, %u remain", h,
                            code, need, n - i);
        const cact_tensor *pr = &f->t[i], *qu = &f->t[i + 2], *pj = &f->t[i + 4];
        if (pr->ndim != 2 || pr->shape[1] != (uint32_t)d || pr->shape[0] % (uint32_t)L1 ||
            !pr->shape[0])
            return nd_error(ND_ESHAPE,
                            "cact: %s (tensor %u) must be [(L+1) * k, d] = [%lld * k, %lld]",
                            pr->name, i, (long long)L1, (long long)d);
        hd->k = (int)(pr->shape[0] / (uint32_t)L1);
        hd->q = qu->ndim == 2 ? (int)qu->shape[0] : 0;
        hd->out = pj->ndim == 2 ? (int)pj->shape[0] : 0;
        int64_t k = hd->k, qn = hd->q, out = hd->out;
        int rc;
        if (qn < 1 || out < 1)
            return nd_error(ND_ESHAPE, "cact: head %d (code %d) has %lld queries and %lld outputs",
                            h, code, (long long)qn, (long long)out);
        if ((rc = qmat_one(f, (int)i, &hd->probes, L1 * k, d, pr->name)) ||
            (rc = expect3(f, i + 1, CACT_FP16, 2, S3(L1, k))) ||
            (rc = qmat_one(f, (int)i + 2, &hd->query, qn, d, qu->name)) ||
            (rc = expect3(f, i + 3, CACT_FP16, 3, S3(qn, L1, k))) ||
            (rc = qmat_one(f, (int)i + 4, &hd->proj, out, qn * d, pj->name)) ||
            (rc = expect3(f, i + 5, CACT_FP16, 1, S3(out))) ||
            (code == 3 && (rc = expect3(f, i + 6, CACT_FP16, 1, S3(3)))))
            return rc;
        hd->gain = fp16_copy(f, i + 1);
        hd->row_bias = fp16_copy(f, i + 3);
        hd->bias = fp16_copy(f, i + 5);
        if (!hd->gain || !hd->row_bias || !hd->bias)
            return nd_error(ND_ENOMEM, "out of memory");
        if (code == 3)
            fp16_into(f, i + 6, hd->calibration);
        if (floats) { /* the float layouts model/probe3.h reads */
            size_t nn;
            float *pt = NULL;
            if ((rc = cact_dequant(f, (int)i, &hd->probes_f, &nn)) ||
                (rc = cact_dequant(f, (int)i + 2, &hd->query_f, &nn)) ||
                (rc = cact_dequant(f, (int)i + 4, &pt, &nn)))
                return rc;
            hd->proj_f = malloc((size_t)(qn * d * out) * sizeof *hd->proj_f + 1);
            if (!hd->proj_f) {
                free(pt);
                return nd_error(ND_ENOMEM, "out of memory");
            }
            for (int64_t o = 0; o < out; o++) /* [out, q*d] -> [q*d, out] */
                for (int64_t x = 0; x < qn * d; x++)
                    hd->proj_f[x * out + o] = pt[o * qn * d + x];
            free(pt);
        }
        i += need;
        q->n_heads = h + 1;
    }
    if (i != n)
        return nd_error(ND_EFORMAT,
                        "cact: %u tensors between the probe heads and the tokenizer that no head "
                        "uses",
                        n - i);
    return ND_OK;
}

/* Walk a v3 archive. q == NULL: dequantise every model tensor into m;
 * else small tensors into m and the matrices as views (q->q). */
/* One walk over the model tensors. m == NULL: only check every record
 * against the geometry (before anything is allocated from the header's
 * numbers); else convert into m (and q: views). */
static int walk3(const cact_file *f, const san_config *cp, const san_dims *D,
                 const cact3_layout *lp, san_model *m, nd_qweights3 *q)
{
    const san_config c = *cp;
    const cact3_layout lay = *lp;
    int rc = ND_OK;
    nd_qweights3 unused; /* view targets when there is no q (never read) */
    nd_qlayer unused_layer;
    nd_qweights3 *qv = q ? q : &unused;
    const san_weights *w = m ? &m->w : NULL;
    int64_t d = D->d, hn = D->hada_n, n = D->n, L = D->L, T = c.qkv_conv_taps;
    int64_t ba = D->hada_ba, bb = D->hada_bb, R = SAN_HADA_COND_RANK;
    int untied = c.hada_factor_mode == SAN_HADA_BLOCK_UNTIED;
    /* an FP16 tensor of exactly this shape into dst */
#define SMALL(idx, dst, nd_, ...)                                                                  \
    do {                                                                                           \
        if ((rc = expect3(f, idx, CACT_FP16, nd_, S3(__VA_ARGS__))))                               \
            return rc;                                                                             \
        if (m)                                                                                     \
            fp16_into(f, idx, dst);                                                                \
    } while (0)
    /* a CQ matrix stored [rows, in]: a view, or dequantised through map */
#define MAT(idx, dst, qdst, rows, in, map, a, b, c_)                                               \
    do {                                                                                           \
        uint32_t ix_ = (idx);                                                                      \
        if ((rc = expect3(f, ix_, CACT_CQ, 2, S3(rows, in))))                                      \
            return rc;                                                                             \
        if (m && q)                                                                                \
            rc = qmat_one(f, (int)ix_, qdst, rows, in, f->t[ix_].name);                            \
        else if (m)                                                                                \
            rc = load_one(f, (int)ix_, dst, (size_t)(rows) * (size_t)(in), map, a, b, c_,          \
                          f->t[ix_].name);                                                         \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)
    MAT(0, w->emb, &qv->q.emb, D->V, d, MAP_DIRECT, 0, 0, 0);
    for (int l = 0; l < L; l++) {
        size_t li = (size_t)l;
        nd_qlayer *ql = m && q ? &qv->q.layer[l] : &unused_layer;
#define IX(k) l3_index(&lay, l, k)
        SMALL(IX(L3_NORM_IN), w->norm_in + li * d, 1, d);
        MAT(IX(L3_Q), w->wq + li * d * D->q_dim, &ql->wq, D->q_dim, d, MAP_KERNEL, d, D->q_dim, 0);
        MAT(IX(L3_K), w->wk + li * d * D->k_dim, &ql->wk, D->k_dim, d, MAP_KERNEL, d, D->k_dim, 0);
        MAT(IX(L3_V), w->wv + li * d * D->v_dim, &ql->wv, D->v_dim, d, MAP_KERNEL, d, D->v_dim, 0);
        if (T) {
            SMALL(IX(L3_QT), w->q_taps + li * T * D->q_dim, 2, T, D->q_dim);
            SMALL(IX(L3_KT), w->k_taps + li * T * D->k_dim, 2, T, D->k_dim);
            SMALL(IX(L3_VT), w->v_taps + li * T * D->v_dim, 2, T, D->v_dim);
        }
        SMALL(IX(L3_Q_NORM), w->q_norm + li * D->hd, 1, D->hd);
        SMALL(IX(L3_K_NORM), w->k_norm + li * D->hd, 1, D->hd);
        MAT(IX(L3_GATE), w->wgate + li * d * D->gate_dim, &ql->wgate, D->gate_dim, d, MAP_KERNEL, d,
            D->gate_dim, 0);
        MAT(IX(L3_OUT), w->wout + li * D->o_dim * d, &ql->wout, d, D->o_dim, MAP_KERNEL, D->o_dim,
            d, 0);
        SMALL(IX(L3_POST), w->post_norm + li * d, 1, d);
        SMALL(IX(L3_ATTN_GATE), w->attn_gate + li, 1, 1);
        SMALL(IX(L3_PRE_HADA), w->pre_hada + li * d, 1, d);
        SMALL(IX(L3_D1), w->d1 + li * hn, 1, hn);
        SMALL(IX(L3_D2), w->d2 + li * hn, 1, hn);
        SMALL(IX(L3_B2), w->b2 + li * hn, 1, hn);
        SMALL(IX(L3_D3), w->d3 + li * hn, 1, hn);
        SMALL(IX(L3_D4), w->d4 + li * hn, 1, hn);
        float *none[3] = {NULL, NULL, NULL};
        float *const *fa = none, *const *fb = none;
        float *wa[3], *wb[3];
        if (m) {
            wa[0] = w->w1a, wa[1] = w->w2a, wa[2] = w->w3a;
            wb[0] = w->w1b, wb[1] = w->w2b, wb[2] = w->w3b;
            fa = wa;
            fb = wb;
        }
        for (int k = 0; k < 3; k++) {
            if (untied) {
                SMALL(IX(L3_W1A + 2 * k), fa[k] + li * bb * ba * ba, 3, bb, ba, ba);
                SMALL(IX(L3_W1B + 2 * k), fb[k] + li * ba * bb * bb, 3, ba, bb, bb);
            } else {
                SMALL(IX(L3_W1A + 2 * k), fa[k] + li * ba * ba, 2, ba, ba);
                SMALL(IX(L3_W1B + 2 * k), fb[k] + li * bb * bb, 2, bb, bb);
            }
        }
        SMALL(IX(L3_COND_V), w->cond_v + li * d * R, 2, d, R);
        SMALL(IX(L3_COND_U), w->cond_u + li * R * hn, 2, R, hn);
#undef IX
    }
    uint32_t i = lay.first_mhc;
    SMALL(i, w->a_pre, 1, L);
    SMALL(i + 1, w->a_post, 1, L);
    SMALL(i + 2, w->a_res, 1, L);
    SMALL(i + 3, w->b_pre, 2, L, n);
    SMALL(i + 4, w->b_post, 2, L, n);
    SMALL(i + 5, w->b_res, 3, L, n, n);
    MAT(i + 6, w->phi_pre, &qv->q.phi_pre, L * n, n * d, MAP_PHI, L, n * d, n);
    MAT(i + 7, w->phi_post, &qv->q.phi_post, L * n, n * d, MAP_PHI, L, n * d, n);
    MAT(i + 8, w->phi_res, &qv->q.phi_res, L * n * n, n * d, MAP_PHI, L, n * d, n * n);
    if (m && q) { /* checked against 3.x's permutations by nd_cact3_config */
        for (int k = 0; k < 2; k++) {
            const unsigned char *p = f->data + f->t[lay.first_perm + (uint32_t)k].offset;
            for (int64_t x = 0; x < hn; x++)
                (k ? q->perm2 : q->perm1)[x] = (int32_t)get_f32(p + 4 * x);
        }
    }
    for (int s = 0; s < c.n_sites; s++) {
        uint32_t e = lay.first_engram + 4 * (uint32_t)s;
        int64_t rows = (int64_t)D->eng_tables * c.engram_slots, ed = D->eng_dim;
        MAT(e, w->eng[s].table, &qv->q.eng[s].table, rows, D->eng_sub, MAP_DIRECT, 0, 0, 0);
        MAT(e + 1, w->eng[s].wk, &qv->q.eng[s].wk, d, ed, MAP_KERNEL, ed, d, 0);
        MAT(e + 2, w->eng[s].wv, &qv->q.eng[s].wv, d, ed, MAP_KERNEL, ed, d, 0);
        SMALL(e + 3, w->eng[s].taps, 2, SAN_CONV_TAPS, d);
    }
    SMALL(lay.final_norm, w->final_norm, 1, d);
#undef SMALL
#undef MAT
    nd_qweights3 hq;
    memset(&hq, 0, sizeof hq);
    rc = heads3(f, &lay, D, m && q ? q : &hq, m && q);
    nd_qweights3_free(&hq);
    return rc;
}

static int cact3_load(const cact_file *f, san_model *m, nd_qweights3 *q)
{
    san_config c;
    san_dims D;
    cact3_layout lay;
    int rc;
    if ((rc = nd_cact3_config(f, &c)) || (rc = san_config_dims(&c, &D)) ||
        (rc = cact3_layout_of(f, &lay)))
        return rc;
    /* every record against the geometry first: the allocations below are
     * sized by the header, so they must be backed by the file's blobs */
    if ((rc = walk3(f, &c, &D, &lay, NULL, NULL)))
        return rc;
    if ((rc = q ? create_small(m, &c) : san_model_create(m, &c)))
        return rc;
    if (q) {
        memset(q, 0, sizeof *q);
        q->q.layer = calloc((size_t)D.L, sizeof *q->q.layer);
        q->perm1 = malloc((size_t)D.hada_n * sizeof *q->perm1);
        q->perm2 = malloc((size_t)D.hada_n * sizeof *q->perm2);
        if (!q->q.layer || !q->perm1 || !q->perm2) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = walk3(f, &c, &m->dims, &lay, m, q)))
        goto fail;
    return ND_OK;
fail:
    san_model_free(m);
    nd_qweights3_free(q);
    return rc;
}

int nd_cact3_to_qmodel(const cact_file *f, san_model *m, nd_qweights3 *q)
{
    return cact3_load(f, m, q);
}

int nd_cact3_to_model(const cact_file *f, san_model *m)
{
    return cact3_load(f, m, NULL);
}
