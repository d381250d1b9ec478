#define _POSIX_C_SOURCE 200809L
#include "io/cact.h"
#include "io/cact_bytes.h"

#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/fp16.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/cq.h"
#include "model/hada3.h"

#define TOK_HEADER_SIZE 24

/* ------------------------------------------------------------------ */
/* little-endian helpers                                               */

static void put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_f32(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(p, u);
}

/* numpy float64 -> float16 (one correct rounding): round to odd at float
 * precision first, which cannot double-round at half precision. */
static uint16_t double_to_half(double d)
{
    float f = (float)d;
    if (isfinite(f) && (double)f != d) {
        if (fabs((double)f) > fabs(d))
            f = nextafterf(f, 0.0f);
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= 1;
        memcpy(&f, &u, 4);
    }
    return nd_float_to_half(f);
}

/* ------------------------------------------------------------------ */
/* the export plan                                                      */

typedef enum {
    SRC_MODEL_FP16, /* f[0..numel) -> FP16 */
    SRC_PV_FP16,    /* arr elements [elem0, elem0+numel) -> FP16 */
    SRC_PV_FP16_T,  /* 2-D arr transposed -> FP16 */
    SRC_VALUES,     /* small literal list (manifest, zero bias) */
    SRC_CQ_DIRECT,  /* f is [out, in] */
    SRC_CQ_KERNEL,  /* f is [in, out] (a flax kernel); export its transpose */
    SRC_CQ_PHI,     /* f is (L, nC, lanes); export (L*lanes, nC) */
    SRC_RAW,
    SRC_PERM, /* v3 hada_p1 / hada_p2: int32 permutation -> FP32 */
} src_kind;

typedef struct {
    cact_tensor rec;
    src_kind src;
    const float *f;
    const pv *arr;
    size_t elem0;
    int64_t a, b, c; /* source geometry */
    double values[4];
    const void *raw;
    const int32_t *perm;
} entry;

typedef struct {
    entry *e;
    int n, cap;
    cact_header hdr;
    float cb[CQ_HEADER_CODEBOOK_LEN];
    int group;
    int default_bits;
    cq_bits_map map;
    int use_map;
    int gen;          /* 2 or 3 */
    cact_header3 h3;  /* gen 3 */
    san_hada3_geom g; /* gen 3: the permutation tables */
    float **owned;    /* gen 3: float copies of head arrays */
    int n_owned;
} plan;

static entry *push(plan *p, const char *name, int dtype, src_kind src)
{
    if (p->n == p->cap) {
        int nc = p->cap ? p->cap * 2 : 128;
        entry *e = realloc(p->e, (size_t)nc * sizeof *e);
        if (!e)
            return NULL;
        p->e = e;
        p->cap = nc;
    }
    entry *e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->rec.name, sizeof e->rec.name, "%s", name);
    e->rec.dtype = (uint8_t)dtype;
    e->src = src;
    return e;
}

static void set_shape(entry *e, int ndim, const int64_t *shape)
{
    e->rec.ndim = (uint8_t)ndim;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->rec.shape[i] = (uint32_t)shape[i];
        numel *= (uint64_t)shape[i];
    }
    if (e->rec.dtype == CACT_FP16)
        e->rec.nbytes = numel * 2;
}

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* an FP16 tensor from a model tensor slice (or its stored float64 array) */
static int add_fp16(plan *p, const san_model *m, const pv *params, const char *tname, size_t elem0,
                    const char *name, int ndim, const int64_t *shape)
{
    const san_tensor *t = san_model_find(m, tname);
    if (!t)
        return nd_error(ND_ESHAPE, "model has no tensor %s", tname);
    const pv *arr = params ? ckpt_tree_get(params, tname) : NULL;
    int f64 = arr && arr->kind == PV_NDARRAY && arr->u.nd.dtype == ND_F64 &&
              (size_t)pv_nd_numel(arr) == t->numel;
    entry *e = push(p, name, CACT_FP16, f64 ? SRC_PV_FP16 : SRC_MODEL_FP16);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    e->f = m->mem + t->offset + elem0;
    e->arr = f64 ? arr : NULL;
    e->elem0 = elem0;
    set_shape(e, ndim, shape);
    return ND_OK;
}

static int add_cq_bits(plan *p, const char *name, src_kind src, const float *f, int64_t a,
                       int64_t b, int64_t c, int bits);

static int add_cq(plan *p, const char *name, src_kind src, const float *f, int64_t a, int64_t b,
                  int64_t c)
{
    return add_cq_bits(p, name, src, f, a, b, c,
                       p->use_map ? cq_bits_for(&p->map, name) : p->default_bits);
}

static int add_cq_bits(plan *p, const char *name, src_kind src, const float *f, int64_t a,
                       int64_t b, int64_t c, int bits)
{
    entry *e = push(p, name, CACT_CQ, src);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    e->f = f;
    e->a = a;
    e->b = b;
    e->c = c;
    int64_t out, in;
    if (src == SRC_CQ_DIRECT) {
        out = a;
        in = b;
    } else if (src == SRC_CQ_KERNEL) {
        out = b;
        in = a;
    } else {
        out = a * c;
        in = b;
    }
    e->rec.ndim = 2;
    e->rec.shape[0] = (uint32_t)out;
    e->rec.shape[1] = (uint32_t)in;
    e->rec.group = (uint32_t)p->group;
    e->rec.bits = (uint32_t)bits;
    e->rec.nbytes = cq_blob_bytes(out, in, bits, p->group);
    if (!e->rec.nbytes && out && in)
        return nd_error(ND_ELIMIT, "%s: matrix [%lld, %lld] is too large", name, (long long)out,
                        (long long)in);
    return ND_OK;
}

static int float_array(const pv *a)
{
    return a && a->kind == PV_NDARRAY &&
           (a->u.nd.dtype == ND_F16 || a->u.nd.dtype == ND_F32 || a->u.nd.dtype == ND_F64);
}

static int plan_heads(plan *p, const pv *params)
{
    static const struct {
        const char *key;
        float code;
    } heads[] = {{"contrastive_head", 1.0f}, {"confidence_head", 2.0f}};
    const pv *present[2];
    int n = 0;
    double codes[2];
    for (int i = 0; i < 2; i++) {
        const pv *h = params ? pv_dict_get(params, heads[i].key) : NULL;
        if (h) {
            codes[n] = heads[i].code;
            present[n++] = h;
        }
    }
    if (!n)
        return ND_OK;
    entry *e = push(p, "heads.manifest", CACT_FP16, SRC_VALUES);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        e->values[i] = codes[i];
    set_shape(e, 1, SH(n));
    for (int i = 0; i < n; i++) {
        const char *key = codes[i] == 1.0f ? "contrastive_head" : "confidence_head";
        char name[64];
        const pv *probes = ckpt_tree_get(present[i], "probes");
        const pv *kernel = ckpt_tree_get(present[i], "proj/kernel");
        const pv *bias = ckpt_tree_get(present[i], "proj/bias");
        if (!float_array(probes) || probes->u.nd.ndim > 4)
            return nd_error(ND_ESHAPE, "params/%s/probes is missing or not a float array", key);
        if (!float_array(kernel) || kernel->u.nd.ndim != 2)
            return nd_error(ND_ESHAPE, "params/%s/proj/kernel is missing or not a 2-D array", key);
        int64_t out = kernel->u.nd.shape[1];
        if (bias && (!float_array(bias) || bias->u.nd.ndim != 1 || bias->u.nd.shape[0] != out))
            return nd_error(ND_ESHAPE, "params/%s/proj/bias must be a float array of shape (%lld,)",
                            key, (long long)out);
        snprintf(name, sizeof name, "%s.probes", key);
        if (!(e = push(p, name, CACT_FP16, SRC_PV_FP16)))
            return nd_error(ND_ENOMEM, "out of memory");
        e->arr = probes;
        set_shape(e, probes->u.nd.ndim, probes->u.nd.shape);
        snprintf(name, sizeof name, "%s.proj", key);
        if (!(e = push(p, name, CACT_FP16, SRC_PV_FP16_T)))
            return nd_error(ND_ENOMEM, "out of memory");
        e->arr = kernel;
        set_shape(e, 2, SH(out, kernel->u.nd.shape[0]));
        snprintf(name, sizeof name, "%s.bias", key);
        if (!(e = push(p, name, CACT_FP16, bias ? SRC_PV_FP16 : SRC_VALUES)))
            return nd_error(ND_ENOMEM, "out of memory");
        e->arr = bias;
        set_shape(e, 1, SH(out));
    }
    return ND_OK;
}

static void plan_free(plan *p)
{
    for (int i = 0; i < p->n_owned; i++)
        free(p->owned[i]);
    free(p->owned);
    san_hada3_geom_free(&p->g);
    free(p->e);
    cq_bits_map_free(&p->map);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------ */
/* Needle 3 (tag 0x05E12A84): the layout of cactus-needle 3.x export.py */

static double pv_elem(const pv *a, size_t i);

int cact3_effective_kv_window(const san_config *c)
{
    const long budget = 11L * 1024 * 1024 + 512 * 1024, group = 32, wmin = 160;
    long legacy = (c->attn_dim ? c->attn_dim : c->d_model) / c->num_heads;
    long qk = c->qk_head_dim ? c->qk_head_dim : legacy, v = c->v_head_dim ? c->v_head_dim : legacy;
    long kd = c->num_kv_heads * qk, vd = c->num_kv_heads * v, d = c->d_model, L = c->num_layers;
    long per_layer = kd + vd + (kd / group + vd / group) * 4;
    long per_site = d + (d / group) * 4;
    long window;
    if (c->sliding_window) {
        long local = c->sliding_window < c->max_seq_len ? c->sliding_window : c->max_seq_len;
        long fixed = ((L - c->n_global) * per_layer + c->n_sites * per_site) * local;
        if (c->n_global == 0) {
            window = fixed <= budget ? c->max_seq_len : (local > wmin ? local : wmin);
        } else {
            long rest = budget - fixed; /* python floors; a negative rest ends at wmin anyway */
            long ctx = rest < 0 ? -1 : rest / (c->n_global * per_layer) / group * group;
            if (ctx > c->max_seq_len)
                ctx = c->max_seq_len;
            window = ctx > wmin ? ctx : wmin;
        }
    } else {
        long per_pos = L * per_layer + c->n_sites * per_site;
        window = (budget / per_pos) / group * group;
        if (window > c->max_seq_len)
            window = c->max_seq_len;
        if (window < wmin)
            window = wmin;
    }
    if (c->kv_window && c->kv_window < window)
        window = c->kv_window;
    return (int)window;
}

static float *plan_own(plan *p, size_t n)
{
    float **o = realloc(p->owned, (size_t)(p->n_owned + 1) * sizeof *o);
    if (!o)
        return NULL;
    p->owned = o;
    float *f = malloc(n * sizeof *f + 1);
    if (f)
        p->owned[p->n_owned++] = f;
    return f;
}

/* np.asarray(a, np.float32) */
static const float *pv_f32(plan *p, const pv *a)
{
    size_t n = (size_t)pv_nd_numel(a);
    float *f = plan_own(p, n);
    if (f)
        for (size_t i = 0; i < n; i++)
            f[i] = (float)pv_elem(a, i);
    return f;
}

/* an FP16 tensor straight from a params array (np.asarray(a, np.float16)) */
static int add_pv_fp16(plan *p, const char *name, const pv *a)
{
    entry *e = push(p, name, CACT_FP16, SRC_PV_FP16);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    e->arr = a;
    set_shape(e, a->u.nd.ndim, a->u.nd.shape);
    return ND_OK;
}

/* literal FP16 values (the manifest, an absent bias, the router's default calibration) */
static int add_values(plan *p, const char *name, const double *v, int64_t n)
{
    entry *e = push(p, name, CACT_FP16, SRC_VALUES);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n && i < 4; i++)
        e->values[i] = v ? v[i] : 0.0;
    set_shape(e, 1, SH(n));
    return ND_OK;
}

static int float_array(const pv *a);
static int add_cq_bits(plan *p, const char *name, src_kind src, const float *f, int64_t a,
                       int64_t b, int64_t c, int bits);

/* 3.x _head_tensors: heads.manifest, then per present head (embedding 1,
 * confidence 2, router 3) probes, gain, query, row_bias, proj, bias
 * (+ the router's calibration); probes, query and proj are CQ at
 * HEAD_BITS reshaped to (-1, last axis), the rest FP16. */
static int plan_heads3(plan *p, const pv *params)
{
    static const char *keys[3] = {"embedding_head", "confidence_head", "router_head"};
    const pv *h[3];
    double codes[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        h[i] = params && params->kind == PV_DICT ? pv_dict_get(params, keys[i]) : NULL;
        if (h[i])
            codes[n++] = i + 1;
    }
    if (!n)
        return ND_OK;
    int rc = add_values(p, "heads.manifest", codes, n);
    if (rc)
        return rc;
    for (int i = 0; i < 3; i++) {
        if (!h[i])
            continue;
        const char *key = keys[i];
        char name[64];
        static const char *parts[4] = {"probes", "gain", "query", "row_bias"};
        for (int k = 0; k < 4; k++) {
            const pv *a = ckpt_tree_get(h[i], parts[k]);
            if (!float_array(a) || a->u.nd.ndim < 1 || a->u.nd.shape[a->u.nd.ndim - 1] < 1)
                return nd_error(ND_ESHAPE, "params/%s/%s is missing or not a float array", key,
                                parts[k]);
            snprintf(name, sizeof name, "%s.%s", key, parts[k]);
            if (k == 1 || k == 3) {
                if ((rc = add_pv_fp16(p, name, a)))
                    return rc;
                continue;
            }
            int64_t last = a->u.nd.shape[a->u.nd.ndim - 1], rows = pv_nd_numel(a) / last;
            const float *f = pv_f32(p, a);
            if (!f)
                return nd_error(ND_ENOMEM, "out of memory");
            if ((rc = add_cq_bits(p, name, SRC_CQ_DIRECT, f, rows, last, 0, CACT3_HEAD_BITS)))
                return rc;
        }
        const pv *kernel = ckpt_tree_get(h[i], "proj/kernel");
        if (!float_array(kernel) || kernel->u.nd.ndim != 2)
            return nd_error(ND_ESHAPE, "params/%s/proj/kernel is missing or not a 2-D array", key);
        int64_t in = kernel->u.nd.shape[0], out = kernel->u.nd.shape[1];
        const float *f = pv_f32(p, kernel);
        if (!f)
            return nd_error(ND_ENOMEM, "out of memory");
        snprintf(name, sizeof name, "%s.proj", key);
        if ((rc = add_cq_bits(p, name, SRC_CQ_KERNEL, f, in, out, 0, CACT3_HEAD_BITS)))
            return rc;
        const pv *bias = ckpt_tree_get(h[i], "proj/bias");
        snprintf(name, sizeof name, "%s.bias", key);
        if (bias) {
            if (!float_array(bias))
                return nd_error(ND_ESHAPE, "params/%s/proj/bias is not a float array", key);
            rc = add_pv_fp16(p, name, bias);
        } else {
            rc = add_values(p, name, NULL, out); /* np.zeros(out, float16) */
        }
        if (rc)
            return rc;
        if (i == 2) { /* RouterHead.export: calibration, default calibration_init */
            static const double cal[3] = {0.90, 0.00, 0.60};
            const pv *c = pv_dict_get(h[i], "calibration");
            snprintf(name, sizeof name, "%s.calibration", key);
            if (c) {
                if (!float_array(c))
                    return nd_error(ND_ESHAPE, "params/%s/calibration is not a float array", key);
                rc = add_pv_fp16(p, name, c);
            } else {
                rc = add_values(p, name, cal, 3);
            }
            if (rc)
                return rc;
        }
    }
    return ND_OK;
}

static void plan_free(plan *p);

/* The engram geometry both generations' headers record: tables per order
 * (3.x engram_geometry) and the taps' dilation (the largest order). */
static int engram_table_heads(const san_config *c)
{
    int heads = c->engram_heads ? c->engram_heads : c->d_model / (c->n_orders * SAN_ENGRAM_SUB);
    return heads < 1 ? 1 : heads;
}

static int engram_max_order(const san_config *c)
{
    int dil = 0;
    for (int i = 0; i < c->n_orders; i++)
        if (c->engram_orders[i] > dil)
            dil = c->engram_orders[i];
    return dil;
}

/* Blob offsets: after the header, the codebooks and the records, each
 * blob on a CACT_ALIGN boundary in plan order. */
static void plan_offsets(plan *p, uint64_t header_size)
{
    uint64_t pos =
        header_size + (uint64_t)CQ_HEADER_CODEBOOK_LEN * 4 + (uint64_t)p->n * CACT_REC_SIZE;
    for (int i = 0; i < p->n; i++) {
        pos = (pos + CACT_ALIGN - 1) & ~(uint64_t)(CACT_ALIGN - 1);
        p->e[i].rec.offset = pos;
        pos += p->e[i].rec.nbytes;
    }
}

/* The stack's mHC mixing tensors: six fp16 ones, then the three phi
 * projections as CQ (both generations). */
static int plan_mhc(plan *p, const san_model *m, const pv *params)
{
    static const char *mhc[] = {"a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res"};
    static const char *phi[] = {"pre", "post", "res"};
    char tn[48], name[48];
    int rc;
    for (int k = 0; k < 9; k++) {
        if (k < 6)
            snprintf(tn, sizeof tn, "stack/mhc_%s", mhc[k]);
        else
            snprintf(tn, sizeof tn, "stack/mhc_phi_%s", phi[k - 6]);
        const san_tensor *t = san_model_find(m, tn);
        if (!t)
            return nd_error(ND_ESHAPE, "model has no tensor %s", tn);
        snprintf(name, sizeof name, "%s", tn + strlen("stack/"));
        rc = k < 6 ? add_fp16(p, m, params, tn, 0, name, t->ndim, t->shape)
                   : add_cq(p, name, SRC_CQ_PHI, m->mem + t->offset, t->shape[0], t->shape[1],
                            t->shape[2]);
        if (rc)
            return rc;
    }
    return ND_OK;
}

/* Each engram site's tables, key/value projections and conv taps, then the
 * final norm. With engram banks (which 3.x's exporter cannot read: it looks
 * for engrams_<s>/embedding) each site gets its bank's tables, the layout of
 * the same model without banks. */
static int plan_engrams(plan *p, const san_model *m, const pv *params)
{
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    int64_t d = D->d;
    char tn[96], name[64];
    int rc = ND_OK;
    for (int s = 0; s < c->n_sites && !rc; s++) {
        snprintf(name, sizeof name, "engram%d.tables", s);
        rc = add_cq(p, name, SRC_CQ_DIRECT, m->w.eng[s].table,
                    (int64_t)D->eng_tables * c->engram_slots, D->eng_sub, 0);
        snprintf(name, sizeof name, "engram%d.key_proj", s);
        if (!rc)
            rc = add_cq(p, name, SRC_CQ_KERNEL, m->w.eng[s].wk, D->eng_dim, d, 0);
        snprintf(name, sizeof name, "engram%d.value_proj", s);
        if (!rc)
            rc = add_cq(p, name, SRC_CQ_KERNEL, m->w.eng[s].wv, D->eng_dim, d, 0);
        snprintf(tn, sizeof tn, D->n_banks ? "engram_readers_%d/taps" : "engrams_%d/taps", s);
        snprintf(name, sizeof name, "engram%d.taps", s);
        if (!rc)
            rc = add_fp16(p, m, params, tn, 0, name, 2, SH(SAN_CONV_TAPS, d));
    }
    if (rc)
        return rc;
    return add_fp16(p, m, params, "stack/final_norm/scale", 0, "final_norm", 1, SH(d));
}

/* The tokenizer's bytes as the last record, when the build has them. */
static int plan_tokenizer(plan *p, const cact_write_opts *o)
{
    if (!o->tokenizer)
        return ND_OK;
    entry *e = push(p, "tokenizer", CACT_RAW, SRC_RAW);
    if (!e)
        return nd_error(ND_ENOMEM, "out of memory");
    e->raw = o->tokenizer;
    e->rec.nbytes = o->tokenizer_len;
    return ND_OK;
}

/* The header fields both generations' headers share, from the config. */
#define CACT_HEADER_COMMON(h, p, c, D, o)                                                          \
    do {                                                                                           \
        (h)->num_tensors = (uint32_t)(p)->n;                                                       \
        (h)->codebook_len = CQ_HEADER_CODEBOOK_LEN;                                                \
        (h)->kv_window = (uint32_t)((o)->kv_window > 0 ? (o)->kv_window : 0);                      \
        (h)->kv_bits = (uint32_t)((c)->kv_bits ? (c)->kv_bits : 8);                                \
        (h)->vocab = (uint32_t)(c)->vocab_size;                                                    \
        (h)->d_model = (uint32_t)(c)->d_model;                                                     \
        (h)->num_heads = (uint32_t)(c)->num_heads;                                                 \
        (h)->num_kv_heads = (uint32_t)(c)->num_kv_heads;                                           \
        (h)->num_layers = (uint32_t)(c)->num_layers;                                               \
        (h)->max_seq_len = (uint32_t)(c)->max_seq_len;                                             \
        (h)->hada_n = (uint32_t)(D)->hada_n;                                                       \
        (h)->mhc_lanes = (uint32_t)(c)->mhc_lanes;                                                 \
        (h)->engram_slots = (uint32_t)(c)->engram_slots;                                           \
        int heads_ = engram_table_heads(c);                                                        \
        (h)->engram_sub_dim = (uint32_t)((c)->d_model / ((c)->n_orders * heads_));                 \
        (h)->num_engram_tables = (uint32_t)((c)->n_orders * heads_);                               \
        (h)->engram_conv_taps = SAN_CONV_TAPS;                                                     \
        (h)->engram_conv_dilation = (uint32_t)engram_max_order(c);                                 \
        (h)->num_engram_orders = (uint32_t)(c)->n_orders;                                          \
        for (int i_ = 0; i_ < (c)->n_orders; i_++)                                                 \
            (h)->engram_orders[i_] = (uint32_t)(c)->engram_orders[i_];                             \
        (h)->num_engram_sites = (uint32_t)(c)->n_sites;                                            \
        for (int i_ = 0; i_ < (c)->n_sites; i_++)                                                  \
            (h)->engram_sites[i_] = (uint32_t)(c)->engram_layers[i_];                              \
        (h)->rope_theta = (float)(c)->rope_theta;                                                  \
    } while (0)

static int make_plan3(const san_model *m, const pv *params, const cact_write_opts *o, plan *p)
{
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    int rc;
    p->gen = 3;
    p->group = o->group ? o->group : CQ_GROUP;
    p->default_bits = o->bits;
    if (o->bits != 2 && o->bits != 3 && o->bits != 4)
        return nd_error(ND_EARG, "Needle 3 archives take CQ widths 2, 3 or 4, not %d", o->bits);
    if ((rc = cq_header_codebooks(p->group, p->cb)))
        return rc;
    /* export.py _geometry's limits */
    if (c->num_layers > 64)
        return nd_error(ND_ELIMIT, "the v3 .cact global mask holds 64 layers, the model has %d",
                        c->num_layers);
    if (c->n_sites > CACT3_MAX_SITES || c->n_orders > 4 || c->n_orders < 1)
        return nd_error(ND_ELIMIT,
                        "the v3 .cact header holds 1 to 4 engram orders and at most %d sites "
                        "(the model has %d orders, %d sites)",
                        CACT3_MAX_SITES, c->n_orders, c->n_sites);
    if (c->out_vocab > c->vocab_size)
        return nd_error(ND_ESHAPE, "out_vocab %d exceeds the exported vocab %d", c->out_vocab,
                        c->vocab_size);
    if (o->tokenizer) {
        if (o->tokenizer_len < TOK_HEADER_SIZE)
            return nd_error(ND_EFORMAT, "tokenizer blob is %zu bytes, shorter than its header",
                            o->tokenizer_len);
        uint32_t nt = get_u32(o->tokenizer);
        if (nt > (uint32_t)c->vocab_size)
            return nd_error(ND_ESHAPE, "tokenizer vocab %u > exported vocab %d", nt, c->vocab_size);
    }
    if ((rc = san_hada3_geom_init(&p->g, c->d_model, c->hada_factor_mode == SAN_HADA_BLOCK_UNTIED,
                                  c->n_ladder_widths > 0)))
        return rc;

    int64_t L = D->L, d = D->d, hn = D->hada_n, T = c->qkv_conv_taps;
    int64_t ba = D->hada_ba, bb = D->hada_bb, R = SAN_HADA_COND_RANK;
    int untied = c->hada_factor_mode == SAN_HADA_BLOCK_UNTIED;
    const char *blk = "stack/layers/block";
    char tn[128], name[64];
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((rc = (x)))                                                                            \
            goto fail;                                                                             \
    } while (0)
    TRY(add_cq(p, "embedding", SRC_CQ_DIRECT, m->w.emb, D->V, d, 0));
    for (int64_t i = 0; i < L; i++) {
        size_t li = (size_t)i;
#define FP16(path, sfx, cnt, nd_, ...)                                                             \
    do {                                                                                           \
        snprintf(tn, sizeof tn, "%s/%s", blk, path);                                               \
        snprintf(name, sizeof name, "layer%02d.%s", (int)i, sfx);                                  \
        TRY(add_fp16(p, m, params, tn, li *(size_t)(cnt), name, nd_, SH(__VA_ARGS__)));            \
    } while (0)
#define KERNEL(k)                                                                                  \
    do {                                                                                           \
        snprintf(tn, sizeof tn, "%s/self_attn/%s/kernel", blk, k);                                 \
        const san_tensor *t = san_model_find(m, tn);                                               \
        if (!t) {                                                                                  \
            rc = nd_error(ND_ESHAPE, "model has no tensor %s", tn);                                \
            goto fail;                                                                             \
        }                                                                                          \
        snprintf(name, sizeof name, "layer%02d.%s", (int)i, k);                                    \
        TRY(add_cq(p, name, SRC_CQ_KERNEL,                                                         \
                   m->mem + t->offset + li * (size_t)(t->shape[1] * t->shape[2]), t->shape[1],     \
                   t->shape[2], 0));                                                               \
    } while (0)
        FP16("ZCRMSNorm_0/scale", "norm_in", d, 1, d);
        KERNEL("q_proj");
        KERNEL("k_proj");
        KERNEL("v_proj");
        if (T) {
            FP16("self_attn/q_taps", "q_taps", T * D->q_dim, 2, T, D->q_dim);
            FP16("self_attn/k_taps", "k_taps", T * D->k_dim, 2, T, D->k_dim);
            FP16("self_attn/v_taps", "v_taps", T * D->v_dim, 2, T, D->v_dim);
        }
        FP16("self_attn/q_norm/scale", "q_norm", D->hd, 1, D->hd);
        FP16("self_attn/k_norm/scale", "k_norm", D->hd, 1, D->hd);
        KERNEL("gate_proj");
        KERNEL("out_proj");
        FP16("post_attn_norm/scale", "post_norm", d, 1, d);
        FP16("attn_gate", "attn_gate", 1, 1, 1);
        FP16("pre_hada_norm/scale", "pre_hada", d, 1, d);
        FP16("hadamard_mlp/d1", "d1", hn, 1, hn);
        FP16("hadamard_mlp/d2", "d2", hn, 1, hn);
        FP16("hadamard_mlp/b2", "b2", hn, 1, hn);
        FP16("hadamard_mlp/d3", "d3", hn, 1, hn);
        FP16("hadamard_mlp/d4", "d4", hn, 1, hn);
        for (int k = 1; k <= 3; k++) {
            char pa[32], pb[32], sa[8], sb[8];
            snprintf(pa, sizeof pa, "hadamard_mlp/w%da", k);
            snprintf(pb, sizeof pb, "hadamard_mlp/w%db", k);
            snprintf(sa, sizeof sa, "w%da", k);
            snprintf(sb, sizeof sb, "w%db", k);
            if (untied) {
                FP16(pa, sa, bb * ba * ba, 3, bb, ba, ba);
                FP16(pb, sb, ba * bb * bb, 3, ba, bb, bb);
            } else {
                FP16(pa, sa, ba * ba, 2, ba, ba);
                FP16(pb, sb, bb * bb, 2, bb, bb);
            }
        }
        FP16("hadamard_mlp/cond_v", "cond_v", d * R, 2, d, R);
        FP16("hadamard_mlp/cond_u", "cond_u", R * hn, 2, R, hn);
#undef FP16
#undef KERNEL
    }
    TRY(plan_mhc(p, m, params));
    for (int k = 0; k < 2; k++) {
        entry *e = push(p, k ? "hada_p2" : "hada_p1", CACT_FP32, SRC_PERM);
        if (!e) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto fail;
        }
        e->perm = k ? p->g.perm2 : p->g.perm1;
        set_shape(e, 1, SH(hn));
        e->rec.nbytes = (uint64_t)hn * 4;
    }
    TRY(plan_engrams(p, m, params));
    TRY(plan_heads3(p, params));
    TRY(plan_tokenizer(p, o));
#undef TRY

    /* header: export.py _pack_cact */
    cact_header3 *h = &p->h3;
    h->tag = CACT3_TAG;
    CACT_HEADER_COMMON(h, p, c, D, o);
    h->out_vocab = (uint32_t)(c->out_vocab > 0 ? c->out_vocab : 0);
    h->qk_head_dim = (uint32_t)D->hd;
    h->v_head_dim = (uint32_t)D->v_hd;
    h->sliding_window = (uint32_t)(c->sliding_window > 0 ? c->sliding_window : 0);
    uint64_t gmask = 0;
    for (int i = 0; i < c->n_global; i++)
        if (c->global_layers[i] >= 0 && c->global_layers[i] < 64)
            gmask |= 1ull << c->global_layers[i];
    h->global_mask_lo = (uint32_t)gmask;
    h->global_mask_hi = (uint32_t)(gmask >> 32);
    h->qkv_conv_taps = (uint32_t)c->qkv_conv_taps;
    h->engram_seed_heads = (uint32_t)c->engram_seed_heads;

    plan_offsets(p, CACT3_HEADER_SIZE);
    return ND_OK;
fail:
    plan_free(p);
    return rc;
}

static int make_plan(const san_model *m, const pv *params, const cact_write_opts *o, plan *p)
{
    memset(p, 0, sizeof *p);
    const san_config *c = &m->cfg;
    const san_dims *D = &m->dims;
    int rc;
    /* the archive and the engine are Needle 2's: a Needle 3 model would be
     * written with the wrong layout and run with the wrong block */
    if (c->generation == 3)
        return make_plan3(m, params, o, p);
    p->group = o->group ? o->group : CQ_GROUP;
    if (o->bits_map && *o->bits_map) {
        rc = cq_bits_map_parse(o->bits_map, &p->map);
        if (rc)
            return rc;
        p->use_map = 1;
    } else if (!cq_bits_valid(o->bits)) {
        return nd_error(ND_EARG, "CQ width must be 2, 3, 4 or ternary, not %d", o->bits);
    }
    p->default_bits = o->bits;
    if ((rc = cq_header_codebooks(p->group, p->cb)))
        goto fail;
    if (c->n_orders < 1) {
        rc = nd_error(ND_EUNSUPPORTED, "cact export needs at least one engram order");
        goto fail;
    }
    if (c->n_sites > 4 || c->n_orders > 4) {
        rc = nd_error(ND_ELIMIT, "cact header holds at most 4 engram orders and sites");
        goto fail;
    }
    if (o->tokenizer) {
        if (o->tokenizer_len < TOK_HEADER_SIZE) {
            rc = nd_error(ND_EFORMAT, "tokenizer blob is %zu bytes, shorter than its header",
                          o->tokenizer_len);
            goto fail;
        }
        uint32_t nt = get_u32(o->tokenizer);
        if (nt != (uint32_t)c->vocab_size) {
            rc = nd_error(ND_ESHAPE, "tokenizer vocab %u != config %d", nt, c->vocab_size);
            goto fail;
        }
    }

    int64_t L = D->L, d = D->d;
    const char *blk = "stack/layers/block";
    char tn[128], name[64];
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((rc = (x)))                                                                            \
            goto fail;                                                                             \
    } while (0)
    TRY(add_cq(p, "embedding", SRC_CQ_DIRECT, m->w.emb, D->V, d, 0));
    static const char *kern[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    for (int64_t i = 0; i < L; i++) {
        size_t li = (size_t)i;
#define FP16(path, sfx, cnt, ...)                                                                  \
    do {                                                                                           \
        snprintf(tn, sizeof tn, "%s/%s", blk, path);                                               \
        snprintf(name, sizeof name, "layer%02d.%s", (int)i, sfx);                                  \
        TRY(add_fp16(p, m, params, tn, li *(size_t)(cnt), name, 1, SH(__VA_ARGS__)));              \
    } while (0)
#define KERNEL(k)                                                                                  \
    do {                                                                                           \
        snprintf(tn, sizeof tn, "%s/self_attn/%s/kernel", blk, kern[k]);                           \
        const san_tensor *t = san_model_find(m, tn);                                               \
        snprintf(name, sizeof name, "layer%02d.%s", (int)i, kern[k]);                              \
        TRY(add_cq(p, name, SRC_CQ_KERNEL,                                                         \
                   m->mem + t->offset + li * (size_t)(t->shape[1] * t->shape[2]), t->shape[1],     \
                   t->shape[2], 0));                                                               \
    } while (0)
        FP16("ZCRMSNorm_0/scale", "norm_in", d, d);
        KERNEL(0);
        KERNEL(1);
        KERNEL(2);
        FP16("self_attn/q_norm/scale", "q_norm", D->hd, D->hd);
        FP16("self_attn/k_norm/scale", "k_norm", D->hd, D->hd);
        KERNEL(3);
        KERNEL(4);
        FP16("post_attn_norm/scale", "post_norm", d, d);
        FP16("attn_gate", "attn_gate", 1, 1);
        FP16("pre_hada_norm/scale", "pre_hada", d, d);
        FP16("hadamard_mlp/d1", "d1", D->hada_n, D->hada_n);
        FP16("hadamard_mlp/d2", "d2", D->hada_n, D->hada_n);
        FP16("hadamard_mlp/d3", "d3", D->hada_n, D->hada_n);
#undef FP16
#undef KERNEL
    }
    TRY(plan_mhc(p, m, params));
    TRY(plan_engrams(p, m, params));
    TRY(plan_heads(p, params));
    TRY(plan_tokenizer(p, o));
#undef TRY

    /* header */
    cact_header *h = &p->hdr;
    h->tag = CACT_TAG;
    CACT_HEADER_COMMON(h, p, c, D, o);
    h->head_dim = (uint32_t)D->hd;

    plan_offsets(p, CACT_HEADER_SIZE);
    return ND_OK;
fail:
    plan_free(p);
    return rc;
}

static uint64_t plan_size(const plan *p)
{
    if (!p->n)
        return CACT_HEADER_SIZE + CQ_HEADER_CODEBOOK_LEN * 4;
    const entry *l = &p->e[p->n - 1];
    return l->rec.offset + l->rec.nbytes;
}

/* ------------------------------------------------------------------ */
/* emitting                                                            */

typedef struct {
    nd_atomic_file *af;
    unsigned char *buf;
    size_t len, cap;
    uint64_t written;
} sink;

static int sink_put(sink *s, const void *p, size_t n)
{
    if (s->af) {
        int rc = nd_atomic_write(s->af, p, n);
        if (rc)
            return rc;
    } else {
        if (s->len + n > s->cap)
            return nd_error(ND_EARG, "internal: archive size mismatch");
        memcpy(s->buf + s->len, p, n);
        s->len += n;
    }
    s->written += n;
    return ND_OK;
}

static int sink_zeros(sink *s, uint64_t n)
{
    static const unsigned char z[CACT_ALIGN];
    while (n) {
        size_t k = n < sizeof z ? (size_t)n : sizeof z;
        int rc = sink_put(s, z, k);
        if (rc)
            return rc;
        n -= k;
    }
    return ND_OK;
}

static void encode_header(const cact_header *h, unsigned char *b)
{
    const uint32_t v[29] = {h->tag,
                            h->num_tensors,
                            h->codebook_len,
                            h->kv_window,
                            h->kv_bits,
                            h->vocab,
                            h->d_model,
                            h->num_heads,
                            h->num_kv_heads,
                            h->num_layers,
                            h->head_dim,
                            h->max_seq_len,
                            h->hada_n,
                            h->mhc_lanes,
                            h->engram_slots,
                            h->engram_sub_dim,
                            h->num_engram_tables,
                            h->engram_conv_taps,
                            h->engram_conv_dilation,
                            h->num_engram_orders,
                            h->engram_orders[0],
                            h->engram_orders[1],
                            h->engram_orders[2],
                            h->engram_orders[3],
                            h->num_engram_sites,
                            h->engram_sites[0],
                            h->engram_sites[1],
                            h->engram_sites[2],
                            h->engram_sites[3]};
    for (int i = 0; i < 29; i++)
        put_u32(b + 4 * i, v[i]);
    put_f32(b + 116, h->rope_theta);
}

/* the 48 u32 fields of "<48If" in file order */
#define H3_FIELDS(X, h)                                                                            \
    X(h->tag), X(h->num_tensors), X(h->codebook_len), X(h->kv_window), X(h->kv_bits), X(h->vocab), \
        X(h->out_vocab), X(h->d_model), X(h->num_heads), X(h->num_kv_heads), X(h->num_layers),     \
        X(h->qk_head_dim), X(h->v_head_dim), X(h->max_seq_len), X(h->hada_n), X(h->mhc_lanes),     \
        X(h->sliding_window), X(h->global_mask_lo), X(h->global_mask_hi), X(h->qkv_conv_taps),     \
        X(h->engram_slots), X(h->engram_sub_dim), X(h->num_engram_tables), X(h->engram_conv_taps), \
        X(h->engram_conv_dilation), X(h->engram_seed_heads), X(h->num_engram_orders),              \
        X(h->engram_orders[0]), X(h->engram_orders[1]), X(h->engram_orders[2]),                    \
        X(h->engram_orders[3]), X(h->num_engram_sites), X(h->engram_sites[0]),                     \
        X(h->engram_sites[1]), X(h->engram_sites[2]), X(h->engram_sites[3]),                       \
        X(h->engram_sites[4]), X(h->engram_sites[5]), X(h->engram_sites[6]),                       \
        X(h->engram_sites[7]), X(h->engram_sites[8]), X(h->engram_sites[9]),                       \
        X(h->engram_sites[10]), X(h->engram_sites[11]), X(h->engram_sites[12]),                    \
        X(h->engram_sites[13]), X(h->engram_sites[14]), X(h->engram_sites[15])
#define H3_VAL(x) (x)
#define H3_PTR(x) (&(x))

void cact3_encode_header(const cact_header3 *h, unsigned char *b)
{
    const uint32_t v[48] = {H3_FIELDS(H3_VAL, h)};
    for (int i = 0; i < 48; i++)
        put_u32(b + 4 * i, v[i]);
    put_f32(b + 192, h->rope_theta);
}

void cact3_decode_header(const unsigned char *b, cact_header3 *h)
{
    uint32_t *const v[48] = {H3_FIELDS(H3_PTR, h)};
    for (int i = 0; i < 48; i++)
        *v[i] = get_u32(b + 4 * i);
    h->rope_theta = get_f32(b + 192);
}

static void encode_record(const cact_tensor *t, unsigned char *b)
{
    b[0] = t->dtype;
    b[1] = t->ndim;
    put_u16(b + 2, 0);
    for (int i = 0; i < 4; i++)
        put_u32(b + 4 + 4 * i, t->shape[i]);
    put_u64(b + 20, t->offset);
    put_u64(b + 28, t->nbytes);
    put_u32(b + 36, t->group);
    put_u32(b + 40, t->bits);
}

static double pv_elem(const pv *a, size_t i)
{
    switch (a->u.nd.dtype) {
    case ND_F16: return nd_half_to_float(((const uint16_t *)a->u.nd.data)[i]);
    case ND_F32: return ((const float *)a->u.nd.data)[i];
    default: return ((const double *)a->u.nd.data)[i];
    }
}

static uint16_t pv_half(const pv *a, size_t i)
{
    if (a->u.nd.dtype == ND_F16)
        return ((const uint16_t *)a->u.nd.data)[i];
    return double_to_half(pv_elem(a, i));
}

static int emit_entry(sink *s, const entry *e, unsigned char *scratch)
{
    const cact_tensor *r = &e->rec;
    size_t nb = (size_t)r->nbytes;
    switch (e->src) {
    case SRC_RAW: return sink_put(s, e->raw, nb);
    case SRC_PERM:
        for (size_t i = 0; i < nb / 4; i++)
            put_f32(scratch + 4 * i, (float)e->perm[i]);
        return sink_put(s, scratch, nb);
    case SRC_MODEL_FP16:
    case SRC_PV_FP16:
    case SRC_PV_FP16_T:
    case SRC_VALUES: {
        size_t n = nb / 2;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            if (e->src == SRC_MODEL_FP16) {
                h = nd_float_to_half(e->f[i]);
            } else if (e->src == SRC_PV_FP16) {
                h = pv_half(e->arr, e->elem0 + i);
            } else if (e->src == SRC_PV_FP16_T) {
                size_t out = r->shape[0], in = r->shape[1], o = i / in, k = i % in;
                h = pv_half(e->arr, k * out + o);
            } else {
                h = double_to_half(i < 4 ? e->values[i] : 0.0);
            }
            put_u16(scratch + 2 * i, h);
        }
        return sink_put(s, scratch, nb);
    }
    default: break;
    }
    /* CQ */
    int64_t out = r->shape[0], in = r->shape[1];
    const float *w = e->f;
    float *tmp = NULL;
    if (e->src != SRC_CQ_DIRECT) {
        tmp = malloc((size_t)out * (size_t)in * sizeof *tmp + 1);
        if (!tmp)
            return nd_error(ND_ENOMEM, "out of memory transposing %s", r->name);
        if (e->src == SRC_CQ_KERNEL) {
            for (int64_t i = 0; i < in; i++)
                for (int64_t o = 0; o < out; o++)
                    tmp[o * in + i] = e->f[i * out + o];
        } else { /* phi (L, nC, lanes) -> (L*lanes, nC) */
            int64_t L = e->a, nC = e->b, lanes = e->c;
            for (int64_t l = 0; l < L; l++)
                for (int64_t c = 0; c < nC; c++)
                    for (int64_t j = 0; j < lanes; j++)
                        tmp[(l * lanes + j) * nC + c] = e->f[(l * nC + c) * lanes + j];
        }
        w = tmp;
    }
    int rc = cq_quantize(w, out, in, (int)r->bits, (int)r->group, scratch);
    free(tmp);
    if (rc)
        return nd_error_prefix(rc, "%s", r->name);
    return sink_put(s, scratch, nb);
}

static int emit(const plan *p, sink *s)
{
    size_t hsize = p->gen == 3 ? CACT3_HEADER_SIZE : CACT_HEADER_SIZE;
    size_t head = hsize + CQ_HEADER_CODEBOOK_LEN * 4 + (size_t)p->n * CACT_REC_SIZE;
    size_t scratch_len = head;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].rec.nbytes > scratch_len)
            scratch_len = (size_t)p->e[i].rec.nbytes;
    unsigned char *b = malloc(scratch_len + 1);
    if (!b)
        return nd_error(ND_ENOMEM, "out of memory");
    if (p->gen == 3)
        cact3_encode_header(&p->h3, b);
    else
        encode_header(&p->hdr, b);
    for (int i = 0; i < CQ_HEADER_CODEBOOK_LEN; i++)
        put_f32(b + hsize + 4 * i, p->cb[i]);
    for (int i = 0; i < p->n; i++)
        encode_record(&p->e[i].rec,
                      b + hsize + CQ_HEADER_CODEBOOK_LEN * 4 + (size_t)i * CACT_REC_SIZE);
    int rc = sink_put(s, b, head);
    for (int i = 0; !rc && i < p->n; i++) {
        rc = sink_zeros(s, p->e[i].rec.offset - s->written);
        if (!rc)
            rc = emit_entry(s, &p->e[i], b);
    }
    free(b);
    return rc;
}

int cact_model_tensors(const san_model *m, const cact_write_opts *o, cact_model_tensor **list,
                       int *n)
{
    *list = NULL;
    *n = 0;
    if (m->cfg.generation == 3) /* 3.x trains through its own numerics (model/fake_quant.h) */
        return nd_error(ND_EUNSUPPORTED,
                        "the --qat tensor list is Needle 2's; Needle 3 models train through "
                        "the 3.x numerics (the default on a Needle 3 base)");
    plan p;
    int rc = make_plan(m, NULL, o, &p);
    if (rc)
        return rc;
    cact_model_tensor *l = calloc((size_t)p.n + 1, sizeof *l);
    if (!l) {
        plan_free(&p);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < p.n; i++) {
        const entry *e = &p.e[i];
        if (e->src != SRC_MODEL_FP16 && e->src != SRC_CQ_DIRECT && e->src != SRC_CQ_KERNEL &&
            e->src != SRC_CQ_PHI)
            continue;
        cact_model_tensor *t = &l[k++];
        snprintf(t->name, sizeof t->name, "%s", e->rec.name);
        t->src = e->src == SRC_MODEL_FP16  ? CACT_SRC_FP16
                 : e->src == SRC_CQ_DIRECT ? CACT_SRC_DIRECT
                 : e->src == SRC_CQ_KERNEL ? CACT_SRC_KERNEL
                                           : CACT_SRC_PHI;
        t->offset = (size_t)(e->f - m->mem);
        t->numel = (size_t)cact_numel(&e->rec);
        t->a = e->a;
        t->b = e->b;
        t->c = e->c;
        t->out = e->rec.shape[0];
        t->in = e->rec.shape[1];
        t->bits = (int)e->rec.bits;
        t->group = (int)e->rec.group;
    }
    plan_free(&p);
    *list = l;
    *n = k;
    return ND_OK;
}

int cact_write_mem(const san_model *m, const pv *params, const cact_write_opts *o,
                   unsigned char **buf, size_t *len, cact_write_info *info)
{
    *buf = NULL;
    *len = 0;
    plan p;
    int rc = make_plan(m, params, o, &p);
    if (rc)
        return rc;
    uint64_t total = plan_size(&p);
    sink s = {0};
    s.cap = (size_t)total;
    s.buf = malloc(s.cap ? s.cap : 1);
    if (!s.buf) {
        plan_free(&p);
        return nd_error(ND_ENOMEM, "out of memory for a %llu-byte archive",
                        (unsigned long long)total);
    }
    rc = emit(&p, &s);
    if (!rc && info) {
        info->bytes = total;
        info->num_tensors = p.n;
    }
    plan_free(&p);
    if (rc) {
        free(s.buf);
        return rc;
    }
    *buf = s.buf;
    *len = s.len;
    return ND_OK;
}

int cact_write_file(const char *path, const san_model *m, const pv *params,
                    const cact_write_opts *o, cact_write_info *info)
{
    plan p;
    int rc = make_plan(m, params, o, &p);
    if (rc)
        return rc;
    nd_atomic_file af;
    rc = nd_atomic_open(&af, path);
    if (rc) {
        plan_free(&p);
        return rc;
    }
    sink s = {0};
    s.af = &af;
    rc = emit(&p, &s);
    if (rc) {
        nd_atomic_abort(&af);
        plan_free(&p);
        return rc == ND_EIO ? rc : nd_error_prefix(rc, "%s", path);
    }
    rc = nd_atomic_commit(&af);
    if (!rc && info) {
        info->bytes = s.written;
        info->num_tensors = p.n;
    }
    plan_free(&p);
    return rc;
}
