#define _POSIX_C_SOURCE 200809L
/* safetensors checkpoints and adapters <-> the pickle-shaped tree (see
 * safetensors.h and docs/formats.md "safetensors"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/safetensors.h"
#include "text/pyjson.h"

/* ---- JSON <-> pv ---- */

static pv *pj_to_pv(const nd_pj *v, const char *what, int *rc)
{
    switch (v->type) {
    case ND_PJ_NULL: return pv_none();
    case ND_PJ_FALSE: return pv_bool(0);
    case ND_PJ_TRUE: return pv_bool(1);
    case ND_PJ_FLOAT: return pv_float(v->num);
    case ND_PJ_STRING: return pv_strn(v->str, v->len);
    case ND_PJ_INT: {
        errno = 0;
        char *end;
        long long x = strtoll(v->str, &end, 10);
        if (errno || *end) {
            *rc = nd_error(ND_ELIMIT, "%s: integer %.40s%s is outside the 64-bit range", what,
                           v->str, v->len > 40 ? "..." : "");
            return NULL;
        }
        return pv_int(x);
    }
    case ND_PJ_ARRAY: {
        pv *l = pv_list();
        for (size_t i = 0; l && i < v->len; i++) {
            pv *it = pj_to_pv(v->items[i], what, rc);
            if (!it || pv_append(l, it)) {
                pv_decref(l);
                return NULL;
            }
        }
        return l;
    }
    case ND_PJ_OBJECT: {
        pv *d = pv_dict();
        for (size_t i = 0; d && i < v->len; i++) {
            pv *k = pv_strn(v->obj[i].key, v->obj[i].key_len);
            pv *it = k ? pj_to_pv(v->obj[i].val, what, rc) : NULL;
            int bad = !it || pv_dict_set_key(d, k, it);
            pv_decref(k);
            if (bad) {
                pv_decref(d);
                return NULL;
            }
        }
        return d;
    }
    }
    return NULL;
}

int st_json_to_pv(const char *text, size_t len, const char *what, pv **out)
{
    *out = NULL;
    nd_pj_doc *doc = NULL;
    int rc = nd_pj_parse(text, len, &doc, NULL);
    if (rc)
        return nd_error(rc == ND_ENOMEM ? rc : ND_EFORMAT, "%s: not valid JSON (%s)", what,
                        nd_last_error());
    rc = ND_OK;
    *out = pj_to_pv(nd_pj_root(doc), what, &rc);
    nd_pj_free(doc);
    if (!*out)
        return rc ? rc : nd_error(ND_ENOMEM, "%s: out of memory", what);
    return ND_OK;
}

/* nd_pj nodes built from a pv, freed together */
typedef struct {
    void **p;
    size_t n, cap;
} pool;

static void *pool_alloc(pool *pl, size_t sz)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? pl->cap * 2 : 64;
        void **np = realloc(pl->p, cap * sizeof *np);
        if (!np)
            return NULL;
        pl->p = np;
        pl->cap = cap;
    }
    void *x = calloc(1, sz ? sz : 1);
    if (x)
        pl->p[pl->n++] = x;
    return x;
}

static void pool_free(pool *pl)
{
    for (size_t i = 0; i < pl->n; i++)
        free(pl->p[i]);
    free(pl->p);
}

static nd_pj *pv_to_pj(const pv *v, pool *pl, int depth, int *rc)
{
    if (depth > 200) {
        *rc = nd_error(ND_ELIMIT, "value nested too deeply for JSON");
        return NULL;
    }
    nd_pj *j = pool_alloc(pl, sizeof *j);
    if (!j)
        return NULL;
    switch (v->kind) {
    case PV_NONE: j->type = ND_PJ_NULL; return j;
    case PV_BOOL: j->type = v->u.b ? ND_PJ_TRUE : ND_PJ_FALSE; return j;
    case PV_FLOAT:
        j->type = ND_PJ_FLOAT;
        j->num = v->u.f;
        return j;
    case PV_INT: {
        char *s = pool_alloc(pl, 24);
        if (!s)
            return NULL;
        j->type = ND_PJ_INT;
        j->len = (size_t)snprintf(s, 24, "%lld", (long long)v->u.i);
        j->str = s;
        return j;
    }
    case PV_STR:
        j->type = ND_PJ_STRING;
        j->str = v->u.str.s;
        j->len = v->u.str.len;
        return j;
    case PV_LIST:
    case PV_TUPLE:
        j->type = ND_PJ_ARRAY;
        j->len = v->u.seq.n;
        j->items = pool_alloc(pl, v->u.seq.n * sizeof *j->items);
        if (!j->items)
            return NULL;
        for (size_t i = 0; i < v->u.seq.n; i++)
            if (!(j->items[i] = pv_to_pj(v->u.seq.items[i], pl, depth + 1, rc)))
                return NULL;
        return j;
    case PV_DICT:
        j->type = ND_PJ_OBJECT;
        j->len = v->u.dict.n;
        j->obj = pool_alloc(pl, v->u.dict.n * sizeof *j->obj);
        if (!j->obj)
            return NULL;
        for (size_t i = 0; i < v->u.dict.n; i++) {
            const pv *k = v->u.dict.keys[i];
            if (k->kind == PV_STR) {
                j->obj[i].key = k->u.str.s;
                j->obj[i].key_len = k->u.str.len;
            } else if (k->kind == PV_INT) { /* json.dumps turns int keys into text */
                char *s = pool_alloc(pl, 24);
                if (!s)
                    return NULL;
                j->obj[i].key_len = (size_t)snprintf(s, 24, "%lld", (long long)k->u.i);
                j->obj[i].key = s;
            } else {
                *rc = nd_error(ND_EFORMAT, "a dict key that is a %s cannot be written as JSON",
                               pv_kind_name(k->kind));
                return NULL;
            }
            if (!(j->obj[i].val = pv_to_pj(v->u.dict.vals[i], pl, depth + 1, rc)))
                return NULL;
        }
        return j;
    default:
        *rc =
            nd_error(ND_EFORMAT, "a %s cannot be written as JSON metadata", pv_kind_name(v->kind));
        return NULL;
    }
}

int st_pv_to_json(const pv *v, char **out)
{
    *out = NULL;
    pool pl = {0};
    int rc = ND_OK;
    nd_pj *j = pv_to_pj(v, &pl, 0, &rc);
    nd_buf b = {0};
    if (j)
        rc = nd_pj_dump(j, 0, &b);
    else if (!rc)
        rc = nd_error(ND_ENOMEM, "out of memory");
    pool_free(&pl);
    if (rc) {
        nd_buf_free(&b);
        return rc;
    }
    if (!b.p && nd_buf_put(&b, "", 0)) /* never NULL on success */
        return ND_ENOMEM;
    *out = b.p;
    return ND_OK;
}

/* ---- reading ---- */

static const char *const ckpt_keys[] = {"format_version", "config", "step", "run"};
static const char *const adapter_keys[] = {"scale", "base", "rank", "seed"};

static int is_std_key(const char *k, int adapter)
{
    const char *const *keys = adapter ? adapter_keys : ckpt_keys;
    for (int i = 0; i < 4; i++)
        if (!strcmp(k, keys[i]))
            return 1;
    return 0;
}

/* Put `val` at '/'-separated `path` under dict `node` (steals val). */
static int tree_put(pv *node, const char *path, pv *val, const char *what, const char *full)
{
    for (;;) {
        const char *slash = strchr(path, '/');
        size_t len = slash ? (size_t)(slash - path) : strlen(path);
        if (len == 0) {
            pv_decref(val);
            return nd_error(ND_EFORMAT,
                            "%s: tensor name '%s' has an empty path component (leading, "
                            "trailing or doubled '/')",
                            what, full);
        }
        pv *key = pv_strn(path, len);
        if (!key) {
            pv_decref(val);
            return nd_error(ND_ENOMEM, "out of memory");
        }
        pv *child = pv_dict_get_key(node, key);
        if (!slash) {
            int rc = ND_OK;
            if (child)
                rc = nd_error(ND_EFORMAT,
                              "%s: tensor '%s' clashes with the tensors under it (a name "
                              "cannot be both a tensor and a group)",
                              what, full);
            else if (pv_dict_set_key(node, key, val)) /* consumes val either way */
                rc = nd_error(ND_ENOMEM, "out of memory");
            if (!child)
                val = NULL;
            pv_decref(key);
            pv_decref(val);
            return rc;
        }
        if (!child) {
            child = pv_dict();
            if (!child || pv_dict_set_key(node, key, child)) {
                pv_decref(key);
                pv_decref(val);
                return nd_error(ND_ENOMEM, "out of memory");
            }
        } else if (child->kind != PV_DICT) {
            pv_decref(key);
            pv_decref(val);
            return nd_error(ND_EFORMAT,
                            "%s: tensor '%s' clashes with '%.*s' (a name cannot be both a tensor "
                            "and a group)",
                            what, full, (int)(path + len - full), full);
        }
        pv_decref(key);
        node = child;
        path = slash + 1;
    }
}

static int tensor_to_pv(const st_tensor *t, const char *what, pv **out)
{
    *out = NULL;
    nd_dtype dt;
    switch (t->dtype) {
    case ST_F32:
    case ST_BF16: dt = ND_F32; break;
    case ST_F16: dt = ND_F16; break;
    case ST_F64: dt = ND_F64; break;
    case ST_I32: dt = ND_I32; break;
    case ST_I64: dt = ND_I64; break;
    case ST_BOOL: dt = ND_BOOL; break;
    default:
        return nd_error(ND_EUNSUPPORTED,
                        "%s: tensor '%s' has dtype %s, which needle does not read (F32, F16, "
                        "BF16, F64, I32, I64 and BOOL are)",
                        what, t->name, st_dtype_name(t->dtype));
    }
    pv *a = pv_ndarray(dt, t->ndim, t->shape, NULL);
    if (!a)
        return nd_error(ND_ENOMEM, "%s: out of memory for tensor '%s' (%llu elements)", what,
                        t->name, (unsigned long long)t->numel);
    if (dt == ND_F32)
        st_to_f32(t, a->u.nd.data);
    /* float16 stays float16, as in a pickle: the merge in `build` rounds
     * to the stored dtype (docs/formats.md §2.4) */
    else if (t->nbytes)
        memcpy(a->u.nd.data, t->data, (size_t)t->nbytes);
    *out = a;
    return ND_OK;
}

/* metadata text -> int or None (upstream's _int_or_none) */
static int meta_int(const st_file *f, const char *key, const char *what, pv **out)
{
    const st_meta *m = st_meta_get(f, key);
    *out = NULL;
    if (!m || m->val_len == 0) {
        *out = pv_none();
        return *out ? ND_OK : ND_ENOMEM;
    }
    errno = 0;
    char *end;
    const char *s = m->val;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || end == s || strlen(s) != m->val_len || s[0] == ' ')
        return nd_error(ND_EFORMAT, "%s: __metadata__ '%s' is '%.40s', not an integer", what, key,
                        s);
    *out = pv_int(x);
    return *out ? ND_OK : ND_ENOMEM;
}

/* metadata JSON -> value, `dflt` (a new dict, or None) when absent or "" */
static int meta_json(const st_file *f, const char *key, int dict_default, const char *what,
                     pv **out)
{
    const st_meta *m = st_meta_get(f, key);
    *out = NULL;
    if (!m || m->val_len == 0) {
        *out = dict_default ? pv_dict() : pv_none();
        return *out ? ND_OK : ND_ENOMEM;
    }
    char ctx[600];
    snprintf(ctx, sizeof ctx, "%s: __metadata__ '%s'", what, key);
    return st_json_to_pv(m->val, m->val_len, ctx, out);
}

/* root[key] = val after `rc = reader(..., &val)`; val is freed on failure */
static int set_or_fail(pv *root, const char *key, pv *val, int rc)
{
    if (rc) {
        pv_decref(val);
        return rc;
    }
    if (!val || pv_dict_set(root, key, val))
        return nd_error(ND_ENOMEM, "out of memory");
    return ND_OK;
}

int st_tree_from_file(const st_file *f, const char *what, pv **out)
{
    *out = NULL;
    int adapter = st_meta_get(f, "scale") && !st_meta_get(f, "format_version");
    pv *root = pv_dict(), *body = pv_dict(), *v = NULL;
    int rc = root && body ? ND_OK : nd_error(ND_ENOMEM, "out of memory");
    if (!rc && !adapter) {
        if (!(rc = meta_int(f, "format_version", what, &v)))
            rc = set_or_fail(root, "format_version", v, rc);
        if (!rc && pv_dict_set(root, "params", pv_incref(body)))
            rc = nd_error(ND_ENOMEM, "out of memory");
        if (!rc && !(rc = meta_json(f, "config", 1, what, &v)))
            rc = set_or_fail(root, "config", v, rc);
        if (!rc) {
            const pv *c = pv_dict_get(root, "config");
            if (c->kind != PV_DICT)
                rc = nd_error(ND_EFORMAT, "%s: __metadata__ 'config' is a JSON %s, not an object",
                              what, pv_kind_name(c->kind));
        }
        if (!rc && !(rc = meta_int(f, "step", what, &v)))
            rc = set_or_fail(root, "step", v, rc);
        if (!rc && !(rc = meta_json(f, "run", 1, what, &v)))
            rc = set_or_fail(root, "run", v, rc);
    } else if (!rc) {
        if (pv_dict_set(root, "lora", pv_incref(body)))
            rc = nd_error(ND_ENOMEM, "out of memory");
        for (int i = 0; i < 4 && !rc; i++)
            if (!(rc = meta_json(f, adapter_keys[i], 0, what, &v)))
                rc = set_or_fail(root, adapter_keys[i], v, rc);
    }
    /* our extra top-level keys: JSON in the metadata (plain text is kept
     * as a string), their arrays as tensors under KEY/ */
    for (size_t i = 0; i < f->n_meta && !rc; i++) {
        const st_meta *m = &f->meta[i];
        if (is_std_key(m->key, adapter) || !m->key[0] || strchr(m->key, '/') ||
            !strcmp(m->key, "lora") || !strcmp(m->key, "params"))
            continue;
        nd_pj_doc *doc = NULL;
        if (nd_pj_parse(m->val, m->val_len, &doc, NULL) == ND_OK) {
            nd_pj_free(doc);
            rc = meta_json(f, m->key, 0, what, &v);
        } else {
            v = pv_strn(m->val, m->val_len);
        }
        rc = set_or_fail(root, m->key, v, rc);
    }
    for (size_t i = 0; i < f->n && !rc; i++) {
        const st_tensor *t = &f->t[i];
        const char *slash = strchr(t->name, '/');
        pv *dst = NULL;
        const char *sub = t->name;
        if (slash && slash > t->name) {
            char head[256];
            size_t hl = (size_t)(slash - t->name);
            if (hl < sizeof head) {
                memcpy(head, t->name, hl);
                head[hl] = 0;
                if (!is_std_key(head, adapter) && strcmp(head, "lora") && strcmp(head, "params") &&
                    st_meta_get(f, head)) {
                    dst = pv_dict_get(root, head);
                    sub = slash + 1;
                    if (dst->kind != PV_DICT) {
                        rc = nd_error(ND_EFORMAT,
                                      "%s: tensor '%s' belongs to __metadata__ '%s', which is "
                                      "not a JSON object",
                                      what, t->name, head);
                        break;
                    }
                }
            }
        }
        char key[8192];
        if (!dst && adapter) {
            /* lora/<path>/A or /B */
            size_t n = strlen(t->name);
            if (strncmp(t->name, "lora/", 5) || n < 8 || n - 2 >= sizeof key ||
                t->name[n - 2] != '/' || (t->name[n - 1] != 'A' && t->name[n - 1] != 'B')) {
                rc = nd_error(ND_EFORMAT,
                              "%s: adapter tensor '%s' is not named lora/<weight path>/A or "
                              "lora/<weight path>/B",
                              what, t->name);
                break;
            }
            memcpy(key, t->name + 5, n - 7);
            key[n - 7] = 0;
            pv *grp = pv_dict_get(body, key);
            if (!grp) {
                grp = pv_dict();
                if (!grp || pv_dict_set(body, key, grp)) {
                    rc = nd_error(ND_ENOMEM, "out of memory");
                    break;
                }
            }
            if ((rc = tensor_to_pv(t, what, &v)))
                break;
            if (pv_dict_set(grp, t->name[n - 1] == 'A' ? "A" : "B", v)) {
                rc = nd_error(ND_ENOMEM, "out of memory");
                break;
            }
            continue;
        }
        if ((rc = tensor_to_pv(t, what, &v)))
            break;
        rc = tree_put(dst ? dst : body, sub, v, what, t->name);
    }
    pv_decref(body);
    if (rc) {
        pv_decref(root);
        return rc;
    }
    *out = root;
    return ND_OK;
}

int st_tree_load(const char *path, pv **out)
{
    st_file f;
    *out = NULL;
    int rc = st_open(path, &f);
    if (rc)
        return rc;
    rc = st_tree_from_file(&f, path, out);
    st_close(&f);
    return rc;
}

/* ---- writing ---- */

typedef struct {
    st_out_tensor *t;
    char **names;
    size_t n, cap;
    st_out_meta meta[64];
    char *meta_vals[64];
    size_t n_meta;
} out_set;

static void out_free(out_set *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->names[i]);
    for (size_t i = 0; i < o->n_meta; i++)
        free(o->meta_vals[i]);
    free(o->t);
    free(o->names);
}

static int add_meta(out_set *o, const char *key, char *val /* stolen */)
{
    if (!val)
        return nd_error(ND_ENOMEM, "out of memory");
    if (o->n_meta == sizeof o->meta / sizeof o->meta[0]) {
        free(val);
        return nd_error(ND_ELIMIT, "too many top-level keys for safetensors metadata");
    }
    o->meta[o->n_meta].key = key;
    o->meta[o->n_meta].val = val;
    o->meta_vals[o->n_meta++] = val;
    return ND_OK;
}

static int add_json_meta(out_set *o, const char *key, const pv *v, const char *path)
{
    char *s = NULL;
    int rc = st_pv_to_json(v, &s);
    if (rc)
        return nd_error_prefix(rc, "%s: '%s'", path, key);
    return add_meta(o, key, s);
}

static int add_tensor(out_set *o, const char *name, const pv *a, const char *path)
{
    st_dtype dt;
    switch (a->u.nd.dtype) {
    case ND_F16: dt = ST_F16; break;
    case ND_F32: dt = ST_F32; break;
    case ND_F64: dt = ST_F64; break;
    case ND_I32: dt = ST_I32; break;
    case ND_I64: dt = ST_I64; break;
    default: dt = ST_BOOL; break;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        st_out_tensor *nt = realloc(o->t, cap * sizeof *nt);
        if (nt)
            o->t = nt;
        char **nn = nt ? realloc(o->names, cap * sizeof *nn) : NULL;
        if (!nn)
            return nd_error(ND_ENOMEM, "%s: out of memory", path);
        o->names = nn;
        o->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm)
        return nd_error(ND_ENOMEM, "%s: out of memory", path);
    o->names[o->n] = nm;
    o->t[o->n] = (st_out_tensor){nm, dt, a->u.nd.ndim, a->u.nd.shape, a->u.nd.data};
    o->n++;
    return ND_OK;
}

static int plain_key(const pv *k)
{
    return k->kind == PV_STR && k->u.str.len > 0 && k->u.str.len < 1024 &&
           !memchr(k->u.str.s, '/', k->u.str.len) && !memchr(k->u.str.s, 0, k->u.str.len);
}

/* Arrays under dict `node` as tensors PREFIX/...; with `strip`, a copy of
 * node without its arrays goes to *rest (for the metadata JSON). */
static int flatten(out_set *o, const pv *node, char *prefix, size_t plen, const char *path,
                   pv **rest, int depth)
{
    if (depth > 64)
        return nd_error(ND_ELIMIT, "%s: groups nested more than 64 deep", path);
    pv *keep = rest ? pv_dict() : NULL;
    if (rest && !keep)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = ND_OK;
    for (size_t i = 0; i < node->u.dict.n && !rc; i++) {
        const pv *k = node->u.dict.keys[i], *v = node->u.dict.vals[i];
        if (v->kind != PV_DICT && v->kind != PV_NDARRAY) {
            if (rest)
                rc = pv_dict_set_key(keep, k, pv_incref((pv *)v));
            else
                rc = nd_error(ND_EFORMAT,
                              "%s: '%s/...' holds a %s: only arrays and groups of arrays can "
                              "be written as tensors",
                              path, prefix, pv_kind_name(v->kind));
            continue;
        }
        if (!plain_key(k)) {
            rc = nd_error(ND_EFORMAT,
                          "%s: a key under '%s' is not a plain name (a string without '/'), "
                          "so it cannot be a tensor path",
                          path, prefix);
            break;
        }
        size_t n = plen;
        if (n + 2 + k->u.str.len >= 8192) {
            rc = nd_error(ND_ELIMIT, "%s: tensor path under '%s' too long", path, prefix);
            break;
        }
        if (n)
            prefix[n++] = '/';
        memcpy(prefix + n, k->u.str.s, k->u.str.len + 1);
        n += k->u.str.len;
        if (v->kind == PV_NDARRAY) {
            rc = add_tensor(o, prefix, v, path);
        } else {
            pv *sub = NULL;
            rc = flatten(o, v, prefix, n, path, rest ? &sub : NULL, depth + 1);
            /* a group of arrays only is made again by its tensors; an
             * empty one stays in the JSON */
            if (!rc && rest && (sub->u.dict.n || !v->u.dict.n))
                rc = pv_dict_set_key(keep, k, sub);
            else
                pv_decref(sub);
        }
        prefix[plen] = 0;
    }
    if (rc) {
        pv_decref(keep);
        return rc;
    }
    if (rest)
        *rest = keep;
    return ND_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The tensors and metadata of a tree into o (its arrays borrowed). */
static int collect(const pv *root, const char *path, out_set *op)
{
    if (!root || root->kind != PV_DICT)
        return nd_error(ND_EARG, "%s: nothing to write (not a dict)", path);
    int adapter = pv_dict_get(root, "lora") && !pv_dict_get(root, "params");
    out_set o = *op;
    char *prefix = malloc(8192);
    int rc = prefix ? ND_OK : nd_error(ND_ENOMEM, "out of memory");
    if (!rc)
        prefix[0] = 0;
    if (!rc && !adapter) {
        const pv *params = pv_dict_get(root, "params");
        const pv *fv = pv_dict_get(root, "format_version");
        const pv *cfg = pv_dict_get(root, "config");
        const pv *step = pv_dict_get(root, "step");
        const pv *run = pv_dict_get(root, "run");
        if (!params || params->kind != PV_DICT)
            rc = nd_error(ND_EFORMAT, "%s: the checkpoint has no params dict", path);
        if (!rc)
            rc = flatten(&o, params, prefix, 0, path, NULL, 0);
        char num[32];
        if (!rc) {
            if (fv && fv->kind == PV_INT)
                snprintf(num, sizeof num, "%lld", (long long)fv->u.i);
            else
                num[0] = 0;
            rc = add_meta(&o, "format_version", strdup(num));
        }
        if (!rc) {
            pv *empty = pv_dict();
            rc = empty ? add_json_meta(&o, "config", cfg ? cfg : empty, path) : ND_ENOMEM;
            pv_decref(empty);
        }
        if (!rc) {
            if (step && step->kind == PV_INT)
                snprintf(num, sizeof num, "%lld", (long long)step->u.i);
            else
                num[0] = 0;
            rc = add_meta(&o, "step", strdup(num));
        }
        if (!rc) {
            /* written as it is (what was read comes back), {} when absent */
            pv *empty = pv_dict();
            rc = empty ? add_json_meta(&o, "run", run ? run : empty, path) : ND_ENOMEM;
            pv_decref(empty);
        }
    } else if (!rc) {
        const pv *lora = pv_dict_get(root, "lora");
        if (lora->kind != PV_DICT)
            rc = nd_error(ND_EFORMAT, "%s: the adapter's lora entry is not a dict", path);
        for (size_t i = 0; !rc && i < lora->u.dict.n; i++) {
            const pv *k = lora->u.dict.keys[i], *g = lora->u.dict.vals[i];
            if (k->kind != PV_STR || !k->u.str.len || memchr(k->u.str.s, 0, k->u.str.len) ||
                k->u.str.len > 4000 || g->kind != PV_DICT) {
                rc = nd_error(ND_EFORMAT, "%s: adapter entry %zu is not PATH: {A, B}", path, i);
                break;
            }
            for (int ab = 0; ab < 2 && !rc; ab++) {
                const pv *a = pv_dict_get(g, ab ? "B" : "A");
                if (!a || a->kind != PV_NDARRAY) {
                    rc = nd_error(ND_EFORMAT, "%s: adapter %s has no array %s", path, k->u.str.s,
                                  ab ? "B" : "A");
                    break;
                }
                snprintf(prefix, 8192, "lora/%s/%s", k->u.str.s, ab ? "B" : "A");
                rc = add_tensor(&o, prefix, a, path);
            }
        }
        prefix[0] = 0;
        for (int i = 0; i < 4 && !rc; i++) {
            const pv *v = pv_dict_get(root, adapter_keys[i]);
            if (!v && !strcmp(adapter_keys[i], "seed")) {
                /* our adapters keep the seed with the run settings */
                const pv *st = pv_dict_get(root, "needle_c_state");
                v = st && st->kind == PV_DICT ? pv_dict_get(st, "seed") : NULL;
            }
            pv *none = v ? NULL : pv_none();
            rc = add_json_meta(&o, adapter_keys[i], v ? v : none, path);
            pv_decref(none);
        }
    }
    /* other top-level keys (needle_c_state, needle_c_recommended, ...) */
    const char *body_key = adapter ? "lora" : "params";
    for (size_t i = 0; i < root->u.dict.n && !rc; i++) {
        const pv *k = root->u.dict.keys[i], *v = root->u.dict.vals[i];
        if (k->kind == PV_STR && (is_std_key(k->u.str.s, adapter) || !strcmp(k->u.str.s, body_key)))
            continue;
        if (!plain_key(k)) {
            rc = nd_error(ND_EFORMAT,
                          "%s: top-level key %zu is not a plain name, which safetensors "
                          "metadata cannot hold",
                          path, i);
            break;
        }
        const pv *params = adapter ? NULL : pv_dict_get(root, "params");
        if (params && params->kind == PV_DICT && pv_dict_get(params, k->u.str.s)) {
            rc = nd_error(ND_EFORMAT,
                          "%s: top-level key '%s' is also a parameter group: the two would "
                          "share tensor names",
                          path, k->u.str.s);
            break;
        }
        if (v->kind == PV_NDARRAY) {
            rc = nd_error(ND_EFORMAT, "%s: top-level array '%s' has no place in safetensors", path,
                          k->u.str.s);
            break;
        }
        if (v->kind == PV_DICT) {
            pv *rest = NULL;
            snprintf(prefix, 8192, "%s", k->u.str.s);
            rc = flatten(&o, v, prefix, strlen(prefix), path, &rest, 0);
            prefix[0] = 0;
            if (!rc)
                rc = add_json_meta(&o, k->u.str.s, rest, path);
            pv_decref(rest);
        } else {
            rc = add_json_meta(&o, k->u.str.s, v, path);
        }
    }
    if (!rc && o.n > 1) {
        char **sorted = malloc(o.n * sizeof *sorted);
        if (!sorted)
            rc = nd_error(ND_ENOMEM, "out of memory");
        else {
            memcpy(sorted, o.names, o.n * sizeof *sorted);
            qsort(sorted, o.n, sizeof *sorted, cmp_name);
            for (size_t i = 1; i < o.n && !rc; i++)
                if (!strcmp(sorted[i - 1], sorted[i]))
                    rc = nd_error(ND_EFORMAT, "%s: two tensors would be named '%s'", path,
                                  sorted[i]);
            free(sorted);
        }
    }
    free(prefix);
    *op = o;
    return rc;
}

int st_tree_save(const pv *root, const char *path)
{
    out_set o = {0};
    int rc = collect(root, path, &o);
    if (!rc)
        rc = st_write_file(path, o.t, o.n, o.meta, o.n_meta);
    out_free(&o);
    return rc;
}

int st_tree_dumps(const pv *root, unsigned char **out, size_t *out_len)
{
    out_set o = {0};
    *out = NULL;
    *out_len = 0;
    int rc = collect(root, "(memory)", &o);
    if (!rc)
        rc = st_write_mem(o.t, o.n, o.meta, o.n_meta, out, out_len);
    out_free(&o);
    return rc;
}
