/* safetensors reader and writer (see safetensors.h). */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/fp16.h"
#include "core/status.h"
#include "text/pyjson.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader/writer assume a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_NDTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},   [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype t)
{
    return (unsigned)t < ST_NDTYPES ? dtypes[t].name : "?";
}

size_t st_dtype_size(st_dtype t)
{
    return (unsigned)t < ST_NDTYPES ? dtypes[t].size : 0;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int st_sniff(const unsigned char *p, size_t n)
{
    if (n < 9)
        return 0;
    uint64_t hl = le64(p);
    return hl >= 2 && hl <= ST_MAX_HEADER && p[8] == '{';
}

void st_close(st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->t[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].val);
    }
    free(f->t);
    free(f->meta);
    if (f->map)
        munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

/* ---- repeated keys ----
 * pyjson keeps Python's dict semantics (the last value wins); a header
 * with a repeated tensor name or field is refused instead. The text is
 * known to be valid JSON here, so this walk only tracks strings and
 * nesting; keys are decoded by parsing them as JSON strings. */
typedef struct {
    const char *s, *end;
} scan;

static void scan_ws(scan *c)
{
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
        c->s++;
}

static void scan_string(scan *c) /* at the opening quote */
{
    c->s++;
    while (c->s < c->end && *c->s != '"')
        c->s += *c->s == '\\' ? 2 : 1;
    c->s++;
}

typedef struct {
    char *key;
    size_t len;
} dkey;

static int cmp_dkey(const void *a, const void *b)
{
    const dkey *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int scan_value(scan *c, int depth, const char *what, const char *where);

static int scan_object(scan *c, int depth, const char *what, const char *where)
{
    c->s++; /* '{' */
    dkey *keys = NULL;
    size_t n = 0, cap = 0;
    int rc = ND_OK;
    for (;;) {
        scan_ws(c);
        if (*c->s == '}') {
            c->s++;
            break;
        }
        if (*c->s == ',') {
            c->s++;
            continue;
        }
        const char *k0 = c->s;
        scan_string(c);
        nd_pj_doc *doc = NULL;
        if (nd_pj_parse(k0, (size_t)(c->s - k0), &doc, NULL)) {
            rc = nd_error(ND_EFORMAT, "%s: header key does not parse", what);
            break;
        }
        const nd_pj *ks = nd_pj_root(doc);
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            dkey *nk = realloc(keys, cap * sizeof *nk);
            if (!nk) {
                nd_pj_free(doc);
                rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
                break;
            }
            keys = nk;
        }
        keys[n].key = malloc(ks->len + 1);
        if (!keys[n].key) {
            nd_pj_free(doc);
            rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
            break;
        }
        memcpy(keys[n].key, ks->str, ks->len + 1);
        keys[n].len = ks->len;
        n++;
        nd_pj_free(doc);
        scan_ws(c);
        c->s++; /* ':' */
        scan_ws(c);
        if ((rc = scan_value(c, depth + 1, what, keys[n - 1].key)))
            break;
    }
    if (!rc && n > 1) {
        qsort(keys, n, sizeof *keys, cmp_dkey);
        for (size_t i = 1; i < n && !rc; i++)
            if (!cmp_dkey(&keys[i - 1], &keys[i]))
                rc = depth == 0 ? nd_error(ND_EFORMAT,
                                           "%s: tensor name '%s' appears twice in the "
                                           "header",
                                           what, keys[i].key)
                                : nd_error(ND_EFORMAT, "%s: %s: key '%s' appears twice", what,
                                           where, keys[i].key);
    }
    for (size_t i = 0; i < n; i++)
        free(keys[i].key);
    free(keys);
    return rc;
}

static int scan_value(scan *c, int depth, const char *what, const char *where)
{
    if (*c->s == '{') {
        if (depth < 2)
            return scan_object(c, depth, what, where);
    } else if (*c->s == '"') {
        scan_string(c);
        return ND_OK;
    } else if (*c->s != '[') {
        while (c->s < c->end && !strchr(",]} \t\r\n", *c->s))
            c->s++;
        return ND_OK;
    }
    /* an array, or an object nested deeper than the format has (refused
     * later by the structure checks): skip it whole */
    int level = 0;
    while (c->s < c->end) {
        char ch = *c->s;
        if (ch == '"') {
            scan_string(c);
            continue;
        }
        c->s++;
        if (ch == '[' || ch == '{')
            level++;
        else if ((ch == ']' || ch == '}') && --level == 0)
            break;
    }
    return ND_OK;
}

/* ---- structure ---- */

static int parse_u64(const nd_pj *v, uint64_t *out)
{
    if (!v || v->type != ND_PJ_INT || v->len == 0 || v->str[0] == '-')
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < v->len; i++) {
        unsigned d = (unsigned)(v->str[i] - '0');
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

static int is_neg_int(const nd_pj *v)
{
    return v && v->type == ND_PJ_INT && v->len > 0 && v->str[0] == '-';
}

static const char *pj_type_name(const nd_pj *v)
{
    static const char *names[] = {"null",    "false",    "true",     "an integer",
                                  "a float", "a string", "an array", "an object"};
    return v ? names[v->type] : "missing";
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static int parse_entry(const nd_pj *e, const char *name, size_t data_len, const char *what,
                       st_tensor *t)
{
    if (e->type != ND_PJ_OBJECT)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': entry is %s, not an object", what, name,
                        pj_type_name(e));
    const nd_pj *dt = nd_pj_get(e, "dtype"), *sh = nd_pj_get(e, "shape"),
                *off = nd_pj_get(e, "data_offsets");
    if (!dt || dt->type != ND_PJ_STRING)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': dtype is %s, not a string", what, name,
                        pj_type_name(dt));
    int k = -1;
    for (int i = 0; i < ST_NDTYPES && k < 0; i++)
        if (strlen(dtypes[i].name) == dt->len && !memcmp(dt->str, dtypes[i].name, dt->len))
            k = i;
    if (k < 0)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': unknown dtype '%.40s'", what, name, dt->str);
    t->dtype = (st_dtype)k;
    if (!sh || sh->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': shape is %s, not an array", what, name,
                        pj_type_name(sh));
    if (sh->len > ST_MAX_NDIM)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': shape has %zu dimensions (at most %d)", what,
                        name, sh->len, ST_MAX_NDIM);
    t->ndim = (int)sh->len;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < sh->len; i++) {
        const nd_pj *d = sh->items[i];
        uint64_t x;
        if (is_neg_int(d))
            return nd_error(ND_EFORMAT, "%s: tensor '%s': shape entry %zu is negative (%.40s)",
                            what, name, i, d->str);
        if (parse_u64(d, &x) || x > (uint64_t)INT64_MAX)
            return nd_error(ND_EFORMAT,
                            "%s: tensor '%s': shape entry %zu is %s, not an integer in "
                            "0..2^63-1",
                            what, name, i, d->type == ND_PJ_INT ? "too large" : pj_type_name(d));
        t->shape[i] = (int64_t)x;
        if (x && numel > UINT64_MAX / x)
            overflow = 1;
        numel *= x;
    }
    size_t es = dtypes[k].size;
    /* a zero anywhere makes the tensor empty, whatever the other entries */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            overflow = 0, numel = 0;
    if (overflow || numel > UINT64_MAX / es)
        return nd_error(ND_EFORMAT, "%s: tensor '%s': shape overflows (more than 2^64 bytes)", what,
                        name);
    t->numel = numel;
    t->nbytes = numel * es;
    if (!off || off->type != ND_PJ_ARRAY || off->len != 2)
        return nd_error(
            ND_EFORMAT, "%s: tensor '%s': data_offsets is %s, not an array [begin, end]", what,
            name, off && off->type == ND_PJ_ARRAY ? "the wrong length" : pj_type_name(off));
    if (parse_u64(off->items[0], &t->begin) || parse_u64(off->items[1], &t->end))
        return nd_error(ND_EFORMAT,
                        "%s: tensor '%s': data_offsets must be two non-negative integers", what,
                        name);
    if (t->begin > t->end)
        return nd_error(ND_EFORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", what,
                        name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_len)
        return nd_error(ND_EFORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] run past the data buffer "
                        "(%zu bytes; the file is truncated or the offsets lie)",
                        what, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        data_len);
    if (t->end - t->begin != t->nbytes)
        return nd_error(ND_EFORMAT,
                        "%s: tensor '%s': data_offsets span %llu bytes but %s of that shape "
                        "needs %llu",
                        what, name, (unsigned long long)(t->end - t->begin), dtypes[k].name,
                        (unsigned long long)t->nbytes);
    return ND_OK;
}

static int cmp_span(const void *a, const void *b)
{
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

int st_parse(const void *bufv, size_t len, const char *what, st_file *f)
{
    memset(f, 0, sizeof *f);
    const unsigned char *buf = bufv;
    if (len < 8)
        return nd_error(ND_EFORMAT,
                        "%s: not a safetensors file: %zu bytes, shorter than the 8-byte header "
                        "length",
                        what, len);
    uint64_t hl = le64(buf);
    if (hl > ST_MAX_HEADER)
        return nd_error(ND_EFORMAT,
                        "%s: safetensors header length %llu is over the limit of %llu bytes", what,
                        (unsigned long long)hl, (unsigned long long)ST_MAX_HEADER);
    if (hl > len - 8)
        return nd_error(ND_EFORMAT,
                        "%s: safetensors header length %llu runs past the end of the file (%zu "
                        "bytes): truncated",
                        what, (unsigned long long)hl, len);
    if (hl < 2 || buf[8] != '{')
        return nd_error(ND_EFORMAT, "%s: safetensors header does not start with '{'", what);
    f->buf = buf;
    f->len = len;
    f->header_len = hl;
    const char *hdr = (const char *)buf + 8;
    size_t data_len = len - 8 - (size_t)hl;
    const unsigned char *data = buf + 8 + hl;

    nd_pj_doc *doc = NULL;
    size_t col = 0;
    int rc = nd_pj_parse(hdr, (size_t)hl, &doc, &col);
    if (rc) {
        rc = nd_error(rc == ND_ENOMEM ? ND_ENOMEM : ND_EFORMAT,
                      "%s: safetensors header is not valid JSON (%s)", what, nd_last_error());
        return rc;
    }
    const nd_pj *root = nd_pj_root(doc);
    if (root->type != ND_PJ_OBJECT) {
        nd_pj_free(doc);
        return nd_error(ND_EFORMAT, "%s: safetensors header is %s, not an object", what,
                        pj_type_name(root));
    }
    scan sc = {hdr, hdr + hl};
    scan_ws(&sc);
    if ((rc = scan_object(&sc, 0, what, "")))
        goto fail;
    size_t nt = 0;
    const nd_pj *meta = NULL;
    for (size_t i = 0; i < root->len; i++) {
        if (!strcmp(root->obj[i].key, "__metadata__") && root->obj[i].key_len == 12)
            meta = root->obj[i].val;
        else
            nt++;
    }
    f->t = calloc(nt ? nt : 1, sizeof *f->t);
    if (!f->t) {
        rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
        goto fail;
    }
    for (size_t i = 0; i < root->len; i++) {
        const nd_pj_member *m = &root->obj[i];
        if (m->val == meta)
            continue;
        if (strlen(m->key) != m->key_len) {
            rc = nd_error(ND_EFORMAT, "%s: a tensor name contains a NUL character", what);
            goto fail;
        }
        st_tensor *t = &f->t[f->n];
        if (!(t->name = dup_n(m->key, m->key_len))) {
            rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
            goto fail;
        }
        f->n++;
        if ((rc = parse_entry(m->val, t->name, data_len, what, t)))
            goto fail;
        t->data = data + t->begin;
    }
    if (meta) {
        if (meta->type != ND_PJ_OBJECT) {
            rc = nd_error(ND_EFORMAT, "%s: __metadata__ is %s, not an object of strings", what,
                          pj_type_name(meta));
            goto fail;
        }
        f->meta = calloc(meta->len ? meta->len : 1, sizeof *f->meta);
        if (!f->meta) {
            rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
            goto fail;
        }
        for (size_t i = 0; i < meta->len; i++) {
            const nd_pj_member *m = &meta->obj[i];
            if (strlen(m->key) != m->key_len) {
                rc = nd_error(ND_EFORMAT, "%s: a __metadata__ key contains a NUL character", what);
                goto fail;
            }
            if (m->val->type != ND_PJ_STRING) {
                rc = nd_error(ND_EFORMAT, "%s: __metadata__ '%s' is %s, not a string", what, m->key,
                              pj_type_name(m->val));
                goto fail;
            }
            st_meta *o = &f->meta[f->n_meta];
            o->key = dup_n(m->key, m->key_len);
            o->val = dup_n(m->val->str, m->val->len);
            o->val_len = m->val->len;
            f->n_meta++;
            if (!o->key || !o->val) {
                rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
                goto fail;
            }
        }
    }
    /* the tensors tile the data buffer: sorted by offset, each begins where
     * the previous one ended, and the last ends at the end of the file */
    st_tensor **ord = malloc((f->n ? f->n : 1) * sizeof *ord);
    if (!ord) {
        rc = nd_error(ND_ENOMEM, "out of memory reading %s", what);
        goto fail;
    }
    for (size_t i = 0; i < f->n; i++)
        ord[i] = &f->t[i];
    qsort(ord, f->n, sizeof *ord, cmp_span);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n && !rc; i++) {
        if (ord[i]->begin < at)
            rc =
                nd_error(ND_EFORMAT,
                         "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (ending at %llu)",
                         what, ord[i]->name, (unsigned long long)ord[i]->begin,
                         (unsigned long long)ord[i]->end, ord[i - 1]->name, (unsigned long long)at);
        else if (ord[i]->begin > at)
            rc = nd_error(ND_EFORMAT,
                          "%s: %llu unused bytes before tensor '%s' (data_offsets must cover the "
                          "buffer without gaps)",
                          what, (unsigned long long)(ord[i]->begin - at), ord[i]->name);
        at = ord[i]->end > at ? ord[i]->end : at;
    }
    free(ord);
    if (!rc && at != data_len)
        rc = nd_error(ND_EFORMAT,
                      "%s: %llu bytes after the last tensor's data are not covered by any "
                      "tensor",
                      what, (unsigned long long)(data_len - at));
    if (rc)
        goto fail;
    nd_pj_free(doc);
    return ND_OK;
fail:
    nd_pj_free(doc);
    st_close(f);
    return rc;
}

int st_open(const char *path, st_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return nd_error(ND_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return nd_error(ND_EIO, "%s: not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return nd_error(ND_EIO, "%s: cannot map: %s", path, strerror(e));
        }
    }
    close(fd);
    static const unsigned char empty[1];
    int rc = st_parse(map ? map : empty, len, path, f);
    if (rc) {
        if (map)
            munmap(map, len);
        return rc;
    }
    f->map = map;
    f->map_len = len;
    return ND_OK;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name))
            return &f->t[i];
    return NULL;
}

const st_meta *st_meta_get(const st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key))
            return &f->meta[i];
    return NULL;
}

int st_to_f32(const st_tensor *t, float *dst)
{
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_F32: memcpy(dst, p, n * 4); return ND_OK;
    case ST_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = nd_half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return ND_OK;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return ND_OK;
    case ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return ND_OK;
    default:
        return nd_error(ND_EUNSUPPORTED, "tensor '%s' has dtype %s, not a float type", t->name,
                        st_dtype_name(t->dtype));
    }
}

/* ---- writing ---- */

static int put_json_string(nd_buf *b, const char *s, size_t n)
{
    nd_pj v = {.type = ND_PJ_STRING, .len = n, .str = s};
    return nd_pj_dump(&v, 1, b);
}

static int put_u64(nd_buf *b, const char *sep, unsigned long long a)
{
    char tmp[48];
    int n = snprintf(tmp, sizeof tmp, "%s%llu", sep, a);
    return nd_buf_put(b, tmp, (size_t)n);
}

/* The 8-byte length and the padded JSON header into h. */
static int build_header(const char *path, const st_out_tensor *t, size_t n, const st_out_meta *meta,
                        size_t n_meta, nd_buf *hb)
{
    nd_buf h = {0};
    int rc = nd_buf_put(&h, "01234567{", 9);
    if (!rc && n_meta) {
        rc = nd_buf_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < n_meta && !rc; i++) {
            if (i)
                rc = nd_buf_put(&h, ",", 1);
            if (!rc)
                rc = put_json_string(&h, meta[i].key, strlen(meta[i].key));
            if (!rc)
                rc = nd_buf_put(&h, ":", 1);
            if (!rc)
                rc = put_json_string(&h, meta[i].val, strlen(meta[i].val));
        }
        if (!rc)
            rc = nd_buf_put(&h, "}", 1);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if ((unsigned)t[i].dtype >= ST_NDTYPES || t[i].ndim < 0 || t[i].ndim > ST_MAX_NDIM ||
            !strcmp(t[i].name, "__metadata__")) {
            rc = nd_error(ND_EARG, "%s: cannot write tensor '%s'", path, t[i].name);
            break;
        }
        uint64_t numel = 1;
        for (int k = 0; k < t[i].ndim; k++)
            numel *= (uint64_t)t[i].shape[k];
        uint64_t nb = numel * dtypes[t[i].dtype].size;
        if (i || n_meta)
            rc = nd_buf_put(&h, ",", 1);
        if (!rc)
            rc = put_json_string(&h, t[i].name, strlen(t[i].name));
        if (!rc)
            rc = nd_buf_put(&h, ":{\"dtype\":\"", 11);
        if (!rc)
            rc = nd_buf_put(&h, dtypes[t[i].dtype].name, strlen(dtypes[t[i].dtype].name));
        if (!rc)
            rc = nd_buf_put(&h, "\",\"shape\":[", 11);
        for (int k = 0; k < t[i].ndim && !rc; k++)
            rc = put_u64(&h, k ? "," : "", (unsigned long long)t[i].shape[k]);
        if (!rc)
            rc = nd_buf_put(&h, "],\"data_offsets\":[", 18);
        if (!rc)
            rc = put_u64(&h, "", (unsigned long long)off);
        if (!rc)
            rc = put_u64(&h, ",", (unsigned long long)(off + nb));
        if (!rc)
            rc = nd_buf_put(&h, "]}", 2);
        off += nb;
    }
    if (!rc)
        rc = nd_buf_put(&h, "}", 1);
    /* spaces after the JSON: the data starts on an 8-byte boundary */
    while (!rc && h.n % 8)
        rc = nd_buf_put(&h, " ", 1);
    if (rc) {
        nd_buf_free(&h);
        return rc == ND_EARG ? rc : nd_error(ND_ENOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < 8; i++)
        h.p[i] = (char)(unsigned char)((uint64_t)(h.n - 8) >> (8 * i));
    *hb = h;
    return ND_OK;
}

static size_t out_bytes(const st_out_tensor *t)
{
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++)
        numel *= (uint64_t)t->shape[k];
    return (size_t)(numel * dtypes[t->dtype].size);
}

int st_write_mem(const st_out_tensor *t, size_t n, const st_out_meta *meta, size_t n_meta,
                 unsigned char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    nd_buf h = {0};
    int rc = build_header("(memory)", t, n, meta, n_meta, &h);
    for (size_t i = 0; i < n && !rc; i++)
        rc = nd_buf_put(&h, t[i].data, out_bytes(&t[i]));
    if (rc) {
        nd_buf_free(&h);
        return rc;
    }
    *out = (unsigned char *)h.p;
    *out_len = h.n;
    return ND_OK;
}

int st_write_file(const char *path, const st_out_tensor *t, size_t n, const st_out_meta *meta,
                  size_t n_meta)
{
    nd_buf h = {0};
    int rc = build_header(path, t, n, meta, n_meta, &h);
    if (rc)
        return rc;
    nd_atomic_file af;
    if ((rc = nd_atomic_open(&af, path))) {
        nd_buf_free(&h);
        return rc;
    }
    rc = nd_atomic_write(&af, h.p, h.n);
    nd_buf_free(&h);
    for (size_t i = 0; i < n && !rc; i++) {
        size_t nb = out_bytes(&t[i]);
        if (nb)
            rc = nd_atomic_write(&af, t[i].data, nb);
    }
    if (rc) {
        nd_atomic_abort(&af);
        return rc;
    }
    return nd_atomic_commit(&af);
}
