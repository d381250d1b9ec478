/* Python-compatible JSON: a hand-written parser (jansson cannot keep big
 * integers or duplicate-key positions the way Python does) and a
 * json.dumps-compatible serialiser. */
#include "text/pyjson.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

#define MAX_DEPTH 1000      /* Python's default recursion limit */
#define MAX_INT_DIGITS 4300 /* sys.int_info.default_max_str_digits */
#define CHUNK ((size_t)1 << 16)

/* ---- arena ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct nd_pj_doc {
    chunk *chunks;
    nd_pj *root;
};

static void *arena_alloc(nd_pj_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK ? n : CHUNK;
        chunk *nc = malloc(sizeof *nc + cap);
        if (!nc)
            return NULL;
        nc->used = 0;
        nc->cap = cap;
        /* A dedicated oversize chunk goes behind the current one so the
         * current chunk's free space stays usable. */
        if (c && n > CHUNK) {
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            d->chunks = nc;
        }
        c = nc;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

void nd_pj_free(nd_pj_doc *d)
{
    if (!d)
        return;
    chunk *c = d->chunks;
    while (c) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
    free(d);
}

const nd_pj *nd_pj_root(const nd_pj_doc *d)
{
    return d ? d->root : NULL;
}

/* ---- buffer ---- */

int nd_buf_put(nd_buf *b, const char *s, size_t n)
{
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1) {
            if (cap > SIZE_MAX / 2)
                return nd_error(ND_ENOMEM, "buffer too large");
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p)
            return nd_error(ND_ENOMEM, "out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void nd_buf_free(nd_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- parser ---- */

typedef struct {
    const unsigned char *s, *end, *base;
    nd_pj_doc *doc;
    nd_pj **stack; /* pending array items, shared by all nesting levels */
    size_t sn, scap;
    nd_pj_member *mstack; /* pending object members */
    size_t mn, mcap;
    int depth;
} parser;

static int perr(parser *p, const unsigned char *at, int code, const char *what)
{
    return nd_error(code, "column %zu: %s", (size_t)(at - p->base) + 1, what);
}

static void skip_ws(parser *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static nd_pj *new_val(parser *p, nd_pj_type t)
{
    nd_pj *v = arena_alloc(p->doc, sizeof *v);
    if (v) {
        memset(v, 0, sizeof *v);
        v->type = t;
    }
    return v;
}

static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) { /* includes lone surrogates (generalised UTF-8) */
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* p->s is just past the opening quote. */
static int parse_string(parser *p, const char **out, size_t *out_len)
{
    const unsigned char *start = p->s, *q = p->s;
    while (q < p->end && *q != '"') {
        if (*q < 0x20)
            return perr(p, q, ND_EFORMAT, "invalid control character in string");
        q += *q == '\\' && q + 1 < p->end ? 2 : 1;
    }
    if (q >= p->end)
        return perr(p, start - 1, ND_EFORMAT, "unterminated string");
    /* Decoding never grows the text, so the raw length bounds the output. */
    char *o = arena_alloc(p->doc, (size_t)(q - start) + 1), *w = o;
    if (!o)
        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
    const unsigned char *r = start;
    while (r < q) {
        if (*r != '\\') {
            *w++ = (char)*r++;
            continue;
        }
        const unsigned char *esc = r++;
        unsigned cp;
        switch (*r++) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u':
            if (q - r < 4 || hex4(r, &cp))
                return perr(p, esc, ND_EFORMAT, "invalid \\uXXXX escape");
            r += 4;
            /* A high surrogate directly followed by a low one is a pair. */
            if (cp >= 0xD800 && cp <= 0xDBFF && q - r >= 6 && r[0] == '\\' && r[1] == 'u') {
                unsigned lo;
                if (!hex4(r + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    r += 6;
                }
            }
            w += put_utf8(w, cp);
            break;
        default: return perr(p, esc, ND_EFORMAT, "invalid backslash escape");
        }
    }
    *w = 0;
    *out = o;
    *out_len = (size_t)(w - o);
    p->s = q + 1;
    return 0;
}

static int is_digit(unsigned c)
{
    return c >= '0' && c <= '9';
}

static int parse_number(parser *p, nd_pj **out)
{
    const unsigned char *st = p->s, *q = p->s;
    if (q < p->end && *q == '-')
        q++;
    if (q >= p->end || !is_digit(*q))
        return perr(p, st, ND_EFORMAT, "expecting value");
    if (*q == '0')
        q++;
    else
        while (q < p->end && is_digit(*q))
            q++;
    size_t int_digits = (size_t)(q - st) - (*st == '-');
    int is_float = 0;
    if (q + 1 < p->end && *q == '.' && is_digit(q[1])) {
        is_float = 1;
        q++;
        while (q < p->end && is_digit(*q))
            q++;
    }
    if (q < p->end && (*q == 'e' || *q == 'E')) {
        const unsigned char *e = q + 1;
        if (e < p->end && (*e == '+' || *e == '-'))
            e++;
        if (e < p->end && is_digit(*e)) {
            is_float = 1;
            q = e;
            while (q < p->end && is_digit(*q))
                q++;
        }
    }
    size_t n = (size_t)(q - st);
    nd_pj *v = new_val(p, is_float ? ND_PJ_FLOAT : ND_PJ_INT);
    char *txt = v ? arena_alloc(p->doc, n + 1) : NULL;
    if (!txt)
        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
    memcpy(txt, st, n);
    txt[n] = 0;
    if (is_float) {
        v->num = strtod(txt, NULL); /* correctly rounded, as Python's float() */
    } else {
        if (int_digits > MAX_INT_DIGITS)
            return perr(p, st, ND_ELIMIT,
                        "integer has more than 4300 digits (Python refuses to convert it)");
        if (n == 2 && txt[0] == '-' && txt[1] == '0') /* int("-0") == 0 */
            txt++, n--;
        v->str = txt;
        v->len = n;
    }
    p->s = q;
    *out = v;
    return 0;
}

static int lit(parser *p, const char *w)
{
    size_t n = strlen(w);
    return (size_t)(p->end - p->s) >= n && !memcmp(p->s, w, n);
}

typedef struct {
    const char *key;
    size_t len, pos;
} keyref;

static int cmp_key(const void *a, const void *b)
{
    const keyref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Python dict semantics for repeated keys: the first occurrence keeps its
 * place and takes the value of the last. Returns the new member count. */
static int dedupe(nd_pj_member *m, size_t n, size_t *out_n)
{
    keyref *k = malloc(n * sizeof *k);
    if (!k)
        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
    for (size_t i = 0; i < n; i++)
        k[i] = (keyref){m[i].key, m[i].key_len, i};
    qsort(k, n, sizeof *k, cmp_key);
    int any = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && k[j].len == k[i].len && !memcmp(k[j].key, k[i].key, k[i].len))
            j++;
        if (j - i > 1) {
            any = 1;
            m[k[i].pos].val = m[k[j - 1].pos].val;
            for (size_t t = i + 1; t < j; t++)
                m[k[t].pos].key = NULL; /* drop later duplicates */
        }
        i = j;
    }
    free(k);
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!any || m[i].key)
            m[w++] = m[i];
    *out_n = w;
    return 0;
}

static int parse_value(parser *p, nd_pj **out);

static int parse_container(parser *p, int is_obj, nd_pj **out)
{
    const unsigned char *open = p->s++;
    if (++p->depth > MAX_DEPTH)
        return perr(p, open, ND_ELIMIT, "nesting deeper than 1000 levels");
    size_t base = is_obj ? p->mn : p->sn;
    int rc = 0;
    skip_ws(p);
    if (p->s < p->end && *p->s == (is_obj ? '}' : ']')) {
        p->s++;
    } else {
        for (;;) {
            nd_pj_member m = {0};
            skip_ws(p);
            if (is_obj) {
                if (p->s >= p->end || *p->s != '"')
                    return perr(p, p->s, ND_EFORMAT,
                                "expecting property name enclosed in double quotes");
                p->s++;
                if ((rc = parse_string(p, &m.key, &m.key_len)) != 0)
                    return rc;
                skip_ws(p);
                if (p->s >= p->end || *p->s != ':')
                    return perr(p, p->s, ND_EFORMAT, "expecting ':' delimiter");
                p->s++;
            }
            nd_pj *v;
            if ((rc = parse_value(p, &v)) != 0)
                return rc;
            if (is_obj) {
                if (p->mn == p->mcap) {
                    size_t cap = p->mcap ? p->mcap * 2 : 64;
                    nd_pj_member *ns = realloc(p->mstack, cap * sizeof *ns);
                    if (!ns)
                        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
                    p->mstack = ns;
                    p->mcap = cap;
                }
                m.val = v;
                p->mstack[p->mn++] = m;
            } else {
                if (p->sn == p->scap) {
                    size_t cap = p->scap ? p->scap * 2 : 64;
                    nd_pj **ns = realloc(p->stack, cap * sizeof *ns);
                    if (!ns)
                        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
                    p->stack = ns;
                    p->scap = cap;
                }
                p->stack[p->sn++] = v;
            }
            skip_ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (p->s < p->end && *p->s == (is_obj ? '}' : ']')) {
                p->s++;
                break;
            }
            return perr(p, p->s, ND_EFORMAT,
                        is_obj ? "expecting ',' delimiter or '}'"
                               : "expecting ',' delimiter or ']'");
        }
    }
    nd_pj *v = new_val(p, is_obj ? ND_PJ_OBJECT : ND_PJ_ARRAY);
    if (!v)
        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
    size_t n = (is_obj ? p->mn : p->sn) - base;
    if (is_obj && n > 1 && (rc = dedupe(p->mstack + base, n, &n)) != 0)
        return rc;
    if (n) {
        size_t sz = is_obj ? sizeof(nd_pj_member) : sizeof(nd_pj *);
        void *dst = arena_alloc(p->doc, n * sz);
        if (!dst)
            return nd_error(ND_ENOMEM, "out of memory parsing JSON");
        memcpy(dst, is_obj ? (void *)(p->mstack + base) : (void *)(p->stack + base), n * sz);
        if (is_obj)
            v->obj = dst;
        else
            v->items = dst;
    }
    v->len = n;
    if (is_obj)
        p->mn = base;
    else
        p->sn = base;
    p->depth--;
    *out = v;
    return 0;
}

static int parse_value(parser *p, nd_pj **out)
{
    skip_ws(p);
    if (p->s >= p->end)
        return perr(p, p->s, ND_EFORMAT, "expecting value");
    nd_pj *v = NULL;
    int rc;
    switch (*p->s) {
    case '{': return parse_container(p, 1, out);
    case '[': return parse_container(p, 0, out);
    case '"':
        p->s++;
        if (!(v = new_val(p, ND_PJ_STRING)))
            return nd_error(ND_ENOMEM, "out of memory parsing JSON");
        if ((rc = parse_string(p, &v->str, &v->len)) != 0)
            return rc;
        *out = v;
        return 0;
    default: break;
    }
    static const struct {
        const char *word;
        nd_pj_type t;
        double num;
    } words[] = {{"null", ND_PJ_NULL, 0},
                 {"true", ND_PJ_TRUE, 0},
                 {"false", ND_PJ_FALSE, 0},
                 {"NaN", ND_PJ_FLOAT, NAN},
                 {"Infinity", ND_PJ_FLOAT, INFINITY},
                 {"-Infinity", ND_PJ_FLOAT, -INFINITY}};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (lit(p, words[i].word)) {
            if (!(v = new_val(p, words[i].t)))
                return nd_error(ND_ENOMEM, "out of memory parsing JSON");
            v->num = words[i].num;
            p->s += strlen(words[i].word);
            *out = v;
            return 0;
        }
    return parse_number(p, out);
}

/* Strict UTF-8 as Python's decoder: no overlongs, surrogates or > U+10FFFF. */
static size_t utf8_bad_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t l = c >= 0xC2 && c <= 0xDF   ? 2
                   : (c & 0xF0) == 0xE0     ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4
                                            : 0;
        if (!l || n - i < l)
            return i;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
        if (l == 3) {
            unsigned cp = (c & 0x0Fu) << 12 | (s[i + 1] & 0x3Fu) << 6;
            if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))
                return i;
        } else if (l == 4) {
            unsigned cp = (c & 0x07u) << 18 | (s[i + 1] & 0x3Fu) << 12;
            if (cp < 0x10000 || cp > 0x10FFFF)
                return i;
        }
        i += l;
    }
    return n;
}

int nd_pj_parse(const char *text, size_t len, nd_pj_doc **doc, size_t *err_col)
{
    *doc = NULL;
    const unsigned char *s = (const unsigned char *)text;
    size_t bad = utf8_bad_at(s, len);
    if (bad < len) {
        if (err_col)
            *err_col = bad + 1;
        return nd_error(ND_EFORMAT, "column %zu: invalid UTF-8 byte 0x%02X", bad + 1, s[bad]);
    }
    nd_pj_doc *d = calloc(1, sizeof *d);
    if (!d)
        return nd_error(ND_ENOMEM, "out of memory parsing JSON");
    parser p = {s, s + len, s, d, NULL, 0, 0, NULL, 0, 0, 0};
    int rc = parse_value(&p, &d->root);
    if (!rc) {
        skip_ws(&p);
        if (p.s < p.end)
            rc = perr(&p, p.s, ND_EFORMAT, "extra data after the JSON value");
    }
    free(p.stack);
    free(p.mstack);
    if (rc) {
        if (err_col)
            *err_col = (size_t)(p.s - s) + 1;
        nd_pj_free(d);
        return rc;
    }
    *doc = d;
    return 0;
}

const nd_pj *nd_pj_get(const nd_pj *v, const char *key)
{
    if (!v || v->type != ND_PJ_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < v->len; i++)
        if (v->obj[i].key_len == kl && !memcmp(v->obj[i].key, key, kl))
            return v->obj[i].val;
    return NULL;
}

int nd_pj_truthy(const nd_pj *v)
{
    switch (v->type) {
    case ND_PJ_NULL:
    case ND_PJ_FALSE: return 0;
    case ND_PJ_TRUE: return 1;
    case ND_PJ_INT: return !(v->len == 1 && v->str[0] == '0');
    case ND_PJ_FLOAT: return v->num != 0.0; /* NaN is truthy in Python too */
    default: return v->len != 0;
    }
}

/* ---- float repr ---- */

/* Shortest digit string that round-trips, as Python's repr (David Gay's
 * shortest mode). For each precision the correctly rounded candidate is
 * tried, then its neighbours: near powers of two the rounding interval is
 * lopsided and a neighbour may round-trip when the nearest does not. */
static int shortest_digits(double x, char *digits, int *decpt)
{
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        char *e = strchr(buf, 'e');
        int exp10 = atoi(e + 1);
        uint64_t m = 0;
        for (char *c = buf; c < e; c++)
            if (*c >= '0' && *c <= '9')
                m = m * 10 + (uint64_t)(*c - '0');
        uint64_t cand[3] = {m, m + 1, m - 1};
        for (int k = 0; k < 3; k++) {
            if (k == 2 && m == 0)
                break;
            char t[48];
            snprintf(t, sizeof t, "%llue%d", (unsigned long long)cand[k], exp10 - (prec - 1));
            if (strtod(t, NULL) != x)
                continue;
            /* cand may have prec+1 digits (m+1 == 10^prec): then it is
             * really a shorter number and was found at a lower precision. */
            int nd = snprintf(digits, 24, "%llu", (unsigned long long)cand[k]);
            *decpt = exp10 - (prec - 1) + nd;
            while (nd > 1 && digits[nd - 1] == '0')
                digits[--nd] = 0;
            return nd;
        }
    }
    /* Unreachable for finite doubles (17 digits always round-trip). */
    int nd = snprintf(digits, 24, "%.0f", x);
    *decpt = nd;
    return nd;
}

int nd_pj_float_repr(double x, char *out)
{
    if (isnan(x))
        return sprintf(out, "NaN");
    if (isinf(x))
        return sprintf(out, x < 0 ? "-Infinity" : "Infinity");
    char *o = out;
    if (signbit(x)) {
        *o++ = '-';
        x = -x;
    }
    if (x == 0.0)
        return (int)(o - out) + sprintf(o, "0.0");
    char d[24];
    int decpt, nd = shortest_digits(x, d, &decpt);
    if (decpt <= -4 || decpt > 16) { /* exponent form: 1e-05, 1.5e+16 */
        *o++ = d[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int e = decpt - 1;
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) { /* 0.000123 */
        o += sprintf(o, "0.");
        for (int i = 0; i < -decpt; i++)
            *o++ = '0';
        memcpy(o, d, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) { /* 1200.0 */
        memcpy(o, d, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++)
            *o++ = '0';
        o += sprintf(o, ".0");
    } else { /* 12.5 */
        memcpy(o, d, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, d + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
    return (int)(o - out);
}

/* ---- serialiser ---- */

/* String escaping; input is (generalised) UTF-8 from the parser. With
 * ensure_ascii, non-ASCII and DEL become \uXXXX (surrogate pairs above
 * U+FFFF) and lone surrogates come out as \udXXX like Python; without it
 * only '"', '\\' and the C0 controls are escaped (Python's ESCAPE set) and
 * every other byte, DEL and lone surrogates included, is copied. */
static int dump_string(const char *s, size_t n, int ensure_ascii, nd_buf *out)
{
    static const char hx[] = "0123456789abcdef";
    int rc = nd_buf_put(out, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    char esc[16];
    while (i < n && !rc) {
        unsigned c = u[i];
        if (c >= 0x20 && (c < 0x7F || !ensure_ascii) && c != '"' && c != '\\') {
            run++;
            i++;
            continue;
        }
        if (run && (rc = nd_buf_put(out, s + i - run, run)) != 0)
            break;
        run = 0;
        size_t el = 2;
        esc[0] = '\\';
        unsigned cp = c;
        size_t l = 1;
        if (c >= 0x80) { /* decode; parser output is well formed */
            l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (l > n - i)
                l = n - i;
            cp = c & (0xFFu >> (l + 1));
            for (size_t k = 1; k < l; k++)
                cp = cp << 6 | (u[i + k] & 0x3Fu);
        }
        switch (cp) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default: {
            unsigned units[2] = {cp, 0};
            int nu = 1;
            if (cp >= 0x10000) {
                units[0] = 0xD800 + ((cp - 0x10000) >> 10);
                units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                nu = 2;
            }
            el = 0;
            for (int k = 0; k < nu; k++) {
                esc[el++] = '\\';
                esc[el++] = 'u';
                for (int sh = 12; sh >= 0; sh -= 4)
                    esc[el++] = hx[(units[k] >> sh) & 15];
            }
        }
        }
        rc = nd_buf_put(out, esc, el);
        i += l;
    }
    if (!rc && run)
        rc = nd_buf_put(out, s + n - run, run);
    return rc ? rc : nd_buf_put(out, "\"", 1);
}

static int dump(const nd_pj *v, int compact, int ascii, nd_buf *out, int depth)
{
    const char *isep = compact ? "," : ", ", *ksep = compact ? ":" : ": ";
    size_t isl = compact ? 1 : 2;
    char num[40];
    int rc = 0;
    if (depth > MAX_DEPTH + 1)
        return nd_error(ND_ELIMIT, "JSON nested too deeply to serialise");
    switch (v->type) {
    case ND_PJ_NULL: return nd_buf_put(out, "null", 4);
    case ND_PJ_TRUE: return nd_buf_put(out, "true", 4);
    case ND_PJ_FALSE: return nd_buf_put(out, "false", 5);
    case ND_PJ_INT: return nd_buf_put(out, v->str, v->len);
    case ND_PJ_FLOAT: return nd_buf_put(out, num, (size_t)nd_pj_float_repr(v->num, num));
    case ND_PJ_STRING: return dump_string(v->str, v->len, ascii, out);
    case ND_PJ_ARRAY:
        rc = nd_buf_put(out, "[", 1);
        for (size_t i = 0; i < v->len && !rc; i++) {
            if (i)
                rc = nd_buf_put(out, isep, isl);
            if (!rc)
                rc = dump(v->items[i], compact, ascii, out, depth + 1);
        }
        return rc ? rc : nd_buf_put(out, "]", 1);
    case ND_PJ_OBJECT:
        rc = nd_buf_put(out, "{", 1);
        for (size_t i = 0; i < v->len && !rc; i++) {
            if (i)
                rc = nd_buf_put(out, isep, isl);
            if (!rc)
                rc = dump_string(v->obj[i].key, v->obj[i].key_len, ascii, out);
            if (!rc)
                rc = nd_buf_put(out, ksep, isl);
            if (!rc)
                rc = dump(v->obj[i].val, compact, ascii, out, depth + 1);
        }
        return rc ? rc : nd_buf_put(out, "}", 1);
    }
    return nd_error(ND_EARG, "bad JSON value type %d", (int)v->type);
}

int nd_pj_dump(const nd_pj *v, int compact, nd_buf *out)
{
    return dump(v, compact, 1, out, 0);
}

int nd_pj_dump_ex(const nd_pj *v, int compact, int ensure_ascii, nd_buf *out)
{
    return dump(v, compact, ensure_ascii != 0, out, 0);
}

/* ---- str.strip() ---- */

/* Length of the str.isspace() character starting at s[0] (at_end = 0) or
 * ending at s[n-1] (at_end = 1), 0 if none. The set (Python 3.11): U+0009..
 * U+000D, U+001C..U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000. */
static size_t py_space_len(const unsigned char *s, size_t n, int at_end)
{
    static const char *const wide[] = {
        "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
        "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86",
        "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8",
        "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    if (!n)
        return 0;
    unsigned c = at_end ? s[n - 1] : s[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20))
        return 1;
    for (size_t k = 0; k < sizeof wide / sizeof *wide; k++) {
        size_t l = strlen(wide[k]);
        if (n >= l && !memcmp(at_end ? s + n - l : s, wide[k], l))
            return l;
    }
    return 0;
}

void nd_py_strip(const char **s, size_t *n)
{
    const unsigned char *u = (const unsigned char *)*s;
    size_t len = *n, k;
    while ((k = py_space_len(u, len, 0)) != 0)
        u += k, len -= k;
    while ((k = py_space_len(u, len, 1)) != 0)
        len -= k;
    *s = (const char *)u;
    *n = len;
}
