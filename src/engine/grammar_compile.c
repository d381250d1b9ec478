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
    if (g->warn.n)
        nd_buf_put(&g->warn, "\n", 1);
    nd_buf_put(&g->warn, msg, strlen(msg));
}

static int new_node(nd_grammar *g, int kind)
{
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
    if (n->nlit >= ND_GRAM_MAX_ALT)
        return nd_error(ND_ELIMIT, "more than %d enum values", ND_GRAM_MAX_ALT);
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
    for (int i = 0; i < n->nlit; i++)
        if (n->litlen[i] == len && !memcmp(n->lit[i], c, (size_t)len)) {
            free(c);
            return ND_OK;
        }
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

static const char *known_kw[] = {"type",
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
                                 "description",
                                 "title",
                                 "default",
                                 "examples",
                                 "$schema",
                                 "additionalProperties",
                                 NULL};

static int compile_node(nd_grammar *g, const nd_pj *s, const char *path, int depth);

static int compile_object(nd_grammar *g, const nd_pj *s, const char *path, int depth)
{
    const nd_pj *props = nd_pj_get(s, "properties");
    if (!props || props->type != ND_PJ_OBJECT) {
        if (props)
            warnf(g, "%s: 'properties' is not an object; any object is allowed", path);
        return N_GOBJ;
    }
    if (props->len > ND_GRAM_MAX_ALT)
        return nd_error(ND_ELIMIT, "%s: more than %d properties", path, ND_GRAM_MAX_ALT);
    int id = new_node(g, K_OBJ);
    if (id < 0)
        return id;
    int np = (int)props->len;
    char **key = calloc((size_t)np + 1, sizeof *key);
    int *keylen = calloc((size_t)np + 1, sizeof *keylen),
        *prop = calloc((size_t)np + 1, sizeof *prop);
    g->nodes[id].key = key;
    g->nodes[id].keylen = keylen;
    g->nodes[id].prop = prop;
    if (!key || !keylen || !prop)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < np; i++) {
        const nd_pj_member *mb = &props->obj[i];
        nd_pj ks = {0};
        ks.type = ND_PJ_STRING;
        ks.str = mb->key;
        ks.len = mb->key_len;
        key[i] = dump_value(&ks, &keylen[i]);
        if (!key[i])
            return nd_error(ND_ENOMEM, "out of memory");
        g->nodes[id].nprops = i + 1;
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%.*s", path, (int)(mb->key_len > 64 ? 64 : mb->key_len),
                 mb->key);
        int c = compile_node(g, mb->val, sub, depth + 1);
        if (c < 0)
            return c;
        g->nodes[id].prop[i] = c;
    }
    const nd_pj *req = nd_pj_get(s, "required");
    if (req && req->type == ND_PJ_ARRAY) {
        for (size_t r = 0; r < req->len; r++) {
            const nd_pj *k = req->items[r];
            int found = -1;
            for (int i = 0; k->type == ND_PJ_STRING && i < np; i++)
                if (props->obj[i].key_len == k->len && !memcmp(props->obj[i].key, k->str, k->len))
                    found = i;
            if (found < 0)
                warnf(g, "%s: required property %s is not declared; ignored", path,
                      k->type == ND_PJ_STRING ? k->str : "(not a string)");
            else
                g->nodes[id].required |= 1ull << found;
        }
    } else if (req) {
        warnf(g, "%s: 'required' is not an array; ignored", path);
    }
    return id;
}

static int compile_node(nd_grammar *g, const nd_pj *s, const char *path, int depth)
{
    if (depth > 16)
        return nd_error(ND_ELIMIT, "%s: schema nested deeper than 16 levels", path);
    if (!s || s->type != ND_PJ_OBJECT) {
        if (!(s && s->type == ND_PJ_TRUE))
            warnf(g, "%s: schema is not an object; any value is allowed", path);
        return N_ANY;
    }
    for (size_t i = 0; i < s->len; i++) {
        int known = 0;
        for (int k = 0; known_kw[k]; k++)
            if (strlen(known_kw[k]) == s->obj[i].key_len &&
                !memcmp(known_kw[k], s->obj[i].key, s->obj[i].key_len))
                known = 1;
        if (!known)
            warnf(g, "%s: schema keyword '%.*s' is not supported and was ignored", path,
                  (int)(s->obj[i].key_len > 64 ? 64 : s->obj[i].key_len), s->obj[i].key);
    }
    const nd_pj *en = nd_pj_get(s, "enum"), *cn = nd_pj_get(s, "const");
    if (cn || (en && en->type == ND_PJ_ARRAY && en->len)) {
        int id = new_node(g, K_LIT);
        if (id < 0)
            return id;
        size_t nv = cn ? 1 : en->len;
        for (size_t i = 0; i < nv; i++) {
            int len;
            char *txt = dump_value(cn ? cn : en->items[i], &len);
            if (!txt)
                return nd_error(ND_ENOMEM, "out of memory");
            int rc = add_lit(g, id, txt, len);
            free(txt);
            if (rc)
                return nd_error_prefix(rc, "%s", path);
        }
        return id;
    }
    if (en)
        warnf(g, "%s: 'enum' is not a non-empty array; ignored", path);
    const nd_pj *ty = nd_pj_get(s, "type");
    const char *t = NULL;
    if (ty && ty->type == ND_PJ_STRING)
        t = ty->str;
    else if (ty)
        warnf(g, "%s: a 'type' list is not enforced; any value is allowed", path);
    if (!t) {
        if (nd_pj_get(s, "properties"))
            return compile_object(g, s, path, depth);
        return N_ANY;
    }
    if (!strcmp(t, "object"))
        return compile_object(g, s, path, depth);
    if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        int id = new_node(g, K_LIT);
        if (id < 0)
            return id;
        int rc = !strcmp(t, "null") ? add_lit(g, id, "null", 4)
                                    : (add_lit(g, id, "true", 4) ? -1 : add_lit(g, id, "false", 5));
        return rc ? rc : id;
    }
    if (!strcmp(t, "string")) {
        int id = new_node(g, K_STR);
        if (id < 0)
            return id;
        long long v;
        const nd_pj *mn = nd_pj_get(s, "minLength"), *mx = nd_pj_get(s, "maxLength");
        if (mn && is_int_value(mn, &v) && v >= 0)
            g->nodes[id].min_len = v > 100000 ? 100000 : (int)v;
        else if (mn)
            warnf(g, "%s: bad minLength ignored", path);
        if (mx && is_int_value(mx, &v) && v >= 0)
            g->nodes[id].max_len = v > 100000 ? 100000 : (int)v;
        else if (mx)
            warnf(g, "%s: bad maxLength ignored", path);
        if (g->nodes[id].max_len >= 0 && g->nodes[id].max_len < g->nodes[id].min_len) {
            warnf(g, "%s: maxLength < minLength; maxLength ignored", path);
            g->nodes[id].max_len = -1;
        }
        const nd_pj *pt = nd_pj_get(s, "pattern");
        if (pt && pt->type == ND_PJ_STRING) {
            nd_regex *re = malloc(sizeof *re);
            if (!re)
                return nd_error(ND_ENOMEM, "out of memory");
            if (nd_re_compile(pt->str, re)) {
                warnf(g, "%s: pattern ignored: %s", path, nd_last_error());
                free(re);
            } else {
                int need = nd_re_dist(re, nd_re_initial(re));
                if (g->nodes[id].max_len >= 0 && need > g->nodes[id].max_len) {
                    warnf(g,
                          "%s: pattern needs %d characters but maxLength is %d; pattern "
                          "ignored",
                          path, need, g->nodes[id].max_len);
                    free(re);
                } else if (nd_re_len_min(re, nd_re_initial(re), g->nodes[id].min_len,
                                         g->nodes[id].max_len >= 0 ? g->nodes[id].max_len
                                                                   : INT_MAX) < 0) {
                    /* e.g. "^@[a-z]$" with minLength 9: no string satisfies
                     * both, and a required property would be a dead end */
                    warnf(g, "%s: pattern admits no string of the allowed length; pattern ignored",
                          path);
                    free(re);
                } else {
                    g->nodes[id].re = re;
                }
            }
        } else if (pt) {
            warnf(g, "%s: pattern is not a string; ignored", path);
        }
        return id;
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        int id = new_node(g, !strcmp(t, "integer") ? K_INT : K_NUM);
        if (id < 0)
            return id;
        gnode *n = &g->nodes[id];
        double x;
        const nd_pj *v;
        if ((v = nd_pj_get(s, "minimum")) && is_number(v, &x))
            n->lo = x;
        if ((v = nd_pj_get(s, "maximum")) && is_number(v, &x))
            n->hi = x;
        if ((v = nd_pj_get(s, "exclusiveMinimum"))) {
            if (is_number(v, &x)) {
                if (x >= n->lo) {
                    n->lo = x;
                    n->lo_ex = 1;
                }
            } else if (v->type == ND_PJ_TRUE) {
                n->lo_ex = 1;
            }
        }
        if ((v = nd_pj_get(s, "exclusiveMaximum"))) {
            if (is_number(v, &x)) {
                if (x <= n->hi) {
                    n->hi = x;
                    n->hi_ex = 1;
                }
            } else if (v->type == ND_PJ_TRUE) {
                n->hi_ex = 1;
            }
        }
        if (nd_gram_num_minlen(n) < 0) {
            warnf(g, "%s: no %s with at most %d digits fits the bounds; bounds ignored", path, t,
                  MAX_DIGITS);
            n->lo = -INFINITY;
            n->hi = INFINITY;
            n->lo_ex = n->hi_ex = 0;
        }
        return id;
    }
    if (!strcmp(t, "array")) {
        const nd_pj *it = nd_pj_get(s, "items");
        int item = N_ANY;
        if (it && it->type == ND_PJ_OBJECT) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[]", path);
            item = compile_node(g, it, sub, depth + 1);
            if (item < 0)
                return item;
        } else if (it) {
            warnf(g, "%s: 'items' that is not a schema object is not enforced", path);
        }
        int id = new_node(g, K_ARR);
        if (id < 0)
            return id;
        gnode *n = &g->nodes[id];
        n->item = item;
        long long v;
        const nd_pj *mn = nd_pj_get(s, "minItems"), *mx = nd_pj_get(s, "maxItems");
        if (mn && is_int_value(mn, &v) && v >= 0)
            n->min_items = v > 1000 ? 1000 : (int)v;
        if (mx && is_int_value(mx, &v) && v >= 0)
            n->max_items = v > 100000 ? 100000 : (int)v;
        if (n->max_items >= 0 && n->max_items < n->min_items) {
            warnf(g, "%s: maxItems < minItems; maxItems ignored", path);
            n->max_items = -1;
        }
        return id;
    }
    warnf(g, "%s: unknown type '%s'; any value is allowed", path, t);
    return N_ANY;
}

static int node_minlen(nd_grammar *g, int id)
{
    gnode *n = &g->nodes[id];
    switch (n->kind) {
    case K_ANY: return 1;
    case K_GOBJ:
    case K_GARR: return 2;
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
            if (n->required >> i & 1) {
                m += (k++ ? 1 : 0) + n->keylen[i] + 1 + node_minlen(g, n->prop[i]);
            }
        return m;
    }
    }
    return 1;
}

int nd_gram_compile(const nd_pj *tools, nd_grammar **out)
{
    *out = NULL;
    if (!tools || tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "tools must be a JSON array of tool objects");
    if (tools->len > ND_GRAM_MAX_ALT)
        return nd_error(ND_ELIMIT, "%zu tools declared; at most %d are supported", tools->len,
                        ND_GRAM_MAX_ALT);
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
    g->tools = calloc(tools->len + 1, sizeof *g->tools);
    if (!g->tools) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < tools->len; i++) {
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
    /* minimum serialised lengths (node_minlen recurses into children) */
    for (int i = 0; i < g->n_nodes; i++)
        g->nodes[i].minlen = node_minlen(g, i);
    g->call_fixed = (int)strlen(PFX1) + (int)strlen(PFX2) + 1;
    *out = g;
    return ND_OK;
fail:
    nd_gram_free(g);
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
        for (int k = 0; k < n->nlit; k++)
            free(n->lit[k]);
        free(n->lit);
        free(n->litlen);
        free(n->re);
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
