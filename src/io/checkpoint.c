#include "io/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/mem.h"
#include "core/rng.h"
#include "core/status.h"
#include "io/safetensors.h"

const pv *ckpt_tree_get(const pv *node, const char *path)
{
    char part[128];
    while (node && *path) {
        const char *slash = strchr(path, '/');
        size_t len = slash ? (size_t)(slash - path) : strlen(path);
        if (node->kind != PV_DICT || len >= sizeof part)
            return NULL;
        memcpy(part, path, len);
        part[len] = 0;
        node = pv_dict_get(node, part);
        path += len + (slash ? 1 : 0);
    }
    return node;
}

int ckpt_tree_set(pv *node, const char *path, pv *val)
{
    char part[128];
    for (;;) {
        const char *slash = strchr(path, '/');
        size_t len = slash ? (size_t)(slash - path) : strlen(path);
        if (node->kind != PV_DICT || len >= sizeof part || len == 0) {
            pv_decref(val);
            return nd_error(ND_EARG, "cannot set '%s' in the parameter tree", path);
        }
        memcpy(part, path, len);
        part[len] = 0;
        if (!slash)
            return pv_dict_set(node, part, val);
        pv *child = pv_dict_get(node, part);
        if (!child) {
            child = pv_dict();
            if (!child || pv_dict_set(node, part, child)) {
                pv_decref(val);
                return nd_error(ND_ENOMEM, "out of memory");
            }
        }
        node = child;
        path = slash + 1;
    }
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, ndim == 1 ? ",)" : ")");
}

/* Shape and dtype of one tensor against the layout (no data touched). */
static int check_tensor(const pv *arr, const san_tensor *t, const char *what)
{
    char want[96], got[96];
    shape_str(want, sizeof want, t->ndim, t->shape);
    if (!arr)
        return nd_error(ND_ESHAPE, "%s: missing tensor %s (expected shape %s)", what, t->name,
                        want);
    if (arr->kind != PV_NDARRAY)
        return nd_error(ND_ESHAPE, "%s: %s is not an array (expected shape %s)", what, t->name,
                        want);
    int same = arr->u.nd.ndim == t->ndim;
    for (int i = 0; same && i < t->ndim; i++)
        same = arr->u.nd.shape[i] == t->shape[i];
    if (!same) {
        shape_str(got, sizeof got, arr->u.nd.ndim, arr->u.nd.shape);
        return nd_error(ND_ESHAPE, "%s: tensor %s has shape %s but the config expects %s", what,
                        t->name, got, want);
    }
    if (arr->u.nd.dtype != ND_F32 && arr->u.nd.dtype != ND_F16 && arr->u.nd.dtype != ND_F64)
        return nd_error(ND_EFORMAT, "%s: tensor %s has dtype %s, expected a float type", what,
                        t->name, nd_dtype_name(arr->u.nd.dtype));
    return ND_OK;
}

/* Copy a tensor that passed check_tensor. */
static void copy_tensor(const pv *arr, const san_tensor *t, float *dst)
{
    size_t n = t->numel;
    switch (arr->u.nd.dtype) {
    case ND_F32: memcpy(dst, arr->u.nd.data, n * sizeof(float)); break;
    case ND_F16: {
        const uint16_t *s = arr->u.nd.data;
        for (size_t i = 0; i < n; i++)
            dst[i] = nd_half_to_float(s[i]);
        break;
    }
    default: {
        const double *s = arr->u.nd.data;
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        break;
    }
    }
}

int ckpt_from_tree(const pv *root, const char *what, san_model *m)
{
    memset(m, 0, sizeof *m);
    if (!root || root->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: not a needle checkpoint (top level is not a dict)", what);
    const pv *ver = pv_dict_get(root, "format_version");
    if (!ver && pv_dict_get(root, "lora") && pv_dict_get(root, "scale"))
        return nd_error(ND_EFORMAT,
                        "%s: this is a LoRA adapter, not a checkpoint; pass it with --lora "
                        "(eval, build) or --resume (finetune), and the base it was trained on "
                        "with --checkpoint",
                        what);
    if (!ver || ver->kind != PV_INT || ver->u.i != SAN_CHECKPOINT_FORMAT) {
        char got[48];
        if (ver && ver->kind == PV_INT)
            snprintf(got, sizeof got, "format_version=%lld", (long long)ver->u.i);
        else
            snprintf(got, sizeof got, "%s",
                     ver ? "format_version is not an integer" : "no format_version");
        return nd_error(ND_EFORMAT,
                        "%s is not a format-v%d checkpoint (%s); old encoder-decoder "
                        "checkpoints are not supported",
                        what, SAN_CHECKPOINT_FORMAT, got);
    }
    const pv *cfgv = pv_dict_get(root, "config");
    const pv *params = pv_dict_get(root, "params");
    if (!params || params->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: checkpoint has no 'params' dict", what);
    san_config cfg;
    int rc = san_config_from_pv(&cfg, cfgv);
    if (rc)
        return nd_error_prefix(rc, "%s", what);
    rc = san_model_layout(m, &cfg);
    if (rc)
        return nd_error_prefix(rc, "%s", what);
    /* Every tensor is checked before the weights are allocated: the config
     * alone must not make us allocate (a few bytes of pickle can claim a
     * model of terabytes); arrays that match are backed by the file. */
    for (int i = 0; i < m->n_tensors; i++) {
        rc = check_tensor(ckpt_tree_get(params, m->tensors[i].name), &m->tensors[i], what);
        if (rc) {
            san_model_free(m);
            return rc;
        }
    }
    m->mem = nd_calloc_big(m->numel, sizeof(float));
    if (!m->mem) {
        rc = nd_error(ND_ENOMEM, "%s: out of memory allocating %zu parameters", what, m->numel);
        san_model_free(m);
        return rc;
    }
    san_weights_bind(m, m->mem, &m->w);
    for (int i = 0; i < m->n_tensors; i++)
        copy_tensor(ckpt_tree_get(params, m->tensors[i].name), &m->tensors[i],
                    m->mem + m->tensors[i].offset);
    return ND_OK;
}

int ckpt_path_is_safetensors(const char *path)
{
    size_t n = strlen(path), k = strlen(".safetensors");
    return n >= k && !strcmp(path + n - k, ".safetensors");
}

int ckpt_file_is_safetensors(const char *path)
{
    unsigned char head[9];
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return 0;
    size_t n = fread(head, 1, sizeof head, fp);
    fclose(fp);
    return st_sniff(head, n);
}

int ckpt_file_load(const char *path, pv **out)
{
    *out = NULL;
    unsigned char head[9];
    size_t n = 0;
    FILE *fp = fopen(path, "rb");
    if (fp) {
        n = fread(head, 1, sizeof head, fp);
        fclose(fp);
    }
    if (fp &&
        (st_sniff(head, n) || (ckpt_path_is_safetensors(path) && !(n >= 2 && head[0] == 0x80))))
        return st_tree_load(path, out);
    int rc = pickle_load_file(path, out);
    if (rc && fp && !(n >= 1 && head[0] == 0x80)) {
        char why[1024];
        snprintf(why, sizeof why, "%s", nd_last_error());
        rc = nd_error(rc, "%s; nor is it a safetensors file (no 8-byte header length, then '{')",
                      why);
    }
    return rc;
}

int ckpt_file_save(const pv *root, const char *path)
{
    return ckpt_path_is_safetensors(path) ? st_tree_save(root, path) : pickle_dump_file(root, path);
}

int ckpt_load(const char *path, san_model *m, pv **tree_out)
{
    pv *root = NULL;
    if (tree_out)
        *tree_out = NULL;
    int rc = ckpt_file_load(path, &root);
    if (rc)
        return rc;
    rc = ckpt_from_tree(root, path, m);
    if (rc || !tree_out)
        pv_decref(root);
    else
        *tree_out = root;
    return rc;
}

/* Copy everything under `src` that is not a model tensor into `dst`,
 * nesting and keys exactly as they are. The loader reaches tensors by
 * '/'-joined paths of plain string keys, so only a node all of whose keys
 * on the way are plain can be a model tensor (reach); any other key (with
 * '/', NUL, empty, very long, not a string) is carried as it is: joined
 * into a path it could land on, and overwrite, a model tensor or the whole
 * subtree above one. */
static int carry_extras(const san_model *m, const pv *src, pv *dst, char *path, size_t plen,
                        int reach)
{
    for (size_t i = 0; i < src->u.dict.n; i++) {
        const pv *k = src->u.dict.keys[i], *v = src->u.dict.vals[i];
        size_t klen = k->kind == PV_STR ? k->u.str.len : 0, n = plen;
        int plain = reach && k->kind == PV_STR && klen > 0 && klen < 128 &&
                    !memchr(k->u.str.s, '/', klen) && !memchr(k->u.str.s, 0, klen) &&
                    plen + 1 + klen < 512;
        if (plain) {
            if (plen)
                path[n++] = '/';
            memcpy(path + n, k->u.str.s, klen);
            n += klen;
            path[n] = 0;
        }
        int rc = ND_OK;
        if (v->kind == PV_DICT) {
            pv *child = pv_dict_get_key(dst, k);
            if (!child) {
                child = pv_dict();
                rc = child ? pv_dict_set_key(dst, k, child) : ND_ENOMEM;
            }
            /* a dict where the model has an array cannot have loaded */
            if (!rc && child->kind == PV_DICT)
                rc = carry_extras(m, v, child, path, n, plain);
        } else if (!plain || !san_model_find(m, path)) {
            rc = pv_dict_set_key(dst, k, pv_incref((pv *)v));
        }
        path[plen] = 0;
        if (rc)
            return rc;
    }
    return ND_OK;
}

pv *ckpt_to_tree(const san_model *m, const pv *base)
{
    pv *root = pv_dict(), *params = pv_dict();
    if (!root || !params)
        goto fail;
    pv_dict_set(root, "format_version", pv_int(SAN_CHECKPOINT_FORMAT));
    for (int i = 0; i < m->n_tensors; i++) {
        const san_tensor *t = &m->tensors[i];
        pv *a = pv_ndarray(ND_F32, t->ndim, t->shape, m->mem + t->offset);
        if (!a || ckpt_tree_set(params, t->name, a))
            goto fail;
    }
    const pv *bparams = base ? pv_dict_get(base, "params") : NULL;
    if (bparams && bparams->kind == PV_DICT) {
        char path[512] = "";
        if (carry_extras(m, bparams, params, path, 0, 1))
            goto fail;
    }
    pv_dict_set(root, "params", params);
    params = NULL;
    const pv *bcfg = base ? pv_dict_get(base, "config") : NULL;
    /* keep the original config dict when there is one: it may carry keys we
     * do not model, and upstream reads it back verbatim */
    pv_dict_set(root, "config", bcfg ? pv_incref((pv *)bcfg) : san_config_to_pv(&m->cfg));
    /* other top-level entries (step, run, ...) with their exact keys: a key
     * such as "params\0x" must not replace what we wrote */
    if (base && base->kind == PV_DICT)
        for (size_t i = 0; i < base->u.dict.n; i++) {
            const pv *k = base->u.dict.keys[i];
            if (pv_dict_get_key(root, k))
                continue; /* format_version, params, config: ours */
            if (pv_dict_set_key(root, k, pv_incref(base->u.dict.vals[i])))
                goto fail;
        }
    return root;
fail:
    pv_decref(params);
    pv_decref(root);
    nd_error(ND_ENOMEM, "out of memory building the checkpoint tree");
    return NULL;
}

int ckpt_save(const char *path, const san_model *m, const pv *base)
{
    pv *root = ckpt_to_tree(m, base);
    if (!root)
        return ND_ENOMEM;
    int rc = ckpt_file_save(root, path);
    pv_decref(root);
    return rc;
}

/* float64 -> float16 rounded once: round to odd into float32 (24 bits >=
 * 2 x 11 + 2, so the second rounding is exact), then to nearest even. */
static uint16_t double_to_half(double x)
{
    float f = (float)x;
    if (isfinite(f) && (double)f != x) {
        if (fabs((double)f) > fabs(x))
            f = nextafterf(f, 0.0f);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        bits |= 1;
        memcpy(&f, &bits, 4);
    }
    return nd_float_to_half(f);
}

static int params_to_dtype(pv *node, nd_dtype dtype)
{
    for (size_t i = 0; i < node->u.dict.n; i++) {
        pv *v = node->u.dict.vals[i];
        if (v->kind == PV_DICT) {
            int rc = params_to_dtype(v, dtype);
            if (rc)
                return rc;
            continue;
        }
        if (v->kind != PV_NDARRAY || v->u.nd.dtype == dtype ||
            (v->u.nd.dtype != ND_F16 && v->u.nd.dtype != ND_F32 && v->u.nd.dtype != ND_F64))
            continue; /* integer arrays and non-arrays stay as they are */
        pv *a = pv_ndarray(dtype, v->u.nd.ndim, v->u.nd.shape, NULL);
        if (!a)
            return nd_error(ND_ENOMEM, "out of memory converting the checkpoint");
        int64_t n = pv_nd_numel(v);
        for (int64_t k = 0; k < n; k++) {
            /* float64 goes straight to the target, as numpy's astype does
             * (no double rounding through float32) */
            double x = v->u.nd.dtype == ND_F64 ? ((const double *)v->u.nd.data)[k]
                       : v->u.nd.dtype == ND_F32
                           ? ((const float *)v->u.nd.data)[k]
                           : nd_half_to_float(((const uint16_t *)v->u.nd.data)[k]);
            if (dtype == ND_F32)
                ((float *)a->u.nd.data)[k] = (float)x;
            else if (v->u.nd.dtype == ND_F64)
                ((uint16_t *)a->u.nd.data)[k] = double_to_half(x);
            else
                ((uint16_t *)a->u.nd.data)[k] = nd_float_to_half((float)x);
        }
        pv_decref(v);
        node->u.dict.vals[i] = a;
    }
    return ND_OK;
}

int ckpt_tree_params_to_dtype(pv *root, nd_dtype dtype)
{
    if (dtype != ND_F16 && dtype != ND_F32)
        return nd_error(ND_EARG, "checkpoints are written as float16 or float32, not %s",
                        nd_dtype_name(dtype));
    pv *params = root && root->kind == PV_DICT ? pv_dict_get(root, "params") : NULL;
    if (!params || params->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "checkpoint tree has no params dict");
    return params_to_dtype(params, dtype);
}

pv *ckpt_fresh_tree(const san_model *m, uint64_t seed)
{
    pv *root = ckpt_to_tree(m, NULL);
    if (!root)
        return NULL;
    pv *params = pv_dict_get(root, "params");
    const san_dims *D = &m->dims;
    int64_t d = D->d;
    float res_std = (float)(0.02 / sqrt(2.0 * D->L));
    /* the multi-token-prediction head upstream's model.init creates: one
     * Block without the layer axis plus two norms and a combiner */
    const struct {
        const char *name;
        int ndim;
        int64_t s0, s1;
        san_init_kind init;
        float v;
    } mtp[] = {
        {"mtp_combine/kernel", 2, 2 * d, d, INIT_NORMAL, 0.02f},
        {"mtp_block/ZCRMSNorm_0/scale", 1, d, 0, INIT_ZEROS, 0},
        {"mtp_block/self_attn/q_proj/kernel", 2, d, D->q_dim, INIT_NORMAL, 0.02f},
        {"mtp_block/self_attn/k_proj/kernel", 2, d, D->kv_dim, INIT_NORMAL, 0.02f},
        {"mtp_block/self_attn/v_proj/kernel", 2, d, D->kv_dim, INIT_NORMAL, 0.02f},
        {"mtp_block/self_attn/q_norm/scale", 1, D->hd, 0, INIT_ZEROS, 0},
        {"mtp_block/self_attn/k_norm/scale", 1, D->hd, 0, INIT_ZEROS, 0},
        {"mtp_block/self_attn/gate_proj/kernel", 2, d, D->q_dim, INIT_NORMAL, 0.02f},
        {"mtp_block/self_attn/out_proj/kernel", 2, D->q_dim, d, INIT_NORMAL, res_std},
        {"mtp_block/post_attn_norm/scale", 1, d, 0, INIT_ZEROS, 0},
        {"mtp_block/attn_gate", 0, 0, 0, INIT_ZEROS, 0},
        {"mtp_block/pre_hada_norm/scale", 1, d, 0, INIT_ZEROS, 0},
        {"mtp_block/hadamard_mlp/d1", 1, D->hada_n, 0, INIT_ONES, 1},
        {"mtp_block/hadamard_mlp/d2", 1, D->hada_n, 0, INIT_ONES, 1},
        {"mtp_block/hadamard_mlp/d3", 1, D->hada_n, 0, INIT_CONST, 0.02f},
        {"mtp_emb_norm/scale", 1, d, 0, INIT_ZEROS, 0},
        {"mtp_final_norm/scale", 1, d, 0, INIT_ZEROS, 0},
    };
    for (size_t i = 0; i < sizeof mtp / sizeof mtp[0]; i++) {
        san_tensor t;
        memset(&t, 0, sizeof t);
        t.ndim = mtp[i].ndim;
        t.shape[0] = mtp[i].s0;
        t.shape[1] = mtp[i].s1;
        t.numel = 1;
        for (int k = 0; k < t.ndim; k++)
            t.numel *= (size_t)t.shape[k];
        t.init = mtp[i].init;
        t.init_value = mtp[i].v;
        pv *a = pv_ndarray(ND_F32, t.ndim, t.shape, NULL);
        nd_rng rng;
        nd_rng_seed(&rng, seed * 0x100000001B3ull + 0xA5A5A5A5ull + i * 0x9E3779B97F4A7C15ull);
        if (!a || ckpt_tree_set(params, mtp[i].name, a)) {
            pv_decref(root);
            nd_error(ND_ENOMEM, "out of memory");
            return NULL;
        }
        san_tensor_init(&t, a->u.nd.data, &rng);
    }
    return root;
}
