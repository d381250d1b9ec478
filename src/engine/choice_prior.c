/* The choice prior (choice_prior.h): a bonus for the pieces that name a
 * tool, or write an enum value, that the turn speaks of. */
#define _POSIX_C_SOURCE 200809L
#include "engine/choice_prior.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/copy_prior.h"
#include "engine/reason_prior.h"

/* the words of a tool that count: its name's, and its description's
 * first (what a tool does is said first; a long description's rest would
 * only add cost) */
#define NAME_WORDS 16
#define DESC_WORDS 96
/* the most words of one bucket compared pairwise (index_words) */
#define BUCKET_CMP 4096

/* words too common in requests and descriptions to say which tool */
static const char *const stop_words[] = {
    "the",   "and",     "for",    "you",       "your",   "with",   "from",  "that",  "this",
    "can",   "could",   "would",  "will",      "please", "want",   "need",  "into",  "about",
    "all",   "any",     "some",   "get",       "set",    "make",   "use",   "using", "via",
    "per",   "are",     "not",    "was",       "its",    "our",    "out",   "has",   "have",
    "had",   "what",    "which",  "who",       "how",    "when",   "where", "there", "then",
    "also",  "just",    "like",   "let",       "give",   "thanks", "thank", "tool",  "function",
    "given", "returns", "return", "specified", "one",
};

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int is_alnum(int c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* a byte that goes on a tool's name (what follows a whole name is none) */
static int is_name_byte(int c)
{
    return is_alnum(c) || c == '_' || c == '-' || c == '.';
}

/* a word worth comparing: 3+ bytes, not all digits, not a stop word */
static int keep_word(const char *w, size_t n)
{
    if (n < 3 || n > 40)
        return 0;
    size_t digits = 0;
    for (size_t i = 0; i < n; i++)
        digits += is_digit((unsigned char)w[i]) != 0;
    if (digits == n)
        return 0;
    for (size_t i = 0; i < sizeof stop_words / sizeof *stop_words; i++)
        if (strlen(stop_words[i]) == n && !memcmp(stop_words[i], w, n))
            return 0;
    return 1;
}

/* Append the lower-cased words of s[0..len) to out, each followed by a 0
 * byte; camelCase and letter/digit changes split a word when split_case
 * (tool names: "getUserTracks", "v1nutrition"). */
static int add_words(nd_buf *out, const char *s, size_t len, int split_case, int max_words)
{
    size_t i = 0;
    int count = 0;
    while (i < len && count < max_words) {
        while (i < len && !is_alnum((unsigned char)s[i]))
            i++;
        size_t j = i;
        while (j < len && is_alnum((unsigned char)s[j])) {
            j++;
            if (split_case && j < len) {
                int a = (unsigned char)s[j - 1], b = (unsigned char)s[j];
                int camel = a >= 'a' && a <= 'z' && b >= 'A' && b <= 'Z';
                if (camel || is_digit(a) != is_digit(b))
                    break;
            }
        }
        char w[41];
        size_t n = j - i;
        for (size_t k = 0; k < n && k < sizeof w; k++)
            w[k] = (char)lower((unsigned char)s[i + k]);
        if (keep_word(w, n)) { /* stop words compared lower-cased ("Get") */
            count++;
            int rc = nd_buf_put(out, w, n);
            if (rc || (rc = nd_buf_put(out, "", 1)))
                return rc;
        }
        i = j;
    }
    return ND_OK;
}

/* Two words are the same word: equal, the shorter (4+ bytes) begins the
 * longer ("park", "parking"), or they share their first 5 bytes
 * ("watered", "watering"). */
static int same_word(const char *a, const char *b)
{
    size_t k = 0;
    while (a[k] && a[k] == b[k])
        k++;
    if (!a[k] && !b[k])
        return 1;
    return k >= 5 || (k >= 4 && (!a[k] || !b[k]));
}

int nd_choice_prior_setting(const char *env, float b[3])
{
    b[0] = ND_CHOICE_TOOL_BONUS;
    b[1] = ND_CHOICE_ENUM_BONUS;
    b[2] = ND_REASON_KEY_BONUS;
    if (!env || !*env)
        return ND_OK;
    if (!strcmp(env, "0") || !strcmp(env, "off")) {
        b[0] = b[1] = b[2] = 0.0f;
        return ND_OK;
    }
    const char *s = env;
    float v[3] = {0, 0, ND_REASON_KEY_BONUS};
    int ok = 1, i = 0;
    for (; i < 3 && ok; i++) { /* plain decimals: no sign, space, hex or exponent */
        size_t n = strspn(s, "0123456789.");
        char *end;
        double x = n ? strtod(s, &end) : -1;
        ok = n && end == s + n && x <= 100 && (*end == ',' ? i < 2 : !*end && i >= 1);
        v[i] = (float)x;
        if (ok && !*end)
            break;
        s += n + 1;
    }
    if (ok) {
        memcpy(b, v, sizeof v);
        return ND_OK;
    }
    return nd_error(ND_EARG,
                    "NEEDLE_CHOICE_PRIOR='%s': expected 0 (off) or TOOL,ENUM[,KEY] bonuses (each "
                    "0..100; the default is %g,%g,%g)",
                    env, (double)ND_CHOICE_TOOL_BONUS, (double)ND_CHOICE_ENUM_BONUS,
                    (double)ND_REASON_KEY_BONUS);
}

const nd_pj *nd_choice_tool_fields(const nd_pj *t)
{
    const nd_pj *fn = nd_pj_get(t, "function");
    return fn && fn->type == ND_PJ_OBJECT && !nd_pj_get(t, "name") ? fn : t;
}

/* whether the word list `list` (0-separated, ending with an empty word)
 * has a word that is the same word as w */
static int has_word(const char *list, const char *w)
{
    for (; *list; list += strlen(list) + 1)
        if (same_word(list, w))
            return 1;
    return 0;
}

/* Words can be the same word (same_word) only with the same first 4
 * bytes, a 3-byte word only with itself: its 3 bytes and the 0 after
 * them. So the 4 bytes at w are a bucket key, and words are compared
 * within a bucket only. */
static int key_cmp(const char *a, const char *b)
{
    return memcmp(a, b, 4);
}

static int tword_cmp(const void *x, const void *y)
{
    const nd_choice_word *a = x, *b = y;
    int c = key_cmp(a->w, b->w);
    if (!c)
        c = (a->tool > b->tool) - (a->tool < b->tool);
    return c ? c : (a->w > b->w) - (a->w < b->w); /* a tool's name words first */
}

static int str_key_cmp(const void *x, const void *y)
{
    return key_cmp(*(const char *const *)x, *(const char *const *)y);
}

/* The tools' words sorted by bucket, each with 1 / (the tools that have
 * it), ND_CHOICE_NAME_WEIGHT / (the same) for a word of the tool's name,
 * ND_CHOICE_PARAM_WEIGHT / (the same) for one of a parameter's
 * description, 0 for a word its tool has twice (the first kept: name,
 * description, enum values, parameters' descriptions). In a bucket of more than
 * BUCKET_CMP words (a hostile catalogue: every word "aaaa...") every word
 * counts the bucket's tools instead, to bound the work. */
static int index_words(nd_choice_prior *p, const size_t *name_ends, const size_t *desc_ends,
                       const size_t *ends)
{
    size_t nw = 0, at = 0;
    for (size_t k = 0; k < p->words.n; k++)
        nw += p->words.p[k] == 0;
    p->tw = calloc(nw ? nw : 1, sizeof *p->tw);
    if (!p->tw)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < p->n; i++)
        for (; at < ends[i]; at += strlen(p->words.p + at) + 1)
            p->tw[p->ntw++] =
                (nd_choice_word){p->words.p + at, i, 0.0f, at < name_ends[i], at >= desc_ends[i]};
    qsort(p->tw, p->ntw, sizeof *p->tw, tword_cmp);
    for (size_t a = 0, b; a < p->ntw; a = b) {
        for (b = a + 1; b < p->ntw && !key_cmp(p->tw[a].w, p->tw[b].w); b++)
            ;
        int tools = 0; /* the bucket's tools (entries sorted by tool) */
        for (size_t k = a; k < b; k++)
            tools += k == a || p->tw[k].tool != p->tw[k - 1].tool;
        for (size_t k = a; k < b; k++) {
            int repeat = 0, owners = 0, last = -1;
            for (size_t m = k; m > a && p->tw[m - 1].tool == p->tw[k].tool && !repeat; m--)
                repeat = same_word(p->tw[m - 1].w, p->tw[k].w);
            if (b - a > BUCKET_CMP)
                owners = tools;
            else
                for (size_t m = a; m < b; m++)
                    if (p->tw[m].tool != last && same_word(p->tw[m].w, p->tw[k].w)) {
                        owners++;
                        last = p->tw[m].tool;
                    }
            float w = p->tw[k].from_name    ? ND_CHOICE_NAME_WEIGHT
                      : p->tw[k].from_param ? ND_CHOICE_PARAM_WEIGHT
                                            : 1.0f;
            p->tw[k].share = repeat ? 0.0f : w / (float)(owners ? owners : 1);
        }
    }
    return ND_OK;
}

/* Each tool's r: its words the turn says, each 1 / (the tools that have
 * it); the turn's words are sorted into p->said for a binary search by
 * bucket. */
static int tool_weights(nd_choice_prior *p)
{
    size_t nt = 0;
    for (const char *w = p->turn_words.p; *w; w += strlen(w) + 1)
        nt++;
    const char **said = malloc((nt ? nt : 1) * sizeof *said);
    if (!said)
        return nd_error(ND_ENOMEM, "out of memory");
    nt = 0;
    for (const char *w = p->turn_words.p; *w; w += strlen(w) + 1)
        said[nt++] = w;
    qsort(said, nt, sizeof *said, str_key_cmp);
    for (int i = 0; i < p->n; i++)
        p->weight[i] = 0.0f;
    for (size_t k = 0; k < p->ntw; k++) {
        const nd_choice_word *e = &p->tw[k];
        if (e->share == 0.0f)
            continue;
        size_t lo = 0, hi = nt; /* the first said word of e's bucket */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (key_cmp(said[mid], e->w) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (; lo < nt && !key_cmp(said[lo], e->w); lo++)
            if (same_word(said[lo], e->w)) {
                p->weight[e->tool] += e->share;
                break;
            }
    }
    free(said);
    return ND_OK;
}

/* The words of a tool's parameters: with enum_values the values of its
 * string enums (they say what the tool acts on: "How much fuel" with
 * displayCarStatus's option "fuel"), else its parameters' descriptions. */
static int add_param_words(nd_buf *out, const nd_pj *f, int enum_values)
{
    const nd_pj *params = nd_pj_get(f, "parameters");
    const nd_pj *props = params ? nd_pj_get(params, "properties") : NULL;
    if (!props || props->type != ND_PJ_OBJECT)
        return ND_OK;
    int rc = ND_OK;
    for (size_t k = 0; k < props->len && !rc; k++) {
        const nd_pj *prop = props->obj[k].val;
        const nd_pj *d = nd_pj_get(prop, "description"), *en = nd_pj_get(prop, "enum");
        if (!enum_values && d && d->type == ND_PJ_STRING)
            rc = add_words(out, d->str, d->len, 0, DESC_WORDS);
        for (size_t j = 0; enum_values && en && en->type == ND_PJ_ARRAY && j < en->len && !rc; j++)
            if (en->items[j]->type == ND_PJ_STRING)
                rc = add_words(out, en->items[j]->str, en->items[j]->len, 0, NAME_WORDS);
    }
    return rc;
}

int nd_choice_prior_init(nd_choice_prior *p, const nd_pj *tools, int V, const float b[2])
{
    memset(p, 0, sizeof *p);
    p->tool_bonus = b[0];
    p->enum_bonus = b[1];
    p->key_bonus = b[0] != 0.0f || b[1] != 0.0f ? ND_CHOICE_KEY_BONUS : 0.0f;
    if (b[0] == 0.0f && b[1] == 0.0f)
        return ND_OK;
    int n = tools && tools->type == ND_PJ_ARRAY ? (int)tools->len : 0, rc = ND_OK;
    p->name = calloc((size_t)(n ? n : 1), sizeof *p->name);
    p->weight = calloc((size_t)(n ? n : 1), sizeof *p->weight);
    p->biased = malloc((size_t)V * sizeof *p->biased);
    p->bonus = calloc((size_t)V, sizeof *p->bonus);
    if (!p->name || !p->weight || !p->biased || !p->bonus)
        return nd_error(ND_ENOMEM, "out of memory");
    p->n = n;
    /* each tool's words end, and its name's */
    size_t *ends = calloc((size_t)(n ? n : 1), sizeof *ends);
    size_t *name_ends = calloc((size_t)(n ? n : 1), sizeof *name_ends);
    size_t *desc_ends = calloc((size_t)(n ? n : 1), sizeof *desc_ends);
    if (!ends || !name_ends || !desc_ends) {
        free(ends);
        free(name_ends);
        free(desc_ends);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n && !rc; i++) {
        const nd_pj *f = nd_choice_tool_fields(tools->items[i]);
        const nd_pj *name = nd_pj_get(f, "name"), *desc = nd_pj_get(f, "description");
        if (name && name->type == ND_PJ_STRING) {
            if (!(p->name[i] = strndup(name->str, name->len)))
                rc = nd_error(ND_ENOMEM, "out of memory");
            else
                rc = add_words(&p->words, name->str, name->len, 1, NAME_WORDS);
        }
        name_ends[i] = p->words.n;
        if (!rc && desc && desc->type == ND_PJ_STRING)
            rc = add_words(&p->words, desc->str, desc->len, 0, DESC_WORDS);
        if (!rc) /* enum values count as the description's words */
            rc = add_param_words(&p->words, f, 1);
        desc_ends[i] = p->words.n;
        if (!rc)
            rc = add_param_words(&p->words, f, 0);
        ends[i] = p->words.n;
    }
    if (!rc)
        rc = index_words(p, name_ends, desc_ends, ends);
    free(ends);
    free(name_ends);
    free(desc_ends);
    return rc;
}

void nd_choice_prior_free(nd_choice_prior *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->name[i]);
    free(p->name);
    free(p->weight);
    free(p->biased);
    free(p->bonus);
    free(p->tw);
    free(p->key_mask);
    nd_buf_free(&p->words);
    nd_buf_free(&p->turn);
    nd_buf_free(&p->turn_words);
    nd_buf_free(&p->named);
    memset(p, 0, sizeof *p);
}

/* whether s[0..n) is a tool's name, caseless */
static int is_tool_name(const nd_choice_prior *p, const char *s, size_t n)
{
    for (int i = 0; i < p->n; i++) {
        size_t k = 0;
        if (!p->name[i] || strlen(p->name[i]) != n)
            continue;
        while (k < n && lower((unsigned char)p->name[i][k]) == lower((unsigned char)s[k]))
            k++;
        if (k == n)
            return 1;
    }
    return 0;
}

/* The words of the turn's request: its text with each quoted span blanked
 * but one that is a tool's name. Why: a quoted text is a value to copy,
 * not what the user asks for ("dispatch the message 'The latest stock
 * price of XTC'" chose get_watchlist by "stock" and "price"). */
static int request_words(nd_choice_prior *p, const char *text, size_t len)
{
    char *r = malloc(len + 1);
    if (!r)
        return nd_error(ND_ENOMEM, "out of memory");
    memcpy(r, text, len + 1);
    size_t at = 0, st, e;
    while ((e = nd_quoted_next(text, len, &at, &st)) < len)
        if (!is_tool_name(p, text + st, e - st))
            memset(r + st, ' ', e - st);
    int rc = add_words(&p->turn_words, r, len, 0, INT_MAX);
    free(r);
    return rc;
}

int nd_choice_prior_turn(nd_choice_prior *p, const char *text)
{
    p->named.n = p->turn.n = p->turn_words.n = 0;
    p->naming = p->reasoned = p->first_call = 0;
    if (p->tool_bonus == 0.0f && p->enum_bonus == 0.0f)
        return ND_OK;
    size_t len = strlen(text);
    int rc = request_words(p, text, len);
    if (rc || (rc = nd_buf_put(&p->turn_words, "", 1)) || (rc = nd_buf_put(&p->turn, text, len)) ||
        (rc = nd_buf_put(&p->turn, "", 1)) || (rc = tool_weights(p)))
        return rc;
    for (size_t i = 0; i < len; i++)
        p->turn.p[i] = (char)lower((unsigned char)p->turn.p[i]);
    float rmax = 1.0f;
    for (int i = 0; i < p->n; i++)
        rmax = p->weight[i] > rmax ? p->weight[i] : rmax;
    for (int i = 0; i < p->n; i++) /* the best-said tool 1 once its r reaches 1 */
        p->weight[i] /= rmax;
    p->naming = p->tool_bonus != 0.0f && p->n > 0;
    return ND_OK;
}

const float *nd_choice_prior_weights(const nd_choice_prior *p)
{
    return p->weight;
}

/* The string a JSON text q[0..len) is (the grammar keeps names and enum
 * values as JSON text, escapes and all): its bytes, or NULL when it is
 * no string. Text without a backslash is its own bytes; else decoded
 * into *buf (the caller frees it). */
static const char *json_string(const char *q, size_t len, size_t *n, nd_buf *buf)
{
    if (len < 2 || q[0] != '"' || q[len - 1] != '"')
        return NULL;
    if (!memchr(q, '\\', len)) {
        *n = len - 2;
        return q + 1;
    }
    nd_pj_doc *doc = NULL;
    if (nd_pj_parse(q, len, &doc, NULL))
        return NULL;
    const nd_pj *v = nd_pj_root(doc);
    int ok = v && v->type == ND_PJ_STRING && !nd_buf_put(buf, v->str, v->len);
    *n = ok ? v->len : 0;
    nd_pj_free(doc);
    return ok ? (buf->p ? buf->p : "") : NULL;
}

/* whether the turn says v[0..n) (nd_choice_prior_says) */
static int says_text(const nd_choice_prior *p, const char *v, size_t n)
{
    const char *t = p->turn.p;
    size_t tn = p->turn.n - 1;
    int alnum = 0;
    for (size_t i = 0; i < n; i++)
        alnum += is_alnum((unsigned char)v[i]) != 0;
    if (!alnum)
        return 0;
    /* the value as whole words of the turn, caseless */
    for (size_t at = 0; at + n <= tn; at++) {
        size_t k = 0;
        while (k < n && (unsigned char)t[at + k] == lower((unsigned char)v[k]))
            k++;
        if (k == n && (!at || !is_alnum((unsigned char)t[at - 1])) &&
            (at + n == tn || !is_alnum((unsigned char)t[at + n])))
            return 1;
    }
    /* a single word: matched as tool words are ("broiling" for "broil") */
    if ((size_t)alnum != n || n < 4 || n > 40)
        return 0;
    char w[41];
    for (size_t i = 0; i < n; i++)
        w[i] = (char)lower((unsigned char)v[i]);
    w[n] = 0;
    return has_word(p->turn_words.p, w);
}

int nd_choice_prior_says(const nd_choice_prior *p, const char *lit, int len)
{
    nd_buf dec = {0};
    size_t n;
    const char *v = len > 0 && p->turn.n ? json_string(lit, (size_t)len, &n, &dec) : NULL;
    int said = v && says_text(p, v, n);
    nd_buf_free(&dec);
    return said;
}

/* ---- the reasoning's first tool name ---- */

/* The largest weight of a tool whose name the bytes named + piece t can
 * begin (or end, when what follows the name is no name byte); -1: none. */
static float piece_weight(const nd_choice_prior *p, const needle_model *M, int t)
{
    unsigned char b[PIECE_MAX];
    int len;
    if (!nd_piece_bytes(M->tok, t, b, &len))
        return -1.0f;
    int skip = 0;
    while (!p->named.n && skip < len && b[skip] == ' ')
        skip++; /* the answer's leading space */
    const unsigned char *s = b + skip;
    size_t sn = (size_t)(len - skip), done = p->named.n;
    if (!sn && !done)
        return 0.0f; /* the answer's space alone: on the way to any tool, for none */
    float best = -1.0f;
    for (int i = 0; i < p->n; i++) {
        const char *nm = p->name[i];
        size_t nl = nm ? strlen(nm) : 0;
        if (!nm || done > nl || (done && memcmp(nm, p->named.p, done)))
            continue;
        size_t rest = nl - done, k = sn < rest ? sn : rest;
        if (k && memcmp(nm + done, s, k))
            continue;
        if (sn > rest && is_name_byte(s[rest]))
            continue; /* a longer name than this tool's */
        best = p->weight[i] > best ? p->weight[i] : best;
    }
    return best;
}

static int argmax_allowed(const float *lg, const uint8_t *ok, int V)
{
    int best = -1;
    for (int i = 0; i < V; i++)
        if (ok[i] && (best < 0 || lg[i] > lg[best]))
            best = i;
    return best;
}

const float *nd_choice_prior_reason(nd_choice_prior *p, const needle_model *M, const float *logits,
                                    const uint8_t *allowed)
{
    if (!p->naming)
        return logits;
    int V = M->m.dims.V;
    float wmax = 0.0f;
    for (int i = 0; i < p->n; i++)
        wmax = p->weight[i] > wmax ? p->weight[i] : wmax;
    if (wmax == 0.0f)
        return logits;
    float bonus = p->tool_bonus;
    if (!p->named.n) { /* the model would begin otherwise: most often a refusal */
        int top = argmax_allowed(logits, allowed, V);
        if (top >= 0 && piece_weight(p, M, top) < 0.0f)
            bonus *= ND_CHOICE_OVER_REFUSAL;
    }
    for (int t = 0; t < V; t++) {
        float w = allowed[t] ? piece_weight(p, M, t) : -1.0f;
        p->biased[t] = logits[t] + (w > 0.0f ? bonus * w : 0.0f);
    }
    return p->biased;
}

void nd_choice_prior_feed(nd_choice_prior *p, const needle_model *M, int t)
{
    if (!p->naming)
        return;
    unsigned char b[PIECE_MAX];
    int len = 0, skip = 0;
    nd_piece_bytes(M->tok, t, b, &len);
    while (!p->named.n && skip < len && b[skip] == ' ')
        skip++;
    if (nd_buf_put(&p->named, (const char *)b + skip, (size_t)(len - skip))) {
        p->naming = 0;
        return;
    }
    /* naming goes on while the bytes so far are the start of a longer
     * name; the reasoning has named a tool once they hold a whole name
     * (then the call follows it, and its own name gets no bonus) */
    p->naming = 0;
    for (int i = 0; i < p->n; i++) {
        size_t nl = p->name[i] ? strlen(p->name[i]) : 0, k = p->named.n;
        if (!nl || (k && memcmp(p->name[i], p->named.p, k < nl ? k : nl)))
            continue;
        if (nl > k)
            p->naming = 1;
        else if (nl == k || !is_name_byte((unsigned char)p->named.p[nl]))
            p->reasoned = 1;
    }
}

/* ---- the call ---- */

/* whether the lower-cased turn t has the word w[0..n) as a word, maybe
 * plural, or ending a longer word when n >= 4 ("hashtags": "tags") */
static int turn_has_word(const char *t, const char *w, size_t n)
{
    for (const char *at = strstr(t, w); at; at = strstr(at + 1, w)) {
        const char *e = at + n;
        if (*e == 's' && !is_alnum((unsigned char)e[1]))
            e++; /* plural */
        if (is_alnum((unsigned char)*e) || (at > t && is_alnum((unsigned char)at[-1]) && n < 4))
            continue; /* inside a longer word */
        return 1;
    }
    return 0;
}

int nd_choice_prior_says_key(void *ctx, const char *key, int len)
{
    const nd_choice_prior *p = ctx;
    if (len < 2 || key[0] != '"' || !p->turn.n)
        return 0;
    char w[41]; /* the name's last word: "file_name" -> "name", "maxResults" -> "results" */
    int n = nd_name_last_word(key + 1, len - 2, w, (int)sizeof w);
    if (n < 3)
        return 0;
    w[n] = 0;
    return turn_has_word(p->turn.p, w, (size_t)n);
}

void nd_choice_prior_call(nd_choice_prior *p, const nd_grammar *g)
{
    free(p->key_mask);
    p->key_mask = NULL;
    if (p->key_bonus != 0.0f && p->turn.n &&
        nd_gram_key_marks(g, nd_choice_prior_says_key, p, &p->key_mask)) {
        free(p->key_mask); /* out of memory: no key bonus */
        p->key_mask = NULL;
    }
    memset(p->gweight, 0, sizeof p->gweight);
    p->first_call = p->tool_bonus != 0.0f && p->n > 0 && !p->reasoned;
    if (!p->first_call)
        return;
    int n = nd_gram_num_tools(g);
    for (int i = 0; i < n && i < ND_GRAM_MAX_ALT; i++) {
        int len;
        const char *q = nd_gram_tool_name(g, i, &len); /* JSON text: "r\u00e9server" */
        nd_buf dec = {0};
        size_t nl = 0;
        const char *nm = q ? json_string(q, (size_t)len, &nl, &dec) : NULL;
        for (int k = 0; nm && k < p->n; k++)
            if (p->name[k] && strlen(p->name[k]) == nl && !memcmp(p->name[k], nm, nl))
                p->gweight[i] = p->weight[k];
        nd_buf_free(&dec);
    }
}

int nd_choice_prior_step(nd_choice_prior *p, const nd_gram_state *st, int *names, int *enums)
{
    uint64_t cands = 0;
    int call = p->first_call ? nd_gram_naming(st, &cands) : 0;
    if (call > 1)
        p->first_call = 0; /* past the first call */
    /* one tool left: every piece leads to it, nothing to weigh */
    *names = call == 1 && (cands & (cands - 1));
    *enums = p->enum_bonus != 0.0f && p->turn.n;
    return *names || *enums;
}

float nd_choice_prior_name(const nd_choice_prior *p, const nd_gram_state *after)
{
    uint64_t cands;
    float w = 0.0f;
    if (nd_gram_naming(after, &cands))
        for (int i = 0; i < ND_GRAM_MAX_ALT; i++)
            if ((cands >> i & 1) && p->gweight[i] > w)
                w = p->gweight[i];
    return w;
}

float nd_choice_prior_literal(const nd_choice_prior *p, const nd_grammar *g, const nd_gram_state *s)
{
    char *const *lits;
    const int *lens;
    int lo, hi;
    if (!nd_gram_literal(g, s, &lits, &lens, &lo, &hi))
        return -1.0f;
    for (int i = lo; i < hi; i++)
        if (nd_choice_prior_says(p, lits[i], lens[i]))
            return 1.0f;
    return 0.0f;
}

void nd_choice_prior_add(const nd_choice_prior *p, const uint8_t *allowed, int V, float *logits)
{
    for (int t = 0; t < V; t++)
        if (allowed[t])
            logits[t] += p->bonus[t];
}
