#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "core/status.h"
#include "io/checkpoint.h"

static const char *target_names[LORA_NTARGETS] = {
    "stack/layers/block/self_attn/q_proj/kernel",   "stack/layers/block/self_attn/k_proj/kernel",
    "stack/layers/block/self_attn/v_proj/kernel",   "stack/layers/block/self_attn/gate_proj/kernel",
    "stack/layers/block/self_attn/out_proj/kernel",
};

const char *san_lora_target_name(int t)
{
    return target_names[t];
}

float *san_lora_weight_slot(san_weights *w, int t)
{
    switch (t) {
    case LORA_Q: return w->wq;
    case LORA_K: return w->wk;
    case LORA_V: return w->wv;
    case LORA_GATE: return w->wgate;
    default: return w->wout;
    }
}

int san_lora_create(san_lora *lo, const san_model *m, int rank, float alpha)
{
    memset(lo, 0, sizeof *lo);
    if (rank < 1)
        return nd_error(ND_EARG, "LoRA rank must be >= 1 (got %d)", rank);
    lo->rank = rank;
    lo->alpha = alpha;
    lo->scale = alpha / (float)rank;
    lo->L = m->dims.L;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        const san_tensor *ten = san_model_find(m, target_names[t]);
        san_lora_target *g = &lo->t[t];
        g->in = (int)ten->shape[1];
        g->out = (int)ten->shape[2];
        const float *x = m->mem + ten->offset; /* the host's copy (m->w: the ops') */
        float mx = 0;
        for (size_t i = 0; i < ten->numel; i++)
            mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
        /* upstream skips all-zero kernels: adapting them caused NaNs (#53) */
        g->present = mx > 1e-6f;
        if (!g->present)
            continue;
        g->a_off = lo->numel;
        lo->numel += (size_t)lo->L * g->in * rank;
        g->b_off = lo->numel;
        lo->numel += (size_t)lo->L * rank * g->out;
    }
    lo->mem = calloc(lo->numel ? lo->numel : 1, sizeof(float));
    if (!lo->mem)
        return nd_error(ND_ENOMEM, "out of memory for LoRA (%zu floats)", lo->numel);
    return ND_OK;
}

/* lo->mem's device copy (or lo->mem itself, from a backend) released;
 * lo->mem then plain host memory */
static int lora_to_host(san_lora *lo)
{
    const nd_backend *old = lo->mem_be;
    if (!old)
        return ND_OK;
    size_t n = lo->numel ? lo->numel : 1;
    nd_backend_sync(old);
    if (lo->dev && lo->dev != lo->mem) {
        old->free(old, lo->dev);
    } else {
        float *h = calloc(n, sizeof(float));
        if (!h)
            return nd_error(ND_ENOMEM, "out of memory for the LoRA adapter");
        nd_backend_download(old, h, lo->mem, n * sizeof(float));
        old->free(old, lo->mem);
        lo->mem = h;
    }
    lo->dev = NULL;
    lo->mem_be = NULL;
    return ND_OK;
}

int san_lora_to_backend(san_lora *lo, const nd_backend *be)
{
    if (!be->device || lo->mem_be == be)
        return ND_OK;
    int rc = lora_to_host(lo);
    if (rc)
        return rc;
    size_t n = lo->numel ? lo->numel : 1;
    float *p = be->alloc(be, n * sizeof(float));
    if (!p)
        return nd_error(ND_ENOMEM, "out of %s memory for the LoRA adapter", be->name);
    nd_backend_upload(be, p, lo->mem, n * sizeof(float));
    if (be->host_mem) { /* the host works on it in place */
        free(lo->mem);
        lo->mem = p;
    }
    lo->dev = p;
    lo->mem_be = be;
    return ND_OK;
}

void san_lora_upload(san_lora *lo)
{
    if (lo->mem_be && lo->dev && lo->dev != lo->mem)
        nd_backend_upload(lo->mem_be, lo->dev, lo->mem, lo->numel * sizeof(float));
}

void san_lora_free(san_lora *lo)
{
    lora_to_host(lo);
    free(lo->mem);
    memset(lo, 0, sizeof *lo);
}

void san_lora_init(san_lora *lo, uint64_t seed)
{
    nd_rng rng;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lo->t[t].present)
            continue;
        nd_rng_seed(&rng, seed * 0x2545F4914F6CDD1Dull + (uint64_t)t + 1);
        float *A = san_lora_A(lo, lo->mem, t);
        size_t na = (size_t)lo->L * lo->t[t].in * lo->rank;
        for (size_t i = 0; i < na; i++)
            A[i] = (float)(nd_rng_normal(&rng) / lo->rank);
        memset(san_lora_B(lo, lo->mem, t), 0,
               sizeof(float) * (size_t)lo->L * lo->rank * lo->t[t].out);
    }
}

pv *san_lora_to_pv(const san_lora *lo)
{
    pv *root = pv_dict(), *tree = pv_dict();
    if (!root || !tree)
        goto fail;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lo->t[t].present)
            continue;
        pv *ab = pv_dict();
        int64_t sa[3] = {lo->L, lo->t[t].in, lo->rank}, sb[3] = {lo->L, lo->rank, lo->t[t].out};
        pv *A = pv_ndarray(ND_F32, 3, sa, san_lora_A(lo, lo->mem, t));
        pv *B = pv_ndarray(ND_F32, 3, sb, san_lora_B(lo, lo->mem, t));
        if (!ab || !A || !B || pv_dict_set(ab, "A", A) || pv_dict_set(ab, "B", B) ||
            pv_dict_set(tree, target_names[t], ab))
            goto fail;
    }
    pv_dict_set(root, "lora", tree);
    tree = NULL;
    pv_dict_set(root, "scale", pv_float((double)lo->scale));
    pv_dict_set(root, "base", pv_str(lo->base));
    pv_dict_set(root, "rank", pv_int(lo->rank));
    return root;
fail:
    pv_decref(tree);
    pv_decref(root);
    nd_error(ND_ENOMEM, "out of memory building the adapter");
    return NULL;
}

int san_lora_save(const san_lora *lo, const char *path, pv *extra)
{
    pv *root = san_lora_to_pv(lo);
    if (!root) {
        pv_decref(extra);
        return ND_ENOMEM;
    }
    if (extra)
        pv_dict_set(root, "needle_c_state", extra);
    int rc = ckpt_file_save(root, path);
    pv_decref(root);
    return rc;
}

static int copy_array(const pv *a, float *dst, int64_t d0, int64_t d1, int64_t d2, const char *path,
                      const char *name, const char *what)
{
    if (!a || a->kind != PV_NDARRAY)
        return nd_error(ND_ESHAPE, "%s: adapter entry %s/%s is missing or not an array", path, what,
                        name);
    if (a->u.nd.ndim != 3 || a->u.nd.shape[0] != d0 || a->u.nd.shape[1] != d1 ||
        a->u.nd.shape[2] != d2)
        return nd_error(ND_ESHAPE,
                        "%s: adapter %s %s has shape (%lld, %lld, %lld)... but the base model "
                        "needs (%lld, %lld, %lld)",
                        path, what, name, a->u.nd.ndim > 0 ? (long long)a->u.nd.shape[0] : -1LL,
                        a->u.nd.ndim > 1 ? (long long)a->u.nd.shape[1] : -1LL,
                        a->u.nd.ndim > 2 ? (long long)a->u.nd.shape[2] : -1LL, (long long)d0,
                        (long long)d1, (long long)d2);
    size_t n = (size_t)(d0 * d1 * d2);
    if (a->u.nd.dtype == ND_F32)
        memcpy(dst, a->u.nd.data, n * sizeof(float));
    else if (a->u.nd.dtype == ND_F16)
        for (size_t i = 0; i < n; i++)
            dst[i] = nd_half_to_float(((const uint16_t *)a->u.nd.data)[i]);
    else if (a->u.nd.dtype == ND_F64)
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)((const double *)a->u.nd.data)[i];
    else
        return nd_error(ND_EFORMAT, "%s: adapter %s %s has dtype %s", path, what, name,
                        nd_dtype_name(a->u.nd.dtype));
    return ND_OK;
}

/* Everything the adapter file holds, checked against the model; `root` is
 * only read. */
int san_lora_from_tree(san_lora *lo, const san_model *m, const pv *root, const char *path)
{
    memset(lo, 0, sizeof *lo);
    int rc = ND_OK;
    const pv *tree = root && root->kind == PV_DICT ? pv_dict_get(root, "lora") : NULL;
    const pv *rank = root && root->kind == PV_DICT ? pv_dict_get(root, "rank") : NULL;
    const pv *scale = root && root->kind == PV_DICT ? pv_dict_get(root, "scale") : NULL;
    if (!tree || tree->kind != PV_DICT || !scale ||
        (scale->kind != PV_FLOAT && scale->kind != PV_INT))
        return nd_error(ND_EFORMAT, "%s: not a LoRA adapter (needs 'lora' dict and 'scale')", path);
    /* rank: recorded, else read off the first A */
    int r = rank && rank->kind == PV_INT && rank->u.i >= 1 && rank->u.i <= 1 << 16 ? (int)rank->u.i
            : rank && rank->kind == PV_INT                                         ? -1
                                                                                   : 0;
    for (size_t i = 0; !r && i < tree->u.dict.n; i++) {
        const pv *A =
            tree->u.dict.vals[i]->kind == PV_DICT ? pv_dict_get(tree->u.dict.vals[i], "A") : NULL;
        if (A && A->kind == PV_NDARRAY && A->u.nd.ndim == 3)
            r = A->u.nd.shape[2] >= 1 && A->u.nd.shape[2] <= 1 << 16 ? (int)A->u.nd.shape[2] : -1;
    }
    if (r < 1 || r > 1 << 16)
        return nd_error(ND_EFORMAT, "%s: adapter rank is missing or outside 1..65536", path);
    /* every key must name a target before anything is allocated */
    for (size_t i = 0; i < tree->u.dict.n; i++) {
        const pv *k = tree->u.dict.keys[i];
        int known = 0;
        for (int t = 0; t < LORA_NTARGETS && k->kind == PV_STR; t++)
            known |= !strcmp(k->u.str.s, target_names[t]);
        if (!known)
            return nd_error(ND_ESHAPE,
                            "%s: adapter targets '%s', which is not a LoRA target of "
                            "this model",
                            path, k->kind == PV_STR ? k->u.str.s : "(a key that is not a string)");
    }
    double sc = scale->kind == PV_FLOAT ? scale->u.f : (double)scale->u.i;
    if (!isfinite(sc) || fabs(sc) > LORA_MAX_SCALE) {
        return nd_error(ND_ENUMERIC,
                        "%s: adapter 'scale' is %g (must be finite and at most %g in magnitude)",
                        path, sc, (double)LORA_MAX_SCALE);
    }
    rc = san_lora_create(lo, m, r, (float)(sc * r));
    if (rc)
        return rc;
    lo->scale = (float)sc;
    /* which targets the file has decides what is adapted, not the base */
    size_t off = 0;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        const pv *ab = pv_dict_get(tree, target_names[t]);
        lo->t[t].present = ab != NULL;
        if (!ab)
            continue;
        lo->t[t].a_off = off;
        off += (size_t)lo->L * lo->t[t].in * r;
        lo->t[t].b_off = off;
        off += (size_t)lo->L * r * lo->t[t].out;
    }
    if ((rc = lora_to_host(lo)))
        return rc;
    free(lo->mem);
    lo->numel = off;
    lo->mem = calloc(off ? off : 1, sizeof(float));
    if (!lo->mem) {
        san_lora_free(lo);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    for (int t = 0; t < LORA_NTARGETS && !rc; t++) {
        if (!lo->t[t].present)
            continue;
        const pv *ab = pv_dict_get(tree, target_names[t]);
        if (ab->kind != PV_DICT) {
            rc = nd_error(ND_EFORMAT, "%s: adapter entry %s is not a dict", path, target_names[t]);
            break;
        }
        rc = copy_array(pv_dict_get(ab, "A"), san_lora_A(lo, lo->mem, t), lo->L, lo->t[t].in, r,
                        path, "A", target_names[t]);
        if (!rc)
            rc = copy_array(pv_dict_get(ab, "B"), san_lora_B(lo, lo->mem, t), lo->L, r,
                            lo->t[t].out, path, "B", target_names[t]);
        for (int ab_i = 0; ab_i < 2 && !rc; ab_i++) {
            const float *x = ab_i ? san_lora_B(lo, lo->mem, t) : san_lora_A(lo, lo->mem, t);
            size_t n = (size_t)lo->L * r * (ab_i ? lo->t[t].out : lo->t[t].in);
            for (size_t i = 0; i < n; i++)
                if (!isfinite(x[i])) {
                    rc = nd_error(ND_ENUMERIC, "%s: adapter %s %s has a non-finite value (%g)",
                                  path, ab_i ? "B" : "A", target_names[t], (double)x[i]);
                    break;
                }
        }
    }
    const pv *base = pv_dict_get(root, "base");
    if (base && base->kind == PV_STR)
        snprintf(lo->base, sizeof lo->base, "%s", base->u.str.s);
    if (rc)
        san_lora_free(lo);
    return rc;
}

int san_lora_load(san_lora *lo, const san_model *m, const char *path, pv **root_out)
{
    memset(lo, 0, sizeof *lo);
    if (root_out)
        *root_out = NULL;
    pv *root;
    int rc = ckpt_file_load(path, &root);
    if (rc)
        return rc;
    rc = san_lora_from_tree(lo, m, root, path);
    if (rc || !root_out)
        pv_decref(root);
    else
        *root_out = root;
    return rc;
}
