/* Tool-call grammar (see grammar.h). */
#include "engine/grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/regex.h"

enum { K_ANY, K_OBJ, K_GOBJ, K_STR, K_INT, K_NUM, K_LIT, K_ARR, K_GARR };
/* built-in nodes */
enum { N_ANY, N_STR, N_NUM, N_TFN, N_GOBJ, N_GARR, N_BUILTIN };

enum { FR_TOP, FR_CALL, FR_OBJ, FR_GOBJ, FR_STR, FR_NUM, FR_LIT, FR_ARR, FR_GARR, FR_ANY };
enum { R_REJ, R_ACC, R_ACC_POP, R_POP, R_RETRY };

#define MAX_CALLS 16
#define MAX_DIGITS 15

typedef struct {
    int kind, minlen;
    /* object */
    int nprops;
    char **key; /* serialised with quotes */
    int *keylen, *prop;
    uint64_t required;
    /* string */
    int min_len, max_len;
    nd_regex *re;
    /* number */
    double lo, hi;
    int lo_ex, hi_ex;
    /* literal */
    int nlit;
    char **lit;
    int *litlen;
    /* array */
    int item, min_items, max_items;
} gnode;

typedef struct {
    char *name; /* serialised with quotes */
    int namelen, args;
} gtool;

struct nd_grammar {
    gnode *nodes;
    int n_nodes, cap_nodes;
    gtool *tools;
    int n_tools;
    int call_fixed; /* len of {"name": + ,"arguments": + } */
    int require_call;
    nd_buf warn;
};

static const char PFX1[] = "{\"name\":";
static const char PFX2[] = ",\"arguments\":";

/* ------------------------------------------------------------------ */
/* numbers                                                             */

static const int64_t P10[19] = {1,
                                10,
                                100,
                                1000,
                                10000,
                                100000,
                                1000000,
                                10000000,
                                100000000,
                                1000000000,
                                10000000000,
                                100000000000,
                                1000000000000,
                                10000000000000,
                                100000000000000,
                                1000000000000000,
                                10000000000000000,
                                100000000000000000,
                                1000000000000000000};

/* K * 10^-ft as the double a JSON parser reads from its decimal text, so
 * bound checks agree with any validator comparing parsed floats */
static double decimal_value(int64_t K, int ft)
{
    char buf[48];
    int n = snprintf(buf, sizeof buf, "%0*lld", ft + 1, (long long)K);
    if (ft > 0) {
        memmove(buf + n - ft + 1, buf + n - ft, (size_t)ft + 1);
        buf[n - ft] = '.';
    }
    return strtod(buf, NULL);
}

typedef struct {
    double lo, hi;
    int lo_ex, hi_ex;
} mag_bounds;

static int ok_lo(const mag_bounds *b, double m)
{
    return b->lo_ex ? m > b->lo : m >= b->lo;
}

static int ok_hi(const mag_bounds *b, double m)
{
    return b->hi_ex ? m < b->hi : m <= b->hi;
}

/* some K in [Klo, Khi] (units of 10^-ft) within the magnitude bounds? */
static int range_feasible(const mag_bounds *b, int64_t Klo, int64_t Khi, int ft)
{
    int64_t K = Klo;
    if (!ok_lo(b, decimal_value(Klo, ft))) {
        double x = ceil(b->lo * (double)P10[ft]);
        if (x > (double)Khi + 1)
            return 0;
        K = x < (double)Klo ? Klo : (int64_t)x;
        for (int i = 0; i < 4 && K > Klo && ok_lo(b, decimal_value(K - 1, ft)); i++)
            K--;
        for (int i = 0; i < 4 && K <= Khi && !ok_lo(b, decimal_value(K, ft)); i++)
            K++;
        if (K > Khi || !ok_lo(b, decimal_value(K, ft)))
            return 0;
    }
    return ok_hi(b, decimal_value(K, ft));
}

/* Fewest characters to append to the number prefix t[0..len) so that it
 * becomes a number the node admits (no exponent, <= MAX_DIGITS digits);
 * -1 if none. */
static int num_short(const gnode *n, const char *t, int len)
{
    int i = 0, neg = 0;
    if (i < len && t[i] == '-') {
        neg = 1;
        i++;
    }
    int is = i;
    int64_t ival = 0, fval = 0;
    while (i < len && t[i] >= '0' && t[i] <= '9' && i - is < MAX_DIGITS)
        ival = ival * 10 + (t[i++] - '0');
    int ni = i - is, dot = 0, nf = 0;
    if (i < len && t[i] == '.') {
        dot = 1;
        i++;
        while (i < len && t[i] >= '0' && t[i] <= '9' && ni + nf < MAX_DIGITS) {
            fval = fval * 10 + (t[i++] - '0');
            nf++;
        }
    }
    if (i != len)
        return -1;
    mag_bounds b;
    if (!neg)
        b = (mag_bounds){n->lo, n->hi, n->lo_ex, n->hi_ex};
    else
        b = (mag_bounds){-n->hi, -n->lo, n->hi_ex, n->lo_ex};
    if (b.lo < 0 || (b.lo == 0 && !b.lo_ex && neg)) {
        b.lo = 0;
        b.lo_ex = 0;
    }
    int unbounded = isinf(n->lo) && isinf(n->hi);
    int allow_frac = n->kind != K_INT;
    int lead0 = ni > 0 && t[is] == '0';
    for (int L = 0; L <= MAX_DIGITS + 2; L++) {
        for (int e = 0; e <= L; e++) {
            if ((dot || lead0) && e > 0)
                break;
            if (ni + e == 0)
                continue;
            int rem = L - e, ft;
            if (dot)
                ft = nf + rem;
            else if (rem == 0)
                ft = 0;
            else if (rem >= 2 && allow_frac)
                ft = rem - 1;
            else
                continue;
            if (dot && ft < 1)
                continue;
            if (ni + e + ft > MAX_DIGITS)
                continue;
            if (unbounded)
                return L;
            int64_t Ilo, Ihi;
            if (ni == 0) {
                Ilo = e == 1 ? 0 : P10[e - 1];
                Ihi = P10[e] - 1;
            } else {
                Ilo = ival * P10[e];
                Ihi = Ilo + P10[e] - 1;
            }
            int64_t Klo, Khi;
            if (dot) {
                Klo = ival * P10[ft] + fval * P10[ft - nf];
                Khi = Klo + P10[ft - nf] - 1;
            } else {
                Klo = Ilo * P10[ft];
                Khi = Ihi * P10[ft] + P10[ft] - 1;
            }
            if (range_feasible(&b, Klo, Khi, ft))
                return L;
        }
    }
    return -1;
}

/* Is t[0..len) a syntactically possible number prefix for the node? */
static int num_syntax(const gnode *n, const char *t, int len)
{
    int i = 0, digits = 0;
    if (i < len && t[i] == '-')
        i++;
    int is = i;
    while (i < len && t[i] >= '0' && t[i] <= '9') {
        i++;
        digits++;
    }
    if (i - is > 1 && t[is] == '0')
        return 0;
    if (i < len && t[i] == '.') {
        if (n->kind == K_INT || i == is)
            return 0;
        i++;
        while (i < len && t[i] >= '0' && t[i] <= '9') {
            i++;
            digits++;
        }
    }
    return i == len && digits <= MAX_DIGITS;
}

static int num_minlen(const gnode *n)
{
    int a = num_short(n, "", 0), b = num_short(n, "-", 1);
    if (a < 0)
        return b < 0 ? -1 : b + 1;
    return b < 0 || a <= b + 1 ? a : b + 1;
}

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
        if (num_minlen(n) < 0) {
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
        if (n->re) {
            int d = nd_re_dist(n->re, nd_re_initial(n->re));
            m = d > m ? d : m;
        }
        return 2 + m;
    }
    case K_INT:
    case K_NUM: return num_minlen(n);
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

/* ------------------------------------------------------------------ */
/* the automaton                                                       */

static int frame_kind(const nd_grammar *g, int node)
{
    switch (g->nodes[node].kind) {
    case K_OBJ: return FR_OBJ;
    case K_GOBJ: return FR_GOBJ;
    case K_STR: return FR_STR;
    case K_INT:
    case K_NUM: return FR_NUM;
    case K_LIT: return FR_LIT;
    case K_ARR: return FR_ARR;
    case K_GARR: return FR_GARR;
    default: return FR_ANY;
    }
}

static void frame_set(const nd_grammar *g, nd_gram_frame *f, int node)
{
    memset(f, 0, sizeof *f);
    f->node = (uint16_t)node;
    f->kind = (uint8_t)frame_kind(g, node);
    const gnode *n = &g->nodes[node];
    if (f->kind == FR_LIT)
        f->mask = n->nlit >= 64 ? ~0ull : (1ull << n->nlit) - 1;
    if (f->kind == FR_STR && n->re) {
        nd_re_set r = nd_re_initial(n->re);
        f->re[0] = r.w[0];
        f->re[1] = r.w[1];
    }
}

static int push(const nd_grammar *g, nd_gram_state *s, int node)
{
    if (s->depth >= ND_GRAM_DEPTH)
        return 0;
    frame_set(g, &s->f[s->depth++], node);
    return 1;
}

void nd_gram_init(const nd_grammar *g, nd_gram_state *s)
{
    (void)g;
    s->depth = 1;
    memset(&s->f[0], 0, sizeof s->f[0]);
    s->f[0].kind = FR_TOP;
}

int nd_gram_done(const nd_gram_state *s)
{
    return s->depth == 1 && s->f[0].kind == FR_TOP && s->f[0].phase == 4;
}

static uint64_t all_bits(int n)
{
    return n >= 64 ? ~0ull : (1ull << n) - 1;
}

/* one character of string content (ASCII ch, or -1 for a non-ASCII / \u
 * character, which a pattern string never admits) */
static int str_char(const gnode *n, nd_gram_frame *f, int ch)
{
    if (n->re) {
        if (ch < 0)
            return 0;
        nd_re_set r = {{f->re[0], f->re[1]}};
        r = nd_re_step(n->re, r, ch);
        if (nd_re_empty(r))
            return 0;
        if (n->max_len >= 0 && f->count + 1 + nd_re_dist(n->re, r) > n->max_len)
            return 0;
        f->re[0] = r.w[0];
        f->re[1] = r.w[1];
    } else if (n->max_len >= 0 && f->count + 1 > n->max_len) {
        return 0;
    }
    f->count++;
    return 1;
}

static int step_str(const nd_grammar *g, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    if (f->phase == 0) {
        if (b != '"')
            return R_REJ;
        f->phase = 1;
        return R_ACC;
    }
    if (f->u8left) {
        if (b < f->u8lo || b > f->u8hi)
            return R_REJ;
        f->u8left--;
        f->u8lo = 0x80;
        f->u8hi = 0xBF;
        return R_ACC;
    }
    if (f->esc == 1) {
        static const char simple[] = "\"\\/bfnrt";
        const char *p = b ? strchr(simple, b) : NULL;
        if (p) {
            static const char dec[] = "\"\\/\b\f\n\r\t";
            if (!str_char(n, f, dec[p - simple]))
                return R_REJ;
            f->esc = 0;
            return R_ACC;
        }
        if (b == 'u' && !n->re) {
            if (!str_char(n, f, -1))
                return R_REJ;
            f->esc = 5;
            return R_ACC;
        }
        return R_REJ;
    }
    if (f->esc >= 2) {
        int hex = (b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'f');
        if (!hex)
            return R_REJ;
        f->esc = f->esc == 2 ? 0 : (uint8_t)(f->esc - 1);
        return R_ACC;
    }
    if (b == '"') {
        if (f->count < n->min_len)
            return R_REJ;
        if (n->re) {
            nd_re_set r = {{f->re[0], f->re[1]}};
            if (!nd_re_accepts(n->re, r))
                return R_REJ;
        }
        return R_ACC_POP;
    }
    if (b == '\\') {
        if (n->max_len >= 0 && f->count + 1 > n->max_len)
            return R_REJ;
        if (n->re) {
            nd_gram_frame t = *f;
            if (!str_char(n, &t, '"') && !(t = *f, str_char(n, &t, '\\')) &&
                !(t = *f, str_char(n, &t, '/')))
                return R_REJ;
        }
        f->esc = 1;
        return R_ACC;
    }
    if (b < 0x20)
        return R_REJ;
    if (b < 0x80)
        return str_char(n, f, b) ? R_ACC : R_REJ;
    if (n->re)
        return R_REJ;
    uint8_t left, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        left = 1;
    else if (b >= 0xE0 && b <= 0xEF) {
        left = 2;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        left = 3;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        return R_REJ;
    }
    if (!str_char(n, f, -1))
        return R_REJ;
    f->u8left = left;
    f->u8lo = lo;
    f->u8hi = hi;
    return R_ACC;
}

static int step_num(const nd_grammar *g, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    if ((b >= '0' && b <= '9') || b == '-' || b == '.') {
        if (f->nlen + 1 >= (int)sizeof f->num)
            return R_REJ;
        char t[sizeof f->num];
        memcpy(t, f->num, f->nlen);
        t[f->nlen] = (char)b;
        int len = f->nlen + 1;
        if (!num_syntax(n, t, len) || num_short(n, t, len) < 0)
            return R_REJ;
        f->num[f->nlen++] = (char)b;
        return R_ACC;
    }
    return f->nlen && num_short(n, f->num, f->nlen) == 0 ? R_POP : R_REJ;
}

static int step_lit(const nd_grammar *g, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    uint64_t nm = 0;
    int complete_now = 0, longer = 0;
    for (int i = 0; i < n->nlit; i++) {
        if (!(f->mask >> i & 1))
            continue;
        if (n->litlen[i] == f->count)
            complete_now = 1;
        else if ((unsigned char)n->lit[i][f->count] == b) {
            nm |= 1ull << i;
            if (n->litlen[i] > f->count + 1)
                longer = 1;
        }
    }
    if (!nm)
        return complete_now ? R_POP : R_REJ;
    f->mask = nm;
    f->count++;
    return longer ? R_ACC : R_ACC_POP;
}

static int step(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    switch (f->kind) {
    case FR_TOP:
        switch (f->phase) {
        case 0:
            if (b != '[')
                return R_REJ;
            f->phase = 1;
            return R_ACC;
        case 1:
        case 5:
            if (b == ']' && f->phase == 1 && !g->require_call) {
                f->phase = 4;
                return R_ACC;
            }
            if (b != '{' || !g->n_tools || s->depth >= ND_GRAM_DEPTH)
                return R_REJ;
            f->phase = 2;
            f->count++;
            memset(&s->f[s->depth], 0, sizeof s->f[0]);
            s->f[s->depth++].kind = FR_CALL;
            return R_RETRY;
        case 3:
            if (b == ']') {
                f->phase = 4;
                return R_ACC;
            }
            if (b == ',' && f->count < MAX_CALLS) {
                f->phase = 5;
                return R_ACC;
            }
            return R_REJ;
        default: return R_REJ;
        }
    case FR_CALL:
        switch (f->phase) {
        case 0:
            if ((unsigned char)PFX1[f->count] != b)
                return R_REJ;
            if (!PFX1[++f->count]) {
                f->phase = 1;
                f->count = 0;
                f->mask = all_bits(g->n_tools);
            }
            return R_ACC;
        case 1: {
            uint64_t nm = 0;
            int done = -1;
            for (int i = 0; i < g->n_tools; i++)
                if ((f->mask >> i & 1) && g->tools[i].namelen > f->count &&
                    (unsigned char)g->tools[i].name[f->count] == b) {
                    nm |= 1ull << i;
                    if (g->tools[i].namelen == f->count + 1)
                        done = i;
                }
            if (!nm)
                return R_REJ;
            f->mask = nm;
            f->count++;
            if (done >= 0) {
                f->cur = done;
                f->phase = 2;
                f->count = 0;
            }
            return R_ACC;
        }
        case 2:
            if ((unsigned char)PFX2[f->count] != b)
                return R_REJ;
            if (!PFX2[++f->count])
                f->phase = 3;
            return R_ACC;
        case 3:
            if (!push(g, s, g->tools[f->cur].args))
                return R_REJ;
            f->phase = 4;
            return R_RETRY;
        case 5: return b == '}' ? R_ACC_POP : R_REJ;
        default: return R_REJ;
        }
    case FR_OBJ: {
        uint64_t used = f->re[0], missing = n->required & ~used;
        switch (f->phase) {
        case 0:
            if (b != '{')
                return R_REJ;
            f->phase = 1;
            return R_ACC;
        case 1:
        case 7:
            if (b == '}' && f->phase == 1)
                return missing ? R_REJ : R_ACC_POP;
            f->mask = 0;
            for (int i = 0; i < n->nprops; i++)
                if (!(used >> i & 1) && (unsigned char)n->key[i][0] == b)
                    f->mask |= 1ull << i;
            if (!f->mask)
                return R_REJ;
            f->count = 1;
            f->phase = 2;
            return R_ACC;
        case 2: {
            uint64_t nm = 0;
            int done = -1;
            for (int i = 0; i < n->nprops; i++)
                if ((f->mask >> i & 1) && n->keylen[i] > f->count &&
                    (unsigned char)n->key[i][f->count] == b) {
                    nm |= 1ull << i;
                    if (n->keylen[i] == f->count + 1)
                        done = i;
                }
            if (!nm)
                return R_REJ;
            f->mask = nm;
            f->count++;
            if (done >= 0) {
                f->cur = done;
                f->re[0] |= 1ull << done;
                f->phase = 3;
            }
            return R_ACC;
        }
        case 3:
            if (b != ':')
                return R_REJ;
            f->phase = 4;
            return R_ACC;
        case 4:
            if (!push(g, s, n->prop[f->cur]))
                return R_REJ;
            f->phase = 5;
            return R_RETRY;
        case 6:
            if (b == '}')
                return missing ? R_REJ : R_ACC_POP;
            if (b == ',' && (used != all_bits(n->nprops))) {
                f->phase = 7;
                return R_ACC;
            }
            return R_REJ;
        default: return R_REJ;
        }
    }
    case FR_GOBJ:
        switch (f->phase) {
        case 0:
            if (b != '{')
                return R_REJ;
            f->phase = 1;
            return R_ACC;
        case 1:
        case 7:
            if (b == '}' && f->phase == 1)
                return R_ACC_POP;
            if (b != '"' || !push(g, s, N_STR))
                return R_REJ;
            f->phase = 2;
            return R_RETRY;
        case 3:
            if (b != ':')
                return R_REJ;
            f->phase = 4;
            return R_ACC;
        case 4:
            if (!push(g, s, N_ANY))
                return R_REJ;
            f->phase = 5;
            return R_RETRY;
        case 6:
            if (b == '}')
                return R_ACC_POP;
            if (b == ',') {
                f->phase = 7;
                return R_ACC;
            }
            return R_REJ;
        default: return R_REJ;
        }
    case FR_ARR:
    case FR_GARR: {
        int item = f->kind == FR_ARR ? n->item : N_ANY;
        int min = f->kind == FR_ARR ? n->min_items : 0, max = f->kind == FR_ARR ? n->max_items : -1;
        switch (f->phase) {
        case 0:
            if (b != '[')
                return R_REJ;
            f->phase = 1;
            return R_ACC;
        case 1:
        case 4:
            if (b == ']' && f->phase == 1)
                return min == 0 ? R_ACC_POP : R_REJ;
            if (max == 0 || !push(g, s, item))
                return R_REJ;
            f->count++;
            f->phase = 2;
            return R_RETRY;
        case 3:
            if (b == ']')
                return f->count >= min ? R_ACC_POP : R_REJ;
            if (b == ',' && (max < 0 || f->count < max)) {
                f->phase = 4;
                return R_ACC;
            }
            return R_REJ;
        default: return R_REJ;
        }
    }
    case FR_ANY: {
        int node;
        if (b == '{' || b == '[') {
            if (s->depth >= ND_GRAM_DEPTH - 2)
                return R_REJ;
            node = b == '{' ? N_GOBJ : N_GARR;
        } else if (b == '"')
            node = N_STR;
        else if (b == '-' || (b >= '0' && b <= '9'))
            node = N_NUM;
        else if (b == 't' || b == 'f' || b == 'n')
            node = N_TFN;
        else
            return R_REJ;
        frame_set(g, f, node);
        return R_RETRY;
    }
    case FR_STR: return step_str(g, f, b);
    case FR_NUM: return step_num(g, f, b);
    case FR_LIT: return step_lit(g, f, b);
    }
    return R_REJ;
}

int nd_gram_feed(const nd_grammar *g, nd_gram_state *s, unsigned char b)
{
    for (int guard = 0; guard < 4 * ND_GRAM_DEPTH; guard++) {
        if (s->depth < 1)
            return 0;
        nd_gram_frame *f = &s->f[s->depth - 1];
        int r = step(g, s, f, b);
        switch (r) {
        case R_ACC: return 1;
        case R_REJ: return 0;
        case R_RETRY: continue;
        case R_ACC_POP:
        case R_POP:
            if (s->depth < 2)
                return 0;
            s->depth--;
            s->f[s->depth - 1].phase++;
            if (r == R_ACC_POP)
                return 1;
            continue;
        }
    }
    return 0;
}

/* ---- distance to completion ---- */

static int obj_rest(const nd_grammar *g, const gnode *n, uint64_t used)
{
    int m = 1;
    for (int i = 0; i < n->nprops; i++)
        if ((n->required >> i & 1) && !(used >> i & 1))
            m += 1 + n->keylen[i] + 1 + g->nodes[n->prop[i]].minlen;
    return m;
}

static int call_min(const nd_grammar *g, uint64_t mask, int pos)
{
    int best = 1 << 29;
    for (int i = 0; i < g->n_tools; i++)
        if (mask >> i & 1) {
            int v = g->tools[i].namelen - pos + g->nodes[g->tools[i].args].minlen;
            best = v < best ? v : best;
        }
    return best + (int)strlen(PFX2) + 1;
}

static int frame_dist(const nd_grammar *g, const nd_gram_frame *f)
{
    const gnode *n = &g->nodes[f->node];
    switch (f->kind) {
    case FR_TOP:
        switch (f->phase) {
        case 0:
        case 1:
            if (g->require_call)
                return (f->phase == 0) + (int)strlen(PFX1) + call_min(g, all_bits(g->n_tools), 0) +
                       1;
            return f->phase == 0 ? 2 : 1;
        case 2:
        case 3: return 1;
        case 5: return (int)strlen(PFX1) + call_min(g, all_bits(g->n_tools), 0) + 1;
        default: return 0;
        }
    case FR_CALL:
        switch (f->phase) {
        case 0: return (int)strlen(PFX1) - f->count + call_min(g, all_bits(g->n_tools), 0);
        case 1: return call_min(g, f->mask, f->count);
        case 2: return (int)strlen(PFX2) - f->count + g->nodes[g->tools[f->cur].args].minlen + 1;
        case 3: return g->nodes[g->tools[f->cur].args].minlen + 1;
        default: return 1;
        }
    case FR_OBJ: {
        uint64_t used = f->re[0];
        switch (f->phase) {
        case 0: return n->minlen;
        case 1: return n->minlen - 1;
        case 2: {
            int best = 1 << 29;
            for (int i = 0; i < n->nprops; i++)
                if (f->mask >> i & 1) {
                    int v = n->keylen[i] - f->count + 1 + g->nodes[n->prop[i]].minlen +
                            obj_rest(g, n, used | 1ull << i);
                    best = v < best ? v : best;
                }
            return best;
        }
        case 3: return 1 + g->nodes[n->prop[f->cur]].minlen + obj_rest(g, n, used);
        case 4: return g->nodes[n->prop[f->cur]].minlen + obj_rest(g, n, used);
        case 7: {
            int best = 1 << 29;
            for (int i = 0; i < n->nprops; i++)
                if (!(used >> i & 1)) {
                    int v = n->keylen[i] + 1 + g->nodes[n->prop[i]].minlen +
                            obj_rest(g, n, used | 1ull << i);
                    best = v < best ? v : best;
                }
            return best;
        }
        default: return obj_rest(g, n, used);
        }
    }
    case FR_GOBJ:
        switch (f->phase) {
        case 0: return 2;
        case 1: return 1;
        case 2:
        case 3: return 3;
        case 4: return 2;
        case 7: return 5;
        default: return 1;
        }
    case FR_ARR:
    case FR_GARR: {
        int min = f->kind == FR_ARR ? n->min_items : 0;
        int im = g->nodes[f->kind == FR_ARR ? n->item : N_ANY].minlen;
        switch (f->phase) {
        case 0: return f->kind == FR_ARR ? n->minlen : 2;
        case 1: return min ? min * im + (min - 1) + 1 : 1;
        case 4: {
            int left = min - f->count - 1;
            return im + (left > 0 ? left * (1 + im) : 0) + 1;
        }
        default: {
            int left = min - f->count;
            return (left > 0 ? left * (1 + im) : 0) + 1;
        }
        }
    }
    case FR_ANY: return 1;
    case FR_STR: {
        if (f->phase == 0)
            return n->minlen;
        int pend = f->u8left + (f->esc == 1 ? 1 : f->esc >= 2 ? f->esc - 1 : 0);
        /* after a backslash the escaped character is not counted yet */
        int need = n->min_len - f->count - (f->esc == 1);
        if (n->re) {
            nd_re_set r = {{f->re[0], f->re[1]}};
            int d = nd_re_dist(n->re, r);
            need = d > need ? d : need;
        }
        return pend + (need > 0 ? need : 0) + 1;
    }
    case FR_NUM: {
        if (!f->nlen)
            return n->minlen;
        int v = num_short(n, f->num, f->nlen);
        return v < 0 ? 1 << 20 : v;
    }
    case FR_LIT: {
        int best = 1 << 29;
        for (int i = 0; i < n->nlit; i++)
            if ((f->mask >> i & 1) && n->litlen[i] - f->count < best)
                best = n->litlen[i] - f->count;
        return best;
    }
    }
    return 0;
}

int nd_gram_dist(const nd_grammar *g, const nd_gram_state *s)
{
    int d = 0;
    for (int i = 0; i < s->depth; i++)
        d += frame_dist(g, &s->f[i]);
    return d;
}
