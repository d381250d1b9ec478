/* Pickle protocol 4 writer. Arrays use numpy's own __reduce__ form
 * (_reconstruct + BUILD) so both numpy 1.x and 2.x load them; the numpy
 * globals and each dtype are memoized once and fetched with BINGET after.
 * Values referenced more than once (refs > 1) are memoized too, so shared
 * subtrees are written once and read back shared, and a small DAG cannot
 * expand into an exponentially large pickle. */
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"
#include "io/pickle_internal.h"

#define BATCH 1000 /* items per APPENDS/SETITEMS, as CPython does */

enum { G_RECON, G_NDARRAY, G_DTYPE, G_COUNT };

typedef struct {
    unsigned char *buf;
    size_t len, cap;
    int err;
    uint32_t nmemo;
    int64_t gmemo[G_COUNT];
    int64_t dtmemo[ND_BOOL + 1];
    /* pointer -> memo index for shared values (open addressing) */
    const pv **hkeys;
    uint32_t *hvals;
    size_t hcap, hn;
} wr;

static size_t hslot(const wr *w, const pv *v)
{
    uintptr_t x = (uintptr_t)v;
    x ^= x >> 17;
    x *= (uintptr_t)0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(x >> 7) & (w->hcap - 1);
    while (w->hkeys[i] && w->hkeys[i] != v)
        i = (i + 1) & (w->hcap - 1);
    return i;
}

static int64_t memo_find(const wr *w, const pv *v)
{
    if (!w->hcap)
        return -1;
    size_t i = hslot(w, v);
    return w->hkeys[i] ? (int64_t)w->hvals[i] : -1;
}

static void memo_add(wr *w, const pv *v, uint32_t idx)
{
    if (w->err)
        return;
    if ((w->hn + 1) * 2 > w->hcap) {
        size_t ncap = w->hcap ? w->hcap * 2 : 64;
        const pv **ok = w->hkeys;
        uint32_t *ov = w->hvals;
        size_t ocap = w->hcap;
        w->hkeys = calloc(ncap, sizeof *w->hkeys);
        w->hvals = calloc(ncap, sizeof *w->hvals);
        if (!w->hkeys || !w->hvals) {
            free(w->hkeys);
            free(w->hvals);
            w->hkeys = ok;
            w->hvals = ov;
            w->err = ND_ENOMEM;
            return;
        }
        w->hcap = ncap;
        for (size_t i = 0; i < ocap; i++) {
            if (ok[i]) {
                size_t j = hslot(w, ok[i]);
                w->hkeys[j] = ok[i];
                w->hvals[j] = ov[i];
            }
        }
        free(ok);
        free(ov);
    }
    size_t i = hslot(w, v);
    w->hkeys[i] = v;
    w->hvals[i] = idx;
    w->hn++;
}

static void put(wr *w, const void *p, size_t n)
{
    if (w->err)
        return;
    if (n > w->cap - w->len) {
        size_t ncap = w->cap ? w->cap : 256;
        while (n > ncap - w->len) {
            if (ncap > SIZE_MAX / 2) {
                w->err = ND_ENOMEM;
                return;
            }
            ncap *= 2;
        }
        unsigned char *b = realloc(w->buf, ncap);
        if (!b) {
            w->err = ND_ENOMEM;
            return;
        }
        w->buf = b;
        w->cap = ncap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void op(wr *w, unsigned char c)
{
    put(w, &c, 1);
}

static void put_le(wr *w, uint64_t v, size_t n)
{
    unsigned char b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, n);
}

static void memoize(wr *w, int64_t *slot)
{
    op(w, 0x94); /* MEMOIZE */
    *slot = w->nmemo++;
}

static void binget(wr *w, int64_t idx)
{
    if (idx < 256) {
        op(w, 'h');
        put_le(w, (uint64_t)idx, 1);
    } else {
        op(w, 'j');
        put_le(w, (uint64_t)idx, 4);
    }
}

static void w_str(wr *w, int kind, const char *s, size_t n)
{
    if (n < 256) {
        op(w, kind == PV_STR ? 0x8c : 'C');
        put_le(w, n, 1);
    } else if (n <= UINT32_MAX) {
        op(w, kind == PV_STR ? 'X' : 'B');
        put_le(w, n, 4);
    } else {
        op(w, kind == PV_STR ? 0x8d : 0x8e);
        put_le(w, n, 8);
    }
    put(w, s, n);
}

static void w_cstr(wr *w, const char *s)
{
    w_str(w, PV_STR, s, strlen(s));
}

static void w_int(wr *w, int64_t i)
{
    if (i >= 0 && i < 256) {
        op(w, 'K');
        put_le(w, (uint64_t)i, 1);
    } else if (i >= 0 && i < 65536) {
        op(w, 'M');
        put_le(w, (uint64_t)i, 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
        op(w, 'J');
        put_le(w, (uint64_t)i, 4);
    } else {
        /* LONG1: shortest little-endian two's complement */
        uint64_t u = (uint64_t)i;
        size_t n = 8;
        while (n > 1) {
            unsigned char hi = (unsigned char)(u >> (8 * (n - 1)));
            unsigned char next = (unsigned char)(u >> (8 * (n - 2)));
            if ((hi == 0x00 && !(next & 0x80)) || (hi == 0xff && (next & 0x80)))
                n--;
            else
                break;
        }
        op(w, 0x8a);
        put_le(w, n, 1);
        put_le(w, u, n);
    }
}

static void w_float(wr *w, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(bits >> (8 * (7 - i)));
    op(w, 'G');
    put(w, b, 8);
}

static void w_global(wr *w, int g)
{
    static const char *const mod[G_COUNT] = {"numpy.core.multiarray", "numpy", "numpy"};
    static const char *const name[G_COUNT] = {"_reconstruct", "ndarray", "dtype"};
    if (w->gmemo[g] >= 0) {
        binget(w, w->gmemo[g]);
        return;
    }
    w_cstr(w, mod[g]);
    w_cstr(w, name[g]);
    op(w, 0x93); /* STACK_GLOBAL */
    memoize(w, &w->gmemo[g]);
}

/* numpy.dtype('f4', False, True) with state (3, '<', None, None, None,
 * -1, -1, 0), exactly as numpy pickles it. */
static void w_dtype(wr *w, nd_dtype t)
{
    static const char *const code[] = {"f2", "f4", "f8", "i4", "i8", "b1"};
    if (w->dtmemo[t] >= 0) {
        binget(w, w->dtmemo[t]);
        return;
    }
    w_global(w, G_DTYPE);
    w_cstr(w, code[t]);
    op(w, 0x89);
    op(w, 0x88);
    op(w, 0x87); /* TUPLE3 */
    op(w, 'R');
    op(w, '(');
    w_int(w, 3);
    w_cstr(w, t == ND_BOOL ? "|" : "<");
    op(w, 'N');
    op(w, 'N');
    op(w, 'N');
    w_int(w, -1);
    w_int(w, -1);
    w_int(w, 0);
    op(w, 't');
    op(w, 'b');
    memoize(w, &w->dtmemo[t]);
}

static void w_tuple_end(wr *w, size_t n)
{
    if (n == 0)
        op(w, ')');
    else if (n <= 3)
        op(w, (unsigned char)(0x84 + n));
    else
        op(w, 't');
}

static int w_ndarray(wr *w, const pv *a)
{
    int nd = a->u.nd.ndim;
    size_t isz = nd_dtype_size(a->u.nd.dtype);
    if (isz == 0 || nd < 0 || nd > PV_MAX_NDIM)
        return nd_error(ND_EARG, "pickle_dumps: ndarray with bad dtype or ndim %d", nd);
    int64_t numel = pv_nd_numel(a);
    if (numel < 0 || (uint64_t)numel > SIZE_MAX / isz || (size_t)numel * isz != a->u.nd.nbytes ||
        (a->u.nd.nbytes && !a->u.nd.data))
        return nd_error(ND_EARG, "pickle_dumps: ndarray data size does not match its shape");
    w_global(w, G_RECON);
    w_global(w, G_NDARRAY);
    w_int(w, 0);
    op(w, 0x85);
    w_str(w, PV_BYTES, "b", 1);
    op(w, 0x87);
    op(w, 'R');
    op(w, '(');
    w_int(w, 1);
    if (nd > 3)
        op(w, '(');
    for (int i = 0; i < nd; i++)
        w_int(w, a->u.nd.shape[i]);
    w_tuple_end(w, (size_t)nd);
    w_dtype(w, a->u.nd.dtype);
    op(w, 0x89); /* C order */
    w_str(w, PV_BYTES, a->u.nd.data ? a->u.nd.data : "", a->u.nd.nbytes);
    op(w, 't');
    op(w, 'b');
    return 0;
}

static int w_value(wr *w, const pv *v, int depth);

static int w_items(wr *w, pv *const *items, size_t n, int depth)
{
    for (size_t i = 0; i < n; i++) {
        int rc = w_value(w, items[i], depth);
        if (rc)
            return rc;
    }
    return 0;
}

static int w_value_inner(wr *w, const pv *v, int depth)
{
    if (!v)
        return nd_error(ND_EARG, "pickle_dumps: NULL value");
    if (w->err)
        return nd_error(w->err, "pickle_dumps: out of memory");
    int rc;
    switch ((int)v->kind) {
    case PV_NONE: op(w, 'N'); return 0;
    case PV_BOOL: op(w, v->u.b ? 0x88 : 0x89); return 0;
    case PV_INT: w_int(w, v->u.i); return 0;
    case PV_FLOAT: w_float(w, v->u.f); return 0;
    case PV_STR:
    case PV_BYTES: w_str(w, (int)v->kind, v->u.str.s, v->u.str.len); return 0;
    case PV_NDARRAY: return w_ndarray(w, v);
    default: break;
    }
    /* containers; the depth cap also stops reference cycles */
    if (depth >= PK_MAX_DEPTH)
        return nd_error(ND_ELIMIT, "pickle_dumps: containers nested deeper than %d", PK_MAX_DEPTH);
    switch ((int)v->kind) {
    case PV_TUPLE: {
        size_t n = v->u.seq.n;
        if (n > 3)
            op(w, '(');
        if ((rc = w_items(w, v->u.seq.items, n, depth + 1)))
            return rc;
        w_tuple_end(w, n);
        return 0;
    }
    case PV_LIST:
        op(w, ']');
        for (size_t i = 0; i < v->u.seq.n; i += BATCH) {
            size_t k = v->u.seq.n - i < BATCH ? v->u.seq.n - i : BATCH;
            if (k > 1)
                op(w, '(');
            if ((rc = w_items(w, v->u.seq.items + i, k, depth + 1)))
                return rc;
            op(w, k > 1 ? 'e' : 'a');
        }
        return 0;
    case PV_DICT:
        op(w, '}');
        for (size_t i = 0; i < v->u.dict.n; i += BATCH) {
            size_t k = v->u.dict.n - i < BATCH ? v->u.dict.n - i : BATCH;
            if (k > 1)
                op(w, '(');
            for (size_t j = i; j < i + k; j++) {
                const pv *key = v->u.dict.keys[j];
                if (!key || (key->kind != PV_STR && key->kind != PV_INT))
                    return nd_error(ND_EARG, "pickle_dumps: dict key must be str or int, not %s",
                                    key ? pv_kind_name(key->kind) : "NULL");
                if ((rc = w_value(w, key, depth + 1)) ||
                    (rc = w_value(w, v->u.dict.vals[j], depth + 1)))
                    return rc;
            }
            op(w, k > 1 ? 'u' : 's');
        }
        return 0;
    }
    return nd_error(ND_EARG, "pickle_dumps: cannot write a %s", pv_kind_name(v->kind));
}

static int w_value(wr *w, const pv *v, int depth)
{
    int shareable = v && v->refs > 1 && v->kind >= PV_STR;
    if (shareable) {
        int64_t idx = memo_find(w, v);
        if (idx >= 0) {
            binget(w, idx);
            return 0;
        }
    }
    int rc = w_value_inner(w, v, depth);
    if (!rc && shareable) {
        if (w->nmemo == UINT32_MAX)
            return nd_error(ND_ELIMIT, "pickle_dumps: too many shared objects");
        op(w, 0x94);
        memo_add(w, v, w->nmemo++);
    }
    return rc;
}

int pickle_dumps(const pv *v, unsigned char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    wr w;
    memset(&w, 0, sizeof w);
    for (int i = 0; i < G_COUNT; i++)
        w.gmemo[i] = -1;
    for (int i = 0; i <= ND_BOOL; i++)
        w.dtmemo[i] = -1;
    op(&w, 0x80);
    op(&w, 4);
    int rc = w_value(&w, v, 0);
    op(&w, '.');
    free(w.hkeys);
    free(w.hvals);
    if (!rc && w.err)
        rc = nd_error(w.err, "pickle_dumps: out of memory");
    if (rc) {
        free(w.buf);
        return rc;
    }
    *out = w.buf;
    *out_len = w.len;
    return 0;
}

int pickle_dump_file(const pv *v, const char *path)
{
    unsigned char *buf;
    size_t len;
    int rc = pickle_dumps(v, &buf, &len);
    if (rc)
        return nd_error_prefix(rc, "%s", path);
    rc = nd_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}
