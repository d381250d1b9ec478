/* The reasoning prior (src/engine/reason_prior.h): the plan parser's
 * states and value kinds over whole plans, plans that leave the form, and
 * one step's logits with a hand-made vocabulary: only argument names
 * after the colon and ", ", the required one's bonus, a value's type, an
 * enum's values and the said one's bonus, integers without a point, a
 * later call's name from the list, no end inside a part; the copy prior's
 * words a value took (nd_copy_prior_take). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/choice_prior.h"
#include "engine/copy_prior.h"
#include "engine/model_internal.h"
#include "engine/reason_prior.h"
#include "testutil.h"

static const char *const TOOLS =
    "[{\"name\":\"preheat_oven\",\"description\":\"Preheat the oven\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"mode\":{\"type\":\"string\",\"enum\":[\"bake\","
    "\"broil\",\"convection\"]},\"temperature\":{\"type\":\"integer\"},\"rack\":{\"type\":"
    "\"number\"}},\"required\":[\"temperature\"]}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"start_dryer\",\"description\":\"Start the "
    "dryer\",\"parameters\":{\"type\":\"object\",\"properties\":{\"minutes\":{\"type\":"
    "\"integer\"},\"gentle\":{\"type\":\"boolean\"}}}}}]";

static nd_pj_doc *tools_doc(void)
{
    nd_pj_doc *doc = NULL;
    CHECK(nd_pj_parse(TOOLS, strlen(TOOLS), &doc, NULL) == ND_OK);
    return doc;
}

/* feed a whole text; the kind after it */
static int feed_text(const nd_reason_prior *p, nd_reason_pos *s, const char *text)
{
    for (const char *c = text; *c; c++)
        nd_reason_prior_step(p, s, (unsigned char)*c);
    return nd_reason_prior_kind(s);
}

static void start(nd_reason_pos *s)
{
    memset(s, 0, sizeof *s);
    s->tool = s->last = -1;
}

static void test_parser(void)
{
    nd_pj_doc *doc = tools_doc();
    nd_reason_prior p;
    CHECK(nd_reason_prior_init(&p, nd_pj_root(doc), 4, -1, 10.0f) == ND_OK);
    CHECK(p.n == 2 && p.tool[0].nkeys == 3 && p.tool[1].nkeys == 2);
    CHECK(!strcmp(p.tool[1].name, "start_dryer")); /* the {"function": ...} form */
    CHECK(p.tool[0].nreq == 1 && p.tool[0].req_order[0] == 1 && p.tool[0].req == 2);
    CHECK(p.tool[0].keys[0].nenum == 3 && !strcmp(p.tool[0].keys[0].enums[2], "convection"));
    CHECK(p.tool[0].keys[1].nenum == 0 && p.tool[0].keys[2].nenum == 0);

    nd_reason_pos s;
    start(&s);
    CHECK(feed_text(&p, &s, " preheat_oven") == 0 && s.tool == -1);
    CHECK(feed_text(&p, &s, ": ") == 0 && s.tool == 0);
    CHECK(feed_text(&p, &s, "temperature ") == ND_GRAM_AT_VALUE && s.last == 1);
    CHECK(feed_text(&p, &s, "21") == ND_GRAM_IN_NUMBER);
    CHECK(feed_text(&p, &s, "3 from \"two") == ND_GRAM_IN_STRING);
    CHECK(feed_text(&p, &s, " hundred\"") == 0);
    CHECK(feed_text(&p, &s, ", mode \"ba") == ND_GRAM_IN_STRING && s.last == 0);
    CHECK(feed_text(&p, &s, "k\\\"e\"") == 0); /* an escaped quote stays inside */
    CHECK(s.used == 3);
    CHECK(feed_text(&p, &s, "; then start_dryer: gentle true, minutes 5") == ND_GRAM_IN_NUMBER);
    CHECK(s.tool == 1 && s.then == 1 && s.used == 3 && s.last == 0);
    CHECK(feed_text(&p, &s, ", rack") == 0 && s.st != 0); /* rack is no dryer argument: off */
    int off = s.st;
    CHECK(feed_text(&p, &s, " 3, minutes 4") == 0 && s.st == off); /* off to the end */

    /* nested values, numbers, words */
    start(&s);
    feed_text(&p, &s, "start_dryer: gentle [1, {\"a\": \"]\"}], minutes -2.5e3");
    CHECK(nd_reason_prior_kind(&s) == ND_GRAM_IN_NUMBER && s.used == 3);

    /* reasoning out of the form: no tool, or an argument the tool lacks */
    static const char *const other[] = {
        "The user wants: a file. No listed tool does that, so no call.",
        "Chit-chat or a general question; no tool fits, so no call.",
        "preheat_oven: dish \"public\"",
        "preheat_oven:temperature 3",
        "preheat_oven: temperature:15",
        "preheat_oven: temperature 3; then",
        "preheat_oven: temperature 3 and more",
        "preheat_oven: mode bake",
    };
    for (size_t k = 0; k < sizeof other / sizeof *other; k++) {
        start(&s);
        feed_text(&p, &s, other[k]);
        int kind = nd_reason_prior_kind(&s);
        CHECK_MSG(kind == 0, "'%s' ends in kind %d", other[k], kind);
    }
    /* argument names the form cannot write (a space ends a name there; 65
     * bytes) are no keys of the tool: the others keep their order */
    {
        char doc2[512];
        snprintf(doc2, sizeof doc2,
                 "[{\"name\":\"t\",\"parameters\":{\"type\":\"object\",\"properties\":"
                 "{\"a b\":{},\"%065d\":{},\"c\":{}},\"required\":[\"a b\",\"c\"]}}]",
                 0);
        nd_pj_doc *d2 = NULL;
        nd_reason_prior q;
        CHECK(nd_pj_parse(doc2, strlen(doc2), &d2, NULL) == ND_OK);
        CHECK(nd_reason_prior_init(&q, nd_pj_root(d2), 4, -1, 10.0f) == ND_OK);
        CHECK(q.n == 1 && q.tool[0].nkeys == 1 && !strcmp(q.tool[0].keys[0].name, "c"));
        CHECK(q.tool[0].req == 1 && q.tool[0].nreq == 1 && q.tool[0].req_order[0] == 0);
        nd_reason_prior_free(&q);
        nd_pj_free(d2);
        /* nor tool names: with a colon or a space, or over 64 bytes */
        snprintf(doc2, sizeof doc2,
                 "[{\"name\":\"a:b\"},{\"name\":\"a b\"},{\"name\":\"%065d\"},"
                 "{\"name\":\"ok\"}]",
                 0);
        CHECK(nd_pj_parse(doc2, strlen(doc2), &d2, NULL) == ND_OK);
        CHECK(nd_reason_prior_init(&q, nd_pj_root(d2), 4, -1, 10.0f) == ND_OK);
        CHECK(q.n == 4 && !q.tool[0].name && !q.tool[1].name && !q.tool[2].name &&
              !strcmp(q.tool[3].name, "ok"));
        nd_reason_prior_free(&q);
        nd_pj_free(d2);
    }
    /* a name longer than the parser keeps */
    start(&s);
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    feed_text(&p, &s, longname);
    CHECK(feed_text(&p, &s, ": temperature 3") == 0 && s.tool == -1);
    nd_reason_prior_free(&p);
    nd_pj_free(doc);
}

/* ---- one step, with a hand-made vocabulary ---- */

#define SP "\xe2\x96\x81" /* U+2581, a piece's space */

static const char *const MULTI[] = {
    "<unk>", SP "temperature", SP "mode", SP "de", SP "2",    "13",     SP "\"", "bake",
    "\",",   "preheat_oven",   SP "dish", "ff",    SP "rack", "</end>",
};
enum { N_MULTI = sizeof MULTI / sizeof MULTI[0], V = N_MULTI + 95 };
static char vocab[V][8];

static const char *piece(int t)
{
    return t < N_MULTI ? MULTI[t] : vocab[t];
}

static int find(const char *s)
{
    for (int t = 0; t < V; t++)
        if (!strcmp(piece(t), s))
            return t;
    fprintf(stderr, "no piece \"%s\" in the test's vocabulary\n", s);
    abort();
}

static void put32(nd_buf *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    nd_buf_put(b, (const char *)x, 4);
}

/* a tokenizer blob (docs/formats.md §4.3): <unk>, the pieces above, then
 * one piece for each printable ASCII byte (a space as U+2581) */
static nd_tokenizer *build_tokenizer(void)
{
    for (int i = 0; i < 95; i++) {
        char c = (char)(' ' + i);
        if (c == ' ')
            strcpy(vocab[N_MULTI + i], SP);
        else
            vocab[N_MULTI + i][0] = c, vocab[N_MULTI + i][1] = 0;
    }
    nd_buf b = {0};
    put32(&b, V);
    put32(&b, 0xffffffffu); /* pad */
    put32(&b, 0xffffffffu); /* eos */
    put32(&b, 0xffffffffu); /* bos */
    put32(&b, 0);           /* unk */
    nd_buf_put(&b, "\0\0\0\0", 4);
    for (int i = 0; i < V; i++) {
        const char *s = piece(i);
        size_t n = strlen(s);
        /* <unk> unknown, the end piece a control one as "</think>" is */
        unsigned char type = i == 0 ? 1 : !strcmp(s, "</end>") ? 2 : 0;
        unsigned char rec[7] = {0, 0, 0, 0, type, (unsigned char)n, (unsigned char)(n >> 8)};
        nd_buf_put(&b, (const char *)rec, 7);
        nd_buf_put(&b, s, n);
    }
    nd_tokenizer *t = NULL;
    CHECK(nd_tokenizer_from_blob((const unsigned char *)b.p, b.n, &t) == ND_OK);
    nd_buf_free(&b);
    return t;
}

static void feed_pieces(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c,
                        const char *const *pieces)
{
    for (; *pieces; pieces++)
        nd_reason_prior_feed(p, M, c, find(*pieces));
}

#define L(s) lg[find(s)]
#define R(s) r[find(s)]

static void test_step(void)
{
    needle_model M;
    memset(&M, 0, sizeof M);
    M.m.dims.V = V;
    M.tok = build_tokenizer();
    if (!M.tok || nd_model_build_trie(&M) != ND_OK)
        return;
    nd_pj_doc *doc = tools_doc();
    nd_choice_prior choice;
    const float cb[2] = {10.0f, 10.0f};
    CHECK(nd_choice_prior_init(&choice, nd_pj_root(doc), V, cb) == ND_OK);
    nd_copy_prior copy;
    const float kb[ND_COPY_N_BONUS] = {6.0f, 20.0f, 12.0f, 0.0f};
    CHECK(nd_copy_prior_init(&copy, &M, kb) == ND_OK);
    nd_reason_prior p;
    CHECK(nd_reason_prior_init(&p, nd_pj_root(doc), V, find("</end>"), 10.0f) == ND_OK);
    const char *turn = "Bake at 213 degrees";
    CHECK(nd_choice_prior_turn(&choice, turn) == ND_OK &&
          nd_copy_prior_set(&copy, turn, NULL) == 0);
    nd_reason_prior_turn(&p, 1, &choice);
    CHECK(p.tool[0].keys[0].said[0] == 1 && p.tool[0].keys[0].said[1] == 0);
    uint8_t ok[V];
    memset(ok, 1, sizeof ok);
    float lg[V];
    const float *r;

    /* the name: no opinion (the choice prior's part) */
    memset(lg, 0, sizeof lg);
    CHECK(nd_reason_prior_logits(&p, &M, &copy, lg, ok) == lg);
    feed_pieces(&p, &M, &copy, (const char *const[]){"preheat_oven", ":", NULL});
    /* after the colon: argument names only, the required one's bonus */
    L(SP "de") = 5.0f, L(SP "mode") = 1.0f, L("</end>") = 9.0f;
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(r != lg);
    CHECK(isinf(R(SP "de")) && isinf(R(SP "dish")) && isinf(R("o")) && isinf(R("</end>")));
    CHECK(R(SP "temperature") == 10.0f && R(SP "mode") == 1.0f && R(SP "rack") == 0.0f);
    CHECK(R(SP) == 10.0f); /* a bare space: the required name may follow */
    CHECK(isinf(R("x")));  /* a byte no argument name begins with */
    nd_reason_prior_feed(&p, &M, &copy, find(SP "temperature"));

    /* an integer's value: a digit, no string; a copy's first digit keeps
     * its logit (a made-up one would lose the copy prior's start bonus) */
    memset(lg, 0, sizeof lg);
    L(SP "\"") = 4.0f;
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(isinf(R(SP "\"")) && isinf(R("</end>")) && isinf(R("1")));
    CHECK(R(SP "2") == 0.0f);
    nd_reason_prior_feed(&p, &M, &copy, find(SP "2"));
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(isinf(R(".")) && R("13") == 20.0f); /* no point in an integer; the copy goes on */
    nd_reason_prior_feed(&p, &M, &copy, find("13"));
    /* the number may end: a separator (the copy ends there: its edge bonus)
     * or the reasoning's end; nothing else */
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R("</end>") == 6.0f && R(",") == 6.0f && isinf(R(":")) && isinf(R("o")));
    nd_reason_prior_feed(&p, &M, &copy, find(","));
    /* the value took "213": no copy starts there again this call */
    const char *at = strstr(copy.src.p, "213");
    CHECK(at && copy.taken[at - copy.src.p] == 1);

    /* ", ": the optional ones after the last one named, in their order
     * (mode comes before temperature: allowed, no bonus) */
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R(SP "rack") == 10.0f && R(SP "mode") == 0.0f);
    CHECK(isinf(R(SP "temperature")) && isinf(R(SP "de")) && isinf(R("</end>")));
    nd_reason_prior_feed(&p, &M, &copy, find(SP "mode"));
    nd_reason_prior_feed(&p, &M, &copy, find(SP "\""));
    /* an enum's string: only its values; the said one's bonus */
    memset(lg, 0, sizeof lg);
    L("o") = 3.0f;
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(isinf(R("o")) && R("bake") == 10.0f && R("b") == 10.0f && R("c") == 0.0f);
    CHECK(isinf(R("\",")) && isinf(R("</end>")));
    nd_reason_prior_feed(&p, &M, &copy, find("bake"));
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R("\",") == 0.0f && isinf(R("s")));

    /* a tool's result is no request: the prior stays out */
    nd_reason_prior_turn(&p, 0, &choice);
    feed_pieces(&p, &M, &copy, (const char *const[]){"preheat_oven", ":", NULL});
    CHECK(nd_reason_prior_logits(&p, &M, &copy, lg, ok) == lg);

    /* "; then ": a listed tool's name, not the end */
    nd_reason_prior_turn(&p, 1, &choice);
    const char *plan = "preheat_oven: temperature 213; then st";
    for (const char *c = plan; *c; c++) {
        char one[2] = {*c, 0};
        nd_reason_prior_feed(&p, &M, &copy, find(*c == ' ' ? SP : one));
    }
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R("a") == 0.0f && isinf(R("x")) && isinf(R("</end>")) && isinf(R(":")));
    /* every argument named: the call's plan is done, so no ", " after
     * its last value, and (were one written, as after "NAME: " for a tool
     * without arguments) only the end; fuzz_choice_prior found every
     * piece -inf there */
    nd_reason_prior_turn(&p, 1, &choice);
    const char *all = "start_dryer: minutes 3, gentle true";
    for (const char *c = all; *c; c++) {
        char one[2] = {*c, 0};
        nd_reason_prior_feed(&p, &M, &copy, find(*c == ' ' ? SP : one));
    }
    CHECK(p.at.used == 3);
    memset(lg, 0, sizeof lg);
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(isinf(R(",")) && R("</end>") == 0.0f && R(";") == 0.0f);
    nd_reason_prior_feed(&p, &M, &copy, find(","));
    nd_reason_prior_feed(&p, &M, &copy, find(SP));
    CHECK(p.at.st == RP_KEY);
    L("x") = 3.0f;
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R("</end>") == 0.0f && isinf(R("x")) && isinf(R(SP "mode")));
    ok[find("</end>")] = 0; /* the end not allowed: the model's own pick */
    r = nd_reason_prior_logits(&p, &M, &copy, lg, ok);
    CHECK(R("x") == 3.0f);
    ok[find("</end>")] = 1;

    nd_reason_prior_turn(&p, 1, &choice);
    for (const char *c = plan; *c; c++) {
        char one[2] = {*c, 0};
        nd_reason_prior_feed(&p, &M, &copy, find(*c == ' ' ? SP : one));
    }
    /* out of the form (a name no tool has): the model's own logits */
    nd_reason_prior_feed(&p, &M, &copy, find("x"));
    CHECK(nd_reason_prior_logits(&p, &M, &copy, lg, ok) == lg);
    nd_reason_prior_free(&p);
    nd_copy_prior_free(&copy);
    nd_choice_prior_free(&choice);
    nd_pj_free(doc);
    free(M.trie);
    free(M.tok_next);
    free(M.reason_ok);
    nd_tokenizer_free(M.tok);
}

int main(void)
{
    test_parser();
    test_step();
    return tu_finish("test_reason_prior");
}
