/* The reasoning prior (reason_prior.h): argument names and copied values
 * in the reasoning's plan of a call. */
#define _POSIX_C_SOURCE 200809L
#include "engine/reason_prior.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar.h"

static const char *const separators[] = {", ", " from \"", "; then "};
enum { SEP_KEY, SEP_SAID, SEP_CALL, N_SEP };

/* the JSON kinds a value begins as */
enum {
    T_STRING = 1,
    T_NUMBER = 2,
    T_BOOL = 4,
    T_NULL = 8,
    T_ARRAY = 16,
    T_OBJECT = 32,
    T_INT = 64
};

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int listed(const nd_pj *list, const char *key, size_t len)
{
    for (size_t j = 0; list && list->type == ND_PJ_ARRAY && j < list->len; j++) {
        const nd_pj *r = list->items[j];
        if (r->type == ND_PJ_STRING && r->len == len && !memcmp(r->str, key, len))
            return 1;
    }
    return 0;
}

static uint8_t type_bits(const char *t, size_t n)
{
    static const struct {
        const char *name;
        uint8_t bits;
    } names[] = {{"string", T_STRING}, {"number", T_NUMBER}, {"integer", T_NUMBER | T_INT},
                 {"boolean", T_BOOL},  {"null", T_NULL},     {"array", T_ARRAY},
                 {"object", T_OBJECT}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == n && !memcmp(names[i].name, t, n))
            return names[i].bits;
    return 0xff; /* a type we do not know: anything */
}

static uint8_t value_bits(const nd_pj *v)
{
    switch (v->type) {
    case ND_PJ_STRING: return T_STRING;
    case ND_PJ_INT: return T_NUMBER | T_INT;
    case ND_PJ_FLOAT: return T_NUMBER;
    case ND_PJ_TRUE:
    case ND_PJ_FALSE: return T_BOOL;
    case ND_PJ_NULL: return T_NULL;
    case ND_PJ_ARRAY: return T_ARRAY;
    default: return T_OBJECT;
    }
}

/* the kinds a schema lets its value be: "type" (one or a list), else the
 * enum's values; 0 when it says neither (anyOf, $ref ...: anything) */
static uint8_t schema_types(const nd_pj *s)
{
    const nd_pj *t = nd_pj_get(s, "type"), *en = nd_pj_get(s, "enum");
    uint8_t bits = 0;
    if (t && t->type == ND_PJ_STRING)
        bits = type_bits(t->str, t->len);
    for (size_t i = 0; t && t->type == ND_PJ_ARRAY && i < t->len; i++)
        bits |= t->items[i]->type == ND_PJ_STRING ? type_bits(t->items[i]->str, t->items[i]->len)
                                                  : 0xff;
    for (size_t i = 0; !t && en && en->type == ND_PJ_ARRAY && i < en->len; i++)
        bits |= value_bits(en->items[i]);
    return bits == 0xff ? 0 : bits;
}

/* a string the reasoning writes as it is: printable ASCII, no quote or backslash */
static int plain(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\')
            return 0;
    return 1;
}

static int key_enum(nd_reason_key *k, const nd_pj *en)
{
    if (!en || en->type != ND_PJ_ARRAY || !en->len)
        return ND_OK;
    for (size_t i = 0; i < en->len; i++)
        if (en->items[i]->type != ND_PJ_STRING || !plain(en->items[i]->str, en->items[i]->len))
            return ND_OK; /* other values: no constraint */
    if (!(k->enums = calloc(en->len, sizeof *k->enums)) || !(k->said = calloc(en->len, 1)))
        return nd_error(ND_ENOMEM, "out of memory");
    for (size_t i = 0; i < en->len; i++) {
        if (!(k->enums[i] = strndup(en->items[i]->str, en->items[i]->len)))
            return nd_error(ND_ENOMEM, "out of memory");
        k->nenum++;
    }
    return ND_OK;
}

static int required_order(nd_reason_tool *tl, const nd_pj *req)
{
    if (!req || req->type != ND_PJ_ARRAY || !req->len)
        return ND_OK;
    if (!(tl->req_order = calloc(req->len, sizeof *tl->req_order)))
        return nd_error(ND_ENOMEM, "out of memory");
    for (size_t j = 0; j < req->len; j++) {
        const nd_pj *r = req->items[j];
        for (int k = 0; k < tl->nkeys && k < 64 && r->type == ND_PJ_STRING; k++) {
            int seen = 0;
            for (int i = 0; i < tl->nreq; i++)
                seen |= tl->req_order[i] == k;
            if (!seen && strlen(tl->keys[k].name) == r->len &&
                !memcmp(tl->keys[k].name, r->str, r->len)) {
                tl->req_order[tl->nreq++] = k;
                break;
            }
        }
    }
    return ND_OK;
}

/* A name the plan's form can write (an argument's; a tool's also without
 * a colon): a space ends an argument's name there, and the parser keeps
 * 64 bytes of one (sizeof nd_reason_pos.b). Others are left out: the
 * plan never names them (the call's grammar still offers them), and a
 * plan is not held at a name it cannot finish (fuzz_choice_prior found
 * every piece -inf there). */
static int plannable(const char *name, size_t len)
{
    return len && len <= sizeof((nd_reason_pos *)0)->b && !memchr(name, ' ', len) &&
           !memchr(name, 0, len);
}

static int tool_keys(nd_reason_tool *tl, const nd_pj *params)
{
    const nd_pj *props = nd_pj_get(params, "properties"), *req = nd_pj_get(params, "required");
    if (!props || props->type != ND_PJ_OBJECT || !props->len)
        return ND_OK;
    if (!(tl->keys = calloc(props->len, sizeof *tl->keys)))
        return nd_error(ND_ENOMEM, "out of memory");
    for (size_t k = 0; k < props->len; k++) {
        const nd_pj_member *m = &props->obj[k];
        if (!plannable(m->key, m->key_len))
            continue;
        int i = tl->nkeys++, rc;
        nd_reason_key *key = &tl->keys[i];
        if (!(key->name = strndup(m->key, m->key_len)))
            return nd_error(ND_ENOMEM, "out of memory");
        key->types = schema_types(m->val);
        if ((rc = key_enum(key, nd_pj_get(m->val, "enum"))))
            return rc;
        if (i < 64 && listed(req, m->key, m->key_len))
            tl->req |= (uint64_t)1 << i;
    }
    return required_order(tl, req);
}

int nd_reason_prior_init(nd_reason_prior *p, const nd_pj *tools, int V, int id_end, float key_bonus)
{
    memset(p, 0, sizeof *p);
    p->key_bonus = key_bonus;
    p->id_end = id_end;
    p->at.st = RP_OFF;
    int n = tools && tools->type == ND_PJ_ARRAY ? (int)tools->len : 0, rc = ND_OK;
    p->tool = calloc((size_t)(n ? n : 1), sizeof *p->tool);
    p->biased = malloc((size_t)V * sizeof *p->biased);
    p->mark = calloc((size_t)V, 1);
    if (!p->tool || !p->biased || !p->mark)
        return nd_error(ND_ENOMEM, "out of memory");
    p->n = n;
    for (int i = 0; i < n && !rc; i++) {
        const nd_pj *f = nd_choice_tool_fields(tools->items[i]);
        const nd_pj *name = nd_pj_get(f, "name");
        if (!name || name->type != ND_PJ_STRING || !plannable(name->str, name->len) ||
            memchr(name->str, ':', name->len))
            continue; /* a name the plan cannot write: never the plan's (a colon ends one) */
        if (!(p->tool[i].name = strndup(name->str, name->len)))
            return nd_error(ND_ENOMEM, "out of memory");
        rc = tool_keys(&p->tool[i], nd_pj_get(f, "parameters"));
    }
    return rc;
}

void nd_reason_prior_free(nd_reason_prior *p)
{
    for (int i = 0; p->tool && i < p->n; i++) {
        nd_reason_tool *tl = &p->tool[i];
        for (int k = 0; k < tl->nkeys; k++) {
            for (int e = 0; e < tl->keys[k].nenum; e++)
                free(tl->keys[k].enums[e]);
            free(tl->keys[k].enums);
            free(tl->keys[k].said);
            free(tl->keys[k].name);
        }
        free(tl->keys);
        free(tl->req_order);
        free(tl->name);
    }
    free(p->tool);
    free(p->biased);
    free(p->mark);
    nd_buf_free(&p->value);
    memset(p, 0, sizeof *p);
}

/* which enum values the turn says, as the choice prior judges them */
static void said_values(nd_reason_prior *p, const nd_choice_prior *choice)
{
    char lit[sizeof p->at.b + 2];
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < p->tool[i].nkeys; k++) {
            nd_reason_key *key = &p->tool[i].keys[k];
            for (int e = 0; e < key->nenum; e++) {
                size_t n = strlen(key->enums[e]);
                key->said[e] = 0;
                if (n + 2 > sizeof lit)
                    continue;
                lit[0] = '"';
                memcpy(lit + 1, key->enums[e], n);
                lit[n + 1] = '"';
                key->said[e] = (uint8_t)nd_choice_prior_says(choice, lit, (int)n + 2);
            }
        }
}

void nd_reason_prior_turn(nd_reason_prior *p, int active, const nd_choice_prior *choice)
{
    p->active = active && p->key_bonus != 0.0f;
    p->enum_bonus = choice->enum_bonus;
    if (p->active)
        said_values(p, choice);
    memset(&p->at, 0, sizeof p->at);
    p->at.st = active ? RP_NAME : RP_OFF;
    p->at.tool = -1;
    p->at.last = -1;
    p->value.n = 0;
}

/* ---- the parser ---- */

static int find_tool(const nd_reason_prior *p, const char *b, int nb)
{
    for (int i = 0; i < p->n; i++) {
        const char *name = p->tool[i].name;
        if (name && (int)strlen(name) == nb && !memcmp(name, b, (size_t)nb))
            return i;
    }
    return -1;
}

/* whether a listed tool's name begins with text[0..n) */
static int tool_prefix(const nd_reason_prior *p, const char *text, size_t n)
{
    for (int i = 0; i < p->n; i++)
        if (p->tool[i].name && strlen(p->tool[i].name) >= n && !memcmp(p->tool[i].name, text, n))
            return 1;
    return 0;
}

/* the named tool's argument that is b[0..nb) and not planned yet (whole:
 * all of it; else one that begins so), -1 none */
static int find_key(const nd_reason_prior *p, const nd_reason_pos *s, int whole)
{
    const nd_reason_tool *tl = &p->tool[s->tool];
    for (int k = 0; k < tl->nkeys; k++) {
        const char *key = tl->keys[k].name;
        size_t kl = strlen(key);
        if (k < 64 && (s->used >> k & 1))
            continue;
        if (whole ? kl == s->nb : kl > s->nb) {
            if (!memcmp(key, s->b, s->nb))
                return k;
        }
    }
    return -1;
}

static void to(nd_reason_pos *s, int st)
{
    s->st = (uint8_t)st;
    s->nb = 0;
}

/* the byte after a value */
static void after_value(const nd_reason_prior *p, nd_reason_pos *s, unsigned char b)
{
    s->b[s->nb++] = (char)b;
    for (int i = 0; i < N_SEP; i++) {
        size_t L = strlen(separators[i]);
        if (L < s->nb || memcmp(separators[i], s->b, s->nb))
            continue;
        if (L == s->nb) {
            if (i == SEP_CALL) {
                s->tool = s->last = -1;
                s->used = 0;
                s->then = 1;
            }
            to(s, i == SEP_KEY ? RP_KEY : i == SEP_SAID ? RP_SAID : RP_NAME);
        }
        return;
    }
    (void)p;
    to(s, RP_OFF);
}

static void in_nested(nd_reason_pos *s, unsigned char b)
{
    if (s->quote) {
        if (s->esc)
            s->esc = 0;
        else if (b == '\\')
            s->esc = 1;
        else if (b == '"')
            s->quote = 0;
    } else if (b == '"') {
        s->quote = 1;
    } else if (b == '[' || b == '{') {
        s->depth++;
    } else if ((b == ']' || b == '}') && --s->depth == 0) {
        to(s, RP_AFTER);
    }
}

void nd_reason_prior_step(const nd_reason_prior *p, nd_reason_pos *s, unsigned char b)
{
    switch (s->st) {
    case RP_NAME:
        if (b == ':') {
            s->tool = (int16_t)find_tool(p, s->b, s->nb);
            to(s, s->tool >= 0 ? RP_COLON : RP_OFF);
        } else if (b != ' ' || s->nb) { /* spaces before the name are the piece's */
            if (s->nb == sizeof s->b)
                to(s, RP_OFF);
            else
                s->b[s->nb++] = (char)b;
            if (s->then && s->st == RP_NAME && !tool_prefix(p, s->b, s->nb))
                to(s, RP_OFF); /* a later call's name is a listed one's or out of the form */
        }
        return;
    case RP_COLON: to(s, b == ' ' ? RP_KEY : RP_OFF); return;
    case RP_KEY:
        if (b == ' ') {
            int k = s->nb ? find_key(p, s, 1) : -1;
            if (k < 0) {
                to(s, RP_OFF);
                return;
            }
            if (k < 64)
                s->used |= (uint64_t)1 << k;
            s->last = (int16_t)k;
            to(s, RP_VALUE);
            return;
        }
        if (s->nb == sizeof s->b) {
            to(s, RP_OFF);
            return;
        }
        s->b[s->nb++] = (char)b;
        if (find_key(p, s, 0) < 0 && find_key(p, s, 1) < 0)
            to(s, RP_OFF);
        return;
    case RP_VALUE:
        s->esc = s->quote = 0;
        if (b == '"')
            to(s, RP_STRING);
        else if (is_digit(b) || b == '-')
            to(s, RP_NUMBER);
        else if (b == 't' || b == 'f' || b == 'n')
            to(s, RP_WORD);
        else if (b == '[' || b == '{')
            s->depth = 1, to(s, RP_NESTED);
        else
            to(s, RP_OFF);
        return;
    case RP_STRING:
    case RP_SAID:
        if (s->esc)
            s->esc = 0;
        else if (b == '\\')
            s->esc = 1;
        else if (b == '"')
            to(s, RP_AFTER);
        return;
    case RP_NUMBER:
        if (is_digit(b) || b == '.' || b == 'e' || b == 'E' || b == '+' || b == '-')
            return;
        to(s, RP_AFTER);
        after_value(p, s, b);
        return;
    case RP_WORD:
        if (b >= 'a' && b <= 'z')
            return;
        to(s, RP_AFTER);
        after_value(p, s, b);
        return;
    case RP_NESTED: in_nested(s, b); return;
    case RP_AFTER: after_value(p, s, b); return;
    default: return;
    }
}

int nd_reason_prior_kind(const nd_reason_pos *s)
{
    switch (s->st) {
    case RP_VALUE: return ND_GRAM_AT_VALUE;
    case RP_STRING:
    case RP_SAID: return ND_GRAM_IN_STRING;
    case RP_NUMBER: return ND_GRAM_IN_NUMBER;
    default: return 0;
    }
}

/* ---- one step ---- */

/* whether a step from s can write an argument name: at a name's start
 * (after the colon, or the comma of ", "), or inside one that is not yet
 * a whole argument name */
static int naming_key(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (s->tool < 0)
        return 0;
    if (s->st == RP_COLON || (s->st == RP_AFTER && s->nb == 1 && s->b[0] == ','))
        return 1;
    return s->st == RP_KEY && (!s->nb || find_key(p, s, 1) < 0);
}

/* Whether argument k of the tool is one the plan may name next, in the
 * order the built-in base learned: the required ones first, in the
 * "required" list's order, then the optional ones in their declared
 * order. (The synthetic corpus keeps the declared order, where its tools
 * list every required argument first and in the same order.) */
static int next_key(const nd_reason_prior *p, const nd_reason_pos *s, int k)
{
    const nd_reason_tool *tl = &p->tool[s->tool];
    for (int i = 0; i < tl->nreq; i++)
        if (!(s->used >> tl->req_order[i] & 1))
            return k == tl->req_order[i];
    return k > s->last && (k >= 64 || !(s->used >> k & 1));
}

/* the argument whose value s is at or in (a whole name in RP_KEY: the
 * value may follow), NULL none */
static const nd_reason_key *value_key(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (s->tool < 0)
        return NULL;
    if (s->st == RP_KEY) {
        int k = s->nb ? find_key(p, s, 1) : -1;
        return k >= 0 ? &p->tool[s->tool].keys[k] : NULL;
    }
    if (s->st == RP_VALUE || s->st == RP_STRING || s->st == RP_NUMBER || s->st == RP_WORD ||
        s->st == RP_NESTED)
        return s->last >= 0 ? &p->tool[s->tool].keys[s->last] : NULL;
    return NULL;
}

/* a later call's name: the form has one of the listed names there */
static int naming_tool(const nd_reason_pos *s)
{
    return s->st == RP_NAME && s->then;
}

/* whether the named tool has an argument the plan has not named: where
 * none is left the plan of this call is done, so after "NAME: " (a tool
 * without arguments) only the reasoning's end, and no ", " after its
 * last value (the built-in base ends "convert: " there) */
static int keys_left(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (s->tool < 0)
        return 0;
    const nd_reason_tool *tl = &p->tool[s->tool];
    for (int k = 0; k < tl->nkeys; k++)
        if (k >= 64 || !(s->used >> k & 1))
            return 1;
    return 0;
}

/* the plan named every argument and goes on as if one were left: ", "
 * or its first byte (the reasoning ends there instead) */
static int plan_done(const nd_reason_prior *p, const nd_reason_pos *s)
{
    int more = s->st == RP_KEY || (s->st == RP_AFTER && s->nb >= 1 && s->b[0] == ',');
    return more && s->tool >= 0 && !keys_left(p, s);
}

/* a part of the form that has one way on: a later call's name, from the
 * colon to a value's first byte, and after a value (a separator, or the
 * reasoning's end, which is no byte) */
static int strict(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (s->st == RP_KEY)
        return keys_left(p, s); /* none left: done (nd_reason_prior_logits) */
    return naming_tool(s) || s->st == RP_COLON || s->st == RP_VALUE || s->st == RP_NUMBER ||
           s->st == RP_WORD || s->st == RP_AFTER;
}

/* where the reasoning may not end: inside a name, an argument or a value
 * (not after a number or a word: they end there) */
static int open_part(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (naming_tool(s))
        return find_tool(p, s->b, s->nb) < 0;
    if (s->st == RP_KEY)
        return keys_left(p, s);
    return s->st == RP_COLON || s->st == RP_VALUE || s->st == RP_STRING || s->st == RP_SAID ||
           s->st == RP_NESTED;
}

/* mark[]: this step's verdict on a piece */
enum {
    M_NONE,
    M_BAD,  /* breaks the form: a value of the wrong kind, a word no enum has */
    M_SAID, /* writes an enum value the turn says */
    M_KEY,  /* writes an argument's name */
    M_NEXT, /* ... one the plan may name next */
};

/* whether the argument name begun at s (a key so far, or the key whose
 * value s is in) is one next_key allows */
static int key_in_window(const nd_reason_prior *p, const nd_reason_pos *s)
{
    if (s->st != RP_KEY)
        return 1; /* past the name: it was in the window when its last byte was */
    const nd_reason_tool *tl = &p->tool[s->tool];
    for (int k = 0; k < tl->nkeys; k++) {
        const char *key = tl->keys[k].name;
        if (strlen(key) >= s->nb && !memcmp(key, s->b, s->nb) && next_key(p, s, k))
            return 1;
    }
    return 0;
}

static uint8_t first_byte_kind(unsigned char b)
{
    return b == '"'                  ? T_STRING
           : is_digit(b) || b == '-' ? T_NUMBER
           : b == 't' || b == 'f'    ? T_BOOL
           : b == 'n'                ? T_NULL
           : b == '['                ? T_ARRAY
           : b == '{'                ? T_OBJECT
                                     : 0;
}

/* whether an enum value of key k (said ones only: said) is text[0..n)
 * (whole), or begins so */
static int enum_has(const nd_reason_key *k, const char *text, size_t n, int whole, int said)
{
    for (int e = 0; e < k->nenum; e++) {
        size_t len = strlen(k->enums[e]);
        if ((!said || k->said[e]) && (whole ? len == n : len >= n) && !memcmp(k->enums[e], text, n))
            return 1;
    }
    return 0;
}

/* Whether byte b, read at s (before it) with the string so far
 * text[0..n), keeps to the form: a later call's name is a listed one's, a
 * value begins as the schema's type allows, and an enum's string is one of
 * its values. */
static int byte_ok(const nd_reason_prior *p, const nd_reason_pos *s, const char *text, size_t n,
                   unsigned char b)
{
    if (naming_tool(s)) {
        if (b == ':' || (b == ' ' && !s->nb))
            return 1; /* the parser judges the name at its colon */
        char t[sizeof s->b + 1];
        memcpy(t, s->b, s->nb);
        t[s->nb] = (char)b;
        return tool_prefix(p, t, (size_t)s->nb + 1);
    }
    const nd_reason_key *k =
        s->st == RP_VALUE || s->st == RP_STRING || s->st == RP_NUMBER ? value_key(p, s) : NULL;
    if (!k)
        return 1;
    if (s->st == RP_VALUE)
        return !k->types || (first_byte_kind(b) & k->types);
    if (s->st == RP_NUMBER)
        return !(k->types & T_INT) || (k->types & ~(T_NUMBER | T_INT)) ||
               !(b == '.' || b == 'e' || b == 'E');
    if (!k->nenum || s->esc)
        return 1;
    if (b == '"')
        return enum_has(k, text, n, 1, 0);
    char t[sizeof s->b];
    if (n + 1 > sizeof t)
        return 0;
    memcpy(t, text, n);
    t[n] = (char)b;
    return enum_has(k, t, n + 1, 0, 0);
}

/* every allowed piece at or below trie node n gets verdict m */
static void mark_subtree(nd_reason_prior *p, const needle_model *M, int n, const uint8_t *allowed,
                         uint8_t m)
{
    int child[PIECE_MAX + 2], d = 0;
    for (int t = M->trie[n].tok; t >= 0; t = M->tok_next[t])
        if (allowed[t])
            p->mark[t] = m;
    child[0] = M->trie[n].child;
    while (d >= 0) {
        int c = child[d];
        if (c < 0 || d >= PIECE_MAX) {
            d--;
            continue;
        }
        child[d] = M->trie[c].sibling;
        for (int t = M->trie[c].tok; t >= 0; t = M->tok_next[t])
            if (allowed[t])
                p->mark[t] = m;
        child[++d] = M->trie[c].child;
    }
}

/* the string so far at depth d: the value before the piece, then the
 * piece's bytes from `from` (-1: the string began before the piece) */
static size_t string_so_far(const nd_reason_prior *p, const unsigned char *path, int from, int d,
                            char *out, size_t cap)
{
    size_t n = 0;
    if (from < 0) {
        n = p->value.n < cap ? p->value.n : cap;
        memcpy(out, p->value.p ? p->value.p : "", n);
        from = 0;
    }
    for (int k = from; k < d && n < cap; k++)
        out[n++] = (char)path[k];
    return n;
}

/* what the walk does this step */
typedef struct {
    int keys;   /* the form has an argument's name next */
    int values; /* the copy prior judges values */
} walk_needs;

/* the verdict on a piece (at: the position after it; in an enum's
 * string, text[0..tn) the string so far) */
static uint8_t piece_mark(const nd_reason_prior *p, walk_needs w, const nd_reason_pos *at,
                          int wrote_key, const char *text, size_t tn, int in_string)
{
    if (at->st == RP_OFF) /* off the form (where nothing else was left) */
        return M_NONE;
    if (w.keys && (wrote_key || at->st == RP_KEY)) /* a bare space: the name follows */
        return key_in_window(p, at) ? M_NEXT : M_KEY;
    if (in_string && tn && p->enum_bonus != 0.0f &&
        enum_has(&p->tool[at->tool].keys[at->last], text, tn, 0, 1))
        return M_SAID;
    return M_NONE;
}

/* Walk every allowed piece from the plan's position: mark the pieces that
 * write an argument name, a said enum value, or break the form, and let
 * the copy prior judge the pieces that open or close a value. */
static void walk_pieces(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c,
                        const uint8_t *allowed, walk_needs w)
{
    nd_reason_pos at[PIECE_MAX + 2];
    int node_at[PIECE_MAX + 2], from[PIECE_MAX + 2];
    unsigned char path[PIECE_MAX + 1];
    signed char inval[PIECE_MAX + 2];
    uint8_t wrote_key[PIECE_MAX + 2];
    at[0] = p->at;
    inval[0] = (signed char)nd_reason_prior_kind(&p->at);
    wrote_key[0] = 0;
    from[0] = -1;
    node_at[0] = M->trie[0].child;
    int d = 0;
    while (d >= 0) {
        int n = node_at[d];
        if (n < 0) {
            d--;
            continue;
        }
        node_at[d] = M->trie[n].sibling;
        unsigned char b = M->trie[n].byte;
        const nd_reason_key *vk = value_key(p, &at[d]);
        int in_enum = vk && vk->nenum && (at[d].st == RP_STRING || at[d].st == RP_VALUE);
        char text[sizeof at[d].b];
        size_t tn = at[d].st == RP_STRING && in_enum
                        ? string_so_far(p, path, from[d], d, text, sizeof text)
                        : 0;
        if (!byte_ok(p, &at[d], text, tn, b)) {
            mark_subtree(p, M, n, allowed, M_BAD);
            continue;
        }
        at[d + 1] = at[d];
        nd_reason_prior_step(p, &at[d + 1], b);
        if ((at[d + 1].st == RP_OFF && strict(p, &at[d])) ||
            (plan_done(p, &at[d + 1]) && !plan_done(p, &at[d]) && at[d].st != RP_COLON)) {
            mark_subtree(p, M, n, allowed, M_BAD);
            continue;
        }
        path[d] = b;
        from[d + 1] = at[d].st == RP_VALUE && at[d + 1].st == RP_STRING ? d + 1 : from[d];
        inval[d + 1] = (signed char)nd_reason_prior_kind(&at[d + 1]);
        wrote_key[d + 1] = wrote_key[d] || (at[d].st == RP_KEY && b != ' ');
        const nd_reason_key *nk = value_key(p, &at[d + 1]);
        int enum_after = in_enum || (nk && nk->nenum);
        int in_string = enum_after && at[d + 1].st == RP_STRING;
        size_t tn1 = in_string ? string_so_far(p, path, from[d + 1], d + 1, text, sizeof text) : 0;
        uint8_t mark = piece_mark(p, w, &at[d + 1], wrote_key[d + 1], text, tn1, in_string);
        for (int t = M->trie[n].tok; t >= 0; t = M->tok_next[t]) {
            if (!allowed[t])
                continue;
            if (mark) {
                p->mark[t] = mark;
                p->nkeyed += mark >= M_KEY;
            }
            if (w.values && !enum_after)
                nd_copy_prior_token(c, t, (const unsigned char *)(p->value.p ? p->value.p : ""),
                                    (int)p->value.n, path, d + 1, inval);
        }
        if (d + 1 <= PIECE_MAX && M->trie[n].child >= 0) {
            node_at[d + 1] = M->trie[n].child;
            d++;
        }
    }
}

const float *nd_reason_prior_logits(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c,
                                    const float *logits, const uint8_t *allowed)
{
    if (!p->active || (p->at.tool < 0 && !naming_tool(&p->at)))
        return logits;
    int V = M->m.dims.V, kind = nd_reason_prior_kind(&p->at);
    if (plan_done(p, &p->at) && p->id_end >= 0 && p->id_end < V &&
        allowed[p->id_end]) { /* the call's plan is done: the reasoning ends */
        for (int t = 0; t < V; t++)
            p->biased[t] = t == p->id_end ? logits[t] : -INFINITY;
        return p->biased;
    }
    const nd_reason_key *vk = value_key(p, &p->at);
    nd_copy_prior_key(c, vk ? vk->name : NULL, vk ? (int)strlen(vk->name) : 0);
    /* values get the copy prior's bonuses (an enum's the said ones'); a
     * value's first piece often carries the space before it, so from a
     * whole argument name on */
    walk_needs w = {naming_key(p, &p->at), vk && !vk->nenum && c->bonus != 0.0f};
    int walk = w.keys || w.values || strict(p, &p->at) || (vk && vk->nenum) ||
               p->at.st == RP_AFTER || p->at.st == RP_NUMBER || p->at.st == RP_WORD;
    int ends = open_part(p, &p->at);
    if (!walk && !ends)
        return logits;
    memset(p->mark, 0, (size_t)V);
    p->nkeyed = 0;
    const unsigned char *v = (const unsigned char *)(p->value.p ? p->value.p : "");
    int vn = (int)p->value.n;
    if (w.values)
        nd_copy_prior_begin(c, V, kind, v, vn);
    if (walk)
        walk_pieces(p, M, c, allowed, w);
    if (w.values && (kind == ND_GRAM_IN_STRING || kind == ND_GRAM_IN_NUMBER))
        nd_copy_prior_mark(c, M, kind, v, vn, allowed);
    if (ends && p->id_end >= 0 && p->id_end < V)
        p->mark[p->id_end] = M_BAD;
    memcpy(p->biased, logits, (size_t)V * sizeof *p->biased);
    if (w.values)
        nd_copy_prior_add(c, allowed, V, p->biased);
    /* the reasoning's end closes a number as a separator does (it is no
     * piece of bytes, so the walk never judged it): without the copy's
     * edge bonus, a plan that is done would go on with "; then ..." */
    if (w.values && kind == ND_GRAM_IN_NUMBER && c->closes && p->id_end >= 0 && p->id_end < V &&
        allowed[p->id_end])
        p->biased[p->id_end] += c->edge_bonus;
    /* where the form has an argument's name next, only names are written
     * (when the tool has one left), and those the plan may name next get
     * the bonus; no piece that breaks the form is written while another is
     * allowed (a piece of every single byte exists, so one always is) */
    int keep_keys = w.keys && p->nkeyed;
    for (int t = 0; t < V; t++) {
        uint8_t m = p->mark[t];
        if (m == M_BAD || (keep_keys && m < M_KEY))
            p->biased[t] = -INFINITY;
        else if (m == M_NEXT)
            p->biased[t] += p->key_bonus;
        else if (m == M_SAID)
            p->biased[t] += p->enum_bonus;
    }
    return p->biased;
}

void nd_reason_prior_feed(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c, int t)
{
    if (!p->active || p->at.st == RP_OFF)
        return;
    unsigned char b[PIECE_MAX];
    int len = 0;
    nd_piece_bytes(M->tok, t, b, &len);
    for (int k = 0; k < len; k++) {
        int was = p->at.st;
        nd_reason_prior_step(p, &p->at, b[k]);
        int now = p->at.st;
        if (c && was != now && (was == RP_STRING || was == RP_SAID || was == RP_NUMBER))
            nd_copy_prior_take(c, (const unsigned char *)(p->value.p ? p->value.p : ""),
                               (int)p->value.n, was == RP_NUMBER);
        if (c && now == RP_NAME && was != RP_NAME)
            nd_copy_prior_untake(c); /* "; then ": the next call copies afresh */
        if (now == RP_STRING || now == RP_SAID || now == RP_NUMBER) {
            if (was != now)
                p->value.n = 0;
            if ((was == now || now == RP_NUMBER) && nd_buf_put(&p->value, (const char *)b + k, 1))
                p->at.st = RP_OFF; /* out of memory: the prior stops, the reasoning goes on */
        }
    }
}
