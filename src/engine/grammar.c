/* Tool-call grammar: the byte-level runtime (see grammar.h). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar_internal.h"

/* ------------------------------------------------------------------ */
/* the automaton                                                       */

_Static_assert(sizeof(((nd_gram_frame *)0)->re) == sizeof(nd_re_set),
               "a string frame holds one pattern state set");

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
    case K_ALT: return FR_ALT;
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
        f->mask = (uint64_t)(uint32_t)n->nlit << 32; /* the range [0, nlit) */
    if (f->kind == FR_STR && n->re) {
        nd_re_set r = nd_re_initial(n->re);
        memcpy(f->re, r.w, sizeof f->re);
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

int nd_gram_value_pos(const nd_gram_state *s, const char **num, int *nlen)
{
    const nd_gram_frame *f = &s->f[s->depth - 1];
    if (f->kind == FR_OBJ && f->phase == 4)
        return ND_GRAM_AT_VALUE;
    if (f->kind == FR_STR && f->phase == 1)
        return ND_GRAM_IN_STRING;
    if (f->kind == FR_NUM) {
        *num = f->num;
        *nlen = f->nlen;
        return ND_GRAM_IN_NUMBER;
    }
    return 0;
}

int nd_gram_in_array(const nd_gram_state *s)
{
    int i = s->depth - 1;
    while (i > 0 && (s->f[i].kind == FR_NUM || s->f[i].kind == FR_LIT))
        i--; /* an item being written */
    return i > 0 && (s->f[i].kind == FR_ARR || s->f[i].kind == FR_GARR);
}

int nd_gram_string_item(const nd_gram_state *s)
{
    const nd_gram_frame *f = &s->f[s->depth - 1];
    return s->depth > 2 && f->kind == FR_STR && f->phase == 1 &&
           (f[-1].kind == FR_ARR || f[-1].kind == FR_GARR);
}

static void range_unpack(uint64_t m, int *lo, int *hi);

int nd_gram_naming(const nd_gram_state *s, uint64_t *cands)
{
    if (s->depth < 2 || s->f[1].kind != FR_CALL)
        return 0;
    const nd_gram_frame *f = &s->f[1];
    *cands = f->phase == 0 ? ~0ull : f->phase == 1 ? f->mask : 1ull << f->cur;
    return s->f[0].count;
}

int nd_gram_literal(const nd_grammar *g, const nd_gram_state *s, char *const **lits,
                    const int **lens, int *lo, int *hi)
{
    const nd_gram_frame *f = &s->f[s->depth - 1];
    if (f->kind != FR_LIT)
        return 0;
    const gnode *n = &g->nodes[f->node];
    *lits = n->lit;
    *lens = n->litlen;
    range_unpack(f->mask, lo, hi);
    return 1;
}

static int used_has(const gnode *n, const nd_gram_frame *f, int i);
static int obj_missing(const gnode *n, const nd_gram_frame *f);

int nd_gram_key_marks(const nd_grammar *g, int (*said)(void *ctx, const char *key, int len),
                      void *ctx, uint64_t **mask)
{
    *mask = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof **mask);
    if (!*mask)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < g->n_nodes; i++) {
        const gnode *n = &g->nodes[i];
        if (n->kind != K_OBJ || n->ordered)
            continue;
        for (int k = 0; k < n->nprops && k < 64; k++)
            if (!n->req[k] && said(ctx, n->key[k], n->keylen[k]))
                (*mask)[i] |= 1ull << k;
    }
    return ND_OK;
}

int nd_gram_key_marked(const nd_grammar *g, const nd_gram_state *s, const uint64_t *mask)
{
    if (s->depth < 1)
        return -1;
    const nd_gram_frame *f = &s->f[s->depth - 1];
    if (f->kind != FR_OBJ || (f->phase != 2 && f->phase != 3))
        return -1;
    const gnode *n = &g->nodes[f->node];
    if (n->ordered || !mask[f->node] || obj_missing(n, f))
        return 0;      /* the required keys first: their order stays the model's */
    if (f->phase == 3) /* the key is complete: key_mark wrote it */
        return f->cur < 64 && (mask[f->node] >> f->cur & 1);
    int lo, hi;
    range_unpack(f->mask, &lo, &hi);
    for (int k = lo; k < hi; k++) {
        int i = n->ord[k];
        if (i < 64 && (mask[f->node] >> i & 1) && !used_has(n, f, i))
            return 1;
    }
    return 0;
}

const char *nd_gram_tool_name(const nd_grammar *g, int i, int *len)
{
    if (i < 0 || i >= g->n_tools)
        return NULL;
    *len = g->tools[i].namelen;
    return g->tools[i].name;
}

static uint64_t all_bits(int n)
{
    return n >= 64 ? ~0ull : (1ull << n) - 1;
}

/* a candidate range [lo, hi) of a sorted list, kept in a frame's mask */
static uint64_t range_pack(int lo, int hi)
{
    return (uint64_t)(uint32_t)lo | (uint64_t)(uint32_t)hi << 32;
}

static void range_unpack(uint64_t m, int *lo, int *hi)
{
    *lo = (int)(uint32_t)m;
    *hi = (int)(uint32_t)(m >> 32);
}

/* Within [lo, hi) of strings sorted by bytes that share their first pos
 * bytes and are all longer than pos: the sub-range whose byte pos is b
 * (binary search). ord maps a rank to the string's index (NULL: itself). */
static void range_narrow(char *const *str, const int *ord, int pos, unsigned char b, int *lo,
                         int *hi)
{
    int a = *lo, z = *hi;
    while (a < z) { /* first rank whose byte is >= b */
        int m = a + (z - a) / 2;
        if ((unsigned char)str[ord ? ord[m] : m][pos] < b)
            a = m + 1;
        else
            z = m;
    }
    int c = a;
    z = *hi;
    while (c < z) { /* first rank whose byte is > b */
        int m = c + (z - c) / 2;
        if ((unsigned char)str[ord ? ord[m] : m][pos] <= b)
            c = m + 1;
        else
            z = m;
    }
    *lo = a;
    *hi = c;
}

/* An object frame's written keys: a bit per property in re[], or, for an
 * ordered object (more properties than those bits), re[0] = 1 + the index
 * of the last key written (0: none). */
static int obj_last(const nd_gram_frame *f)
{
    return (int)f->re[0] - 1;
}

/* property i written, or (ordered) passed over */
static int used_has(const gnode *n, const nd_gram_frame *f, int i)
{
    if (n->ordered)
        return i <= obj_last(f);
    return f->re[i >> 6] >> (i & 63) & 1;
}

/* property i may be written next */
static int key_free(const gnode *n, const nd_gram_frame *f, int i)
{
    if (n->ordered) /* after the last one, skipping no required one */
        return i > obj_last(f) && i <= n->next_req[obj_last(f) + 1];
    return !used_has(n, f, i);
}

static void key_mark(const gnode *n, nd_gram_frame *f, int i)
{
    if (n->ordered)
        f->re[0] = (uint64_t)i + 1;
    else
        f->re[i >> 6] |= 1ull << (i & 63);
}

static int req_has(const gnode *n, int i)
{
    return n->req[i];
}

/* a required property not written yet */
static int obj_missing(const gnode *n, const nd_gram_frame *f)
{
    if (n->ordered)
        return n->next_req[obj_last(f) + 1] < n->nprops;
    for (int w = 0; w < ND_GRAM_PROP_WORDS; w++)
        if (n->required[w] & ~f->re[w])
            return 1;
    return 0;
}

/* no key may follow */
static int obj_all_used(const gnode *n, const nd_gram_frame *f)
{
    if (n->ordered)
        return obj_last(f) >= n->nprops - 1;
    int c = 0;
    for (int w = 0; w < ND_GRAM_PROP_WORDS; w++)
        c += __builtin_popcountll(f->re[w]);
    return c >= n->nprops;
}

/* object key bytes: narrow the frame's key range by b (pos = bytes so far);
 * 0 when no unwritten key is left in it */
static int key_narrow(const gnode *n, nd_gram_frame *f, unsigned char b, int lo, int hi)
{
    range_narrow(n->key, n->ord, f->count, b, &lo, &hi);
    int free_key = 0;
    for (int k = lo; k < hi && !free_key; k++)
        free_key = key_free(n, f, n->ord[k]);
    if (!free_key)
        return 0;
    f->count++;
    f->mask = range_pack(lo, hi);
    /* keys are prefix-free: a complete one is alone in its range */
    if (hi - lo == 1 && n->keylen[n->ord[lo]] == f->count) {
        int i = n->ord[lo];
        f->cur = i;
        key_mark(n, f, i);
        f->phase = 3;
    }
    return 1;
}

_Static_assert(2 * ND_GRAM_STR_PERIOD + 2 <= sizeof(((nd_gram_frame *)0)->num),
               "a string frame keeps its last characters, their runs and a \\u code in num[]");

/* The repeat guard (grammar_internal.h) counts ASCII characters as they
 * read once decoded, so "\u0059" and "Y" are the same character
 * and a call list re-serialised with other escapes (eval-calls checks the
 * predicted calls that way) is judged as the decoder judged it. A
 * non-ASCII character, raw or escaped, ends every cycle and clears the
 * history. num[0..P) holds the last characters, newest first (nlen of
 * them), num[P + p - 1] how many characters in a row have equalled the one
 * p before them, so the tail repeats with period p over run + p
 * characters; num[2P..2P+2) the \u escape's code so far. At most P
 * characters are refused at any point, and every string position admits
 * more (9 after a backslash, 22 hex digits, any other character), so no
 * prefix becomes a dead end. */
static int str_cycle_ok(nd_gram_frame *f, unsigned ch)
{
    enum { P = ND_GRAM_STR_PERIOD };
    uint8_t *last = (uint8_t *)f->num, *run = last + P;
    if (ch >= 0x80) {
        memset(run, 0, P);
        f->nlen = 0;
        return 1;
    }
    for (int p = 1; p <= P; p++) {
        if (p <= f->nlen && last[p - 1] == ch) {
            if (run[p - 1] + 1 + p > ND_GRAM_STR_PERIODIC)
                return 0;
            run[p - 1]++;
        } else {
            run[p - 1] = 0;
        }
    }
    memmove(last + 1, last, P - 1);
    last[0] = (uint8_t)ch;
    if (f->nlen < P)
        f->nlen++;
    return 1;
}

/* the \u escape's code: hex digits so far (2P.. of num[]) */
static unsigned esc_code(const nd_gram_frame *f)
{
    const uint8_t *c = (const uint8_t *)f->num + 2 * ND_GRAM_STR_PERIOD;
    return (unsigned)c[0] << 8 | c[1];
}

static void esc_code_set(nd_gram_frame *f, unsigned code)
{
    uint8_t *c = (uint8_t *)f->num + 2 * ND_GRAM_STR_PERIOD;
    c[0] = (uint8_t)(code >> 8);
    c[1] = (uint8_t)code;
}

/* one character of string content (ASCII ch, or -1 for a non-ASCII / \u
 * character, which a pattern string never admits) */
static int str_char(const gnode *n, nd_gram_frame *f, int ch)
{
    if (n->re) {
        if (ch < 0)
            return 0;
        nd_re_set r;
        memcpy(r.w, f->re, sizeof r.w);
        r = nd_re_step(n->re, r, ch);
        if (nd_re_empty(r))
            return 0;
        /* the pattern must still be able to match at a length within
         * [minLength, maxLength]: otherwise the string is a dead end */
        int c1 = f->count + 1;
        if (nd_re_len_min(n->re, r, n->min_len - c1, n->max_len >= 0 ? n->max_len - c1 : INT_MAX) <
            0)
            return 0;
        memcpy(f->re, r.w, sizeof f->re);
    } else if (n->max_len >= 0 && f->count + 1 > n->max_len) {
        return 0;
    } else if (ch >= 0 && !str_cycle_ok(f, (unsigned)ch)) {
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
            esc_code_set(f, 0);
            f->esc = 5;
            return R_ACC;
        }
        return R_REJ;
    }
    if (f->esc >= 2) {
        int hex = (b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'f');
        if (!hex)
            return R_REJ;
        unsigned code = esc_code(f) << 4 | (unsigned)(b <= '9' ? b - '0' : (b | 0x20) - 'a' + 10);
        esc_code_set(f, code);
        if (f->esc == 2 && !str_cycle_ok(f, code)) /* the escape's character, complete */
            return R_REJ;
        f->esc = f->esc == 2 ? 0 : (uint8_t)(f->esc - 1);
        return R_ACC;
    }
    if (b == '"') {
        if (f->count < n->min_len)
            return R_REJ;
        if (n->re) {
            nd_re_set r;
            memcpy(r.w, f->re, sizeof r.w);
            if (!nd_re_accepts(n->re, r))
                return R_REJ;
        }
        return R_ACC_POP;
    }
    if (b == '\\') {
        if (n->max_len >= 0 && f->count + 1 > n->max_len)
            return R_REJ;
        if (n->re) { /* some escaped character must fit the pattern */
            static const char escaped[] = "\"\\/\b\f\n\r\t";
            int ok = 0;
            for (int i = 0; escaped[i] && !ok; i++) {
                nd_gram_frame t = *f;
                ok = str_char(n, &t, escaped[i]);
            }
            if (!ok)
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
    str_cycle_ok(f, 0x80); /* a non-ASCII character ends every cycle */
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
        if (!nd_gram_num_syntax(n, t, len) || nd_gram_num_short(n, t, len) < 0)
            return R_REJ;
        f->num[f->nlen++] = (char)b;
        return R_ACC;
    }
    return f->nlen && nd_gram_num_short(n, f->num, f->nlen) == 0 ? R_POP : R_REJ;
}

static int step_lit(const nd_grammar *g, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    int lo, hi;
    range_unpack(f->mask, &lo, &hi);
    /* sorted and without duplicates: a candidate equal to the bytes so far
     * (e.g. "1" while "10" is possible) comes first in the range */
    int complete_now = lo < hi && n->litlen[lo] == f->count;
    lo += complete_now;
    range_narrow(n->lit, NULL, f->count, b, &lo, &hi);
    if (lo == hi)
        return complete_now ? R_POP : R_REJ;
    f->mask = range_pack(lo, hi);
    f->count++;
    return hi - lo > 1 || n->litlen[lo] > f->count ? R_ACC : R_ACC_POP;
}

/* the top-level list: [ then calls separated by commas, then ]; an empty
 * list only when no call is required */
static int step_top(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
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
}

/* one call: {"name": then a tool's name (as JSON) narrowed byte by byte
 * among the tools, then ,"arguments": and that tool's argument object,
 * then } */
static int step_call(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
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
}

/* an object with declared properties: each key narrowed among the ones
 * not used yet, its value pushed, } only once the required ones are in */
static int step_obj(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    switch (f->phase) {
    case 0:
        if (b != '{')
            return R_REJ;
        f->phase = 1;
        return R_ACC;
    case 1:
    case 7:
        if (b == '}' && f->phase == 1)
            return obj_missing(n, f) ? R_REJ : R_ACC_POP;
        f->count = 0;
        f->phase = 2;
        if (!key_narrow(n, f, b, 0, n->nprops)) {
            f->phase = 1;
            return R_REJ;
        }
        return R_ACC;
    case 2: {
        int lo, hi;
        range_unpack(f->mask, &lo, &hi);
        return key_narrow(n, f, b, lo, hi) ? R_ACC : R_REJ;
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
            return obj_missing(n, f) ? R_REJ : R_ACC_POP;
        if (b == ',' && !obj_all_used(n, f)) {
            f->phase = 7;
            return R_ACC;
        }
        return R_REJ;
    default: return R_REJ;
    }
}

/* a generic object (a map): string keys, values of one node, between
 * min_items and max_items pairs */
static int step_gobj(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    switch (f->phase) {
    case 0:
        if (b != '{')
            return R_REJ;
        f->phase = 1;
        return R_ACC;
    case 1:
    case 7:
        if (b == '}' && f->phase == 1)
            return n->min_items == 0 ? R_ACC_POP : R_REJ;
        if (b != '"' || n->max_items == 0 || !push(g, s, N_STR))
            return R_REJ;
        f->count++;
        f->phase = 2;
        return R_RETRY;
    case 3:
        if (b != ':')
            return R_REJ;
        f->phase = 4;
        return R_ACC;
    case 4:
        if (!push(g, s, n->item))
            return R_REJ;
        f->phase = 5;
        return R_RETRY;
    case 6:
        if (b == '}')
            return f->count >= n->min_items ? R_ACC_POP : R_REJ;
        if (b == ',' && (n->max_items < 0 || f->count < n->max_items)) {
            f->phase = 7;
            return R_ACC;
        }
        return R_REJ;
    default: return R_REJ;
    }
}

/* an array (FR_ARR: its node's item and bounds; FR_GARR: any values) */
static int step_arr(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
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

/* any JSON value: its first byte picks the frame that parses it */
static int step_any(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
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

/* an alternative: the one whose first bytes admit b (they are disjoint,
 * checked when compiled) */
static int step_alt(const nd_grammar *g, nd_gram_frame *f, unsigned char b)
{
    const gnode *n = &g->nodes[f->node];
    /* the alternatives' first bytes are disjoint (checked when compiled) */
    for (int i = 0; i < n->nalt; i++) {
        const gnode *a = &g->nodes[n->alt[i]];
        if (a->first[b >> 6] >> (b & 63) & 1) {
            frame_set(g, f, n->alt[i]);
            return R_RETRY;
        }
    }
    return R_REJ;
}

/* One byte into the innermost frame: a dispatch on the frame's kind, each
 * kind a small state machine over f->phase in its step_* function. */
static int step(const nd_grammar *g, nd_gram_state *s, nd_gram_frame *f, unsigned char b)
{
    switch (f->kind) {
    case FR_TOP: return step_top(g, s, f, b);
    case FR_CALL: return step_call(g, s, f, b);
    case FR_OBJ: return step_obj(g, s, f, b);
    case FR_GOBJ: return step_gobj(g, s, f, b);
    case FR_ARR:
    case FR_GARR: return step_arr(g, s, f, b);
    case FR_ANY: return step_any(g, s, f, b);
    case FR_ALT: return step_alt(g, f, b);
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

/* property i written whole: "key":<shortest value> */
static int prop_min(const nd_grammar *g, const gnode *n, int i)
{
    return n->keylen[i] + 1 + g->nodes[n->prop[i]].minlen;
}

/* the closing brace and a comma and entry for every required property not
 * written yet */
static int obj_rest(const nd_grammar *g, const gnode *n, const nd_gram_frame *f)
{
    int m = 1;
    for (int i = 0; i < n->nprops; i++)
        if (req_has(n, i) && !used_has(n, f, i))
            m += 1 + prop_min(g, n, i);
    return m;
}

/* fewest bytes after choosing to write property i (from pos bytes of its
 * key), given rest = obj_rest before it */
static int obj_with(const nd_grammar *g, const gnode *n, int i, int pos, int rest)
{
    return prop_min(g, n, i) - pos + rest - (req_has(n, i) ? 1 + prop_min(g, n, i) : 0);
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
        switch (f->phase) {
        case 0: return n->minlen;
        case 1: return n->minlen - 1;
        case 2: {
            int best = 1 << 29, lo, hi, rest = obj_rest(g, n, f);
            range_unpack(f->mask, &lo, &hi);
            for (int k = lo; k < hi; k++)
                if (key_free(n, f, n->ord[k])) {
                    int v = obj_with(g, n, n->ord[k], f->count, rest);
                    best = v < best ? v : best;
                }
            return best;
        }
        case 3: return 1 + g->nodes[n->prop[f->cur]].minlen + obj_rest(g, n, f);
        case 4: return g->nodes[n->prop[f->cur]].minlen + obj_rest(g, n, f);
        case 7: {
            int best = 1 << 29, rest = obj_rest(g, n, f);
            for (int i = 0; i < n->nprops; i++)
                if (key_free(n, f, i)) {
                    int v = obj_with(g, n, i, 0, rest);
                    best = v < best ? v : best;
                }
            return best;
        }
        default: return obj_rest(g, n, f);
        }
    }
    case FR_GOBJ: {
        /* an entry is "":<value>; entries still owed to minProperties */
        int im = g->nodes[n->item].minlen, left = n->min_items - f->count;
        int rest = (left > 0 ? left * (4 + im) : 0) + 1;
        switch (f->phase) {
        case 0: return n->minlen;
        case 1: return n->min_items ? n->min_items * (4 + im) : 1;
        case 2:
        case 3: return 1 + im + rest;
        case 4: return im + rest;
        case 7: return 3 + im + (left > 1 ? (left - 1) * (4 + im) : 0) + 1;
        default: return rest;
        }
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
    case FR_ALT: return n->minlen;
    case FR_STR: {
        if (f->phase == 0)
            return n->minlen;
        if (f->esc == 1 && n->re) {
            /* after a backslash under a pattern: the best escaped character
             * (it need not bring the pattern closer to a match) */
            static const char dec[] = "\"\\/\b\f\n\r\t";
            int best = 1 << 20;
            for (int i = 0; dec[i]; i++) {
                nd_gram_frame t = *f;
                if (!str_char(n, &t, dec[i]))
                    continue;
                nd_re_set r;
                memcpy(r.w, t.re, sizeof r.w);
                int x = nd_re_len_min(n->re, r, n->min_len - t.count,
                                      n->max_len >= 0 ? n->max_len - t.count : INT_MAX);
                if (x >= 0 && 1 + x < best)
                    best = 1 + x;
            }
            return best + 1;
        }
        int pend = f->u8left + (f->esc == 1 ? 1 : f->esc >= 2 ? f->esc - 1 : 0);
        /* after a backslash the escaped character is not counted yet */
        int need = n->min_len - f->count - (f->esc == 1);
        if (n->re) {
            /* characters to come, the escaped one included */
            nd_re_set r;
            memcpy(r.w, f->re, sizeof r.w);
            int lo = n->min_len - f->count, hi = n->max_len >= 0 ? n->max_len - f->count : INT_MAX;
            if (f->esc == 1 && lo < 1)
                lo = 1;
            int t = nd_re_len_min(n->re, r, lo, hi);
            if (t < 0)
                return 1 << 20;
            need = t - (f->esc == 1);
        }
        return pend + (need > 0 ? need : 0) + 1;
    }
    case FR_NUM: {
        if (!f->nlen)
            return n->minlen;
        int v = nd_gram_num_short(n, f->num, f->nlen);
        return v < 0 ? 1 << 20 : v;
    }
    case FR_LIT: {
        int best = 1 << 29, lo, hi;
        range_unpack(f->mask, &lo, &hi);
        for (int i = lo; i < hi; i++)
            if (n->litlen[i] - f->count < best)
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
