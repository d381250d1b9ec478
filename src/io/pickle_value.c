/* Reference-counted pickle values: construction, inspection, equality. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/pickle_internal.h"

pv *pv_new_kind(int kind)
{
    pv_box *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->v.kind = (pv_kind)kind;
    b->v.refs = 1;
    if (kind >= PVX_GLOBAL)
        b->opaque = 1;
    return &b->v;
}

pv *pv_none(void)
{
    return pv_new_kind(PV_NONE);
}

pv *pv_bool(int b)
{
    pv *v = pv_new_kind(PV_BOOL);
    if (v)
        v->u.b = b != 0;
    return v;
}

pv *pv_int(int64_t i)
{
    pv *v = pv_new_kind(PV_INT);
    if (v)
        v->u.i = i;
    return v;
}

pv *pv_float(double f)
{
    pv *v = pv_new_kind(PV_FLOAT);
    if (v)
        v->u.f = f;
    return v;
}

pv *pv_str_take(int kind, char *buf, size_t len)
{
    pv *v = pv_new_kind(kind);
    if (!v) {
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    v->u.str.s = buf;
    v->u.str.len = len;
    return v;
}

static pv *str_copy(int kind, const void *p, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *buf = malloc(len + 1);
    if (!buf)
        return NULL;
    if (len)
        memcpy(buf, p, len);
    return pv_str_take(kind, buf, len);
}

pv *pv_str(const char *s)
{
    return str_copy(PV_STR, s, strlen(s));
}

pv *pv_strn(const char *s, size_t len)
{
    return str_copy(PV_STR, s, len);
}

pv *pv_bytes(const void *p, size_t len)
{
    return str_copy(PV_BYTES, p, len);
}

pv *pv_list(void)
{
    pv *v = pv_new_kind(PV_LIST);
    if (v)
        PV_BOX(v)->depth = 1;
    return v;
}

pv *pv_tuple(void)
{
    pv *v = pv_new_kind(PV_TUPLE);
    if (v)
        PV_BOX(v)->depth = 1;
    return v;
}

pv *pv_dict(void)
{
    pv *v = pv_new_kind(PV_DICT);
    if (v)
        PV_BOX(v)->depth = 1;
    return v;
}

size_t nd_dtype_size(nd_dtype t)
{
    switch (t) {
    case ND_F16: return 2;
    case ND_F32: return 4;
    case ND_F64: return 8;
    case ND_I32: return 4;
    case ND_I64: return 8;
    case ND_BOOL: return 1;
    }
    return 0;
}

const char *nd_dtype_name(nd_dtype t)
{
    switch (t) {
    case ND_F16: return "float16";
    case ND_F32: return "float32";
    case ND_F64: return "float64";
    case ND_I32: return "int32";
    case ND_I64: return "int64";
    case ND_BOOL: return "bool";
    }
    return "?";
}

const char *pv_kind_name(pv_kind k)
{
    switch ((int)k) {
    case PV_NONE: return "None";
    case PV_BOOL: return "bool";
    case PV_INT: return "int";
    case PV_FLOAT: return "float";
    case PV_STR: return "str";
    case PV_BYTES: return "bytes";
    case PV_LIST: return "list";
    case PV_TUPLE: return "tuple";
    case PV_DICT: return "dict";
    case PV_NDARRAY: return "ndarray";
    case PVX_GLOBAL: return "global";
    case PVX_DTYPE: return "numpy.dtype";
    case PVX_RECON: return "unbuilt ndarray";
    }
    return "?";
}

/* numel of a shape, or -1 if it overflows int64 or has a negative dim. */
static int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0)
            n = 0;
    }
    if (n == 0)
        return 0;
    for (int i = 0; i < ndim; i++) {
        if (n > INT64_MAX / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

int64_t pv_nd_numel(const pv *a)
{
    if (!a || a->kind != PV_NDARRAY)
        return -1;
    return shape_numel(a->u.nd.ndim, a->u.nd.shape);
}

pv *pv_ndarray(nd_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    size_t isz = nd_dtype_size(dtype);
    if (isz == 0 || ndim < 0 || ndim > PV_MAX_NDIM || (ndim > 0 && !shape))
        return NULL;
    int64_t numel = shape_numel(ndim, shape);
    if (numel < 0 || (uint64_t)numel > (SIZE_MAX - 1) / isz)
        return NULL;
    size_t nbytes = (size_t)numel * isz;
    void *buf = data ? malloc(nbytes ? nbytes : 1) : calloc(nbytes ? nbytes : 1, 1);
    if (!buf)
        return NULL;
    if (data && nbytes)
        memcpy(buf, data, nbytes);
    pv *v = pv_new_kind(PV_NDARRAY);
    if (!v) {
        free(buf);
        return NULL;
    }
    v->u.nd.dtype = dtype;
    v->u.nd.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        v->u.nd.shape[i] = shape[i];
    v->u.nd.data = buf;
    v->u.nd.nbytes = nbytes;
    return v;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elsize)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 4;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elsize)
            return ND_ENOMEM;
        ncap *= 2;
    }
    void *p = realloc(*arr, ncap * elsize);
    if (!p)
        return ND_ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

int pv_seq_push(pv *seq, pv *item)
{
    if (grow((void **)&seq->u.seq.items, &seq->u.seq.cap, seq->u.seq.n + 1, sizeof(pv *))) {
        pv_decref(item);
        return ND_ENOMEM;
    }
    seq->u.seq.items[seq->u.seq.n++] = item;
    return 0;
}

int pv_dict_push(pv *d, pv *key, pv *val)
{
    size_t need = d->u.dict.n + 1, cap = d->u.dict.cap;
    /* keys and vals share one capacity: grow both before touching cap */
    if (need > cap) {
        size_t kc = cap, vc = cap;
        if (grow((void **)&d->u.dict.keys, &kc, need, sizeof(pv *)) ||
            grow((void **)&d->u.dict.vals, &vc, need, sizeof(pv *))) {
            pv_decref(key);
            pv_decref(val);
            return ND_ENOMEM;
        }
        d->u.dict.cap = kc < vc ? kc : vc;
    }
    d->u.dict.keys[d->u.dict.n] = key;
    d->u.dict.vals[d->u.dict.n] = val;
    d->u.dict.n++;
    return 0;
}

int pv_append(pv *seq, pv *item)
{
    if (!seq || !item || (seq->kind != PV_LIST && seq->kind != PV_TUPLE) || seq == item) {
        pv_decref(item);
        return ND_EARG;
    }
    uint16_t d = PV_BOX(item)->depth;
    int rc = pv_seq_push(seq, item);
    if (rc == 0 && d + 1 > PV_BOX(seq)->depth)
        PV_BOX(seq)->depth = (uint16_t)(d < UINT16_MAX - 1 ? d + 1 : UINT16_MAX);
    return rc;
}

static int str_eq(const pv *k, const char *key, size_t len)
{
    return k->kind == PV_STR && k->u.str.len == len && memcmp(k->u.str.s, key, len) == 0;
}

int pv_dict_set(pv *dict, const char *key, pv *val)
{
    if (!dict || dict->kind != PV_DICT || !key || !val || val == dict) {
        pv_decref(val);
        return ND_EARG;
    }
    size_t len = strlen(key);
    uint16_t d = PV_BOX(val)->depth;
    if (d + 1 > PV_BOX(dict)->depth)
        PV_BOX(dict)->depth = (uint16_t)(d < UINT16_MAX - 1 ? d + 1 : UINT16_MAX);
    for (size_t i = 0; i < dict->u.dict.n; i++) {
        if (str_eq(dict->u.dict.keys[i], key, len)) {
            pv_decref(dict->u.dict.vals[i]);
            dict->u.dict.vals[i] = val;
            return 0;
        }
    }
    pv *k = pv_strn(key, len);
    if (!k) {
        pv_decref(val);
        return ND_ENOMEM;
    }
    return pv_dict_push(dict, k, val);
}

pv *pv_dict_get(const pv *dict, const char *key)
{
    if (!dict || dict->kind != PV_DICT || !key)
        return NULL;
    size_t len = strlen(key);
    for (size_t i = 0; i < dict->u.dict.n; i++)
        if (str_eq(dict->u.dict.keys[i], key, len))
            return dict->u.dict.vals[i];
    return NULL;
}

pv *pv_dict_get_key(const pv *dict, const pv *key)
{
    if (!dict || dict->kind != PV_DICT || !key)
        return NULL;
    for (size_t i = 0; i < dict->u.dict.n; i++)
        if (pv_equal(dict->u.dict.keys[i], key))
            return dict->u.dict.vals[i];
    return NULL;
}

int pv_dict_set_key(pv *dict, const pv *key, pv *val)
{
    if (!dict || dict->kind != PV_DICT || !key || !val || val == dict || key == dict) {
        pv_decref(val);
        return ND_EARG;
    }
    uint16_t d = PV_BOX(val)->depth;
    if (d + 1 > PV_BOX(dict)->depth)
        PV_BOX(dict)->depth = (uint16_t)(d < UINT16_MAX - 1 ? d + 1 : UINT16_MAX);
    for (size_t i = 0; i < dict->u.dict.n; i++) {
        if (pv_equal(dict->u.dict.keys[i], key)) {
            pv_decref(dict->u.dict.vals[i]);
            dict->u.dict.vals[i] = val;
            return 0;
        }
    }
    return pv_dict_push(dict, pv_incref((pv *)key), val);
}

pv *pv_incref(pv *v)
{
    if (v)
        v->refs++;
    return v;
}

void pv_decref(pv *v)
{
    if (!v || --v->refs > 0)
        return;
    switch ((int)v->kind) {
    case PV_STR:
    case PV_BYTES: free(v->u.str.s); break;
    case PV_LIST:
    case PV_TUPLE:
        for (size_t i = 0; i < v->u.seq.n; i++)
            pv_decref(v->u.seq.items[i]);
        free(v->u.seq.items);
        break;
    case PV_DICT:
        for (size_t i = 0; i < v->u.dict.n; i++) {
            pv_decref(v->u.dict.keys[i]);
            pv_decref(v->u.dict.vals[i]);
        }
        free(v->u.dict.keys);
        free(v->u.dict.vals);
        break;
    case PV_NDARRAY: free(v->u.nd.data); break;
    default: break;
    }
    free(PV_BOX(v));
}

int pv_key_cmp(const pv *a, const pv *b)
{
    if (a->kind != b->kind)
        return a->kind == PV_INT ? -1 : 1;
    if (a->kind == PV_INT)
        return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
    size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
    int c = n ? memcmp(a->u.str.s, b->u.str.s, n) : 0;
    if (c)
        return c;
    return a->u.str.len < b->u.str.len ? -1 : a->u.str.len > b->u.str.len;
}

typedef struct {
    pv *key;
    size_t idx;
} key_ent;

static int key_ent_cmp(const void *pa, const void *pb)
{
    const key_ent *a = pa, *b = pb;
    int c = pv_key_cmp(a->key, b->key);
    if (c)
        return c;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

int pv_dict_dedupe(pv *d)
{
    size_t n = d->u.dict.n;
    if (n < 2)
        return 0;
    key_ent *e = malloc(n * sizeof *e);
    if (!e)
        return ND_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        e[i].key = d->u.dict.keys[i];
        e[i].idx = i;
    }
    /* sorting keeps this O(n log n) for hostile dicts with many keys */
    qsort(e, n, sizeof *e, key_ent_cmp);
    pv **keys = d->u.dict.keys, **vals = d->u.dict.vals;
    for (size_t g = 0; g < n;) {
        size_t h = g + 1;
        while (h < n && pv_key_cmp(e[g].key, e[h].key) == 0)
            h++;
        if (h - g > 1) {
            size_t first = e[g].idx, last = e[h - 1].idx;
            pv_decref(vals[first]);
            vals[first] = vals[last];
            vals[last] = NULL;
            for (size_t j = g + 1; j < h; j++) {
                size_t k = e[j].idx;
                pv_decref(keys[k]);
                pv_decref(vals[k]);
                keys[k] = vals[k] = NULL;
            }
        }
        g = h;
    }
    free(e);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!keys[i])
            continue;
        keys[m] = keys[i];
        vals[m] = vals[i];
        m++;
    }
    d->u.dict.n = m;
    return 0;
}

int pv_equal(const pv *a, const pv *b)
{
    if (a == b)
        return 1;
    if (!a || !b || a->kind != b->kind)
        return 0;
    switch ((int)a->kind) {
    case PV_NONE: return 1;
    case PV_BOOL: return a->u.b == b->u.b;
    case PV_INT: return a->u.i == b->u.i;
    case PV_FLOAT: return memcmp(&a->u.f, &b->u.f, sizeof(double)) == 0;
    case PV_STR:
    case PV_BYTES:
        return a->u.str.len == b->u.str.len &&
               (a->u.str.len == 0 || memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0);
    case PV_LIST:
    case PV_TUPLE:
        if (a->u.seq.n != b->u.seq.n)
            return 0;
        for (size_t i = 0; i < a->u.seq.n; i++)
            if (!pv_equal(a->u.seq.items[i], b->u.seq.items[i]))
                return 0;
        return 1;
    case PV_DICT:
        if (a->u.dict.n != b->u.dict.n)
            return 0;
        for (size_t i = 0; i < a->u.dict.n; i++)
            if (!pv_equal(a->u.dict.keys[i], b->u.dict.keys[i]) ||
                !pv_equal(a->u.dict.vals[i], b->u.dict.vals[i]))
                return 0;
        return 1;
    case PV_NDARRAY:
        if (a->u.nd.dtype != b->u.nd.dtype || a->u.nd.ndim != b->u.nd.ndim ||
            a->u.nd.nbytes != b->u.nd.nbytes)
            return 0;
        for (int i = 0; i < a->u.nd.ndim; i++)
            if (a->u.nd.shape[i] != b->u.nd.shape[i])
                return 0;
        return a->u.nd.nbytes == 0 || memcmp(a->u.nd.data, b->u.nd.data, a->u.nd.nbytes) == 0;
    }
    return 0;
}

double pk_half_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp((double)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}
