/* Reading eval-calls examples: parse, check every field the scorer and the
 * engine rely on, report the first problem with file:line:field. */
#include "eval/calldata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "eval/callscore.h"
#include "io/jsonl.h"

static void example_free(nd_call_example *e)
{
    for (int k = 0; k < 3; k++)
        nd_pj_free(e->docs[k]);
    free(e->tools_json);
    memset(e, 0, sizeof *e);
}

void nd_call_set_free(nd_call_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        example_free(&s->ex[i]);
    free(s->ex);
    memset(s, 0, sizeof *s);
}

/* "tools" / "answers": a JSON value, or JSON text in a string (as
 * training accepts); the parsed text's document goes to *doc. */
static int json_field(const char *field, const nd_pj *v, nd_pj_doc **doc, const nd_pj **out)
{
    *out = v;
    if (v->type != ND_PJ_STRING)
        return ND_OK;
    int rc = nd_pj_parse(v->str, v->len, doc, NULL);
    if (rc)
        return nd_error_prefix(rc, "%s: the string is not JSON", field);
    *out = nd_pj_root(*doc);
    return ND_OK;
}

static const nd_pj empty_array = {.type = ND_PJ_ARRAY};

/* Fill e from one parsed line (e->docs[0] holds it). 1 = no "query". */
static int load_example(nd_call_example *e)
{
    const nd_pj *root = nd_pj_root(e->docs[0]);
    if (root->type != ND_PJ_OBJECT)
        return nd_error(ND_EFORMAT, "the line is not a JSON object");
    e->query = nd_pj_get(root, "query");
    if (!e->query)
        return 1;
    if (e->query->type != ND_PJ_STRING)
        return nd_error(ND_EFORMAT, "query: not a string");
    if (memchr(e->query->str, 0, e->query->len))
        return nd_error(ND_EFORMAT, "query: contains a NUL character");
    const nd_pj *sys = nd_pj_get(root, "system");
    if (sys && nd_pj_truthy(sys)) {
        if (sys->type != ND_PJ_STRING)
            return nd_error(ND_EFORMAT, "system: not a string");
        e->system = sys->str;
    }
    int rc;
    const nd_pj *tools = nd_pj_get(root, "tools");
    e->tools = &empty_array;
    if (tools && (rc = json_field("tools", tools, &e->docs[1], &e->tools)))
        return rc;
    if (e->tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "tools: not a JSON array");
    for (size_t k = 0; k < e->tools->len; k++)
        if (e->tools->items[k]->type != ND_PJ_OBJECT)
            return nd_error(ND_EFORMAT, "tools: tool %zu is not an object", k);
    const char *afield = nd_pj_get(root, "answers") ? "answers" : "function_calls";
    const nd_pj *answers = nd_pj_get(root, afield);
    e->expected = &empty_array;
    if (answers && (rc = json_field(afield, answers, &e->docs[2], &e->expected)))
        return rc;
    if ((rc = nd_calls_check(e->expected)))
        return nd_error_prefix(rc, "%s", afield);
    nd_buf b = {0};
    if ((rc = nd_pj_dump(e->tools, 1, &b))) {
        nd_buf_free(&b);
        return rc;
    }
    e->tools_json = b.p;
    return ND_OK;
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\f' && s[i] != '\v')
            return 0;
    return 1;
}

int nd_calldata_load(const char *path, int skip_bad, size_t limit, nd_call_set *out)
{
    memset(out, 0, sizeof *out);
    nd_lines *r;
    int rc = nd_lines_open(path, 0, &r);
    if (rc)
        return rc;
    size_t cap = 0;
    while (!limit || out->n < limit) {
        const char *line;
        size_t len, lineno;
        int got = nd_lines_next(r, &line, &len, &lineno);
        if (got == 0)
            break;
        if (got < 0 && !(got == ND_ELIMIT && skip_bad)) {
            rc = got;
            break;
        }
        out->lines++;
        if (got > 0 && blank(line, len)) {
            out->blank++;
            continue;
        }
        if (out->n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            nd_call_example *ne = realloc(out->ex, nc * sizeof *ne);
            if (!ne) {
                rc = nd_error(ND_ENOMEM, "out of memory for %zu examples", nc);
                break;
            }
            out->ex = ne;
            cap = nc;
        }
        nd_call_example *e = &out->ex[out->n];
        memset(e, 0, sizeof *e);
        e->line = lineno;
        int lr = got;
        if (got > 0) {
            lr = nd_pj_parse(line, len, &e->docs[0], NULL);
            if (lr)
                nd_error_prefix(lr, "invalid JSON");
            else
                lr = load_example(e);
        }
        if (lr == 0) {
            out->n++;
            continue;
        }
        example_free(e);
        if (lr == 1) {
            out->no_query++;
            continue;
        }
        if (got > 0)
            nd_error_prefix(lr, "%s:%zu", path, lineno);
        if (!skip_bad) {
            rc = lr;
            break;
        }
        if (!out->bad++)
            snprintf(out->first_bad, sizeof out->first_bad, "%s", nd_last_error());
    }
    nd_lines_close(r);
    if (rc)
        nd_call_set_free(out);
    return rc;
}
