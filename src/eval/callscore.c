/* Call-list scoring: JSON-normalised equality, multiset matching, schema
 * validity through the decoder's grammar. */
#include "eval/callscore.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar.h"

static int is_num(const nd_pj *v)
{
    return v->type == ND_PJ_INT || v->type == ND_PJ_FLOAT;
}

/* An integer's decimal text against a double: equal only when the double
 * is finite, integral and prints to the same digits (exact, any size). */
static int int_equals_float(const nd_pj *i, double f)
{
    if (!isfinite(f) || f != floor(f))
        return 0;
    if (f == 0)
        return !strcmp(i->str, "0");
    char buf[400]; /* |f| < 2^1024: at most 309 digits */
    snprintf(buf, sizeof buf, "%.0f", f);
    return !strcmp(i->str, buf);
}

int nd_json_equal(const nd_pj *a, const nd_pj *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->type == ND_PJ_INT && b->type == ND_PJ_INT)
            return !strcmp(a->str, b->str);
        if (a->type == ND_PJ_FLOAT && b->type == ND_PJ_FLOAT)
            return a->num == b->num;
        return a->type == ND_PJ_INT ? int_equals_float(a, b->num) : int_equals_float(b, a->num);
    }
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case ND_PJ_STRING: return a->len == b->len && !memcmp(a->str, b->str, a->len);
    case ND_PJ_ARRAY:
        if (a->len != b->len)
            return 0;
        for (size_t k = 0; k < a->len; k++)
            if (!nd_json_equal(a->items[k], b->items[k]))
                return 0;
        return 1;
    case ND_PJ_OBJECT:
        /* the parser merges repeated keys, so equal sizes + every key of a
         * found in b with an equal value means equal key sets */
        if (a->len != b->len)
            return 0;
        for (size_t k = 0; k < a->len; k++) {
            const nd_pj *bv = NULL;
            for (size_t j = 0; j < b->len && !bv; j++)
                if (b->obj[j].key_len == a->obj[k].key_len &&
                    !memcmp(b->obj[j].key, a->obj[k].key, a->obj[k].key_len))
                    bv = b->obj[j].val;
            if (!bv || !nd_json_equal(a->obj[k].val, bv))
                return 0;
        }
        return 1;
    default: return 1; /* null, true, false: the type is the value */
    }
}

int nd_calls_check(const nd_pj *v)
{
    if (v->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "not a JSON array of calls");
    for (size_t k = 0; k < v->len; k++) {
        const nd_pj *c = v->items[k];
        if (c->type != ND_PJ_OBJECT)
            return nd_error(ND_EFORMAT, "call %zu is not an object", k);
        const nd_pj *name = nd_pj_get(c, "name"), *args = nd_pj_get(c, "arguments");
        if (!name || name->type != ND_PJ_STRING)
            return nd_error(ND_EFORMAT, "call %zu: \"name\" %s", k,
                            name ? "is not a string" : "is missing");
        if (args && args->type != ND_PJ_OBJECT)
            return nd_error(ND_EFORMAT, "call %zu: \"arguments\" is not an object", k);
    }
    return ND_OK;
}

static const nd_pj empty_object = {.type = ND_PJ_OBJECT};

static const nd_pj *call_args(const nd_pj *call)
{
    const nd_pj *a = nd_pj_get(call, "arguments");
    return a ? a : &empty_object;
}

/* Multiset equality of two call lists by `same` (an equivalence, so a
 * greedy matching finds a perfect one whenever one exists). */
static int multiset_equal(const nd_pj *x, const nd_pj *y, int with_args)
{
    if (x->len != y->len)
        return 0;
    if (!x->len)
        return 1;
    char *used = calloc(y->len, 1);
    if (!used)
        return 0;
    int ok = 1;
    for (size_t i = 0; i < x->len && ok; i++) {
        const nd_pj *xn = nd_pj_get(x->items[i], "name");
        size_t j = 0;
        for (; j < y->len; j++) {
            if (used[j])
                continue;
            const nd_pj *yn = nd_pj_get(y->items[j], "name");
            if (!nd_json_equal(xn, yn))
                continue;
            if (with_args && !nd_json_equal(call_args(x->items[i]), call_args(y->items[j])))
                continue;
            break;
        }
        if (j == y->len)
            ok = 0;
        else
            used[j] = 1;
    }
    free(used);
    return ok;
}

static void why(nd_call_verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why(nd_call_verdict *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
}

/* Append the compact text the decoder writes for calls [from, to):
 * [{"name":..,"arguments":{..}},...]. */
static int put_calls(const nd_pj *calls, size_t from, size_t to, nd_buf *b)
{
    int rc = nd_buf_put(b, "[", 1);
    for (size_t k = from; k < to && !rc; k++) {
        const nd_pj *c = calls->items[k];
        rc = nd_buf_put(b, k > from ? ",{\"name\":" : "{\"name\":", k > from ? 9 : 8);
        if (!rc)
            rc = nd_pj_dump(nd_pj_get(c, "name"), 1, b);
        if (!rc)
            rc = nd_buf_put(b, ",\"arguments\":", 13);
        if (!rc)
            rc = nd_pj_dump(call_args(c), 1, b);
        if (!rc)
            rc = nd_buf_put(b, "}", 1);
    }
    return rc ? rc : nd_buf_put(b, "]", 1);
}

/* 1 when the grammar accepts calls [from, to) as a whole call list; -1 on
 * out of memory. */
static int accepts(const nd_grammar *g, const nd_pj *calls, size_t from, size_t to)
{
    nd_buf b = {0};
    nd_gram_state *st = malloc(sizeof *st);
    if (!st || put_calls(calls, from, to, &b)) {
        free(st);
        nd_buf_free(&b);
        return -1;
    }
    nd_gram_init(g, st);
    int ok = 1;
    for (size_t at = 0; at < b.n && ok; at++)
        ok = nd_gram_feed(g, st, (unsigned char)b.p[at]);
    ok = ok && nd_gram_done(st);
    free(st);
    nd_buf_free(&b);
    return ok;
}

static const char *tool_name(const nd_pj *tool)
{
    const nd_pj *f = nd_pj_get(tool, "function");
    const nd_pj *n = nd_pj_get(f && f->type == ND_PJ_OBJECT ? f : tool, "name");
    return n && n->type == ND_PJ_STRING ? n->str : NULL;
}

/* Is the parsed call list valid for the tools? On no, `why` says which
 * call fails and how. */
static int calls_valid(const nd_pj *calls, const nd_pj *tools, const nd_grammar *g,
                       nd_call_verdict *v)
{
    for (size_t k = 0; k < calls->len; k++) {
        const nd_pj *c = calls->items[k];
        if (c->len > 1u + (nd_pj_get(c, "arguments") != NULL)) {
            why(v, "call %zu (%.100s): keys other than \"name\" and \"arguments\"", k,
                nd_pj_get(c, "name")->str);
            return 0;
        }
    }
    int all = accepts(g, calls, 0, calls->len);
    if (all > 0)
        return 1;
    if (all < 0) {
        why(v, "out of memory");
        return 0;
    }
    if (!calls->len) {
        why(v, "the grammar rejects the empty list");
        return 0;
    }
    for (size_t k = 0; k < calls->len; k++) {
        const nd_pj *c = calls->items[k];
        const char *name = nd_pj_get(c, "name")->str;
        size_t t = 0;
        for (; t < tools->len; t++) {
            const char *tn = tool_name(tools->items[t]);
            if (tn && !strcmp(tn, name))
                break;
        }
        if (t == tools->len) {
            why(v, "call %zu: \"%.100s\" is not a declared tool", k, name);
            return 0;
        }
        if (accepts(g, calls, k, k + 1) == 0) {
            why(v, "call %zu (%.100s): arguments do not satisfy the tool's schema", k, name);
            return 0;
        }
    }
    why(v, "the grammar rejects the list as a whole");
    return 0;
}

int nd_callscore_example(const nd_pj *expected, const char *predicted, size_t predicted_len,
                         const nd_pj *tools, const char *engine_error, nd_call_verdict *v)
{
    memset(v, 0, sizeof *v);
    int rc = nd_calls_check(expected);
    if (rc)
        return nd_error_prefix(rc, "expected calls");
    if (tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "tools: not a JSON array");
    v->expects_call = expected->len > 0;
    if (!predicted) {
        why(v, "engine error: %.200s", engine_error ? engine_error : "no answer");
        return ND_OK;
    }
    nd_pj_doc *doc = NULL;
    size_t col = 0;
    if (nd_pj_parse(predicted, predicted_len, &doc, &col)) {
        why(v, "not valid JSON (%.200s)", nd_last_error());
        return ND_OK;
    }
    const nd_pj *calls = nd_pj_root(doc);
    if (nd_calls_check(calls)) {
        why(v, "not a call list: %.200s", nd_last_error());
        nd_pj_free(doc);
        return ND_OK;
    }
    v->parsed = 1;
    v->called = calls->len > 0;
    v->names_ok = multiset_equal(expected, calls, 0);
    v->args_ok = multiset_equal(expected, calls, 1);
    nd_grammar *g = NULL;
    rc = nd_gram_compile(tools, &g);
    if (rc) {
        nd_pj_free(doc);
        return nd_error_prefix(rc, "tools");
    }
    v->valid = calls_valid(calls, tools, g, v);
    nd_gram_free(g);
    nd_pj_free(doc);
    return ND_OK;
}

void nd_callscore_add(nd_callscore_totals *t, const nd_call_verdict *v)
{
    int k = v->expects_call ? 1 : 0;
    t->examples[k]++;
    t->valid[k] += v->valid != 0;
    t->names_ok[k] += v->names_ok != 0;
    t->args_ok[k] += v->args_ok != 0;
    t->refused[k] += v->parsed && !v->called;
}
