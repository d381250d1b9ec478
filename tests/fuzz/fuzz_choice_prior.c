/* libFuzzer target: the choice prior (engine/choice_prior.h) on hostile
 * input: a user's tools JSON, the user's turn, a NEEDLE_CHOICE_PRIOR value
 * and an enum literal. The input is split at its first three NUL bytes:
 *
 *   TOOLS \0 TURN \0 SETTING \0 LITERAL (the rest, NULs included)
 *
 * TOOLS that do not parse are the turn instead, with no tools (TURN is then
 * a second turn). Checked:
 *  - the setting: accepted, both bonuses in [0, 100]; refused, ND_EARG and
 *    the defaults (10, 10) left in b[];
 *  - the weights (w = r / max(1, the largest r)): finite, in [0, 1]; the
 *    largest is exactly 1, or below 1 and then every weight is a raw r, so
 *    a positive one is at least 1/n (a word shared by at most n tools);
 *    the empty turn weighs nothing; the same weights for the turn again
 *    after others (a turn resets all), ASCII case changed, said twice, and
 *    for the tools in reverse order (reversed);
 *  - nd_choice_prior_says: 0 or 1; 0 for a literal that is no JSON string;
 *    1 for every whole ASCII word of the turn, quoted, once the prior is on;
 *  - the reasoning, with a small hand-made vocabulary (letters, digits,
 *    name bytes, a few words, the 256 byte pieces: V = 347): the biased
 *    logits add 0 .. tool bonus to allowed pieces only, and after each
 *    piece fed, naming goes on exactly while the bytes so far begin a
 *    longer tool name;
 *  - the reasoning prior (engine/reason_prior.h) with the copy prior, over
 *    a plan of a listed tool's own arguments ("NAME: KEY 12, KEY \"word\";
 *    then NAME2: ...") with noise: the logits it returns are the model's
 *    or its own copy, never NaN or +inf, each within the bonuses of the
 *    model's (or -inf); with every byte piece allowed, some allowed piece
 *    stays finite; the parser's position after each piece fed is the one
 *    nd_reason_prior_step reaches over the same bytes, and once off the
 *    form it stays off; the plan read as a call's JSON
 *    (nd_copy_prior_call_key) and as a value (nd_copy_prior_runs_on,
 *    _quote_done: only a quoted text of the source is done); each quoted
 *    span of the source is done unless a longer one begins with it, and
 *    each #tag or @mention likewise (nd_copy_prior_tag_done), never a tag
 *    less its last byte;
 *  - when the tools compile (nd_gram_compile): nd_choice_prior_call's
 *    weights are 0 or a tool's weight, that tool's for the name the
 *    grammar's JSON text decodes to; along a sampled call list, nd_choice_prior_step /
 *    _name / _literal and nd_gram_key_marked give 0/1, a call weight,
 *    -1/0/1 and -1/0/1, and
 *    nd_choice_prior_add adds the (zero) bonuses only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/choice_prior.h"
#include "engine/reason_prior.h"
#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"

#define SP "\xe2\x96\x81" /* U+2581, a piece's space */
#define MAX_TEXT 4096     /* bytes of a turn (longer inputs are cut) */
#define REASON_STEPS 16

/* The vocabulary the reasoning is driven with: <unk>, letters, digits and
 * name bytes to spell any ASCII name, these words, then the 256 byte
 * pieces <0x00> .. <0xFF> (byte fallback) for any other byte. */
static const char *const WORDS[] = {
    SP,        SP "get",    SP "set",  SP "brew", SP "start", SP "search",
    SP "send", SP "create", SP "list", SP "play", SP "book",  SP "The",
    SP "I",    SP "a",      "_user",   "_coffee", "_oven",    "er",
    "ing",     "tion",      "User",    "Get",     "::",       SP "brew_coffee:",
};
enum { NLETTER = 26 + 26 + 10 + 4 };
enum { V = 1 + NLETTER + (int)(sizeof WORDS / sizeof *WORDS) + 256 };

/* a broken promise: say which, then abort() for libFuzzer */
static void fail(int line)
{
    fprintf(stderr, "fuzz_choice_prior: check at line %d failed: %s\n", line, nd_last_error());
    abort();
}

static nd_tokenizer *tok;
static needle_model *model;
static unsigned char piece[V][PIECE_MAX]; /* each piece's bytes */
static int piece_len[V];

static void put32(nd_buf *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    nd_buf_put(b, (const char *)x, 4);
}

static void put_piece(nd_buf *b, const char *s, int type)
{
    size_t n = strlen(s);
    unsigned char rec[7] = {
        0, 0, 0, 0, (unsigned char)type, (unsigned char)n, (unsigned char)(n >> 8)};
    nd_buf_put(b, (const char *)rec, 7);
    nd_buf_put(b, s, n);
}

/* a tokenizer blob (docs/formats.md §4.3): <unk>, then the pieces */
static void build_model(void)
{
    nd_buf b = {0};
    put32(&b, V);
    put32(&b, 0xffffffffu);        /* pad */
    put32(&b, 0xffffffffu);        /* eos */
    put32(&b, 0xffffffffu);        /* bos */
    put32(&b, 0);                  /* unk */
    nd_buf_put(&b, "\0\1\0\0", 4); /* byte_fallback: the <0xNN> pieces */
    put_piece(&b, "<unk>", 1);
    static const char extra[] = "_-.:";
    for (int i = 0; i < NLETTER; i++) {
        char s[2] = {i < 26   ? (char)('a' + i)
                     : i < 52 ? (char)('A' + i - 26)
                     : i < 62 ? (char)('0' + i - 52)
                              : extra[i - 62],
                     0};
        put_piece(&b, s, 0);
    }
    for (size_t i = 0; i < sizeof WORDS / sizeof *WORDS; i++)
        put_piece(&b, WORDS[i], 0);
    for (int i = 0; i < 256; i++) { /* byte_fallback wants all 256 */
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        put_piece(&b, s, 4);
    }
    if (nd_tokenizer_from_blob((const unsigned char *)b.p, b.n, &tok) != 0)
        fail(__LINE__); /* the harness's own vocabulary */
    nd_buf_free(&b);
    for (int t = 0; t < V; t++)
        if (!nd_piece_bytes(tok, t, piece[t], &piece_len[t]))
            piece_len[t] = 0;
    model = calloc(1, sizeof *model);
    if (!model)
        fail(__LINE__);
    model->m.dims.V = V;
    model->tok = tok;
    if (nd_model_build_trie(model) != ND_OK)
        fail(__LINE__);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    build_model();
    return 0;
}

static uint64_t fnv1a(const uint8_t *d, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

static int is_alnum(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* the weights after turn `text` (checked), copied into out[n] */
static void weigh(nd_choice_prior *p, const char *text, float *out)
{
    if (nd_choice_prior_turn(p, text) != ND_OK)
        fail(__LINE__); /* a turn only fails for memory */
    if (p->n == 0)
        return;
    const float *w = nd_choice_prior_weights(p);
    if (!w)
        fail(__LINE__);
    float m = 0.0f;
    for (int i = 0; i < p->n; i++) {
        if (!isfinite(w[i]) || w[i] < 0.0f || w[i] > 1.0f)
            fail(__LINE__);
        m = w[i] > m ? w[i] : m;
        out[i] = w[i];
    }
    /* w = r / max(1, rmax): the largest is rmax / rmax = 1 exactly once
     * rmax >= 1; below that every w is its r, a sum of 1/owners (owners
     * <= n), so a positive one is at least 1/n */
    if (m > 0.0f && m != 1.0f)
        for (int i = 0; i < p->n; i++)
            if (w[i] > 0.0f && w[i] < (float)(1.0 / p->n) * (1.0f - 1e-6f))
                fail(__LINE__);
}

static void same(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            fail(__LINE__);
}

/* says: 0 or 1; never for a literal that is no JSON string */
static int says(const nd_choice_prior *p, const char *lit, size_t len)
{
    int r = nd_choice_prior_says(p, lit, (int)len);
    if (r != 0 && r != 1)
        fail(__LINE__);
    if (r && (len < 3 || lit[0] != '"' || lit[len - 1] != '"'))
        fail(__LINE__);
    return r;
}

/* every whole ASCII word of the turn is said, quoted (the first 16) */
static void says_its_words(const nd_choice_prior *p, const char *text)
{
    char lit[MAX_TEXT + 3];
    int words = 0;
    for (size_t i = 0; text[i] && words < 16;) {
        if (!is_alnum((unsigned char)text[i])) {
            i++;
            continue;
        }
        size_t j = i;
        while (is_alnum((unsigned char)text[j]))
            j++;
        lit[0] = '"';
        memcpy(lit + 1, text + i, j - i);
        lit[j - i + 1] = '"';
        if (p->turn.n && !says(p, lit, j - i + 2))
            fail(__LINE__);
        if (!p->turn.n && says(p, lit, j - i + 2))
            fail(__LINE__); /* off: nothing is said */
        words++;
        i = j;
    }
}

/* a plan in the reasoning prior's form for tools from `from` on: each
 * tool's first arguments with a number or a word of the turn, "; then "
 * between calls (the names and keys as the prior read them) */
static void make_plan(const nd_reason_prior *rp, int from, const char *turn, nd_rng *r, char *out,
                      size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int k = from; k < rp->n && k < from + 2; k++) {
        const nd_reason_tool *t = &rp->tool[k];
        if (!t->name)
            continue;
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s: ", k > from ? "; then " : "",
                              t->name);
        for (int j = 0; j < t->nkeys && j < 3 && n < cap; j++) {
            const char *word = turn + nd_rng_below(r, strlen(turn) + 1);
            int wl = 0;
            while (is_alnum((unsigned char)word[wl]) && wl < 12)
                wl++;
            if (nd_rng_below(r, 2))
                n += (size_t)snprintf(out + n, cap - n, "%s%s %d", j ? ", " : "",
                                      t->keys[j].name ? t->keys[j].name : "",
                                      (int)nd_rng_below(r, 1000));
            else
                n += (size_t)snprintf(out + n, cap - n, "%s%s \"%.*s\"", j ? ", " : "",
                                      t->keys[j].name ? t->keys[j].name : "", wl, word);
        }
        if (n >= cap)
            break;
    }
    out[cap - 1] = 0;
}

/* whether the source holds v[0..n) followed by a quote mark */
static int quoted_in_source(const nd_copy_prior *c, const char *v, int n)
{
    for (size_t st = 0; n > 0 && st + (size_t)n < c->src.n; st++)
        if (!memcmp(c->src.p + st, v, (size_t)n) && strchr("'\"`\xE2", c->src.p[st + n]))
            return 1;
    return 0;
}

/* Each quoted span of the source, found as the copy prior marks them
 * (left to right, none inside another), is a done value exactly when no
 * longer one begins with it. */
static void check_quote_done(const nd_copy_prior *c)
{
    enum { MAX_SPANS = 64 };
    size_t at[MAX_SPANS], len[MAX_SPANS];
    int n = 0;
    const char *s = c->src.p;
    if (c->src.n == 0 || c->bonus == 0.0f)
        return;
    for (size_t st = 0; st < c->src.n && n < MAX_SPANS; st++) {
        size_t e = nd_quoted_end(s, st);
        if (e == st)
            continue;
        at[n] = st;
        len[n++] = e - st;
        st = e + 1;
    }
    if (n == MAX_SPANS)
        return; /* the rest unmarked here; the prior saw them all */
    for (int i = 0; i < n; i++) {
        int longer = 0;
        for (int k = 0; k < n; k++)
            longer |= len[k] > len[i] && !memcmp(s + at[k], s + at[i], len[i]);
        int done = nd_copy_prior_quote_done(c, (const unsigned char *)s + at[i], (int)len[i]);
        if (done != !longer)
            fail(__LINE__);
    }
}

static int tag_byte(unsigned char b)
{
    return (b >= '0' && b <= '9') || ((b | 32) >= 'a' && (b | 32) <= 'z') || b == '_';
}

/* every #tag / @mention of the source is done unless a longer one begins
 * with it; a tag less its last byte is never done */
static void check_tag_done(const nd_copy_prior *c)
{
    enum { MAX_TAGS = 64 };
    size_t at[MAX_TAGS], len[MAX_TAGS];
    int n = 0;
    const char *s = c->src.p;
    if (c->bonus == 0.0f)
        return;
    for (size_t st = 0; st < c->src.n && n < MAX_TAGS; st++) {
        if ((s[st] != '#' && s[st] != '@') ||
            (st > 0 && s[st - 1] != '_' && tag_byte((unsigned char)s[st - 1])))
            continue; /* after a letter or digit: no tag (bob@example.com) */
        size_t e = st + 1;
        while (e < c->src.n && tag_byte((unsigned char)s[e]))
            e++;
        if (e - st >= 2)
            at[n] = st, len[n++] = e - st;
    }
    if (n == MAX_TAGS)
        return; /* the rest unlisted here; the prior saw them all */
    for (int i = 0; i < n; i++) {
        int longer = 0;
        for (int k = 0; k < n; k++)
            longer |= len[k] > len[i] && !memcmp(s + at[k], s + at[i], len[i]);
        if (nd_copy_prior_tag_done(c, (const unsigned char *)s + at[i], (int)len[i]) != !longer)
            fail(__LINE__);
        if (len[i] > 2 &&
            nd_copy_prior_tag_done(c, (const unsigned char *)s + at[i], (int)len[i] - 1))
            fail(__LINE__);
    }
}

/* the reasoning prior and the copy prior over a plan, with noise; piece
 * 0 (<unk>) stands for the reasoning's end */
static void plan_reason(const nd_pj *tools, const nd_choice_prior *choice, const char *turn,
                        const float b[3], nd_rng *r)
{
    nd_reason_prior rp;
    nd_copy_prior c;
    const float cb[ND_COPY_N_BONUS] = {ND_COPY_EDGE_BONUS, ND_COPY_INSIDE_BONUS,
                                       ND_COPY_START_BONUS, ND_COPY_QUOTE_BONUS};
    if (nd_reason_prior_init(&rp, tools, V, 0, b[2]) != ND_OK ||
        nd_copy_prior_init(&c, model, cb) != ND_OK || nd_copy_prior_set(&c, turn, NULL) != 0)
        fail(__LINE__); /* only for memory */
    nd_reason_prior_turn(&rp, 1, choice);
    nd_reason_pos ref = rp.at;
    char plan[512];
    make_plan(&rp, rp.n ? (int)nd_rng_below(r, (uint64_t)rp.n) : 0, turn, r, plan, sizeof plan);
    size_t at = 0, plen = strlen(plan);
    float lg[V];
    uint8_t ok[V];
    int all_bytes = (int)nd_rng_below(r, 4) != 0; /* every byte piece allowed */
    float most = rp.key_bonus + rp.enum_bonus + c.bonus + c.edge_bonus + c.start_bonus;
    for (int step = 0; step < 64; step++) {
        int best = -1, blen = 0;
        for (int t = 0; t < V; t++) {
            int len = piece_len[t];
            lg[t] = (float)nd_rng_uniform(r) * 4.0f;
            ok[t] = (all_bytes && t >= V - 256) || nd_rng_below(r, 8) != 0;
            if (len > blen && at + (size_t)len <= plen && !memcmp(plan + at, piece[t], (size_t)len))
                best = t, blen = len;
        }
        if (best >= 0 && nd_rng_below(r, 16)) {
            lg[best] = 6.0f;
            ok[best] = 1;
        }
        const float *o = nd_reason_prior_logits(&rp, model, &c, lg, ok);
        if (o != lg && o != rp.biased)
            fail(__LINE__);
        int pick = -1, live = 0;
        for (int t = 0; t < V; t++) {
            float d = o[t] - lg[t];
            if (isnan(o[t]) || o[t] == INFINITY)
                fail(__LINE__);
            if (o[t] != -INFINITY && (d > most + 1e-3f || d < -c.start_bonus - 1e-3f))
                fail(__LINE__);
            if (!ok[t])
                continue;
            live |= o[t] != -INFINITY;
            if (pick < 0 || o[t] > o[pick])
                pick = t;
        }
        if (all_bytes && !live)
            fail(__LINE__); /* a piece of every byte keeps some piece in the form */
        if (pick < 0 || pick == 0)
            break;
        uint8_t st_before = rp.at.st;
        nd_reason_prior_feed(&rp, model, &c, pick);
        for (int k = 0; k < piece_len[pick] && rp.active; k++)
            nd_reason_prior_step(&rp, &ref, piece[pick][k]);
        if (ref.st != rp.at.st || ref.tool != rp.at.tool || ref.last != rp.at.last ||
            ref.used != rp.at.used || ref.nb != rp.at.nb || memcmp(ref.b, rp.at.b, ref.nb))
            fail(__LINE__);
        if (rp.at.tool < -1 || rp.at.tool >= rp.n || rp.at.nb > sizeof rp.at.b)
            fail(__LINE__);
        if (st_before == RP_OFF && rp.at.st != RP_OFF)
            fail(__LINE__); /* off the form: off for the rest of the turn */
        if (pick == best)
            at += (size_t)blen;
    }
    /* the plan as a call's JSON and as a value: the key found is a word
     * of it (or none), and a value runs on or not */
    for (int end = 0; end <= (int)plen; end += 1 + (int)nd_rng_below(r, 8)) {
        nd_copy_prior_call_key(&c, plan, (int)plen, end);
        if (c.key_n < 0 || c.key_n >= (int)sizeof c.key)
            fail(__LINE__);
        int ro = nd_copy_prior_runs_on(&c, (const unsigned char *)plan, end);
        if (ro != 0 && ro != 1)
            fail(__LINE__);
        if (nd_copy_prior_quote_done(&c, (const unsigned char *)plan, end) &&
            !quoted_in_source(&c, plan, end))
            fail(__LINE__);
    }
    check_quote_done(&c);
    check_tag_done(&c);
    nd_copy_prior_free(&c);
    nd_reason_prior_free(&rp);
}

/* the reasoning's first words, steered toward `plan` (greedy longest
 * pieces) with noise; checks the biased logits and naming after each piece */
static void reason(nd_choice_prior *p, const char *plan, nd_rng *r)
{
    float lg[V];
    uint8_t ok[V];
    size_t at = 0, plen = strlen(plan);
    for (int step = 0; step < REASON_STEPS; step++) {
        int best = -1, blen = 0;
        for (int t = 0; t < V; t++) {
            int len = piece_len[t];
            lg[t] = (float)nd_rng_uniform(r) * 4.0f;
            ok[t] = nd_rng_below(r, 8) != 0;
            if (len > blen && at + (size_t)len <= plen && !memcmp(plan + at, piece[t], (size_t)len))
                best = t, blen = len;
        }
        if (best >= 0) {
            lg[best] = 5.0f;
            ok[best] = 1;
        }
        int was_naming = p->naming;
        const float *b = nd_choice_prior_reason(p, model, lg, ok);
        if (b != lg && (b != p->biased || !was_naming))
            fail(__LINE__);
        int feeding = p->naming; /* the reasoning may stop naming on the model's top piece */
        int pick = 0;
        for (int t = 0; t < V; t++) {
            float d = b[t] - lg[t];
            if (!isfinite(b[t]) || d < 0.0f || (!ok[t] && d != 0.0f) ||
                d > p->tool_bonus * (1.0f + 1e-6f) + 1e-4f)
                fail(__LINE__);
            if (ok[t] && (!ok[pick] || b[t] > b[pick]))
                pick = t;
        }
        size_t before = p->named.n;
        int reasoned = p->reasoned;
        nd_choice_prior_feed(p, model, pick);
        if (p->reasoned < reasoned)
            fail(__LINE__); /* a named tool stays named this turn */
        if (!feeding) {
            if (p->naming || p->named.n != before)
                fail(__LINE__); /* once off, off until the next turn */
        } else {
            int longer = 0; /* a tool name that the bytes so far begin, longer */
            for (int i = 0; i < p->n && !longer; i++) {
                const char *nm = p->name[i];
                longer = nm && strlen(nm) > p->named.n &&
                         (!p->named.n || !memcmp(nm, p->named.p, p->named.n));
            }
            if (p->naming != longer)
                fail(__LINE__);
        }
        if (!p->naming)
            break;
        if (pick == best)
            at += (size_t)blen;
    }
}

/* the call side along one sampled call list */
static void call(nd_choice_prior *p, const nd_grammar *g, nd_rng *r)
{
    nd_choice_prior_call(p, g);
    for (int i = 0; i < ND_GRAM_MAX_ALT; i++) {
        int found = p->gweight[i] == 0.0f;
        for (int k = 0; k < p->n && !found; k++)
            found = p->gweight[i] == p->weight[k];
        if (!found || (!p->first_call && p->gweight[i] != 0.0f))
            fail(__LINE__);
    }
    /* a grammar tool whose JSON name decodes to a tool's name weighs what
     * that tool weighs (names the grammar keeps escaped, "r\u00e9server",
     * included) */
    for (int i = 0; p->first_call && i < nd_gram_num_tools(g) && i < ND_GRAM_MAX_ALT; i++) {
        int len, k = -1;
        const char *q = nd_gram_tool_name(g, i, &len);
        nd_pj_doc *nd = NULL;
        if (!q || nd_pj_parse(q, (size_t)len, &nd, NULL))
            fail(__LINE__); /* the grammar's names are JSON strings */
        const nd_pj *nm = nd_pj_root(nd);
        for (int j = 0; nm->type == ND_PJ_STRING && j < p->n; j++)
            if (p->name[j] && strlen(p->name[j]) == nm->len &&
                !memcmp(p->name[j], nm->str, nm->len))
                k = j;
        nd_pj_free(nd);
        if (k >= 0 && p->gweight[i] != p->weight[k])
            fail(__LINE__);
    }
    nd_gram_state st, next;
    nd_gram_init(g, &st);
    nd_buf out = {0};
    int rc = nd_gram_sample(g, r, 48, &out);
    for (size_t i = 0; i <= out.n && !rc; i++) {
        int names = -1, enums = -1;
        int s = nd_choice_prior_step(p, &st, &names, &enums);
        if ((s != 0 && s != 1) || (names != 0 && names != 1) || (enums != 0 && enums != 1) ||
            s != (names || enums) || enums != (p->enum_bonus != 0.0f && p->turn.n != 0))
            fail(__LINE__);
        if (names && (p->tool_bonus == 0.0f || p->n == 0))
            fail(__LINE__);
        float w = nd_choice_prior_name(p, &st);
        int found = w == 0.0f;
        for (int k = 0; k < ND_GRAM_MAX_ALT && !found; k++)
            found = w == p->gweight[k];
        if (!found)
            fail(__LINE__);
        int km = p->key_mask ? nd_gram_key_marked(g, &st, p->key_mask) : -1;
        if (km < -1 || km > 1 || (p->key_mask && p->key_bonus == 0.0f))
            fail(__LINE__);
        float l = nd_choice_prior_literal(p, g, &st);
        if (l != -1.0f && l != 0.0f && l != 1.0f)
            fail(__LINE__);
        if (l == 1.0f && !p->turn.n)
            fail(__LINE__);
        if (i == out.n)
            break;
        nd_gram_copy(&next, &st);
        if (!nd_gram_feed(g, &next, (unsigned char)out.p[i]))
            break; /* the sampler's promise: fuzz_grammar's business */
        nd_gram_copy(&st, &next);
    }
    nd_buf_free(&out);
    if (p->bonus) {
        float lg[V];
        uint8_t ok[V];
        for (int t = 0; t < V; t++) {
            lg[t] = (float)t;
            ok[t] = t & 1;
        }
        nd_choice_prior_add(p, ok, V, lg);
        for (int t = 0; t < V; t++)
            if (lg[t] != (float)t + (ok[t] ? p->bonus[t] : 0.0f))
                fail(__LINE__);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok)
        build_model();
    /* the parts */
    const uint8_t *part[4];
    size_t plen[4];
    const uint8_t *at = data, *end = data + size;
    for (int k = 0; k < 4; k++) {
        const uint8_t *nul = k < 3 ? memchr(at, 0, (size_t)(end - at)) : NULL;
        part[k] = at;
        plen[k] = (size_t)((nul ? nul : end) - at);
        at = nul ? nul + 1 : end;
    }
    char *text[3];
    for (int k = 0; k < 3; k++) {
        size_t n = plen[k] < MAX_TEXT ? plen[k] : MAX_TEXT;
        if (!(text[k] = malloc(n + 1)))
            fail(__LINE__);
        memcpy(text[k], part[k], n);
        text[k][n] = 0;
    }
    uint64_t seed = fnv1a(data, size);
    nd_rng rng;
    nd_rng_seed(&rng, seed);

    /* the setting */
    float b[3] = {-1.0f, -1.0f, -1.0f};
    int rc = nd_choice_prior_setting(plen[2] ? text[2] : NULL, b);
    if (rc == ND_OK) {
        if (!(b[0] >= 0.0f && b[0] <= 100.0f && b[1] >= 0.0f && b[1] <= 100.0f && b[2] >= 0.0f &&
              b[2] <= 100.0f))
            fail(__LINE__);
    } else if (rc != ND_EARG || b[0] != ND_CHOICE_TOOL_BONUS || b[1] != ND_CHOICE_ENUM_BONUS ||
               b[2] != ND_REASON_KEY_BONUS)
        fail(__LINE__);

    /* the tools, or the turn with none */
    nd_pj_doc *doc = NULL;
    const char *turn = text[1], *other = text[0];
    if (nd_pj_parse((const char *)part[0], plen[0], &doc, NULL) != 0) {
        turn = text[0];
        other = text[1];
        if (nd_pj_parse("[]", 2, &doc, NULL) != 0)
            fail(__LINE__);
    }
    const nd_pj *tools = nd_pj_root(doc);
    nd_choice_prior p;
    if (nd_choice_prior_init(&p, tools, V, b) != ND_OK)
        fail(__LINE__);
    int n = p.n;
    if (n != (b[0] == 0.0f && b[1] == 0.0f ? 0 : tools->type == ND_PJ_ARRAY ? (int)tools->len : 0))
        fail(__LINE__);
    float *w = calloc((size_t)n + 1, sizeof *w), *w2 = calloc((size_t)n + 1, sizeof *w2);
    if (!w || !w2)
        fail(__LINE__);

    /* the weights, and what a turn says */
    weigh(&p, turn, w);
    says_its_words(&p, turn);
    says(&p, (const char *)part[3], plen[3] < 1u << 20 ? plen[3] : 1u << 20);
    if (plen[3] && part[3][0] != '"' &&
        nd_choice_prior_says(&p, (const char *)part[3], (int)plen[3]))
        fail(__LINE__);
    if (!p.turn.n && plen[3] && nd_choice_prior_says(&p, (const char *)part[3], (int)plen[3]))
        fail(__LINE__);

    weigh(&p, "", w2);
    for (int i = 0; i < n; i++)
        if (w2[i] != 0.0f)
            fail(__LINE__);
    weigh(&p, other, w2);
    weigh(&p, turn, w2);
    same(w, w2, n); /* nothing left of the turns between */
    size_t tl = strlen(turn);
    char *t2 = malloc(2 * tl + 2);
    if (!t2)
        fail(__LINE__);
    for (size_t i = 0; i < tl; i++) { /* ASCII case flipped */
        char c = turn[i];
        t2[i] = c >= 'a' && c <= 'z' ? (char)(c - 32) : c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
    }
    t2[tl] = 0;
    weigh(&p, t2, w2);
    same(w, w2, n);
    memcpy(t2, turn, tl); /* said twice, on two lines (a quoted span never crosses one) */
    t2[tl] = '\n';
    memcpy(t2 + tl + 1, turn, tl + 1);
    weigh(&p, t2, w2);
    same(w, w2, n);
    free(t2);

    /* the tools in reverse order: the same weights, reversed */
    if (n > 1) {
        nd_pj **items = ((nd_pj *)tools)->items;
        for (int i = 0; i < n / 2; i++) {
            nd_pj *x = items[i];
            items[i] = items[n - 1 - i];
            items[n - 1 - i] = x;
        }
        nd_choice_prior q;
        if (nd_choice_prior_init(&q, tools, V, b) != ND_OK)
            fail(__LINE__);
        weigh(&q, turn, w2);
        for (int i = 0; i < n; i++)
            if (w2[i] != w[n - 1 - i])
                fail(__LINE__);
        nd_choice_prior_free(&q);
        for (int i = 0; i < n / 2; i++) {
            nd_pj *x = items[i];
            items[i] = items[n - 1 - i];
            items[n - 1 - i] = x;
        }
    }

    /* the reasoning, toward a tool's name or the turn's text */
    weigh(&p, turn, w2);
    if (n <= 64) {
        const char *plan = turn;
        char buf[256];
        int k = n ? (int)nd_rng_below(&rng, (uint64_t)n + 1) : n;
        if (k < n && p.name[k]) {
            size_t nl = strlen(p.name[k]);
            nl = nl < sizeof buf - 32 ? nl : sizeof buf - 32;
            buf[0] = ' ';
            memcpy(buf + 1, p.name[k], nl);
            const char *tail = nd_rng_below(&rng, 2) ? ": because" : "s and";
            memcpy(buf + 1 + nl, tail, strlen(tail) + 1);
            plan = buf;
        }
        reason(&p, plan, &rng);
    }
    if (n <= 64)
        plan_reason(tools, &p, turn, b, &rng);

    /* the call */
    nd_grammar *g = NULL;
    if (nd_gram_compile(tools, &g) == ND_OK) {
        call(&p, g, &rng);
        nd_gram_free(g);
    }

    nd_choice_prior_free(&p);
    nd_pj_free(doc);
    free(w);
    free(w2);
    for (int k = 0; k < 3; k++)
        free(text[k]);
    return 0;
}
