#include "model/lora_merge.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/lora.h"

static int is_float(const pv *a)
{
    return a && a->kind == PV_NDARRAY &&
           (a->u.nd.dtype == ND_F16 || a->u.nd.dtype == ND_F32 || a->u.nd.dtype == ND_F64);
}

/* element i of a float array as the float32 jnp.asarray gives */
static float elem(const pv *a, size_t i)
{
    switch (a->u.nd.dtype) {
    case ND_F16: return nd_half_to_float(((const uint16_t *)a->u.nd.data)[i]);
    case ND_F32: return ((const float *)a->u.nd.data)[i];
    default: return (float)((const double *)a->u.nd.data)[i];
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

/* check one group; fills *rank_out */
static int check_group(const san_model *m, const pv *params, const char *what, const char *path,
                       const pv *g, int rank, int *skip)
{
    *skip = 0;
    const san_tensor *t = san_model_find(m, path);
    if (!t) {
        if (params && ckpt_tree_get(params, path)) {
            *skip = 1; /* e.g. mtp_*: merged upstream but never exported */
            return ND_OK;
        }
        return nd_error(ND_ESHAPE, "%s: adapter targets %s, which the checkpoint does not have",
                        what, path);
    }
    if (!g || g->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: lora[%s] is not a dict with A and B", what, path);
    const pv *A = pv_dict_get(g, "A"), *B = pv_dict_get(g, "B");
    if (!is_float(A) || !is_float(B))
        return nd_error(ND_EFORMAT, "%s: lora[%s] needs float arrays A and B", what, path);
    if (t->ndim < 2)
        return nd_error(ND_ESHAPE, "%s: %s is not a matrix (ndim %d)", what, path, t->ndim);
    int nd = t->ndim;
    int64_t in = t->shape[nd - 2], out = t->shape[nd - 1];
    int64_t r = A->u.nd.ndim == nd ? A->u.nd.shape[nd - 1] : -1;
    int64_t wa[4], wb[4];
    for (int i = 0; i < nd - 2; i++)
        wa[i] = wb[i] = t->shape[i];
    wa[nd - 2] = in;
    wa[nd - 1] = rank > 0 ? rank : r;
    wb[nd - 2] = rank > 0 ? rank : r;
    wb[nd - 1] = out;
    char got[96], want[96], ws[96];
    shape_str(ws, sizeof ws, nd, t->shape);
    int ok = A->u.nd.ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = A->u.nd.shape[i] == wa[i];
    if (!ok || r < 1) {
        shape_str(got, sizeof got, A->u.nd.ndim, A->u.nd.shape);
        shape_str(want, sizeof want, nd, wa);
        return nd_error(ND_ESHAPE, "%s: %s: A has shape %s, the base weight %s needs %s%s", what,
                        path, got, ws, want, rank > 0 ? " (adapter rank)" : "");
    }
    ok = B->u.nd.ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = B->u.nd.shape[i] == wb[i];
    if (!ok) {
        shape_str(got, sizeof got, B->u.nd.ndim, B->u.nd.shape);
        shape_str(want, sizeof want, nd, wb);
        return nd_error(ND_ESHAPE, "%s: %s: B has shape %s, the base weight %s needs %s", what,
                        path, got, ws, want);
    }
    for (int k = 0; k < 2; k++) {
        const pv *X = k ? B : A;
        size_t n = (size_t)pv_nd_numel(X);
        for (size_t i = 0; i < n; i++)
            if (!isfinite(elem(X, i)))
                return nd_error(ND_ENUMERIC, "%s: adapter %s %s has a non-finite value (%g)", what,
                                k ? "B" : "A", path, (double)elem(X, i));
    }
    return ND_OK;
}

static int merge_group(san_model *m, const pv *params, const char *path, const pv *g, float scale)
{
    const san_tensor *t = san_model_find(m, path);
    const pv *A = pv_dict_get(g, "A"), *B = pv_dict_get(g, "B");
    const pv *stored = params ? ckpt_tree_get(params, path) : NULL;
    int f16 = stored && stored->kind == PV_NDARRAY && stored->u.nd.dtype == ND_F16;
    int nd = t->ndim;
    int64_t in = t->shape[nd - 2], out = t->shape[nd - 1], r = A->u.nd.shape[nd - 1];
    size_t lead = t->numel / (size_t)(in * out);
    float *W = m->mem + t->offset;
    double *acc = malloc((size_t)out * sizeof *acc);
    float *brow = malloc((size_t)(r * out) * sizeof *brow);
    if (!acc || !brow) {
        free(acc);
        free(brow);
        return nd_error(ND_ENOMEM, "out of memory merging %s", path);
    }
    for (size_t l = 0; l < lead; l++) {
        size_t a0 = l * (size_t)(in * r), b0 = l * (size_t)(r * out);
        for (int64_t k = 0; k < r * out; k++)
            brow[k] = elem(B, b0 + (size_t)k);
        for (int64_t i = 0; i < in; i++) {
            for (int64_t o = 0; o < out; o++)
                acc[o] = 0.0;
            for (int64_t k = 0; k < r; k++) {
                double a = elem(A, a0 + (size_t)(i * r + k));
                const float *br = brow + k * out;
                for (int64_t o = 0; o < out; o++)
                    acc[o] += a * (double)br[o];
            }
            float *w = W + l * (size_t)(in * out) + (size_t)(i * out);
            for (int64_t o = 0; o < out; o++) {
                float delta = scale * (float)acc[o];
                if (f16) {
                    float d16 = nd_half_to_float(nd_float_to_half(delta));
                    w[o] = nd_half_to_float(nd_float_to_half(w[o] + d16));
                } else {
                    w[o] = w[o] + delta;
                }
            }
        }
    }
    free(acc);
    free(brow);
    return ND_OK;
}

int lora_merge(san_model *m, const pv *params, const pv *adapter, const char *what,
               lora_merge_info *info)
{
    lora_merge_info inf = {0};
    if (!adapter || adapter->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: not a LoRA adapter (top level is not a dict)", what);
    const pv *lora = pv_dict_get(adapter, "lora");
    const pv *sc = pv_dict_get(adapter, "scale");
    const pv *rk = pv_dict_get(adapter, "rank");
    if (!lora || lora->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: adapter has no 'lora' dict", what);
    if (!sc || (sc->kind != PV_FLOAT && sc->kind != PV_INT))
        return nd_error(ND_EFORMAT, "%s: adapter has no numeric 'scale'", what);
    inf.scale = sc->kind == PV_FLOAT ? sc->u.f : (double)sc->u.i;
    if (!isfinite(inf.scale) || fabs(inf.scale) > LORA_MAX_SCALE)
        return nd_error(ND_ENUMERIC,
                        "%s: adapter 'scale' is %g (must be finite and at most %g in magnitude)",
                        what, inf.scale, (double)LORA_MAX_SCALE);
    if (rk && rk->kind != PV_NONE) {
        if (rk->kind != PV_INT || rk->u.i < 1 || rk->u.i > (1 << 20))
            return nd_error(ND_EFORMAT, "%s: adapter 'rank' must be a positive int", what);
        inf.rank = (int)rk->u.i;
    }
    /* validate everything first: a refused adapter leaves the model as is */
    for (size_t i = 0; i < lora->u.dict.n; i++) {
        const pv *k = lora->u.dict.keys[i];
        if (k->kind != PV_STR)
            return nd_error(ND_EFORMAT, "%s: lora keys must be 'a/b/kernel' strings", what);
        int skip;
        int rc = check_group(m, params, what, k->u.str.s, lora->u.dict.vals[i], inf.rank, &skip);
        if (rc)
            return rc;
        if (!skip && !inf.rank) { /* no rank recorded: every A must match the first */
            const pv *A = pv_dict_get(lora->u.dict.vals[i], "A");
            inf.rank = (int)A->u.nd.shape[A->u.nd.ndim - 1];
        }
    }
    for (size_t i = 0; i < lora->u.dict.n; i++) {
        const char *path = lora->u.dict.keys[i]->u.str.s;
        if (!san_model_find(m, path)) {
            inf.skipped++;
            continue;
        }
        int rc = merge_group(m, params, path, lora->u.dict.vals[i], (float)inf.scale);
        if (rc)
            return rc;
        inf.merged++;
    }
    if (info)
        *info = inf;
    return ND_OK;
}

int lora_merge_file(san_model *m, const pv *params, const char *adapter_path, lora_merge_info *info)
{
    pv *ad = NULL;
    int rc = ckpt_file_load(adapter_path, &ad);
    if (rc)
        return rc;
    rc = lora_merge(m, params, ad, adapter_path, info);
    pv_decref(ad);
    return rc;
}
