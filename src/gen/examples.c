/* Prompt, reply parsing, validation and de-duplication of generated
 * examples (see examples.h). */
#include "gen/examples.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar.h"
#include "gen/chat_reply.h"
#include "text/render.h"

const char nd_gen_system_prompt[] =
    "You generate training data for a tool-calling and extraction model. Given a set of tool or "
    "record schemas, produce realistic, diverse inputs paired with the exact calls that satisfy "
    "them. Return only JSON.";

/* Same structure as upstream's _GEN_TEMPLATE: the replies are parsed as a
 * JSON array of {"query", "reasoning", "answers": [{"name", "arguments"}]}. */
int nd_gen_user_prompt(const nd_pj *tools, int n, int refusals, nd_buf *out)
{
    char tail[1400];
    int rc = nd_buf_put(out, "Schemas available (JSON):\n", 26);
    if (!rc)
        rc = nd_pj_dump(tools, 0, out);
    int k = snprintf(
        tail, sizeof tail,
        "\n\nProduce %d varied examples as a JSON array. Each element is an object:\n"
        "  {\"query\": \"<a natural user request to act on, or a passage of text to extract "
        "from>\",\n"
        "    \"reasoning\": \"<one short line deriving each argument from its source span in the "
        "query>\",\n"
        "    \"answers\": [{\"name\": \"<schema name>\", \"arguments\": {...}}]}\n\n"
        "Rules:\n"
        "- Use only the schemas above; arguments must match them exactly and contain only\n"
        "  values evidenced in the query.\n"
        "- For an action tool the query is a command. For a record/extraction schema (its\n"
        "  fields describe an entity), the query is a natural passage that contains those\n"
        "  fields and the call extracts them.\n"
        "- Cover single-call, multi-call, and about %d off-topic inputs that no\n"
        "  schema can serve (for those, \"answers\" is []).\n"
        "- Vary phrasing, values, and which schemas are used. Return ONLY the JSON array.",
        n, refusals);
    if (!rc)
        rc = nd_buf_put(out, tail, (size_t)k);
    return rc;
}

/* ---- de-duplication: open-addressing set of normalised keys ---- */

typedef struct {
    char **slot;
    size_t *len;
    size_t cap, n;
} key_set;

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Insert; 1 if it was new, 0 if present, negative on allocation failure. */
static int key_set_add(key_set *ks, const char *k, size_t n)
{
    if (2 * (ks->n + 1) > ks->cap) {
        size_t cap = ks->cap ? 2 * ks->cap : 64;
        char **slot = calloc(cap, sizeof *slot);
        size_t *len = calloc(cap, sizeof *len);
        if (!slot || !len) {
            free(slot);
            free(len);
            return ND_ENOMEM;
        }
        for (size_t i = 0; i < ks->cap; i++) {
            if (!ks->slot[i])
                continue;
            size_t j = fnv1a(ks->slot[i], ks->len[i]) & (cap - 1);
            while (slot[j])
                j = (j + 1) & (cap - 1);
            slot[j] = ks->slot[i];
            len[j] = ks->len[i];
        }
        free(ks->slot);
        free(ks->len);
        ks->slot = slot;
        ks->len = len;
        ks->cap = cap;
    }
    size_t j = fnv1a(k, n) & (ks->cap - 1);
    for (; ks->slot[j]; j = (j + 1) & (ks->cap - 1))
        if (ks->len[j] == n && !memcmp(ks->slot[j], k, n))
            return 0;
    char *copy = malloc(n + 1);
    if (!copy)
        return ND_ENOMEM;
    memcpy(copy, k, n);
    copy[n] = 0;
    ks->slot[j] = copy;
    ks->len[j] = n;
    ks->n++;
    return 1;
}

static void key_set_free(key_set *ks)
{
    for (size_t i = 0; i < ks->cap; i++)
        free(ks->slot[i]);
    free(ks->slot);
    free(ks->len);
}

/* JSON with object keys sorted (json.dumps(sort_keys=True) up to spacing):
 * the same answers in another key order are the same answers. */
static int key_less(const nd_pj_member *x, const nd_pj_member *y)
{
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c < 0 : x->key_len < y->key_len;
}

static int dump_sorted(const nd_pj *v, nd_buf *out)
{
    int rc = 0;
    if (v->type == ND_PJ_ARRAY) {
        rc = nd_buf_put(out, "[", 1);
        for (size_t i = 0; !rc && i < v->len; i++) {
            if (i)
                rc = nd_buf_put(out, ",", 1);
            if (!rc)
                rc = dump_sorted(v->items[i], out);
        }
        return rc ? rc : nd_buf_put(out, "]", 1);
    }
    if (v->type != ND_PJ_OBJECT)
        return nd_pj_dump(v, 1, out);
    size_t *order = malloc((v->len + 1) * sizeof *order);
    if (!order)
        return ND_ENOMEM;
    /* insertion sort: argument objects are small, and C11's qsort takes
     * no context pointer */
    for (size_t i = 0; i < v->len; i++) {
        size_t j = i;
        for (; j > 0 && key_less(&v->obj[i], &v->obj[order[j - 1]]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    rc = nd_buf_put(out, "{", 1);
    for (size_t i = 0; !rc && i < v->len; i++) {
        const nd_pj_member *m = &v->obj[order[i]];
        nd_pj key = {.type = ND_PJ_STRING, .len = m->key_len, .str = m->key};
        if (i)
            rc = nd_buf_put(out, ",", 1);
        if (!rc)
            rc = nd_pj_dump(&key, 1, out);
        if (!rc)
            rc = nd_buf_put(out, ":", 1);
        if (!rc)
            rc = dump_sorted(m->val, out);
    }
    free(order);
    return rc ? rc : nd_buf_put(out, "}", 1);
}

/* query.strip().lower() + NUL + sorted answers, as upstream's _dedup_key
 * (ASCII case folding and whitespace only). */
static int dedup_key(const nd_pj *query, const nd_pj *answers, nd_buf *key)
{
    const char *q = query ? query->str : "";
    size_t a = 0, b = query ? query->len : 0;
    while (a < b && strchr(" \t\n\r\f\v", q[a]))
        a++;
    while (b > a && strchr(" \t\n\r\f\v", q[b - 1]))
        b--;
    key->n = 0;
    for (size_t i = a; i < b; i++) {
        char c = q[i] >= 'A' && q[i] <= 'Z' ? (char)(q[i] - 'A' + 'a') : q[i];
        if (nd_buf_put(key, &c, 1))
            return ND_ENOMEM;
    }
    if (nd_buf_put(key, "", 1))
        return ND_ENOMEM;
    if (answers)
        return dump_sorted(answers, key);
    return nd_buf_put(key, "[]", 2);
}

/* ---- the set ---- */

struct nd_gen_set {
    const nd_pj *tools;
    nd_grammar *gram;
    key_set seen;
    char **lines;
    size_t *line_len;
    size_t n, cap;
    nd_gen_counts counts;
    char first_invalid[256];
    char first_unparsable[256];
    nd_buf scratch, prompt, target;
};

int nd_gen_set_new(const nd_pj *tools, nd_gen_set **out)
{
    *out = NULL;
    if (!tools || tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "the tools must be a JSON array of schemas");
    nd_gen_set *s = calloc(1, sizeof *s);
    if (!s)
        return ND_ENOMEM;
    s->tools = tools;
    int rc = nd_gram_compile(tools, &s->gram);
    if (rc) {
        free(s);
        return nd_error_prefix(rc, "tools");
    }
    *out = s;
    return 0;
}

void nd_gen_set_free(nd_gen_set *s)
{
    if (!s)
        return;
    nd_gram_free(s->gram);
    key_set_free(&s->seen);
    for (size_t i = 0; i < s->n; i++)
        free(s->lines[i]);
    free(s->lines);
    free(s->line_len);
    nd_buf_free(&s->scratch);
    nd_buf_free(&s->prompt);
    nd_buf_free(&s->target);
    free(s);
}

size_t nd_gen_size(const nd_gen_set *s)
{
    return s->n;
}

const char *nd_gen_line(const nd_gen_set *s, size_t i, size_t *len)
{
    *len = s->line_len[i];
    return s->lines[i];
}

const nd_gen_counts *nd_gen_get_counts(const nd_gen_set *s)
{
    return &s->counts;
}

const char *nd_gen_warnings(const nd_gen_set *s)
{
    return nd_gram_warnings(s->gram);
}

const char *nd_gen_first_invalid(const nd_gen_set *s)
{
    return s->first_invalid;
}

const char *nd_gen_first_unparsable(const nd_gen_set *s)
{
    return s->first_unparsable;
}

static void reject(nd_gen_set *s, size_t idx, const char *why)
{
    s->counts.invalid++;
    if (!s->first_invalid[0])
        snprintf(s->first_invalid, sizeof s->first_invalid, "element %zu: %s", idx + 1, why);
}

/* Check the answers through the tool-call grammar: the compact JSON of
 * [{"name":..,"arguments":..}, ...] must be accepted to the end. */
static int answers_match_schemas(nd_gen_set *s, const nd_pj *answers, char *why, size_t why_n)
{
    for (size_t i = 0; i < answers->len; i++) {
        const nd_pj *a = answers->items[i];
        const nd_pj *name = nd_pj_get(a, "name"), *args = nd_pj_get(a, "arguments");
        if (!a || a->type != ND_PJ_OBJECT || !name || name->type != ND_PJ_STRING || !args ||
            args->type != ND_PJ_OBJECT || a->len != 2) {
            snprintf(why, why_n, "answer %zu is not {\"name\": string, \"arguments\": object}",
                     i + 1);
            return 0;
        }
    }
    /* name first, then arguments: the order the grammar (and training) uses */
    nd_buf *b = &s->scratch;
    b->n = 0;
    int rc = nd_buf_put(b, "[", 1);
    for (size_t i = 0; !rc && i < answers->len; i++) {
        const nd_pj *a = answers->items[i];
        rc = nd_buf_put(b, i ? ",{\"name\":" : "{\"name\":", i ? 9 : 8);
        if (!rc)
            rc = nd_pj_dump(nd_pj_get(a, "name"), 1, b);
        if (!rc)
            rc = nd_buf_put(b, ",\"arguments\":", 13);
        if (!rc)
            rc = nd_pj_dump(nd_pj_get(a, "arguments"), 1, b);
        if (!rc)
            rc = nd_buf_put(b, "}", 1);
    }
    if (!rc)
        rc = nd_buf_put(b, "]", 1);
    if (rc) {
        snprintf(why, why_n, "out of memory");
        return 0;
    }
    nd_gram_state st;
    nd_gram_init(s->gram, &st);
    for (size_t i = 0; i < b->n; i++)
        if (!nd_gram_feed(s->gram, &st, (unsigned char)b->p[i])) {
            size_t from = i > 40 ? i - 40 : 0;
            snprintf(why, why_n, "answers break the tool schemas at \"%.*s\" <- here",
                     (int)(i + 1 - from), b->p + from);
            return 0;
        }
    if (!nd_gram_done(&st)) {
        snprintf(why, why_n, "answers are incomplete for the tool schemas");
        return 0;
    }
    return 1;
}

static int store_line(nd_gen_set *s, const nd_buf *line)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **l = realloc(s->lines, cap * sizeof *l);
        if (!l)
            return ND_ENOMEM;
        s->lines = l;
        size_t *ll = realloc(s->line_len, cap * sizeof *ll);
        if (!ll)
            return ND_ENOMEM;
        s->line_len = ll;
        s->cap = cap;
    }
    char *copy = malloc(line->n + 1);
    if (!copy)
        return ND_ENOMEM;
    memcpy(copy, line->p, line->n + 1);
    s->lines[s->n] = copy;
    s->line_len[s->n++] = line->n;
    return 0;
}

/* Validate element idx; keep it when valid and new. 1 = kept. */
static int consider(nd_gen_set *s, const nd_pj *e, size_t idx)
{
    char why[200];
    const nd_pj *query = nd_pj_get(e, "query"), *answers = nd_pj_get(e, "answers");
    const nd_pj *reasoning = nd_pj_get(e, "reasoning");
    if (!e || e->type != ND_PJ_OBJECT || !query || !answers) {
        reject(s, idx, "not an object with \"query\" and \"answers\"");
        return 0;
    }
    if (query->type != ND_PJ_STRING || strspn(query->str, " \t\r\n") == query->len) {
        reject(s, idx, "\"query\" is not a non-empty string");
        return 0;
    }
    if (reasoning && reasoning->type != ND_PJ_STRING) {
        reject(s, idx, "\"reasoning\" is not a string");
        return 0;
    }
    if (answers->type != ND_PJ_ARRAY) {
        reject(s, idx, "\"answers\" is not an array");
        return 0;
    }
    if (!answers_match_schemas(s, answers, why, sizeof why)) {
        reject(s, idx, why);
        return 0;
    }
    /* the example as it will be written: query, reasoning, answers, tools */
    nd_pj_member m[4];
    size_t k = 0;
    m[k++] = (nd_pj_member){"query", 5, (nd_pj *)query};
    if (reasoning)
        m[k++] = (nd_pj_member){"reasoning", 9, (nd_pj *)reasoning};
    m[k++] = (nd_pj_member){"answers", 7, (nd_pj *)answers};
    m[k++] = (nd_pj_member){"tools", 5, (nd_pj *)s->tools};
    nd_pj ex = {.type = ND_PJ_OBJECT, .len = k, .obj = m};
    s->prompt.n = s->target.n = 0;
    if (nd_render_example(&ex, &s->prompt, &s->target)) {
        snprintf(why, sizeof why, "does not render: %s", nd_last_error());
        reject(s, idx, why);
        return 0;
    }
    int fresh = dedup_key(query, answers, &s->scratch);
    if (fresh >= 0)
        fresh = key_set_add(&s->seen, s->scratch.p, s->scratch.n);
    if (fresh < 0) {
        reject(s, idx, "out of memory");
        return 0;
    }
    if (!fresh) {
        s->counts.duplicate++;
        return 0;
    }
    s->scratch.n = 0;
    if (nd_pj_dump(&ex, 0, &s->scratch) || store_line(s, &s->scratch)) {
        reject(s, idx, "out of memory");
        return 0;
    }
    s->counts.kept++;
    return 1;
}

void nd_gen_seen(nd_gen_set *s, const nd_pj *example)
{
    const nd_pj *q = nd_pj_get(example, "query");
    const nd_pj *a = nd_pj_get(example, "answers");
    if (!a)
        a = nd_pj_get(example, "function_calls");
    if (q && q->type == ND_PJ_STRING && !dedup_key(q, a, &s->scratch))
        (void)key_set_add(&s->seen, s->scratch.p, s->scratch.n);
}

/* The array in a reply: upstream takes the first '[' to the last ']'; when
 * that is not JSON (prose with brackets around a fenced block), each
 * ```-fenced block is tried the same way. */
/* The reply's array of examples, or NULL with why[] saying what was wrong
 * with the first candidate (the outermost [...]). */
static nd_pj_doc *find_array(const char *t, size_t n, char *why, size_t why_n)
{
    const char *lo = memchr(t, '[', n), *hi = NULL;
    for (size_t i = n; i > 0; i--)
        if (t[i - 1] == ']') {
            hi = t + i - 1;
            break;
        }
    nd_pj_doc *doc = NULL;
    if (!lo || !hi || hi < lo)
        snprintf(why, why_n, "no [...] array in it");
    else if (nd_pj_parse(lo, (size_t)(hi - lo + 1), &doc, NULL))
        snprintf(why, why_n, "its [...] is not JSON (%s)", nd_last_error());
    else if (nd_pj_root(doc)->type == ND_PJ_ARRAY)
        return doc;
    else
        snprintf(why, why_n, "its [...] is not one JSON array");
    nd_pj_free(doc);
    const char *p = t, *end = t + n;
    for (;;) {
        const char *open = NULL;
        for (const char *q = p; q + 3 <= end; q++)
            if (!memcmp(q, "```", 3)) {
                open = q;
                break;
            }
        if (!open)
            return NULL;
        const char *body = memchr(open, '\n', (size_t)(end - open));
        if (!body)
            return NULL;
        const char *close = NULL;
        for (const char *q = body; q + 3 <= end; q++)
            if (!memcmp(q, "```", 3)) {
                close = q;
                break;
            }
        if (!close)
            return NULL;
        doc = NULL;
        if (!nd_pj_parse(body, (size_t)(close - body), &doc, NULL) &&
            nd_pj_root(doc)->type == ND_PJ_ARRAY)
            return doc;
        nd_pj_free(doc);
        p = close + 3;
    }
}

size_t nd_gen_add_reply(nd_gen_set *s, const char *text, size_t len, size_t cap)
{
    s->counts.replies++;
    char why[160];
    nd_pj_doc *doc = find_array(text, len, why, sizeof why);
    if (!doc) {
        s->counts.unparsable++;
        if (!s->first_unparsable[0]) {
            char start[64];
            nd_redact_into(start, sizeof start, text, len, NULL, 48);
            snprintf(s->first_unparsable, sizeof s->first_unparsable,
                     "reply %zu: %s; it begins \"%s%s\"", s->counts.replies, why, start,
                     strlen(start) < len ? "..." : "");
        }
        return 0;
    }
    const nd_pj *arr = nd_pj_root(doc);
    size_t kept = 0;
    for (size_t i = 0; i < arr->len && (!cap || s->n < cap); i++) {
        s->counts.offered++;
        kept += (size_t)consider(s, arr->items[i], i);
    }
    nd_pj_free(doc);
    return kept;
}
