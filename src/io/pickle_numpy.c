/* numpy objects inside pickles: dtype, ndarray (_reconstruct + BUILD and
 * the protocol-5 _frombuffer form), numpy scalars, and the protocol-2
 * _codecs.encode(str, 'latin1') spelling of bytes. Only the data layouts
 * are interpreted; nothing is ever called. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/pickle_internal.h"

#define FAIL(e, code, ...) ((e)->fail((e)->ctx, (code), __VA_ARGS__))

static int is_tuple_n(const pv *v, size_t n)
{
    return v && v->kind == PV_TUPLE && v->u.seq.n == n;
}

/* Python 3 writes bytes under protocol 2 as the str with the same code
 * points; undo that (UTF-8 in the pickle, every code point < 256). */
static int latin1_from_utf8(const pk_env *e, const pv *s, unsigned char **out, size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s->u.str.s;
    size_t n = s->u.str.len, m = 0;
    unsigned char *buf = malloc(n + 1);
    if (!buf)
        return FAIL(e, ND_ENOMEM, "out of memory decoding %zu bytes", n);
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0x80) {
            buf[m++] = p[i];
        } else if ((p[i] == 0xc2 || p[i] == 0xc3) && i + 1 < n && (p[i + 1] & 0xc0) == 0x80) {
            buf[m++] = (unsigned char)(((p[i] & 0x1f) << 6) | (p[i + 1] & 0x3f));
            i++;
        } else {
            free(buf);
            return FAIL(e, ND_EFORMAT, "latin1 data has a character above U+00FF at index %zu", i);
        }
    }
    *out = buf;
    *out_len = m;
    return 0;
}

/* Raw bytes from a bytes value, or from a str holding latin1 code points.
 * *tmp is set when a buffer had to be allocated (caller frees). */
static int raw_bytes(const pk_env *e, const pv *v, const char *what, const unsigned char **p,
                     size_t *len, unsigned char **tmp)
{
    *tmp = NULL;
    if (v->kind == PV_BYTES) {
        *p = (const unsigned char *)v->u.str.s;
        *len = v->u.str.len;
        return 0;
    }
    if (v->kind == PV_STR) {
        int rc = latin1_from_utf8(e, v, tmp, len);
        *p = *tmp;
        return rc;
    }
    return FAIL(e, v->kind == PV_LIST ? ND_EUNSUPPORTED : ND_EFORMAT, "%s must be bytes, got %s",
                what, pv_kind_name(v->kind));
}

int pk_codecs_encode(const pk_env *e, const pv *args, pv **out)
{
    if (!is_tuple_n(args, 2) || args->u.seq.items[0]->kind != PV_STR ||
        args->u.seq.items[1]->kind != PV_STR)
        return FAIL(e, ND_EUNSAFE, "_codecs.encode is only accepted as encode(str, 'latin1')");
    const pv *enc = args->u.seq.items[1];
    if (enc->u.str.len != 6 || memcmp(enc->u.str.s, "latin1", 6) != 0)
        return FAIL(e, ND_EUNSAFE, "_codecs.encode with encoding '%.40s' refused (only 'latin1')",
                    enc->u.str.s);
    unsigned char *buf;
    size_t len;
    int rc = latin1_from_utf8(e, args->u.seq.items[0], &buf, &len);
    if (rc)
        return rc;
    if (len > e->derived_cap - *e->derived) {
        free(buf);
        return FAIL(e, ND_ELIMIT, "decoded bytes exceed the size budget of this pickle");
    }
    *e->derived += len;
    *out = pv_str_take(PV_BYTES, (char *)buf, len);
    return *out ? 0 : FAIL(e, ND_ENOMEM, "out of memory");
}

static int parse_dtype_str(const char *s, size_t n, nd_dtype *t, char *order)
{
    *order = 0;
    if (n == 3 && strchr("<>|=", s[0])) {
        *order = s[0];
        s++;
        n--;
    }
    if (n != 2)
        return -1;
    static const struct {
        char code[3];
        nd_dtype t;
    } tab[] = {{"f2", ND_F16}, {"f4", ND_F32}, {"f8", ND_F64},
               {"i4", ND_I32}, {"i8", ND_I64}, {"b1", ND_BOOL}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (memcmp(s, tab[i].code, 2) == 0) {
            *t = tab[i].t;
            if (!*order)
                *order = *t == ND_BOOL ? '|' : '=';
            return 0;
        }
    }
    return -1;
}

int pk_dtype_from_args(const pk_env *e, const pv *args, pv *dt)
{
    if (!args || args->kind != PV_TUPLE || args->u.seq.n < 1 || args->u.seq.n > 3 ||
        args->u.seq.items[0]->kind != PV_STR)
        return FAIL(e, ND_EFORMAT, "numpy.dtype expects (str, align, copy) arguments");
    const pv *s = args->u.seq.items[0];
    nd_dtype t;
    char order;
    if (parse_dtype_str(s->u.str.s, s->u.str.len, &t, &order))
        return FAIL(e, ND_EUNSUPPORTED,
                    "numpy dtype '%.40s' is not supported (only f2 f4 f8 i4 i8 b1)", s->u.str.s);
    PVX_DT_TYPE(dt) = t;
    PVX_DT_ORDER(dt) = order;
    return 0;
}

/* numpy dtype state: (version, byteorder, subarray, names, fields, elsize,
 * alignment, flags[, metadata]); anything structured is refused. */
int pk_dtype_setstate(const pk_env *e, pv *dt, const pv *state)
{
    if (!state || state->kind != PV_TUPLE || (state->u.seq.n != 8 && state->u.seq.n != 9))
        return FAIL(e, ND_EFORMAT, "numpy.dtype state must be an 8- or 9-tuple");
    pv **it = state->u.seq.items;
    if (it[0]->kind != PV_INT || it[0]->u.i < 3 || it[0]->u.i > 4)
        return FAIL(e, ND_EUNSUPPORTED, "numpy.dtype state version not supported");
    if (it[1]->kind != PV_STR || it[1]->u.str.len != 1 || !strchr("<>|=", it[1]->u.str.s[0]))
        return FAIL(e, ND_EFORMAT, "numpy.dtype byte order must be one of < > | =");
    if (it[2]->kind != PV_NONE || it[3]->kind != PV_NONE || it[4]->kind != PV_NONE)
        return FAIL(e, ND_EUNSUPPORTED, "structured or subarray numpy dtypes are not supported");
    if (it[5]->kind != PV_INT || it[6]->kind != PV_INT || it[7]->kind != PV_INT)
        return FAIL(e, ND_EFORMAT, "numpy.dtype state has non-int size fields");
    if (state->u.seq.n == 9 && it[8]->kind != PV_NONE && it[8]->kind != PV_DICT)
        return FAIL(e, ND_EFORMAT, "numpy.dtype metadata must be None or a dict");
    char order = it[1]->u.str.s[0];
    PVX_DT_ORDER(dt) = order == '=' ? '<' : order;
    return 0;
}

static int parse_shape(const pk_env *e, const pv *shape, int *ndim, int64_t *dims)
{
    if (!shape || shape->kind != PV_TUPLE)
        return FAIL(e, ND_EFORMAT, "ndarray shape must be a tuple");
    if (shape->u.seq.n > PV_MAX_NDIM)
        return FAIL(e, ND_ELIMIT, "ndarray has %zu dimensions (at most %d supported)",
                    shape->u.seq.n, PV_MAX_NDIM);
    for (size_t i = 0; i < shape->u.seq.n; i++) {
        const pv *d = shape->u.seq.items[i];
        if (d->kind != PV_INT || d->u.i < 0)
            return FAIL(e, ND_EFORMAT, "ndarray shape entry %zu is not a non-negative int", i);
        dims[i] = d->u.i;
    }
    *ndim = (int)shape->u.seq.n;
    return 0;
}

/* Fortran-ordered src -> C-ordered dst, one element of isz bytes at a time. */
static void fortran_to_c(unsigned char *dst, const unsigned char *src, int ndim,
                         const int64_t *shape, size_t numel, size_t isz)
{
    size_t fstride[PV_MAX_NDIM], idx[PV_MAX_NDIM] = {0}, off = 0;
    for (int k = 0; k < ndim; k++)
        fstride[k] = k ? fstride[k - 1] * (size_t)shape[k - 1] : 1;
    for (size_t i = 0; i < numel; i++) {
        memcpy(dst + i * isz, src + off * isz, isz);
        for (int k = ndim - 1; k >= 0; k--) {
            off += fstride[k];
            if (++idx[k] < (size_t)shape[k])
                break;
            off -= fstride[k] * (size_t)shape[k];
            idx[k] = 0;
        }
    }
}

/* Build array contents into `target` (an existing pv, turned into
 * PV_NDARRAY) or a new pv in *out. */
static int make_array(const pk_env *e, const pv *dt, const pv *shape_v, int fortran,
                      const pv *data_v, pv *target, pv **out)
{
    if (!dt || (int)dt->kind != PVX_DTYPE)
        return FAIL(e, ND_EFORMAT, "ndarray dtype is %s, not a numpy.dtype",
                    dt ? pv_kind_name(dt->kind) : "missing");
    nd_dtype t = PVX_DT_TYPE(dt);
    size_t isz = nd_dtype_size(t);
    int ndim;
    int64_t dims[PV_MAX_NDIM];
    int rc = parse_shape(e, shape_v, &ndim, dims);
    if (rc)
        return rc;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        if (dims[i] == 0)
            numel = 0;
    for (int i = 0; i < ndim && numel; i++) {
        if (numel > INT64_MAX / dims[i])
            return FAIL(e, ND_ELIMIT, "ndarray shape product overflows");
        numel *= dims[i];
    }
    if ((uint64_t)numel > (SIZE_MAX - 1) / isz)
        return FAIL(e, ND_ELIMIT, "ndarray of %lld elements is too large", (long long)numel);
    size_t nbytes = (size_t)numel * isz;
    const unsigned char *src = NULL;
    size_t len = 0;
    unsigned char *tmp;
    rc = raw_bytes(e, data_v, "ndarray data", &src, &len, &tmp);
    if (rc)
        return rc;
    if (len != nbytes) {
        free(tmp);
        return FAIL(e, ND_EFORMAT, "ndarray data is %zu bytes but shape and dtype %s need %zu", len,
                    nd_dtype_name(t), nbytes);
    }
    if (nbytes > e->derived_cap - *e->derived) {
        free(tmp);
        return FAIL(e, ND_ELIMIT, "array data exceeds the size budget of this pickle");
    }
    unsigned char *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) {
        free(tmp);
        return FAIL(e, ND_ENOMEM, "out of memory for %zu bytes of array data", nbytes);
    }
    *e->derived += nbytes;
    if (fortran && ndim > 1)
        fortran_to_c(buf, src, ndim, dims, (size_t)numel, isz);
    else if (nbytes)
        memcpy(buf, src, nbytes);
    free(tmp);
    if (PVX_DT_ORDER(dt) == '>' && isz > 1) {
        for (size_t i = 0; i < nbytes; i += isz)
            for (size_t a = i, b = i + isz - 1; a < b; a++, b--) {
                unsigned char c = buf[a];
                buf[a] = buf[b];
                buf[b] = c;
            }
    }
    if (t == ND_BOOL)
        for (size_t i = 0; i < nbytes; i++)
            buf[i] = buf[i] != 0;
    pv *a = target ? target : pv_new_kind(PV_NDARRAY);
    if (!a) {
        free(buf);
        return FAIL(e, ND_ENOMEM, "out of memory");
    }
    memset(&a->u, 0, sizeof a->u);
    a->kind = PV_NDARRAY;
    PV_BOX(a)->opaque = 0;
    a->u.nd.dtype = t;
    a->u.nd.ndim = ndim;
    memcpy(a->u.nd.shape, dims, (size_t)ndim * sizeof dims[0]);
    a->u.nd.data = buf;
    a->u.nd.nbytes = nbytes;
    if (out)
        *out = a;
    return 0;
}

/* ndarray.__setstate__((version, shape, dtype, is_fortran, rawdata)); the
 * version is optional. */
int pk_array_setstate(const pk_env *e, pv *arr, const pv *state)
{
    if (!state || state->kind != PV_TUPLE || (state->u.seq.n != 4 && state->u.seq.n != 5))
        return FAIL(e, ND_EFORMAT, "ndarray state must be a 4- or 5-tuple");
    pv **it = state->u.seq.items;
    if (state->u.seq.n == 5) {
        if (it[0]->kind != PV_INT || it[0]->u.i != 1)
            return FAIL(e, ND_EUNSUPPORTED, "ndarray state version not supported");
        it++;
    }
    int fortran;
    if (it[2]->kind == PV_BOOL)
        fortran = it[2]->u.b;
    else if (it[2]->kind == PV_INT)
        fortran = it[2]->u.i != 0;
    else
        return FAIL(e, ND_EFORMAT, "ndarray is_fortran flag must be a bool");
    return make_array(e, it[1], it[0], fortran, it[3], arr, NULL);
}

int pk_frombuffer(const pk_env *e, const pv *args, pv **out)
{
    if (!is_tuple_n(args, 4))
        return FAIL(e, ND_EFORMAT, "_frombuffer expects (buffer, dtype, shape, order)");
    pv **it = args->u.seq.items;
    const pv *order = it[3];
    if (order->kind != PV_STR || order->u.str.len != 1 ||
        (order->u.str.s[0] != 'C' && order->u.str.s[0] != 'F'))
        return FAIL(e, ND_EFORMAT, "_frombuffer order must be 'C' or 'F'");
    return make_array(e, it[1], it[2], order->u.str.s[0] == 'F', it[0], NULL, out);
}

static uint64_t load_le(const unsigned char *p, size_t n, int swap)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[swap ? i : n - 1 - i] << (8 * (n - 1 - i));
    return v;
}

int pk_scalar(const pk_env *e, const pv *args, pv **out)
{
    if (!is_tuple_n(args, 2))
        return FAIL(e, ND_EFORMAT, "numpy scalar expects (dtype, bytes)");
    const pv *dt = args->u.seq.items[0];
    if ((int)dt->kind != PVX_DTYPE)
        return FAIL(e, ND_EFORMAT, "numpy scalar dtype is %s", pv_kind_name(dt->kind));
    const unsigned char *p = NULL;
    size_t len = 0;
    unsigned char *tmp;
    int rc = raw_bytes(e, args->u.seq.items[1], "numpy scalar data", &p, &len, &tmp);
    if (rc)
        return rc;
    nd_dtype t = PVX_DT_TYPE(dt);
    size_t isz = nd_dtype_size(t);
    if (len != isz) {
        free(tmp);
        return FAIL(e, ND_EFORMAT, "numpy %s scalar has %zu data bytes", nd_dtype_name(t), len);
    }
    uint64_t bits = load_le(p, isz, PVX_DT_ORDER(dt) == '>');
    free(tmp);
    pv *v = NULL;
    switch (t) {
    case ND_F16: v = pv_float(pk_half_to_double((uint16_t)bits)); break;
    case ND_F32: {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, 4);
        v = pv_float(f);
        break;
    }
    case ND_F64: {
        double d;
        memcpy(&d, &bits, 8);
        v = pv_float(d);
        break;
    }
    case ND_I32: v = pv_int((int32_t)(uint32_t)bits); break;
    case ND_I64: v = pv_int((int64_t)bits); break;
    case ND_BOOL: v = pv_bool(bits != 0); break;
    }
    if (!v)
        return FAIL(e, ND_ENOMEM, "out of memory");
    *out = v;
    return 0;
}
