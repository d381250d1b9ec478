/* The copy prior (src/engine/copy_prior.h): numbers said in words as
 * digits; which pieces of a small hand-made vocabulary get the bonus, and
 * which of the two bonuses, inside a value, where a value opens and where
 * it closes; what the grammar reports as the value being written; a bonus
 * of 0 changes nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/copy_prior.h"
#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "testutil.h"

static void test_numbers_as_digits(void)
{
    static const char *const cases[][2] = {
        {"I fed Rocky two hundred and ninety-six grams", "I fed Rocky 296 grams"},
        {"twenty one and Twenty-One", "21 and 21"},
        {"forty-two thousand five hundred", "42500"},
        {"offset is twelve!", "offset is 12!"},
        {"zero", "0"},
        {"five hundred zero one", "500 0 1"}, /* "zero" only on its own */
        {"two hundred and zero", "200 and 0"},
        {"twenty,000 and eight,678", "20000 and 8678"}, /* digits from words count */
        {"nineteen eighty", "19 80"},
        {"twenty twenty", "20 20"},
        {"one, two", "1, 2"},
        {"someone tone", "someone tone"}, /* a number word inside a word */
        {"two hundred and the rest", "200 and the rest"},
        {"3 million", "3 million"}, /* digits before a scale stay as they are */
        {"a budget of $1,500 and 12,345,678 rows", "a budget of $1500 and 12345678 rows"},
        {"1,50 and 1,5000", "1,50 and 1,5000"}, /* not groups of three */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nd_buf out = {0};
        CHECK(nd_copy_numbers_as_digits(cases[i][0], &out) == ND_OK);
        const char *got = out.p ? out.p : "";
        CHECK_MSG(!strcmp(got, cases[i][1]), "\"%s\" -> \"%s\", want \"%s\"", cases[i][0], got,
                  cases[i][1]);
        nd_buf_free(&out);
    }
}

/* ---- a model with a hand-made vocabulary: only what the prior reads ---- */

static const char *const VOCAB[] = {
    "2",       "29",    "296",     "6",      "9",     "\"",   "6}",       "\":2",     "\":6",
    "Ro",      "Rocky", "cky",     "\"Ro",   "8",     "x",    "\",",      "ck",       "7",
    "3",       "\":8",  "}",       "eta",    ",",     " on",  "\"ZETA\"", "\"ZETX\"", "ta",
    "-",       "-07",   "-or",     ":/",     "ETA",   "as",   "il",       "final",    "pdf",
    "temp",    "Move",  "\"final", "\"pdf",  "\"xyz", "Tire", " ok",      "!",        "!'",
    "_report", ".pdf",  "Hello",   " world", "Corp",  "s",    "inal",     "ile",
};
enum { V = sizeof VOCAB / sizeof VOCAB[0] };

static int find(const char *s)
{
    for (int t = 0; t < V; t++)
        if (!strcmp(VOCAB[t], s))
            return t;
    fprintf(stderr, "no piece \"%s\" in the test's vocabulary\n", s);
    abort();
}

static void build_model(needle_model *M)
{
    memset(M, 0, sizeof *M);
    M->m.dims.V = V;
    M->trie = calloc(256, sizeof *M->trie);
    M->tok_next = malloc(V * sizeof *M->tok_next);
    M->trie[0] = (trie_node){-1, -1, -1, 0};
    M->n_trie = 1;
    for (int id = 0; id < V; id++) {
        int node = 0;
        for (const char *p = VOCAB[id]; *p; p++) {
            int c = M->trie[node].child;
            while (c >= 0 && M->trie[c].byte != (unsigned char)*p)
                c = M->trie[c].sibling;
            if (c < 0) {
                c = M->n_trie++;
                M->trie[c] = (trie_node){-1, M->trie[node].child, -1, (unsigned char)*p};
                M->trie[node].child = c;
            }
            node = c;
        }
        M->tok_next[id] = M->trie[node].tok;
        M->trie[node].tok = id;
    }
}

/* the bonus each piece gets: begin, mark, then token for the pieces that
 * open or close a value (each with its own inval), then add */
typedef struct {
    const char *piece;
    signed char inval[8];
} opener;

static void bonuses(nd_copy_prior *c, const needle_model *M, int pos, const char *value,
                    const opener *ops, int nops, float *lg)
{
    uint8_t allowed[V];
    memset(allowed, 1, sizeof allowed);
    memset(lg, 0, V * sizeof *lg);
    int n = value ? (int)strlen(value) : 0;
    nd_copy_prior_begin(c, V, pos, (const unsigned char *)value, n);
    for (int i = 0; i < nops; i++) {
        int t = find(ops[i].piece);
        nd_copy_prior_token(c, t, (const unsigned char *)value, n,
                            (const unsigned char *)ops[i].piece, (int)strlen(ops[i].piece),
                            ops[i].inval);
    }
    nd_copy_prior_mark(c, M, pos, (const unsigned char *)value, n, allowed);
    nd_copy_prior_add(c, allowed, V, lg);
}

#define BONUS(s) lg[find(s)]

static void test_marks(void)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 0.0f}; /* edge, inside, start, quote */
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    CHECK(nd_copy_prior_set(&c, "I fed Rocky two hundred and ninety-six grams", NULL) == ND_OK);
    float lg[V];
    enum { S = ND_GRAM_IN_STRING, N = ND_GRAM_IN_NUMBER };

    /* "29" so far, of "296" (the turn's words as digits): inside a word */
    const opener close6[] = {{"6}", {N, N, 0, 0}}};
    bonuses(&c, &M, N, "29", close6, 1, lg);
    CHECK(c.inside == 1);
    CHECK(BONUS("6") == 20.0f);
    CHECK(BONUS("6}") == 20.0f); /* goes on copying, then closes at the word's end */
    CHECK(BONUS("9") == 0.0f && BONUS("2") == 0.0f && BONUS("296") == 0.0f);

    /* a number opened inside a piece: ":2 starts "296", ":6 and ":8 start none */
    const opener open[] = {{"\":2", {0, 0, 0, N}}, {"\":6", {0, 0, 0, N}}, {"\":8", {0, 0, 0, N}}};
    bonuses(&c, &M, 0, NULL, open, 3, lg);
    CHECK(BONUS("\":2") == 0.0f); /* starts a copy: keeps its logit */
    CHECK(BONUS("\":6") == -10.0f &&
          BONUS("\":8") == -10.0f); /* start none: lose the start bonus */
    CHECK(BONUS("2") == 0.0f);      /* no value being written: nothing continues */

    /* a string: "Ro" so far goes on inside "Rocky"; "Rocky" may end there */
    bonuses(&c, &M, S, "Ro", NULL, 0, lg);
    CHECK(BONUS("cky") == 20.0f && BONUS("ck") == 20.0f);
    CHECK(BONUS("Rocky") == 0.0f && BONUS("x") == 0.0f);
    const opener closeq[] = {{"\",", {S, 0, 0, 0}}, {"\"", {S, 0, 0, 0}}};
    bonuses(&c, &M, S, "Rocky", closeq, 2, lg);
    CHECK(c.inside == 0);
    CHECK(BONUS("\",") == 4.0f && BONUS("\"") == 4.0f); /* at a word's end: the edge bonus */
    bonuses(&c, &M, S, "Rock", closeq, 2, lg);
    CHECK(BONUS("\"") == 0.0f); /* "Rock" is no copy that ends there */
    const opener openq[] = {{"\"Ro", {0, S, S, S}}};
    bonuses(&c, &M, 0, NULL, openq, 1, lg);
    CHECK(BONUS("\"Ro") == 0.0f);
    /* a copy starts at a word's start: "cky" alone is none */
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("Ro") == 10.0f && BONUS("Rocky") == 10.0f && BONUS("cky") == 0.0f);
    /* escaped bytes are never a copy */
    bonuses(&c, &M, S, "a\\\"", NULL, 0, lg);
    for (int t = 0; t < V; t++)
        CHECK(lg[t] == 0.0f);

    /* a number's sign is its start: "7" of "c = -7" is no copy (the base
     * wrote c 4 for "c = -4"), of "pages 3-7" it is */
    CHECK(nd_copy_prior_set(&c, "set c = -7 now", "") == ND_OK);
    bonuses(&c, &M, N, "", NULL, 0, lg);
    CHECK(BONUS("7") == 0.0f && BONUS("-") == 10.0f);
    CHECK(nd_copy_prior_set(&c, "pages 3-7", "") == ND_OK);
    bonuses(&c, &M, N, "", NULL, 0, lg);
    CHECK(BONUS("7") == 10.0f && BONUS("3") == 10.0f);

    /* numbers are whole numbers of the text: "8" of "8bdf" is none, "7"
     * of "7012" and "3" of "3.5" are */
    CHECK(nd_copy_prior_set(&c, "device 6dcc-8bdf-7012 at 3.5", "") == ND_OK);
    bonuses(&c, &M, N, "", NULL, 0, lg);
    CHECK(BONUS("8") == 0.0f && BONUS("6") == 0.0f);
    CHECK(BONUS("7") == 10.0f && BONUS("3") == 10.0f);
    /* "29" both ends a word ("29 and") and stops inside one ("296"): the
     * piece that closes at once gets the edge bonus, the one that goes
     * on inside the word first the inside bonus */
    CHECK(nd_copy_prior_set(&c, "29 and 296", NULL) == ND_OK);
    const opener closers[] = {{"}", {N, 0}}, {"6}", {N, N, 0}}};
    bonuses(&c, &M, N, "29", closers, 2, lg);
    CHECK(c.inside == 1);
    CHECK(BONUS("}") == 4.0f && BONUS("6}") == 20.0f && BONUS("6") == 20.0f);
    /* a string's first letter is inside a word: "b" goes on as "basil",
     * not "bil"; a capital goes on as the word or in capitals ("ZETA");
     * letters without case where a value starts or ends; a copy goes on
     * past a word's end over a space, not over a comma and a space */
    CHECK(nd_copy_prior_set(&c, "How do I care for my basil!", NULL) == ND_OK);
    bonuses(&c, &M, S, "b", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("as") == 20.0f && BONUS("il") == 0.0f);
    CHECK(nd_copy_prior_set(&c, "Let's get Zeta Corp on my list, please", NULL) == ND_OK);
    bonuses(&c, &M, S, "Z", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("eta") == 20.0f && BONUS("ETA") == 20.0f && BONUS("ta") == 0.0f);
    bonuses(&c, &M, S, "Ze", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("ta") == 20.0f && BONUS("eta") == 0.0f);
    const opener whole[] = {{"\"ZETA\"", {0, S, S, S, S, S, 0}},
                            {"\"ZETX\"", {0, S, S, S, S, S, 0}}};
    bonuses(&c, &M, 0, NULL, whole, 2, lg);
    CHECK(BONUS("\"ZETA\"") == 0.0f && BONUS("\"ZETX\"") == -10.0f);
    const opener quote[] = {{"\"", {S, 0}}};
    bonuses(&c, &M, S, "Zeta Corp", quote, 1, lg);
    CHECK(BONUS(" on") == 4.0f && BONUS("\"") == 4.0f);
    bonuses(&c, &M, S, "Zeta Corp on my list", quote, 1, lg);
    CHECK(BONUS(",") == 0.0f && BONUS("\"") == 4.0f);
    CHECK(nd_copy_prior_set(&c, "remove ids a,b", NULL) == ND_OK); /* a list in one value */
    bonuses(&c, &M, S, "a", quote, 1, lg);
    CHECK(BONUS(",") == 4.0f && BONUS("\"") == 4.0f);
    /* inside a compound value (an id, a date, a URL) a joining character
     * goes on as inside a word; a plain word's hyphen is an edge */
    CHECK(nd_copy_prior_set(&c, "ids 8dba3a6a-07df-a097 and re-order at https://a.io/x.", NULL) ==
          ND_OK);
    bonuses(&c, &M, S, "8dba3a6a", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("-07") == 20.0f && BONUS("-") == 20.0f);
    bonuses(&c, &M, S, "8dba3a6a-07df-a097", quote, 1, lg);
    CHECK(c.inside == 0 && BONUS("\"") == 4.0f && BONUS("-") == 0.0f); /* its end */
    bonuses(&c, &M, S, "re", NULL, 0, lg);
    CHECK(c.inside == 0 && BONUS("-or") == 4.0f);
    bonuses(&c, &M, S, "https", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS(":/") == 20.0f);
    bonuses(&c, &M, S, "https://a.io/x", quote, 1, lg);
    CHECK(c.inside == 0 && BONUS("\"") == 4.0f); /* the sentence's point is no part of it */
    /* the system text is a source too */
    CHECK(nd_copy_prior_set(&c, "what is my number", "my number is 296") == ND_OK);
    bonuses(&c, &M, N, "29", NULL, 0, lg);
    CHECK(BONUS("6") == 20.0f);
    nd_copy_prior_free(&c);

    /* a bonus of 0: no memory, no marks, the logits as they were */
    const float off[ND_COPY_N_BONUS] = {4.0f, 0.0f, 10.0f, 0.0f};
    CHECK(nd_copy_prior_init(&c, &M, off) == ND_OK);
    CHECK(c.mark == NULL);
    CHECK(nd_copy_prior_set(&c, "I fed Rocky 296 grams", NULL) == ND_OK);
    bonuses(&c, &M, N, "29", close6, 1, lg);
    for (int t = 0; t < V; t++)
        CHECK(lg[t] == 0.0f);
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

/* A quoted span ('...', "...", `...`, curly quotes) is one value: its
 * start gets the quote bonus too, a copy from its start goes on to its
 * closing quote (over spaces and joining characters, not past the quote);
 * an apostrophe inside a word opens and closes nothing. */
static void test_quoted(void)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 5.0f}; /* edge, inside, start, quote */
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    CHECK(nd_copy_prior_set(&c,
                            "Move 'final_report.pdf' to \"temp\" and say `Tire ok!` now; "
                            "Zeta Corp's s 'x",
                            NULL) == ND_OK);
    float lg[V];
    enum { S = ND_GRAM_IN_STRING };
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("final") == 15.0f && BONUS("temp") == 15.0f && BONUS("Tire") == 15.0f);
    CHECK(BONUS("Move") == 10.0f); /* another word's start */
    CHECK(BONUS("pdf") == 0.0f);   /* a quoted span is one value: no copy starts inside */
    CHECK(BONUS("Corp") == 10.0f && BONUS("s") == 10.0f); /* "Corp's": no quote */
    CHECK(BONUS("x") == 10.0f);                           /* 'x never closes */
    /* a value opened in one piece with its first bytes */
    const opener open[] = {
        {"\"final", {0, S, S, S, S, S, S}}, {"\"pdf", {0, S, S, S, S}}, {"\"xyz", {0, S, S, S, S}}};
    bonuses(&c, &M, 0, NULL, open, 3, lg);
    CHECK(BONUS("\"final") == 5.0f && BONUS("\"pdf") == -10.0f && BONUS("\"xyz") == -10.0f);
    /* inside the span: on over "_" and " ", up to the closing quote */
    bonuses(&c, &M, S, "final", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("_report") == 25.0f);
    bonuses(&c, &M, S, "final_report", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS(".pdf") == 25.0f);
    bonuses(&c, &M, S, "Tire", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS(" ok") == 25.0f);
    bonuses(&c, &M, S, "Tire ok", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS("!") == 25.0f && BONUS("!'") == 0.0f);
    const opener closeq[] = {{"\"", {S, 0}}};
    bonuses(&c, &M, S, "Tire ok!", closeq, 1, lg);
    CHECK(c.inside == 0 && BONUS("\"") == 4.0f);
    /* "pdf" would start inside the span: no copy, nothing to close */
    bonuses(&c, &M, S, "pdf", closeq, 1, lg);
    CHECK(c.inside == 0 && BONUS("\"") == 0.0f);
    /* a copy from the span's start closes at its closing quote only */
    bonuses(&c, &M, S, "final_report", closeq, 1, lg);
    CHECK(BONUS("\"") == 0.0f);
    bonuses(&c, &M, S, "final_report.pdf", closeq, 1, lg);
    CHECK(BONUS("\"") == 4.0f);
    /* a taken span starts no copy until untaken */
    nd_copy_prior_take(&c, (const unsigned char *)"final_report.pdf", 16, 0);
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("final") == 0.0f && BONUS("temp") == 15.0f);
    nd_copy_prior_untake(&c);
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("final") == 15.0f);
    CHECK(nd_copy_prior_set(&c, "compare 'final_report.pdf' with 'old_final_report.pdf' please",
                            NULL) == ND_OK);
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("final") == 15.0f);
    /* "f" copies the quoted span and "file": the span's way gets the quote bonus */
    CHECK(nd_copy_prior_set(&c, "compare 'final_report.pdf' with file please", NULL) == ND_OK);
    bonuses(&c, &M, S, "f", NULL, 0, lg);
    CHECK(BONUS("inal") == 25.0f && BONUS("ile") == 20.0f);
    /* curly quotes */
    CHECK(nd_copy_prior_set(&c, "post \xE2\x80\x98Hello world\xE2\x80\x99 please", NULL) == ND_OK);
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("Hello") == 15.0f);
    bonuses(&c, &M, S, "Hello", NULL, 0, lg);
    CHECK(c.inside == 1 && BONUS(" world") == 25.0f);
    /* no quotes: a word's end is an edge */
    CHECK(nd_copy_prior_set(&c, "post Hello world please", NULL) == ND_OK);
    bonuses(&c, &M, S, "", NULL, 0, lg);
    CHECK(BONUS("Hello") == 10.0f);
    bonuses(&c, &M, S, "Hello", NULL, 0, lg);
    CHECK(c.inside == 0 && BONUS(" world") == 4.0f);
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

/* The name bonus: a copy where the turn names the argument being written
 * just before it ("a=2", "height of 9", "depth 3"), by its name's last word
 * ("maxHeight" -> "height"); a name of one or two letters only before "="
 * or ":"; none without a key. */
static void test_named(void)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 5.0f, 6.0f};
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    CHECK(nd_copy_prior_set(&c, "where a=2, b 6, and c: 7; heights of 9 units, depth 3 and x 8",
                            NULL) == ND_OK);
    float lg[V];
    enum { N = ND_GRAM_IN_NUMBER };
    static const struct {
        const char *key, *named;
    } cases[] = {
        {"a", "2"},         {"c", "7"},  {"height", "9"}, {"maxHeight", "9"}, {"depth", "3"},
        {"box_depth", "3"}, {"b", NULL}, {"x", NULL},     {"width", NULL},    {NULL, NULL},
    };
    const char *const starts[] = {"2", "6", "7", "9", "3", "8"};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nd_copy_prior_key(&c, cases[k].key, cases[k].key ? (int)strlen(cases[k].key) : 0);
        bonuses(&c, &M, N, "", NULL, 0, lg);
        for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
            int named = cases[k].named && !strcmp(starts[i], cases[k].named);
            CHECK_MSG(BONUS(starts[i]) == (named ? 16.0f : 10.0f), "key %s: \"%s\" gets %g",
                      cases[k].key ? cases[k].key : "(none)", starts[i], BONUS(starts[i]));
        }
    }
    /* a value opened in one piece: the named copy gains the name bonus */
    nd_copy_prior_key(&c, "a", 1);
    const opener open[] = {{"\":2", {0, 0, 0, N}}, {"\":6", {0, 0, 0, N}}, {"\":8", {0, 0, 0, N}}};
    bonuses(&c, &M, 0, NULL, open, 3, lg);
    CHECK(BONUS("\":2") == 6.0f && BONUS("\":6") == 0.0f && BONUS("\":8") == 0.0f);
    nd_copy_prior_key(&c, "z", 1);
    bonuses(&c, &M, 0, NULL, open, 3, lg);
    CHECK(BONUS("\":2") == 0.0f && BONUS("\":6") == 0.0f);
    /* a new turn forgets the key */
    nd_copy_prior_key(&c, "a", 1);
    CHECK(nd_copy_prior_set(&c, "a=2", NULL) == ND_OK && c.key_n == 0);
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

/* the call grammar of the tools JSON text `tools` (checked) */
static nd_grammar *grammar_of(const char *tools)
{
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(tools, strlen(tools), &doc, NULL) == 0);
    nd_grammar *g = NULL;
    CHECK(nd_gram_compile(nd_pj_root(doc), &g) == ND_OK);
    nd_pj_free(doc);
    return g;
}

/* nd_gram_value_pos along a call's bytes */
static void test_value_pos(void)
{
    const char *tools = "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
                        "{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                        "\"e\":{\"enum\":[\"ab\",\"cd\"]}}}}]";
    nd_grammar *g = grammar_of(tools);
    const char *call = "[{\"name\":\"f\",\"arguments\":{\"s\":\"x\\\"y\",\"n\":-12,\"e\":\"ab\"}}]";
    /* after each byte: S string, N number, . neither (the enum is a choice) */
    const char *want = "..............................SSSSS......NNN............";
    CHECK(strlen(want) == strlen(call));
    nd_gram_state st;
    nd_gram_init(g, &st);
    for (size_t i = 0; call[i]; i++) {
        CHECK(nd_gram_feed(g, &st, (unsigned char)call[i]));
        const char *num = NULL;
        int nlen = -1, pos = nd_gram_value_pos(&st, &num, &nlen);
        char got = pos == ND_GRAM_IN_STRING ? 'S' : pos == ND_GRAM_IN_NUMBER ? 'N' : '.';
        CHECK_MSG(got == want[i], "after \"%.*s\": %c, want %c", (int)i + 1, call, got, want[i]);
        if (pos == ND_GRAM_IN_NUMBER)
            CHECK(nlen >= 1 && !memcmp(num, "-12", (size_t)nlen));
    }
    CHECK(nd_gram_done(&st));
    nd_gram_free(g);
}

/* Where a call is directly in an argument array (nd_gram_in_array): between
 * items, in a number or literal item, not in a string item, an object's
 * value, or the call list itself. */
static void test_in_array(void)
{
    const char *tools =
        "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
        "\"t\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"l\":{\"type\":\"array\",\"items\":{\"enum\":[\"ab\",\"cd\"]}},"
        "\"o\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}}}}]";
    nd_grammar *g = grammar_of(tools);
    const char *call = "[{\"name\":\"f\",\"arguments\":{\"a\":[1,22],\"t\":[\"x\"],\"l\":[\"ab\"],"
                       "\"o\":{\"b\":3}}}]";
    const char *want = "..............................AAAAA......A..A......AAAAA................";
    const char *item = "..........................................SS............................";
    CHECK_MSG(strlen(want) == strlen(call), "%zu %zu", strlen(want), strlen(call));
    nd_gram_state st;
    nd_gram_init(g, &st);
    for (size_t i = 0; call[i]; i++) {
        CHECK(nd_gram_feed(g, &st, (unsigned char)call[i]));
        char got = nd_gram_in_array(&st) ? 'A' : '.';
        CHECK_MSG(got == want[i], "after \"%.*s\": %c, want %c", (int)i + 1, call, got, want[i]);
        got = nd_gram_string_item(&st) ? 'S' : '.';
        CHECK_MSG(got == item[i], "string item after \"%.*s\": %c, want %c", (int)i + 1, call, got,
                  item[i]);
    }
    CHECK(nd_gram_done(&st));
    nd_gram_free(g);
}

/* The key a call's JSON is at (nd_copy_prior_call_key): the value's own
 * key, not the one before a key still being written. */
static void test_call_key(void)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 5.0f, 6.0f};
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    static const struct {
        const char *call;
        int end; /* -1: the call's length (in no value) */
        const char *key;
    } cases[] = {
        {"[{\"name\":\"f\",\"arguments\":{\"offset\":", -1, "offset"},
        {"[{\"name\":\"f\",\"arguments\":{\"offset\":12", 35, "offset"},   /* a number's start */
        {"[{\"name\":\"f\",\"arguments\":{\"city\":\"Par", 33, "city"},    /* a string's quote */
        {"[{\"name\":\"f\",\"arguments\":{\"offset\":12,\"lim", -1, NULL}, /* a key being written */
        {"[{\"name\":\"f\",\"arguments\":{\"offset\":12,", -1, NULL},      /* a key to come */
        {"[{\"name\":\"f\",\"arguments\":{", -1, NULL},
        {"[{\"name\":\"f\",\"arguments\":{\"offset\":12,\"maxLimit\"", -1, "limit"},
        {"[{\"name\":\"f\",\"arguments\":{\"city\":\"Paris\"", -1, "city"}, /* a value closed */
        {"[{\"name\":\"f\",\"arguments\":{\"a\\\"b\":", -1, "b"},           /* an escaped quote */
        {"", -1, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int len = (int)strlen(cases[k].call);
        nd_copy_prior_key(&c, "stale", 5);
        nd_copy_prior_call_key(&c, cases[k].call, len, cases[k].end < 0 ? len : cases[k].end);
        const char *want = cases[k].key ? cases[k].key : "";
        CHECK_MSG(c.key_n == (int)strlen(want) && !memcmp(c.key, want, strlen(want)),
                  "%s: key '%.*s', want '%s'", cases[k].call, c.key_n, c.key, want);
    }
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

/* nd_copy_prior_runs_on: a value that repeats 16 bytes the turn does not */
static void test_runs_on(void)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 5.0f, 6.0f};
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    CHECK(nd_copy_prior_set(&c, "say 'go team go team go team go team' and file a canceled order",
                            NULL) == ND_OK);
    static const struct {
        const char *v;
        int runs_on;
    } cases[] = {
        {"a canceled buy order for a canceled buy order", 1}, /* 16 bytes again */
        {"a canceled buy order, a canceled b", 0},            /* 12 bytes again */
        {"PPPPPPPPPPPPPPPP", 0},                              /* 16 bytes, once */
        {"PPPPPPPPPPPPPPPPP", 1},                             /* twice, overlapping */
        {"go team go team go team go team", 0},               /* the turn repeats it too: a copy */
        {"https://example.com/a https://example.com/b", 0},   /* 15 bytes shared */
        {"", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        CHECK_MSG(nd_copy_prior_runs_on(&c, (const unsigned char *)cases[k].v,
                                        (int)strlen(cases[k].v)) == cases[k].runs_on,
                  "\"%s\": want %d", cases[k].v, cases[k].runs_on);
    nd_copy_prior_free(&c);
    /* off: never */
    const float off[ND_COPY_N_BONUS] = {0};
    CHECK(nd_copy_prior_init(&c, &M, off) == ND_OK);
    CHECK(nd_copy_prior_runs_on(&c, (const unsigned char *)"PPPPPPPPPPPPPPPPPPPP", 20) == 0);
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

typedef int (*done_fn)(const nd_copy_prior *c, const unsigned char *v, int n);
typedef struct {
    const char *v;
    int done;
} done_case;

/* fn over src with the prior on: each case's value done or not as it
 * says; with the prior off no value is done (the first done case's) */
static void check_done(done_fn fn, const char *src, const done_case *cases, size_t n)
{
    needle_model M;
    build_model(&M);
    nd_copy_prior c;
    const float on[ND_COPY_N_BONUS] = {4.0f, 20.0f, 10.0f, 5.0f, 6.0f};
    CHECK(nd_copy_prior_init(&c, &M, on) == ND_OK);
    CHECK(nd_copy_prior_set(&c, src, NULL) == ND_OK);
    const char *some_done = NULL;
    for (size_t k = 0; k < n; k++) {
        CHECK_MSG(fn(&c, (const unsigned char *)cases[k].v, (int)strlen(cases[k].v)) ==
                      cases[k].done,
                  "\"%s\": want %d", cases[k].v, cases[k].done);
        if (cases[k].done && !some_done)
            some_done = cases[k].v;
    }
    nd_copy_prior_free(&c);
    const float off[ND_COPY_N_BONUS] = {0};
    CHECK(nd_copy_prior_init(&c, &M, off) == ND_OK);
    CHECK(nd_copy_prior_set(&c, src, NULL) == ND_OK);
    CHECK(some_done && fn(&c, (const unsigned char *)some_done, (int)strlen(some_done)) == 0);
    nd_copy_prior_free(&c);
    free(M.trie);
    free(M.tok_next);
}

/* A string that has copied a whole quoted span is done (the base wrote
 * "Google' filed" and "Queen'" zero-shot), unless a longer quoted span
 * begins with it ('john' and 'john1234'); a quote after a sentence's
 * closing mark closes its span even before a letter (BFCL: "... financial
 * report?'in their inbox"). */
static void test_quote_done(void)
{
    static const done_case cases[] = {
        {"Google", 1},   {"Goog", 0}, {"Google' filed", 0},      {"google", 0}, {"john", 0},
        {"john1234", 1}, {"1234", 1}, {"What do you think?", 1}, {"Zeta", 0},   {"filed", 0},
        {"", 0},
    };
    check_done(nd_copy_prior_quote_done,
               "the case 'Google' filed; user 'john' password 'john1234'; "
               "send 'What do you think?'in their inbox, id '1234'. Zeta's",
               cases, sizeof cases / sizeof cases[0]);
    const char *src = "say 'report?'in it and 'it's' or 'x'y";
    CHECK(nd_quoted_end(src, 5) == 12);  /* after "?" */
    CHECK(nd_quoted_end(src, 24) == 28); /* not at "it's" */
    CHECK(nd_quoted_end(src, 34) == 34); /* 'x'y: before a letter */
}

/* A whole #tag or @mention of the source is done, unless a longer tag
 * begins with it (nd_copy_prior_tag_done) */
static void test_tag_done(void)
{
    static const done_case cases[] = {
        {"#CarMaintenance", 1},
        {"#CarMaint", 0},
        {"#CarMaintenance and", 0},
        {"@VehicleGuru", 1},
        {"#Journey", 0},
        {"#JourneyHome", 1},
        {"@example", 0},
        {"#a_b2", 1},
        {"CarMaintenance", 0},
        {"#", 0},
        {"", 0},
        {"#Other", 0},
    };
    check_done(nd_copy_prior_tag_done,
               "Use #CarMaintenance and tag @VehicleGuru; #Journey, #JourneyHome, "
               "mail bob@example.com #a_b2",
               cases, sizeof cases / sizeof cases[0]);
}

static void test_setting(void)
{
    float b[ND_COPY_N_BONUS];
    CHECK(nd_copy_prior_setting("", b) == ND_OK);
    CHECK(b[0] == ND_COPY_EDGE_BONUS && b[1] == ND_COPY_INSIDE_BONUS &&
          b[2] == ND_COPY_START_BONUS && b[3] == ND_COPY_QUOTE_BONUS);
    CHECK(nd_copy_prior_setting(NULL, b) == ND_OK && b[1] == ND_COPY_INSIDE_BONUS);
    CHECK(nd_copy_prior_setting("0", b) == ND_OK && b[0] == 0.0f && b[1] == 0.0f && b[2] == 0.0f &&
          b[3] == 0.0f);
    CHECK(nd_copy_prior_setting("off", b) == ND_OK && b[1] == 0.0f);
    CHECK(nd_copy_prior_setting("2.5,30,7", b) == ND_OK && b[0] == 2.5f && b[1] == 30.0f &&
          b[2] == 7.0f && b[3] == ND_COPY_QUOTE_BONUS); /* QUOTE left out: the default */
    CHECK(nd_copy_prior_setting("2.5,30,7,0", b) == ND_OK && b[2] == 7.0f && b[3] == 0.0f &&
          b[4] == ND_COPY_NAME_BONUS);
    CHECK(nd_copy_prior_setting("2.5,30,7,0,9", b) == ND_OK && b[3] == 0.0f && b[4] == 9.0f);
    CHECK(nd_copy_prior_setting("0,8,0", b) == ND_OK && b[0] == 0.0f && b[1] == 8.0f);
    static const char *const bad[] = {"4",       "4,20",    "4,20,",        "4,0,6", "-1,20,6",
                                      "4,200,6", "4,20,6x", "4,20,6,1,1,1", "on",    "nan,5,5",
                                      ",20,6",   "4,20,6,", "4,20,6,101"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK_MSG(nd_copy_prior_setting(bad[k], b) == ND_EARG, "'%s' accepted", bad[k]);
        CHECK(strstr(nd_last_error(), "NEEDLE_COPY_PRIOR") != NULL);
    }
}

int main(void)
{
    test_setting();
    test_numbers_as_digits();
    test_marks();
    test_quoted();
    test_named();
    test_call_key();
    test_runs_on();
    test_quote_done();
    test_tag_done();
    test_in_array();
    test_value_pos();
    return tu_finish("test_copy_prior");
}
