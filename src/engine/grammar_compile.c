/* Tool-call grammar: JSON schemas -> grammar nodes (see grammar.h). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar_internal.h"

/* ------------------------------------------------------------------ */
/* compiling                                                           */

static void warnf(nd_grammar *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(nd_grammar *g, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the same message once (alternatives recompile their shared parts),
     * and at most ND_GRAM_MAX_WARN of them */
    if (g->n_warn > ND_GRAM_MAX_WARN)
        return;
    size_t ml = strlen(msg);
    for (const char *p = g->warn.p; p && (p = strstr(p, msg)); p++)
        if ((p == g->warn.p || p[-1] == '\n') && (p[ml] == 0 || p[ml] == '\n'))
            return;
    if (++g->n_warn > ND_GRAM_MAX_WARN)
        snprintf(msg, sizeof msg, "(more warnings not shown)");
    if (g->warn.n)
        nd_buf_put(&g->warn, "\n", 1);
    nd_buf_put(&g->warn, msg, strlen(msg));
}

static int new_node(nd_grammar *g, int kind)
{
    /* a frame holds a node id in 16 bits; alternatives and recursive
     * $refs multiply nodes, so the bound is checked, never wrapped */
    if (g->n_nodes >= ND_GRAM_MAX_NODES)
        return nd_error(ND_ELIMIT, "the tools' schemas need more than %d grammar nodes",
                        ND_GRAM_MAX_NODES);
    if (g->n_nodes == g->cap_nodes) {
        int nc = g->cap_nodes ? g->cap_nodes * 2 : 32;
        gnode *p = realloc(g->nodes, (size_t)nc * sizeof *p);
        if (!p)
            return nd_error(ND_ENOMEM, "out of memory");
        g->nodes = p;
        g->cap_nodes = nc;
    }
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->max_len = -1;
    n->max_items = -1;
    n->lo = -INFINITY;
    n->hi = INFINITY;
    return g->n_nodes++;
}

static char *dump_value(const nd_pj *v, int *len)
{
    nd_buf b = {0};
    if (nd_pj_dump(v, 1, &b)) {
        nd_buf_free(&b);
        return NULL;
    }
    *len = (int)b.n;
    return b.p;
}

static int add_lit(nd_grammar *g, int node, const char *s, int len)
{
    gnode *n = &g->nodes[node];
    /* any number of values (the runtime finds candidates by binary search
     * in the sorted list); duplicates are kept once */
    for (int i = 0; i < n->nlit; i++)
        if (n->litlen[i] == len && !memcmp(n->lit[i], s, (size_t)len))
            return ND_OK;
    if (n->nlit >= INT_MAX / 2)
        return nd_error(ND_ELIMIT, "more than %d enum values", INT_MAX / 2);
    char **l = realloc(n->lit, (size_t)(n->nlit + 1) * sizeof *l);
    if (l)
        n->lit = l;
    int *ll = realloc(n->litlen, (size_t)(n->nlit + 1) * sizeof *ll);
    if (ll)
        n->litlen = ll;
    char *c = malloc((size_t)len + 1);
    if (!l || !ll || !c) {
        free(c);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    memcpy(c, s, (size_t)len);
    c[len] = 0;
    n->lit[n->nlit] = c;
    n->litlen[n->nlit++] = len;
    return ND_OK;
}

static int is_int_value(const nd_pj *v, long long *out)
{
    if (v && v->type == ND_PJ_INT) {
        char *end;
        long long x = strtoll(v->str, &end, 10);
        if (*end)
            return 0;
        *out = x;
        return 1;
    }
    if (v && v->type == ND_PJ_FLOAT && v->num == floor(v->num) && fabs(v->num) < 9e15) {
        *out = (long long)v->num;
        return 1;
    }
    return 0;
}

static int is_number(const nd_pj *v, double *out)
{
    if (!v)
        return 0;
    if (v->type == ND_PJ_INT) {
        *out = strtod(v->str, NULL);
        return 1;
    }
    if (v->type == ND_PJ_FLOAT && isfinite(v->num)) {
        *out = v->num;
        return 1;
    }
    return 0;
}

/* Keywords the compiler reads (possibly merged over allOf / $ref). */
static const char *handled_kw[] = {"type",
                                   "properties",
                                   "required",
                                   "enum",
                                   "const",
                                   "minimum",
                                   "maximum",
                                   "exclusiveMinimum",
                                   "exclusiveMaximum",
                                   "minLength",
                                   "maxLength",
                                   "pattern",
                                   "items",
                                   "minItems",
                                   "maxItems",
                                   "allOf",
                                   "anyOf",
                                   "oneOf",
                                   "$ref",
                                   "nullable",
                                   "additionalProperties",
                                   "minProperties",
                                   "maxProperties",
                                   "format",
                                   "definitions",
                                   "$defs",
                                   "components",
                                   NULL};
/* Annotations: no effect on which values are valid, so no warning. */
static const char *quiet_kw[] = {"description",
                                 "title",
                                 "default",
                                 "examples",
                                 "example",
                                 "$schema",
                                 "$id",
                                 "$comment",
                                 "readOnly",
                                 "writeOnly",
                                 "deprecated",
                                 "discriminator",
                                 "xml",
                                 "externalDocs",
                                 "contentMediaType",
                                 "contentEncoding",
                                 NULL};

static int in_list(const char **l, const char *k, size_t n)
{
    for (int i = 0; l[i]; i++)
        if (strlen(l[i]) == n && !memcmp(l[i], k, n))
            return 1;
    return 0;
}

/* A schema as the conjunction of the schema objects that allOf and $ref
 * bring together. */
#define MAX_PARTS 32
typedef struct {
    const nd_pj *p[MAX_PARTS];
    int n;
    uint32_t alt_done;            /* parts whose anyOf/oneOf has been distributed */
    const nd_pj *refs[MAX_PARTS]; /* $ref targets followed */
    int nrefs;
    const nd_pj *deep; /* a recursive $ref not followed (expand returned 1) */
} sview;

static const nd_pj *vget(const sview *v, const char *key)
{
    for (int i = 0; i < v->n; i++) {
        const nd_pj *x = nd_pj_get(v->p[i], key);
        if (x)
            return x;
    }
    return NULL;
}

/* JSON pointer "#/a/b~1c" against the tool's parameters schema */
static const nd_pj *resolve_ref(const nd_pj *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const char *p = ref + 1;
    const nd_pj *cur = root;
    while (*p == '/' && cur) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                tok[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = 0;
        if (cur->type == ND_PJ_OBJECT) {
            cur = nd_pj_get(cur, tok);
        } else if (cur->type == ND_PJ_ARRAY) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            cur = (!*tok || *end || i >= cur->len) ? NULL : cur->items[i];
        } else {
            cur = NULL;
        }
    }
    return *p ? NULL : cur;
}

static int ref_count(const nd_grammar *g, const nd_pj *t)
{
    int c = 0;
    for (int i = 0; i < g->c_nrefs; i++)
        c += g->c_refs[i] == t;
    return c;
}

static const char *kind_name(int k);

/* what a recursive $ref's target admits where it is no longer followed:
 * any value of its declared type (object, string, ...) */
static int deep_node(const nd_pj *t)
{
    const nd_pj *ty = nd_pj_get(t, "type");
    if (ty && ty->type == ND_PJ_STRING) {
        if (!strcmp(ty->str, "object"))
            return N_GOBJ;
        if (!strcmp(ty->str, "array"))
            return N_GARR;
        if (!strcmp(ty->str, "string"))
            return N_STR;
        if (!strcmp(ty->str, "integer") || !strcmp(ty->str, "number"))
            return N_NUM;
    }
    return !ty && nd_pj_get(t, "properties") ? N_GOBJ : N_ANY;
}

/* Add schema s (and what its $ref and allOf bring) to the view. 1 if a
 * $ref recursion is too deep to follow (the caller allows any value). */
static int expand(nd_grammar *g, const nd_pj *s, const char *path, sview *v, int hops)
{
    if (hops > 32)
        return nd_error(ND_ELIMIT, "%s: $ref/allOf chain longer than 32", path);
    if (!s || s->type != ND_PJ_OBJECT) {
        if (!(s && s->type == ND_PJ_TRUE))
            warnf(g, "%s: schema is not an object; not enforced", path);
        return 0;
    }
    for (int i = 0; i < v->n; i++)
        if (v->p[i] == s)
            return 0; /* already in (a $ref cycle through allOf) */
    if (v->n >= MAX_PARTS)
        return nd_error(ND_ELIMIT, "%s: more than %d schemas merged by allOf/$ref", path,
                        MAX_PARTS);
    v->p[v->n++] = s;
    for (size_t i = 0; i < s->len; i++) {
        const char *k = s->obj[i].key;
        size_t kn = s->obj[i].key_len;
        if (!in_list(handled_kw, k, kn) && !in_list(quiet_kw, k, kn) &&
            !(kn >= 2 && k[0] == 'x' && k[1] == '-'))
            warnf(g, "%s: schema keyword '%.*s' is not supported and was ignored", path,
                  (int)(kn > 64 ? 64 : kn), k);
    }
    const nd_pj *ref = nd_pj_get(s, "$ref");
    if (ref) {
        const nd_pj *t = ref->type == ND_PJ_STRING ? resolve_ref(g->c_root, ref->str) : NULL;
        if (!t) {
            warnf(g,
                  "%s: $ref %s%.100s%s does not point into this tool's schema ('#/...'); not "
                  "enforced",
                  path, ref->type == ND_PJ_STRING ? "'" : "",
                  ref->type == ND_PJ_STRING ? ref->str : "(not a string)",
                  ref->type == ND_PJ_STRING ? "'" : "");
        } else {
            /* a recursive schema (a tree whose children $ref the node) is
             * followed two levels deep */
            if (ref_count(g, t) >= 2) {
                v->deep = t;
                warnf(g,
                      "%s: recursive $ref '%.100s' is enforced two levels deep; below, any %s is "
                      "allowed",
                      path, ref->str, kind_name(g->nodes[deep_node(t)].kind));
                return 1;
            }
            for (int i = 0; i < v->n; i++)
                if (v->p[i] == t) {
                    warnf(g, "%s: circular $ref '%.100s'; followed once", path, ref->str);
                    break;
                }
            if (v->nrefs < MAX_PARTS)
                v->refs[v->nrefs++] = t;
            int rc = expand(g, t, path, v, hops + 1);
            if (rc)
                return rc;
        }
    }
    const nd_pj *all = nd_pj_get(s, "allOf");
    if (all && all->type == ND_PJ_ARRAY) {
        for (size_t i = 0; i < all->len; i++) {
            int rc = expand(g, all->items[i], path, v, hops + 1);
            if (rc)
                return rc;
        }
    } else if (all) {
        warnf(g, "%s: 'allOf' is not an array; ignored", path);
    }
    return 0;
}

enum {
    T_OBJ = 1,
    T_STR = 2,
    T_INT = 4,
    T_FRAC = 8,
    T_BOOL = 16,
    T_NULL = 32,
    T_ARR = 64,
    T_ALL = 127
};

static int type_bits(const char *t)
{
    return !strcmp(t, "object")    ? T_OBJ
           : !strcmp(t, "string")  ? T_STR
           : !strcmp(t, "integer") ? T_INT
           : !strcmp(t, "number")  ? T_INT | T_FRAC
           : !strcmp(t, "boolean") ? T_BOOL
           : !strcmp(t, "null")    ? T_NULL
           : !strcmp(t, "array")   ? T_ARR
                                   : 0;
}

/* the allowed types: the intersection over the parts (a part's type
 * string or list, plus null when it says nullable: true) */
static int view_types(nd_grammar *g, const sview *v, const char *path)
{
    int m = T_ALL, any_props = 0;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *ty = nd_pj_get(v->p[i], "type");
        if (nd_pj_get(v->p[i], "properties"))
            any_props = 1;
        if (!ty)
            continue;
        int pm = 0;
        if (ty->type == ND_PJ_STRING) {
            pm = type_bits(ty->str);
            if (!pm)
                warnf(g, "%s: unknown type '%.64s'; ignored", path, ty->str);
        } else if (ty->type == ND_PJ_ARRAY) {
            for (size_t k = 0; k < ty->len; k++) {
                int b = ty->items[k]->type == ND_PJ_STRING ? type_bits(ty->items[k]->str) : 0;
                if (!b)
                    warnf(g, "%s: unknown type in the 'type' list; ignored", path);
                pm |= b;
            }
        } else {
            warnf(g, "%s: 'type' is neither a string nor a list; ignored", path);
        }
        if (!pm)
            continue;
        const nd_pj *nl = nd_pj_get(v->p[i], "nullable"); /* OpenAPI 3.0 */
        if (nl && nl->type == ND_PJ_TRUE)
            pm |= T_NULL;
        if (!(m & pm)) {
            warnf(g, "%s: allOf/$ref parts allow no common type; the later 'type' is ignored",
                  path);
            continue;
        }
        m &= pm;
    }
    if (m == T_ALL && any_props)
        m = T_OBJ;
    return m;
}

static int compile_view(nd_grammar *g, sview *v, const char *path, int depth);

/* compile schema s as a fresh view at path */
static int compile_node(nd_grammar *g, const nd_pj *s, const char *path, int depth)
{
    if (depth > 16)
        return nd_error(ND_ELIMIT, "%s: schema nested deeper than 16 levels", path);
    sview v;
    memset(&v, 0, sizeof v);
    int rc = expand(g, s, path, &v, 0);
    if (rc < 0)
        return rc;
    if (rc > 0)
        return deep_node(v.deep);
    int save = g->c_nrefs;
    for (int i = 0; i < v.nrefs; i++) {
        if (g->c_nrefs >= (int)(sizeof g->c_refs / sizeof g->c_refs[0]))
            return nd_error(ND_ELIMIT, "%s: too many nested $refs", path);
        g->c_refs[g->c_nrefs++] = v.refs[i];
    }
    rc = compile_view(g, &v, path, depth);
    g->c_nrefs = save;
    return rc;
}

/* first characters of a value of node id */
static void first_set(const nd_grammar *g, int id, uint64_t f[4])
{
    const gnode *n = &g->nodes[id];
    memset(f, 0, 4 * sizeof *f);
#define SETB(c) (f[(unsigned char)(c) >> 6] |= 1ull << ((unsigned char)(c)&63))
    switch (n->kind) {
    case K_OBJ:
    case K_GOBJ: SETB('{'); break;
    case K_ARR:
    case K_GARR: SETB('['); break;
    case K_STR: SETB('"'); break;
    case K_INT:
    case K_NUM:
        SETB('-');
        for (int c = '0'; c <= '9'; c++)
            SETB(c);
        break;
    case K_LIT:
        for (int i = 0; i < n->nlit; i++)
            SETB(n->lit[i][0]);
        break;
    case K_ALT:
        for (int i = 0; i < n->nalt; i++)
            for (int k = 0; k < 4; k++)
                f[k] |= g->nodes[n->alt[i]].first[k];
        break;
    default:
        SETB('{');
        SETB('[');
        SETB('"');
        SETB('-');
        SETB('t');
        SETB('f');
        SETB('n');
        for (int c = '0'; c <= '9'; c++)
            SETB(c);
    }
#undef SETB
}

static const char *kind_name(int k)
{
    switch (k) {
    case K_OBJ:
    case K_GOBJ: return "object";
    case K_ARR:
    case K_GARR: return "array";
    case K_STR: return "string";
    case K_INT:
    case K_NUM: return "number";
    default: return "value";
    }
}

static int generic_of(int k)
{
    switch (k) {
    case K_OBJ:
    case K_GOBJ: return N_GOBJ;
    case K_ARR:
    case K_GARR: return N_GARR;
    case K_STR: return N_STR;
    case K_INT:
    case K_NUM: return N_NUM;
    default: return N_ANY;
    }
}

/* One node for the alternatives ids[0..n). A grammar that reads one byte
 * at a time picks an alternative by the value's first byte: literals are
 * merged; two alternatives of the same kind that a first byte cannot tell
 * apart (two object shapes, two string patterns) become any value of that
 * kind, with a warning -- wider than the schema, never narrower. */
static int compile_view(nd_grammar *g, sview *v, const char *path, int depth);

static int make_alt_in(nd_grammar *g, int *out, int m, const char *path, sview *base, int depth);

static int make_alt(nd_grammar *g, const int *ids, int n, const char *path, sview *base, int depth)
{
    size_t cap = 0;
    for (int i = 0; i < n; i++) {
        const gnode *a = &g->nodes[ids[i]];
        if (a->kind == K_ANY)
            return N_ANY;
        cap += a->kind == K_ALT ? (size_t)a->nalt : 1;
    }
    int *out = malloc((cap ? cap : 1) * sizeof *out), m = 0, lits = -1;
    if (!out)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const gnode *a = &g->nodes[ids[i]];
        int na = a->kind == K_ALT ? a->nalt : 1;
        for (int k = 0; k < na; k++) /* nested alternatives are flattened */
            out[m++] = a->kind == K_ALT ? a->alt[k] : ids[i];
    }
    /* every literal alternative (consts, enums: a oneOf of const values
     * is a common way to write an enum) in one node, in one pass */
    int nl = 0;
    for (int i = 0; i < m; i++)
        nl += g->nodes[out[i]].kind == K_LIT;
    for (int i = 0, w = 0; nl > 1 && i < m; i++) {
        if (g->nodes[out[i]].kind != K_LIT) {
            out[w++] = out[i];
        } else {
            if (lits < 0 && (lits = new_node(g, K_LIT)) < 0) {
                free(out);
                return lits;
            }
            for (int k = 0; k < g->nodes[out[i]].nlit; k++)
                if (add_lit(g, lits, g->nodes[out[i]].lit[k], g->nodes[out[i]].litlen[k])) {
                    free(out);
                    return nd_error_prefix(ND_ELIMIT, "%s", path);
                }
        }
        if (i == m - 1) {
            out[w++] = lits;
            m = w;
        }
    }
    int id = make_alt_in(g, out, m, path, base, depth);
    free(out);
    return id;
}

/* Two object shapes a first byte cannot tell apart, as one object: the
 * keys of both (a key in both takes either branch's value), required only
 * what both require. Wider than the schema (keys of the two branches
 * mixed), far narrower than any object. */
static int union_objects(nd_grammar *g, int a, int b, const char *path, int depth)
{
    int na = g->nodes[a].nprops, nb = g->nodes[b].nprops;
    int id = new_node(g, K_OBJ);
    if (id < 0)
        return id;
    size_t cap = (size_t)na + (size_t)nb + 1;
    char **key = calloc(cap, sizeof *key);
    int *keylen = calloc(cap, sizeof *keylen), *prop = calloc(cap, sizeof *prop);
    uint8_t *reqd = calloc(cap, 1);
    gnode *n = &g->nodes[id];
    n->key = key;
    n->keylen = keylen;
    n->prop = prop;
    n->req = reqd;
    if (!key || !keylen || !prop || !reqd)
        return nd_error(ND_ENOMEM, "out of memory");
    int np = 0;
    for (int side = 0; side < 2; side++) {
        int from = side ? b : a, other = side ? a : b;
        for (int i = 0; i < g->nodes[from].nprops; i++) {
            const gnode *f = &g->nodes[from], *o = &g->nodes[other];
            int j = -1;
            for (int k = 0; k < o->nprops && j < 0; k++)
                if (o->keylen[k] == f->keylen[i] &&
                    !memcmp(o->key[k], f->key[i], (size_t)f->keylen[i]))
                    j = k;
            if (side && j >= 0)
                continue; /* taken with a's */
            char *kc = malloc((size_t)f->keylen[i] + 1);
            if (!kc)
                return nd_error(ND_ENOMEM, "out of memory");
            memcpy(kc, f->key[i], (size_t)f->keylen[i] + 1);
            int req = j >= 0 && f->req[i] && o->req[j];
            int v = f->prop[i];
            if (j >= 0 && o->prop[j] != v) {
                int two[2] = {v, o->prop[j]};
                v = make_alt(g, two, 2, path, NULL, depth + 1);
                if (v < 0) {
                    free(kc);
                    return v;
                }
            }
            n = &g->nodes[id]; /* make_alt may have grown the node array */
            n->key[np] = kc;
            n->keylen[np] = f->keylen[i];
            n->prop[np] = v;
            n->req[np] = (uint8_t)req;
            n->nprops = ++np;
        }
    }
    return id;
}

static int make_alt_in(nd_grammar *g, int *out, int m, const char *path, sview *base, int depth)
{
    int fb = -1; /* base compiled without the alternatives, when needed */
    int warned_union = 0;
    for (int i = 0; i < m; i++)
        first_set(g, out[i], g->nodes[out[i]].first);
    for (int i = 0; i < m; i++)
        for (int j = i + 1; j < m; j++) {
            gnode *a = &g->nodes[out[i]], *b = &g->nodes[out[j]];
            int overlap = 0;
            for (int k = 0; k < 4; k++)
                overlap |= (a->first[k] & b->first[k]) != 0;
            if (!overlap)
                continue;
            if (a->kind == K_LIT && b->kind == K_LIT) {
                int id = new_node(g, K_LIT);
                if (id < 0)
                    return id;
                a = &g->nodes[out[i]];
                b = &g->nodes[out[j]];
                for (int k = 0; k < a->nlit; k++)
                    if (add_lit(g, id, g->nodes[out[i]].lit[k], g->nodes[out[i]].litlen[k]))
                        return nd_error_prefix(ND_ELIMIT, "%s", path);
                for (int k = 0; k < g->nodes[out[j]].nlit; k++)
                    if (add_lit(g, id, g->nodes[out[j]].lit[k], g->nodes[out[j]].litlen[k]))
                        return nd_error_prefix(ND_ELIMIT, "%s", path);
                out[i] = id;
            } else if (a->kind != K_LIT && b->kind != K_LIT &&
                       generic_of(a->kind) == generic_of(b->kind)) {
                /* what the schema says outside anyOf holds for every
                 * branch: when it is of this kind, it replaces them (e.g.
                 * an object whose anyOf only varies "required") */
                int kind = a->kind, shapes = a->kind == K_OBJ && b->kind == K_OBJ;
                if (base && fb == -1 && !shapes) {
                    fb = compile_view(g, base, path, depth); /* may move g->nodes */
                    if (fb < 0)
                        return fb;
                }
                /* two object shapes: their union, never the base (each
                 * alternative already is the base AND its branch, so the
                 * union is the tighter one; the base alone would refuse
                 * keys the branches add, or be any object) */
                if (!shapes && fb >= 0 && g->nodes[fb].kind != K_ALT &&
                    generic_of(g->nodes[fb].kind) == generic_of(kind)) {
                    warnf(g,
                          "%s: anyOf/oneOf alternatives are two %ss a grammar cannot tell apart "
                          "by their first character; only the schema outside anyOf/oneOf is "
                          "enforced",
                          path, kind_name(kind));
                    out[i] = fb;
                } else if (shapes && depth < 16) {
                    if (!warned_union++)
                        warnf(g,
                              "%s: anyOf/oneOf alternatives are two objects a grammar cannot tell "
                              "apart by their first character; admitted as one object with the "
                              "properties of both (required: what both require)",
                              path);
                    int u = union_objects(g, out[i], out[j], path, depth);
                    if (u < 0)
                        return u;
                    out[i] = u;
                } else {
                    warnf(g,
                          "%s: anyOf/oneOf alternatives are two %ss a grammar cannot tell apart "
                          "by their first character; any %s is allowed",
                          path, kind_name(kind), kind_name(kind));
                    out[i] = generic_of(kind);
                }
            } else {
                warnf(g,
                      "%s: anyOf/oneOf alternatives overlap (a literal and a %s); any value is "
                      "allowed",
                      path, kind_name(a->kind == K_LIT ? b->kind : a->kind));
                return N_ANY;
            }
            first_set(g, out[i], g->nodes[out[i]].first);
            out[j] = out[--m];
            i = -1; /* start over: the merged node may overlap others */
            break;
        }
    if (m == 1)
        return out[0];
    int id = new_node(g, K_ALT);
    if (id < 0)
        return id;
    int *alt = malloc((size_t)m * sizeof *alt);
    if (!alt)
        return nd_error(ND_ENOMEM, "out of memory");
    memcpy(alt, out, (size_t)m * sizeof *alt);
    g->nodes[id].alt = alt;
    g->nodes[id].nalt = m;
    return id;
}

/* minProperties (the largest) and maxProperties (the smallest) over the
 * parts; a max under the min is dropped with a warning. *maxp -1: none. */
static void object_prop_bounds(nd_grammar *g, const sview *v, const char *path, int *minp,
                               int *maxp)
{
    long long iv;
    *minp = 0;
    *maxp = -1;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *x;
        if ((x = nd_pj_get(v->p[i], "minProperties")) && is_int_value(x, &iv) && iv > *minp)
            *minp = iv > 1000 ? 1000 : (int)iv;
        if ((x = nd_pj_get(v->p[i], "maxProperties")) && is_int_value(x, &iv) && iv >= 0 &&
            (*maxp < 0 || iv < *maxp))
            *maxp = iv > 100000 ? 100000 : (int)iv;
    }
    if (*maxp >= 0 && *maxp < *minp) {
        warnf(g, "%s: maxProperties < minProperties; maxProperties ignored", path);
        *maxp = -1;
    }
}

/* The union of the parts' properties, in order of first appearance, into
 * *mbp (the caller frees it, also on failure); *np of them. *any_props:
 * some part declares properties. */
static int object_props_union(nd_grammar *g, const sview *v, const char *path,
                              const nd_pj_member ***mbp, int *np, int *any_props)
{
    const nd_pj_member **mb = NULL;
    int cap = 0;
    *np = 0;
    *any_props = 0;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *props = nd_pj_get(v->p[i], "properties");
        if (!props)
            continue;
        if (props->type != ND_PJ_OBJECT) {
            warnf(g, "%s: 'properties' is not an object; ignored", path);
            continue;
        }
        *any_props = 1;
        for (size_t k = 0; k < props->len; k++) {
            int dup = 0;
            for (int j = 0; j < *np; j++)
                dup |= mb[j]->key_len == props->obj[k].key_len &&
                       !memcmp(mb[j]->key, props->obj[k].key, mb[j]->key_len);
            if (dup)
                continue;
            if (*np >= (1 << 24))
                return nd_error(ND_ELIMIT, "%s: more than %d properties", path, 1 << 24);
            if (*np == cap) {
                cap = cap ? 2 * cap : 16;
                const nd_pj_member **m2 = realloc(mb, (size_t)cap * sizeof *m2);
                if (!m2)
                    return nd_error(ND_ENOMEM, "out of memory");
                *mbp = mb = m2;
            }
            mb[(*np)++] = &props->obj[k];
        }
    }
    return ND_OK;
}

/* An object that declares no properties and is not closed: any object
 * (N_GOBJ), or a map whose values follow additionalProperties' schema ap,
 * with minProperties/maxProperties as its size bounds. */
static int compile_map(nd_grammar *g, const nd_pj *ap, const char *path, int depth, int minp,
                       int maxp)
{
    int item = N_ANY;
    if (ap) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.*", path);
        item = compile_node(g, ap, sub, depth + 1);
        if (item < 0)
            return item;
    }
    if (item == N_ANY && !minp && maxp < 0)
        return N_GOBJ;
    int id = new_node(g, K_GOBJ);
    if (id < 0)
        return id;
    g->nodes[id].item = item;
    g->nodes[id].min_items = minp;
    g->nodes[id].max_items = maxp;
    return id;
}

/* The value node of property m: the schemas every part gives it, all of
 * them applying (its path: path.key). */
static int compile_prop(nd_grammar *g, const sview *v, const nd_pj_member *m, const char *path,
                        int depth)
{
    char sub[256];
    snprintf(sub, sizeof sub, "%s.%.*s", path, (int)(m->key_len > 64 ? 64 : m->key_len), m->key);
    /* the same property in several parts: all its schemas apply */
    sview pv;
    memset(&pv, 0, sizeof pv);
    int rc = 0;
    for (int p = 0; p < v->n && rc == 0; p++) {
        const nd_pj *props = nd_pj_get(v->p[p], "properties");
        const nd_pj *ps = NULL;
        for (size_t k = 0; props && props->type == ND_PJ_OBJECT && k < props->len; k++)
            if (props->obj[k].key_len == m->key_len &&
                !memcmp(props->obj[k].key, m->key, m->key_len))
                ps = props->obj[k].val;
        if (ps)
            rc = expand(g, ps, sub, &pv, 0);
    }
    if (rc < 0)
        return rc;
    if (rc > 0 || depth + 1 > 16) {
        if (depth + 1 > 16)
            return nd_error(ND_ELIMIT, "%s: schema nested deeper than 16 levels", sub);
        return deep_node(pv.deep);
    }
    int save = g->c_nrefs;
    for (int r = 0; r < pv.nrefs; r++) {
        if (g->c_nrefs >= (int)(sizeof g->c_refs / sizeof g->c_refs[0]))
            return nd_error(ND_ELIMIT, "%s: too many nested $refs", sub);
        g->c_refs[g->c_nrefs++] = pv.refs[r];
    }
    int c = compile_view(g, &pv, sub, depth + 1);
    g->c_nrefs = save;
    return c;
}

/* reqd[i] = 1 for each declared property some part's "required" names;
 * undeclared names and a "required" that is no array are warned of */
static void object_required(nd_grammar *g, const sview *v, const nd_pj_member **mb, int np,
                            const char *path, uint8_t *reqd)
{
    for (int p = 0; p < v->n; p++) {
        const nd_pj *req = nd_pj_get(v->p[p], "required");
        if (req && req->type == ND_PJ_ARRAY) {
            for (size_t r = 0; r < req->len; r++) {
                const nd_pj *k = req->items[r];
                int found = -1;
                for (int i = 0; k->type == ND_PJ_STRING && i < np; i++)
                    if (mb[i]->key_len == k->len && !memcmp(mb[i]->key, k->str, k->len))
                        found = i;
                if (found < 0)
                    warnf(g, "%s: required property %.64s is not declared; ignored", path,
                          k->type == ND_PJ_STRING ? k->str : "(not a string)");
                else
                    reqd[found] = 1;
            }
        } else if (req) {
            warnf(g, "%s: 'required' is not an array; ignored", path);
        }
    }
}

/* *mbp: the property list, kept by the caller to free */
static int compile_object_in(nd_grammar *g, const sview *v, const char *path, int depth,
                             const nd_pj_member ***mbp)
{
    int minp, maxp;
    object_prop_bounds(g, v, path, &minp, &maxp);
    int np, any_props;
    int rc = object_props_union(g, v, path, mbp, &np, &any_props);
    if (rc)
        return rc;
    const nd_pj_member **mb = *mbp;
    /* additionalProperties: false closes the object; a schema types the
     * values of an object that declares no properties (a map) */
    const nd_pj *ap = NULL;
    int closed = 0;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *x = nd_pj_get(v->p[i], "additionalProperties");
        if (x && x->type == ND_PJ_FALSE)
            closed = 1;
        else if (x && x->type == ND_PJ_OBJECT && !ap)
            ap = x;
    }
    if (!any_props && !closed)
        return compile_map(g, ap, path, depth, minp, maxp);
    if (minp || maxp >= 0)
        warnf(g,
              "%s: minProperties/maxProperties on an object with declared properties is not "
              "enforced",
              path);
    int id = new_node(g, K_OBJ);
    if (id < 0)
        return id;
    char **key = calloc((size_t)np + 1, sizeof *key);
    int *keylen = calloc((size_t)np + 1, sizeof *keylen),
        *prop = calloc((size_t)np + 1, sizeof *prop);
    uint8_t *reqd = calloc((size_t)np + 1, 1);
    g->nodes[id].req = reqd;
    g->nodes[id].key = key;
    g->nodes[id].keylen = keylen;
    g->nodes[id].prop = prop;
    if (!key || !keylen || !prop || !reqd)
        return nd_error(ND_ENOMEM, "out of memory");
    if (np > ND_GRAM_MAX_PROPS)
        warnf(g,
              "%s: %d properties: more than %d, so the keys are admitted in declaration "
              "order only",
              path, np, ND_GRAM_MAX_PROPS);
    for (int i = 0; i < np; i++) {
        nd_pj ks = {0};
        ks.type = ND_PJ_STRING;
        ks.str = mb[i]->key;
        ks.len = mb[i]->key_len;
        key[i] = dump_value(&ks, &keylen[i]);
        if (!key[i])
            return nd_error(ND_ENOMEM, "out of memory");
        g->nodes[id].nprops = i + 1;
        int c = compile_prop(g, v, mb[i], path, depth);
        if (c < 0)
            return c;
        g->nodes[id].prop[i] = c;
    }
    object_required(g, v, mb, np, path, reqd);
    return id;
}

static int compile_object(nd_grammar *g, const sview *v, const char *path, int depth)
{
    const nd_pj_member **mb = NULL;
    int rc = compile_object_in(g, v, path, depth, &mb);
    free(mb);
    return rc;
}

/* common "format"s as patterns (ASCII) */
static const char *format_pattern(const char *f)
{
    /* within the regex engine's 320 NFA states: a date (also a
     * date-time's) is a calendar date, years 0001..9999, February 29 in leap years only; a
     * date-time's fraction of seconds is \.\d+, no leap second :60; an
     * ipv4 octet is 0..255 without leading zeros; a uri is an RFC 3986 URI
     * (scheme, then an authority of host and port, or a path; query,
     * fragment; percent escapes), less userinfo and IP-literal hosts */
    static const struct {
        const char *name, *re;
    } fm[] = {
        {"date",
         "^((\\d{3}[1-9]|\\d\\d[1-9]\\d|\\d[1-9]\\d\\d|[1-9]\\d{3})-((0[13578]|1[02])-(0[1-9]|[12]"
         "\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))|(\\d\\d(0[48]|[2468]["
         "048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)$"},
        {"time",
         "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
        {"date-time",
         "^((\\d{3}[1-9]|\\d\\d[1-9]\\d|\\d[1-9]\\d\\d|[1-9]\\d{3})-((0[13578]|1[02])-(0[1-9]|[12]"
         "\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))|(\\d\\d(0[48]|[2468]["
         "048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)[Tt]([01]\\d|2[0-3]):[0-5]\\d:"
         "[0-5]\\d(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"ipv4",
         "^(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.("
         "25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$"},
        {"email",
         "^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]"
         "([A-Za-z0-9-]*[A-Za-z0-9])?)*$"},
        {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:(//"
                "([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f][0-9A-Fa-f])*(:[0-9]*)?(/"
                "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f][0-9A-Fa-f])*)*|/"
                "(([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f][0-9A-Fa-f])+(/"
                "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f][0-9A-Fa-f])*)*)?|([A-Za-z0-9._~!$&'()*+"
                ",;=:@-]|%[0-9A-Fa-f][0-9A-Fa-f])+(/"
                "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f][0-9A-Fa-f])*)*)?(\\?([A-Za-z0-9._~!$&'("
                ")*+,;=:@/?-]|%[0-9A-Fa-f][0-9A-Fa-f])*)?(#([A-Za-z0-9._~!$&'()*+,;=:@/"
                "?-]|%[0-9A-Fa-f][0-9A-Fa-f])*)?$"},
    };
    for (size_t i = 0; i < sizeof fm / sizeof fm[0]; i++)
        if (!strcmp(f, fm[i].name))
            return fm[i].re;
    return NULL;
}

/* end of the bracket class starting at p[i] == '[' (index of its ']'),
 * or n when unclosed */
static size_t class_end(const char *p, size_t i, size_t n)
{
    i++;
    if (i < n && p[i] == '^')
        i++;
    if (i < n && p[i] == ']')
        i++;
    while (i < n && p[i] != ']')
        i += p[i] == '\\' ? 2 : 1;
    return i < n ? i : n;
}

/* 1 when p[0..n) is one group "(^...$)" with its anchors inside */
static int anchored_group(const char *p, size_t n)
{
    if (n < 4 || p[0] != '(' || p[1] != '^' || p[n - 1] != ')' || p[n - 2] != '$' ||
        p[n - 3] == '\\')
        return 0;
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\')
            i++;
        else if (p[i] == '[')
            i = class_end(p, i, n);
        else if (p[i] == '(')
            depth++;
        else if (p[i] == ')' && --depth == 0 && i != n - 1)
            return 0;
    }
    return depth == 0;
}

/* Top-level branches written as one group with the anchors inside,
 * "(^a$)|(^b$)", are "^(a)$|^(b)$" (the same strings); into out. 1 if any
 * branch was rewritten. */
static int unwrap_anchored_group(const char *p, char *out, size_t cap)
{
    size_t n = strlen(p), o = 0, start = 0;
    int depth = 0, any = 0;
    if (2 * n + 8 > cap)
        return 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] == '\\') {
            i++;
            continue;
        }
        if (i < n && p[i] == '[') {
            i = class_end(p, i, n);
            continue;
        }
        if (i < n && p[i] == '(')
            depth++;
        else if (i < n && p[i] == ')')
            depth--;
        if (i < n && (p[i] != '|' || depth))
            continue;
        /* a branch p[start..i) */
        size_t bl = i - start;
        if (anchored_group(p + start, bl)) {
            o += (size_t)snprintf(out + o, cap - o, "^(%.*s)$", (int)(bl - 4), p + start + 2);
            any = 1;
        } else {
            memcpy(out + o, p + start, bl);
            o += bl;
        }
        if (i < n)
            out[o++] = '|';
        start = i + 1;
    }
    out[o] = 0;
    return any;
}

/* A fully anchored pattern of single-character atoms (literals, escapes,
 * classes, '.') where one atom has a counted repetition too long for the
 * NFA, e.g. ^[a-zA-Z][a-zA-Z0-9-]{39,100}$: every other atom has a fixed
 * count, so the string's length alone fixes that atom's count, and the
 * pattern is exactly that atom repeated freely (out) with the length in
 * [*lo, *hi] (-1: no upper bound). 1 if rewritten. */
static int counted_as_length(const char *p, char *out, size_t cap, long *lo, long *hi)
{
    size_t n = strlen(p);
    if (n < 3 || p[0] != '^' || p[n - 1] != '$' || n * 2 + 4 > cap)
        return 0;
    size_t bs = 0;
    for (size_t i = n - 1; i > 0 && p[i - 1] == '\\'; i--)
        bs++;
    if (bs & 1)
        return 0; /* an escaped '$' */
    long fixed = 0, vlo = -1, vhi = -1;
    size_t o = 0;
    out[o++] = '^';
    for (size_t i = 1; i < n - 1;) {
        size_t a = i;
        if (p[i] == '\\') {
            if (i + 1 >= n - 1)
                return 0;
            i += 2;
        } else if (p[i] == '[') {
            i++;
            if (p[i] == '^')
                i++;
            if (p[i] == ']')
                i++;
            while (i < n - 1 && p[i] != ']')
                i += p[i] == '\\' ? 2 : 1;
            if (i >= n - 1)
                return 0;
            i++;
        } else if (strchr("()|*+?{}^$", p[i])) {
            return 0;
        } else {
            i++;
        }
        size_t atom_len = i - a;
        long m = 1, x = 1;
        if (p[i] == '{') {
            char *e;
            m = strtol(p + i + 1, &e, 10);
            if (e == p + i + 1 || m < 0)
                return 0;
            if (*e == '}') {
                x = m;
            } else if (*e == ',' && e[1] == '}') {
                x = -1;
                e++;
            } else if (*e == ',') {
                char *e2;
                x = strtol(e + 1, &e2, 10);
                if (e2 == e + 1 || *e2 != '}' || x < m)
                    return 0;
                e = e2;
            } else {
                return 0;
            }
            i = (size_t)(e - p) + 1;
        } else if (p[i] && strchr("*+?", p[i])) {
            return 0;
        }
        if (m == x) {
            /* a fixed count: copied as written */
            fixed += m;
            memcpy(out + o, p + a, i - a);
            o += i - a;
            continue;
        }
        if (vlo >= 0)
            return 0; /* a second variable atom */
        vlo = m;
        vhi = x;
        memcpy(out + o, p + a, atom_len);
        o += atom_len;
        out[o++] = '*';
    }
    if (vlo < 0)
        return 0;
    out[o++] = '$';
    out[o] = 0;
    *lo = fixed + vlo;
    *hi = vhi < 0 ? -1 : fixed + vhi;
    return 1;
}

/* The pattern with every counted repetition {m,n} whose n exceeds `cap`
 * cut to {m,max(m,cap)} (outside classes and escapes), into out: a subset
 * of the strings, for a pattern the NFA cannot hold as written. 1 if any
 * was cut. */
static int narrow_repeats(const char *p, int cap, char *out, size_t outcap)
{
    size_t n = strlen(p), o = 0;
    int cut = 0;
    if (n + 1 > outcap)
        return 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == '\\' && i + 1 < n) {
            out[o++] = p[i++];
            out[o++] = p[i++];
            continue;
        }
        if (p[i] == '[') {
            size_t e = class_end(p, i, n);
            size_t len = (e < n ? e + 1 : n) - i;
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
            continue;
        }
        if (p[i] == '{') {
            char *e1, *e2;
            long m = strtol(p + i + 1, &e1, 10);
            if (e1 != p + i + 1 && *e1 == ',' && e1[1] != '}') {
                long x = strtol(e1 + 1, &e2, 10);
                if (e2 != e1 + 1 && *e2 == '}' && x > cap && x >= m) {
                    long k = m > cap ? m : cap;
                    int w = snprintf(out + o, outcap - o, "{%ld,%ld}", m, k);
                    if (w < 0 || (size_t)w >= outcap - o)
                        return 0;
                    o += (size_t)w;
                    i = (size_t)(e2 - p) + 1;
                    cut = 1;
                    continue;
                }
            }
        }
        if (o + 1 >= outcap)
            return 0;
        out[o++] = p[i++];
    }
    out[o] = 0;
    return cut;
}

static int compile_string(nd_grammar *g, const sview *v, const char *path)
{
    int id = new_node(g, K_STR);
    if (id < 0)
        return id;
    long long iv;
    const char *pat = NULL;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *mn = nd_pj_get(v->p[i], "minLength"), *mx = nd_pj_get(v->p[i], "maxLength");
        if (mn && is_int_value(mn, &iv) && iv >= 0) {
            int x = iv > 100000 ? 100000 : (int)iv;
            if (x > g->nodes[id].min_len)
                g->nodes[id].min_len = x;
        } else if (mn) {
            warnf(g, "%s: bad minLength ignored", path);
        }
        if (mx && is_int_value(mx, &iv) && iv >= 0) {
            int x = iv > 100000 ? 100000 : (int)iv;
            if (g->nodes[id].max_len < 0 || x < g->nodes[id].max_len)
                g->nodes[id].max_len = x;
        } else if (mx) {
            warnf(g, "%s: bad maxLength ignored", path);
        }
        const nd_pj *pt = nd_pj_get(v->p[i], "pattern");
        if (pt && pt->type != ND_PJ_STRING)
            warnf(g, "%s: pattern is not a string; ignored", path);
        else if (pt && !pat)
            pat = pt->str;
        else if (pt && strcmp(pt->str, pat))
            warnf(g, "%s: only one pattern per string is enforced; '%.64s' ignored", path, pt->str);
    }
    const nd_pj *fm = vget(v, "format");
    if (fm && fm->type == ND_PJ_STRING) {
        const char *fp = format_pattern(fm->str);
        if (fp && !pat)
            pat = fp;
        else if (!fp)
            warnf(g, "%s: format '%.64s' is not enforced", path, fm->str);
        else
            warnf(g, "%s: format '%.64s' is not enforced next to a pattern", path, fm->str);
    }
    if (g->nodes[id].max_len >= 0 && g->nodes[id].max_len < g->nodes[id].min_len) {
        warnf(g, "%s: maxLength < minLength; maxLength ignored", path);
        g->nodes[id].max_len = -1;
    }
    if (pat) {
        if (++g->n_re > ND_GRAM_MAX_PATTERNS)
            return nd_error(ND_ELIMIT, "%s: the tools' schemas need more than %d patterns", path,
                            ND_GRAM_MAX_PATTERNS);
        nd_regex *re = malloc(sizeof *re);
        if (!re)
            return nd_error(ND_ENOMEM, "out of memory");
        char alt[1024];
        long lo = 0, hi = -1;
        int rc = nd_re_compile(pat, re);
        if (rc == ND_EUNSUPPORTED && strlen(pat) < 500 &&
            unwrap_anchored_group(pat, alt, sizeof alt)) {
            pat = alt;
            rc = nd_re_compile(pat, re);
        }
        if (rc == ND_ELIMIT && strlen(pat) < 500 &&
            counted_as_length(pat, alt, sizeof alt, &lo, &hi) && !nd_re_compile(alt, re)) {
            rc = ND_OK;
            gnode *sn = &g->nodes[id];
            if (lo > sn->min_len)
                sn->min_len = lo > 100000 ? 100000 : (int)lo;
            if (hi >= 0 && (sn->max_len < 0 || hi < sn->max_len))
                sn->max_len = (int)hi;
            if (sn->max_len >= 0 && sn->max_len < sn->min_len) {
                warnf(g, "%s: pattern admits no string of the allowed length; pattern ignored",
                      path);
                free(re);
                return id;
            }
        }
        /* still too large: cut long counted repetitions (a subset of the
         * strings, with a warning) rather than drop the pattern */
        for (int cap = 32; rc == ND_ELIMIT && cap >= 4 && strlen(pat) < 500; cap /= 2) {
            char nar[1024];
            if (!narrow_repeats(pat, cap, nar, sizeof nar))
                break;
            if (!nd_re_compile(nar, re)) {
                warnf(g,
                      "%s: pattern's counted repetitions over %d cut to %d to fit the grammar "
                      "(longer matches are not allowed): %.200s",
                      path, cap, cap, nar);
                rc = ND_OK;
            }
        }
        if (rc) {
            warnf(g, "%s: pattern ignored: %s", path, nd_last_error());
            free(re);
        } else {
            int need = nd_re_dist(re, nd_re_initial(re));
            if (g->nodes[id].max_len >= 0 && need > g->nodes[id].max_len) {
                warnf(g, "%s: pattern needs %d characters but maxLength is %d; pattern ignored",
                      path, need, g->nodes[id].max_len);
                free(re);
            } else if (nd_re_len_min(re, nd_re_initial(re), g->nodes[id].min_len,
                                     g->nodes[id].max_len >= 0 ? g->nodes[id].max_len : INT_MAX) <
                       0) {
                /* e.g. "^@[a-z]$" with minLength 9: no string satisfies
                 * both, and a required property would be a dead end */
                warnf(g, "%s: pattern admits no string of the allowed length; pattern ignored",
                      path);
                free(re);
            } else {
                g->nodes[id].re = re;
            }
        }
    }
    return id;
}

static int compile_number(nd_grammar *g, const sview *v, const char *path, int integer)
{
    int id = new_node(g, integer ? K_INT : K_NUM);
    if (id < 0)
        return id;
    gnode *n = &g->nodes[id];
    for (int i = 0; i < v->n; i++) {
        const nd_pj *s = v->p[i], *x;
        double d;
        int ex = 0;
        /* draft 4: exclusiveMinimum true makes minimum exclusive */
        if ((x = nd_pj_get(s, "exclusiveMinimum")) && x->type == ND_PJ_TRUE)
            ex = 1;
        if ((x = nd_pj_get(s, "minimum")) && is_number(x, &d) &&
            (d > n->lo || (d == n->lo && ex))) {
            n->lo = d;
            n->lo_ex = ex;
        }
        if ((x = nd_pj_get(s, "exclusiveMinimum")) && is_number(x, &d) && d >= n->lo) {
            n->lo = d;
            n->lo_ex = 1;
        }
        ex = (x = nd_pj_get(s, "exclusiveMaximum")) && x->type == ND_PJ_TRUE;
        if ((x = nd_pj_get(s, "maximum")) && is_number(x, &d) &&
            (d < n->hi || (d == n->hi && ex))) {
            n->hi = d;
            n->hi_ex = ex;
        }
        if ((x = nd_pj_get(s, "exclusiveMaximum")) && is_number(x, &d) && d <= n->hi) {
            n->hi = d;
            n->hi_ex = 1;
        }
    }
    if (nd_gram_num_minlen(n) < 0) {
        warnf(g, "%s: no %s with at most %d digits fits the bounds; bounds ignored", path,
              integer ? "integer" : "number", MAX_DIGITS);
        n->lo = -INFINITY;
        n->hi = INFINITY;
        n->lo_ex = n->hi_ex = 0;
    }
    return id;
}

static int compile_array(nd_grammar *g, const sview *v, const char *path, int depth)
{
    sview iv;
    memset(&iv, 0, sizeof iv);
    int deep = -1; /* items: a recursive $ref no longer followed */
    char sub[256];
    snprintf(sub, sizeof sub, "%s[]", path);
    int min = 0, max = -1;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *it = nd_pj_get(v->p[i], "items"), *x;
        long long k;
        if (it && it->type == ND_PJ_OBJECT) {
            int rc = expand(g, it, sub, &iv, 0);
            if (rc < 0)
                return rc;
            if (rc > 0)
                deep = deep_node(iv.deep);
        } else if (it && it->type != ND_PJ_TRUE) {
            warnf(g, "%s: 'items' that is not a schema object is not enforced", path);
        }
        if ((x = nd_pj_get(v->p[i], "minItems")) && is_int_value(x, &k) && k > min)
            min = k > 1000 ? 1000 : (int)k;
        if ((x = nd_pj_get(v->p[i], "maxItems")) && is_int_value(x, &k) && k >= 0 &&
            (max < 0 || k < max))
            max = k > 100000 ? 100000 : (int)k;
    }
    int item = deep >= 0 ? deep : N_ANY;
    if (iv.n && deep < 0) {
        if (depth + 1 > 16)
            return nd_error(ND_ELIMIT, "%s: schema nested deeper than 16 levels", sub);
        int save = g->c_nrefs;
        for (int r = 0; r < iv.nrefs; r++) {
            if (g->c_nrefs >= (int)(sizeof g->c_refs / sizeof g->c_refs[0]))
                return nd_error(ND_ELIMIT, "%s: too many nested $refs", sub);
            g->c_refs[g->c_nrefs++] = iv.refs[r];
        }
        item = compile_view(g, &iv, sub, depth + 1);
        g->c_nrefs = save;
        if (item < 0)
            return item;
    }
    int id = new_node(g, K_ARR);
    if (id < 0)
        return id;
    gnode *n = &g->nodes[id];
    n->item = item;
    n->min_items = min;
    n->max_items = max;
    if (n->max_items >= 0 && n->max_items < n->min_items) {
        warnf(g, "%s: maxItems < minItems; maxItems ignored", path);
        n->max_items = -1;
    }
    return id;
}

/* the literals every part's enum/const allows; 0 when no part has one */
static int compile_enum(nd_grammar *g, const sview *v, const char *path, int *out)
{
    int id = -1;
    for (int i = 0; i < v->n; i++) {
        const nd_pj *en = nd_pj_get(v->p[i], "enum"), *cn = nd_pj_get(v->p[i], "const");
        if (en && !(en->type == ND_PJ_ARRAY && en->len)) {
            warnf(g, "%s: 'enum' is not a non-empty array; ignored", path);
            en = NULL;
        }
        if (!en && !cn)
            continue;
        int nid = new_node(g, K_LIT);
        if (nid < 0)
            return nid;
        size_t nv = cn ? 1 : en->len;
        for (size_t k = 0; k < nv; k++) {
            int len;
            char *txt = dump_value(cn ? cn : en->items[k], &len);
            if (!txt)
                return nd_error(ND_ENOMEM, "out of memory");
            int keep = 1;
            if (id >= 0) { /* intersect with the earlier parts' values */
                keep = 0;
                for (int j = 0; j < g->nodes[id].nlit; j++)
                    keep |= g->nodes[id].litlen[j] == len &&
                            !memcmp(g->nodes[id].lit[j], txt, (size_t)len);
            }
            int rc = keep ? add_lit(g, nid, txt, len) : 0;
            free(txt);
            if (rc)
                return nd_error_prefix(rc, "%s", path);
        }
        if (!g->nodes[nid].nlit) {
            warnf(g,
                  "%s: allOf/$ref parts have no enum/const value in common; the later one is "
                  "ignored",
                  path);
            continue;
        }
        id = nid;
    }
    *out = id;
    return 0;
}

static int compile_view(nd_grammar *g, sview *v, const char *path, int depth)
{
    /* anyOf / oneOf: each alternative is this schema AND that branch. A
     * grammar cannot enforce oneOf's "exactly one": it is read as anyOf. */
    for (int i = 0; i < v->n && i < 32; i++) {
        if (v->alt_done >> i & 1)
            continue;
        const nd_pj *al = nd_pj_get(v->p[i], "anyOf");
        const nd_pj *one = nd_pj_get(v->p[i], "oneOf");
        if (al && one) {
            warnf(g, "%s: both anyOf and oneOf; oneOf ignored", path);
            one = NULL;
        }
        const nd_pj *br = al ? al : one;
        if (!br)
            continue;
        v->alt_done |= 1u << i;
        if (br->type != ND_PJ_ARRAY || !br->len) {
            warnf(g, "%s: %s is not a non-empty array; ignored", path, al ? "anyOf" : "oneOf");
            continue;
        }
        /* any number of alternatives: each costs its nodes (bounded by
         * ND_GRAM_MAX_NODES), and make_alt merges them in one pass */
        if (br->len > INT_MAX / 2)
            return nd_error(ND_ELIMIT, "%s: %zu alternatives", path, br->len);
        int *ids = malloc(br->len * sizeof *ids), rc = ND_OK;
        if (!ids)
            return nd_error(ND_ENOMEM, "out of memory");
        for (size_t k = 0; k < br->len && !rc; k++) {
            sview av = *v;
            rc = expand(g, br->items[k], path, &av, 0);
            if (rc > 0) {
                ids[k] = deep_node(av.deep);
                rc = ND_OK;
                continue;
            }
            if (rc < 0)
                break;
            int save = g->c_nrefs;
            for (int r = v->nrefs; r < av.nrefs && !rc; r++) {
                if (g->c_nrefs >= (int)(sizeof g->c_refs / sizeof g->c_refs[0]))
                    rc = nd_error(ND_ELIMIT, "%s: too many nested $refs", path);
                else
                    g->c_refs[g->c_nrefs++] = av.refs[r];
            }
            if (!rc && (ids[k] = compile_view(g, &av, path, depth)) < 0)
                rc = ids[k];
            g->c_nrefs = save;
        }
        int id = rc ? rc : make_alt(g, ids, (int)br->len, path, v, depth);
        free(ids);
        return id;
    }
    int lit = -1;
    int rc = compile_enum(g, v, path, &lit);
    if (rc < 0)
        return rc;
    if (lit >= 0)
        return lit;
    int types = view_types(g, v, path);
    if (types == T_ALL)
        return N_ANY;
    int ids[8], n = 0;
    if (types & T_OBJ) {
        if ((ids[n] = compile_object(g, v, path, depth)) < 0)
            return ids[n];
        n++;
    }
    if (types & T_STR) {
        if ((ids[n] = compile_string(g, v, path)) < 0)
            return ids[n];
        n++;
    }
    if (types & (T_INT | T_FRAC)) {
        if ((ids[n] = compile_number(g, v, path, !(types & T_FRAC))) < 0)
            return ids[n];
        n++;
    }
    if (types & (T_BOOL | T_NULL)) {
        int id = new_node(g, K_LIT);
        if (id < 0)
            return id;
        if ((types & T_BOOL) &&
            ((rc = add_lit(g, id, "true", 4)) || (rc = add_lit(g, id, "false", 5))))
            return rc;
        if ((types & T_NULL) && (rc = add_lit(g, id, "null", 4)))
            return rc;
        ids[n++] = id;
    }
    if (types & T_ARR) {
        if ((ids[n] = compile_array(g, v, path, depth)) < 0)
            return ids[n];
        n++;
    }
    return n == 1 ? ids[0] : make_alt(g, ids, n, path, NULL, depth);
}

static int node_minlen(nd_grammar *g, int id)
{
    gnode *n = &g->nodes[id];
    switch (n->kind) {
    case K_ANY: return 1;
    case K_GOBJ: {
        int m = n->min_items;
        return m ? 1 + m * (4 + node_minlen(g, n->item)) : 2;
    }
    case K_GARR: return 2;
    case K_ALT: {
        int m = 1 << 29;
        for (int i = 0; i < n->nalt; i++) {
            int x = node_minlen(g, n->alt[i]);
            m = x < m ? x : m;
        }
        return m;
    }
    case K_STR: {
        int m = n->min_len;
        if (n->re) /* satisfiable: checked when the pattern was kept */
            m = nd_re_len_min(n->re, nd_re_initial(n->re), n->min_len,
                              n->max_len >= 0 ? n->max_len : INT_MAX);
        return 2 + m;
    }
    case K_INT:
    case K_NUM: return nd_gram_num_minlen(n);
    case K_LIT: {
        int m = n->litlen[0];
        for (int i = 1; i < n->nlit; i++)
            m = n->litlen[i] < m ? n->litlen[i] : m;
        return m;
    }
    case K_ARR:
        return 2 + n->min_items * node_minlen(g, n->item) + (n->min_items ? n->min_items - 1 : 0);
    case K_OBJ: {
        int m = 2, k = 0;
        for (int i = 0; i < n->nprops; i++)
            if (n->req[i]) {
                m += (k++ ? 1 : 0) + n->keylen[i] + 1 + node_minlen(g, n->prop[i]);
            }
        return m;
    }
    }
    return 1;
}

/* ---- sorted literal and key lists ---- */

typedef struct {
    char *s;
    int len, idx;
} sitem;

static int cmp_sitem(const void *a, const void *b)
{
    const sitem *x = a, *y = b;
    int c = memcmp(x->s, y->s, (size_t)(x->len < y->len ? x->len : y->len));
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* a node's literals sorted by bytes (a value that is a prefix of another,
 * 1 before 10, comes first); an object's keys get an index in byte order */
static int sort_lists(nd_grammar *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = &g->nodes[i];
        int cnt = n->kind == K_LIT ? n->nlit : n->kind == K_OBJ ? n->nprops : 0;
        if (n->kind != K_OBJ && cnt < 2)
            continue;
        sitem *it = malloc((size_t)(cnt + 1) * sizeof *it);
        int *ord = malloc((size_t)(cnt + 1) * sizeof *ord);
        if (!it || !ord) {
            free(it);
            free(ord);
            return nd_error(ND_ENOMEM, "out of memory");
        }
        for (int k = 0; k < cnt; k++) {
            it[k].s = n->kind == K_LIT ? n->lit[k] : n->key[k];
            it[k].len = n->kind == K_LIT ? n->litlen[k] : n->keylen[k];
            it[k].idx = k;
        }
        qsort(it, (size_t)cnt, sizeof *it, cmp_sitem);
        for (int k = 0; k < cnt; k++)
            ord[k] = it[k].idx;
        if (n->kind == K_OBJ) {
            n->ord = ord;
            if (cnt > ND_GRAM_MAX_PROPS) {
                n->ordered = 1;
                n->next_req = malloc((size_t)(cnt + 1) * sizeof *n->next_req);
                if (!n->next_req) {
                    free(it);
                    return nd_error(ND_ENOMEM, "out of memory");
                }
                n->next_req[cnt] = cnt;
                for (int k = cnt - 1; k >= 0; k--)
                    n->next_req[k] = n->req[k] ? k : n->next_req[k + 1];
            } else {
                for (int k = 0; k < cnt; k++)
                    if (n->req[k])
                        n->required[k >> 6] |= 1ull << (k & 63);
            }
        } else {
            for (int k = 0; k < cnt; k++) {
                n->lit[k] = it[k].s;
                n->litlen[k] = it[k].len;
            }
            free(ord);
        }
        free(it);
    }
    return ND_OK;
}

/* tools->items[first .. first + count) into one grammar (messages name
 * each tool by its index in the whole array) */
static int compile_range(const nd_pj *tools, size_t first, size_t count, nd_grammar **out)
{
    *out = NULL;
    nd_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = ND_OK;
    static const int builtin[N_BUILTIN] = {K_ANY, K_STR, K_NUM, K_LIT, K_GOBJ, K_GARR};
    for (int i = 0; i < N_BUILTIN; i++)
        if (new_node(g, builtin[i]) < 0) {
            nd_gram_free(g);
            return ND_ENOMEM;
        }
    if ((rc = add_lit(g, N_TFN, "true", 4)) || (rc = add_lit(g, N_TFN, "false", 5)) ||
        (rc = add_lit(g, N_TFN, "null", 4)))
        goto fail;
    g->tools = calloc(count + 1, sizeof *g->tools);
    if (!g->tools) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = first; i < first + count; i++) {
        const nd_pj *t = tools->items[i];
        const nd_pj *fn = nd_pj_get(t, "function");
        if (fn && fn->type == ND_PJ_OBJECT && !nd_pj_get(t, "name"))
            t = fn;
        const nd_pj *name = nd_pj_get(t, "name");
        if (!t || t->type != ND_PJ_OBJECT) {
            rc = nd_error(ND_EFORMAT, "tools[%zu] is not an object", i);
            goto fail;
        }
        if (!name || name->type != ND_PJ_STRING || !name->len) {
            rc = nd_error(ND_EFORMAT, "tools[%zu] has no \"name\" string", i);
            goto fail;
        }
        for (int k = 0; k < g->n_tools; k++) {
            nd_pj ns = {0};
            ns.type = ND_PJ_STRING;
            ns.str = name->str;
            ns.len = name->len;
            int len;
            char *txt = dump_value(&ns, &len);
            int same =
                txt && len == g->tools[k].namelen && !memcmp(txt, g->tools[k].name, (size_t)len);
            free(txt);
            if (same) {
                rc = nd_error(ND_EFORMAT, "tools[%zu]: tool name \"%s\" is declared twice", i,
                              name->str);
                goto fail;
            }
        }
        gtool *gt = &g->tools[g->n_tools];
        gt->name = dump_value(name, &gt->namelen);
        if (!gt->name) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto fail;
        }
        g->n_tools++;
        const nd_pj *params = nd_pj_get(t, "parameters");
        char path[128];
        snprintf(path, sizeof path, "%.64s.parameters", name->str);
        if (!params) {
            /* no parameters: the arguments object is {} */
            int id = new_node(g, K_OBJ);
            if (id < 0) {
                rc = id;
                goto fail;
            }
            gt->args = id;
        } else {
            g->c_root = params;
            g->c_nrefs = 0;
            int id = compile_node(g, params, path, 0);
            if (id < 0) {
                rc = id;
                goto fail;
            }
            int k = g->nodes[id].kind;
            if (k != K_OBJ && k != K_GOBJ) {
                if (k != K_ANY)
                    warnf(g,
                          "%s: the parameters schema is not an object schema; any "
                          "arguments object is allowed",
                          path);
                id = N_GOBJ;
            }
            gt->args = id;
        }
    }
    /* literals and keys in byte order, for the runtime's range search */
    if ((rc = sort_lists(g)))
        goto fail;
    /* minimum serialised lengths (node_minlen recurses into children) */
    for (int i = 0; i < g->n_nodes; i++)
        g->nodes[i].minlen = node_minlen(g, i);
    for (int i = 0; i < g->n_nodes; i++)
        first_set(g, i, g->nodes[i].first);
    g->call_fixed = (int)strlen(PFX1) + (int)strlen(PFX2) + 1;
    *out = g;
    return ND_OK;
fail:
    nd_gram_free(g);
    return rc;
}

int nd_gram_compile(const nd_pj *tools, nd_grammar **out)
{
    *out = NULL;
    if (!tools || tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "tools must be a JSON array of tool objects");
    if (tools->len > ND_GRAM_MAX_ALT)
        return nd_error(ND_ELIMIT,
                        "%zu tools declared; one grammar holds at most %d (with more than %d "
                        "tools, an archive with a contrastive head renders the retrieved ones "
                        "only)",
                        tools->len, ND_GRAM_MAX_ALT, 5);
    return compile_range(tools, 0, tools->len, out);
}

static int cmp_name(const void *a, const void *b)
{
    const nd_pj *x = *(const nd_pj *const *)a, *y = *(const nd_pj *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->str, y->str, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

int nd_gram_validate(const nd_pj *tools, nd_buf *warnings)
{
    if (!tools || tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "tools must be a JSON array of tool objects");
    int rc = ND_OK;
    for (size_t first = 0; first < tools->len && !rc; first += ND_GRAM_MAX_ALT) {
        size_t count = tools->len - first;
        count = count > ND_GRAM_MAX_ALT ? ND_GRAM_MAX_ALT : count;
        nd_grammar *g = NULL;
        if ((rc = compile_range(tools, first, count, &g)))
            break;
        const char *w = nd_gram_warnings(g);
        if (*w && warnings->n)
            rc = nd_buf_put(warnings, "\n", 1);
        if (*w && !rc)
            rc = nd_buf_put(warnings, w, strlen(w));
        nd_gram_free(g);
    }
    if (rc)
        return rc;
    /* a name declared twice in different chunks */
    const nd_pj **names = malloc((tools->len + 1) * sizeof *names);
    if (!names)
        return nd_error(ND_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < tools->len; i++) {
        const nd_pj *t = tools->items[i], *fn = nd_pj_get(t, "function");
        if (fn && fn->type == ND_PJ_OBJECT && !nd_pj_get(t, "name"))
            t = fn;
        names[n++] = nd_pj_get(t, "name"); /* a string: checked by compile_range */
    }
    qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 1; i < n && !rc; i++)
        if (!cmp_name(&names[i - 1], &names[i]))
            rc = nd_error(ND_EFORMAT, "tool name \"%s\" is declared twice", names[i]->str);
    free(names);
    return rc;
}

void nd_gram_free(nd_grammar *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = &g->nodes[i];
        for (int k = 0; k < n->nprops; k++)
            free(n->key[k]);
        free(n->key);
        free(n->keylen);
        free(n->prop);
        free(n->ord);
        free(n->req);
        free(n->next_req);
        for (int k = 0; k < n->nlit; k++)
            free(n->lit[k]);
        free(n->lit);
        free(n->litlen);
        free(n->re);
        free(n->alt);
    }
    free(g->nodes);
    for (int i = 0; i < g->n_tools; i++)
        free(g->tools[i].name);
    free(g->tools);
    nd_buf_free(&g->warn);
    free(g);
}

const char *nd_gram_warnings(const nd_grammar *g)
{
    return g->warn.p ? g->warn.p : "";
}

void nd_gram_require_call(nd_grammar *g, int on)
{
    g->require_call = on && g->n_tools > 0;
}

int nd_gram_num_tools(const nd_grammar *g)
{
    return g->n_tools;
}
