/* .cact archive -> san_model: float32 (dequantise at load) or, for the
 * quantised path, small tensors in float and CQ matrices read in place. */
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

int nd_engine_float_path(void)
{
    const char *v = getenv("NEEDLE_FLOAT");
    return v && *v && strcmp(v, "0");
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
    if (nd_tokenizer_vocab_size(*tok) != (int)f->hdr.vocab) {
        int v = nd_tokenizer_vocab_size(*tok);
        nd_tokenizer_free(*tok);
        *tok = NULL;
        return nd_error(ND_ESHAPE, "cact: tokenizer has %d pieces, the model's vocab is %u", v,
                        f->hdr.vocab);
    }
    return ND_OK;
}
