/* Grammar internals: regex matches, known call texts accepted/rejected,
 * and the invariant the budgeted decoder relies on: from every reachable
 * state some byte shortens nd_gram_dist by exactly one (random walks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/grammar.h"
#include "engine/regex.h"
#include "testutil.h"

static void test_regex(void)
{
    static const struct {
        const char *re, *s;
        int match;
    } cases[] = {
        {"^[a-z]{2,5}$", "abc", 1},
        {"^[a-z]{2,5}$", "a", 0},
        {"^[a-z]{2,5}$", "abcdef", 0},
        {"^@[a-z0-9_]+$", "@bob_1", 1},
        {"^@[a-z0-9_]+$", "bob", 0},
        {"^\\d{3}-\\d{4}$", "555-1234", 1},
        {"^(red|green|blue)$", "green", 1},
        {"^(red|green|blue)$", "greenx", 0},
        {"ab+c", "xxabbbcyy", 1},
        {"ab+c", "ac", 0},
        {"^x?y+z*$", "yyzz", 1},
        {"^x?y+z*$", "xz", 0},
        {"\\.com$", "a.com", 1},
        {"\\.com$", "acom", 0},
        {"^[^aeiou\\s]{1,6}$", "xyz", 1},
        {"^[^aeiou\\s]{1,6}$", "xaz", 0},
        {"^.{3}$", "a\nb", 0},
        {"^.{3}$", "a-b", 1},
        {"^(\\+|-)?\\d+(\\.\\d{1,2})?$", "-12.50", 1},
        {"^(\\+|-)?\\d+(\\.\\d{1,2})?$", "12.505", 0},
        /* each top-level branch has its own anchors: ^a|b$ = (^a)|(b$) */
        {"^ab|cd$", "abxx", 1},
        {"^ab|cd$", "xxcd", 1},
        {"^ab|cd$", "xabx", 0},
        {"^ab|cd$", "xcdx", 0},
        {"^(?<year>\\d{4})-(?P<m>\\d{2})$", "2024-05", 1},
        {"^(?<year>\\d{4})-(?P<m>\\d{2})$", "2024-5", 0},
        {"^a\\$$", "a$", 1},
        {"^[\\b]$", "\b", 1},
        {"^a+?b$", "aab", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nd_regex re;
        int rc = nd_re_compile(cases[i].re, &re);
        CHECK_MSG(rc == 0, "%s: %s", cases[i].re, nd_last_error());
        if (!rc)
            CHECK_MSG(nd_re_match(&re, cases[i].s) == cases[i].match, "%s on %s", cases[i].re,
                      cases[i].s);
    }
    nd_regex re;
    CHECK(nd_re_compile("a(b", &re) != 0);
    CHECK(nd_re_compile("a\\1", &re) != 0);
    /* constructs a grammar cannot express are refused, never read as the
     * literal text they start with (the AWS "^(?!aws:).*" used to compile
     * as a pattern for the prefix "?!aws:" -- exactly what it forbids) */
    static const char *refused[] = {
        "^(?!aws:).*$", "^(?=a)b",     "(?<=a)b",     "(?<!a)b",    "(?i)abc", "(a)\\1", "\\k<x>",
        "\\bword\\b",   "\\Bx",        "\\u00e9",     "\\x41",      "\\p{L}",  "*a",     "a|+b",
        "^(^a)$",       "[a-\\u00ff]", "caf\xc3\xa9", "[\xc3\xa9]", "\\q",     "(?<n"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = nd_re_compile(refused[i], &re);
        CHECK_MSG(rc == ND_EUNSUPPORTED, "%s compiled (rc %d)", refused[i], rc);
    }
    CHECK(nd_re_compile("(a{1,9}){1,9}(b{1,9}){1,9}", &re) == ND_ELIMIT);
}

static nd_grammar *compile(const char *tools)
{
    nd_pj_doc *doc;
    if (nd_pj_parse(tools, strlen(tools), &doc, NULL))
        return NULL;
    nd_grammar *g = NULL;
    int rc = nd_gram_compile(nd_pj_root(doc), &g);
    nd_pj_free(doc);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    return g;
}

static int accepts(const nd_grammar *g, const char *text)
{
    nd_gram_state s;
    nd_gram_init(g, &s);
    for (const char *p = text; *p; p++)
        if (!nd_gram_feed(g, &s, (unsigned char)*p))
            return 0;
    return nd_gram_done(&s);
}

/* one tool "f" with the given parameters schema; `args` is the arguments
 * object text */
static nd_grammar *compile_params(const char *params)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "[{\"name\": \"f\", \"parameters\": %s}]", params);
    return compile(buf);
}

static int accepts_args(const nd_grammar *g, const char *args)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "[{\"name\":\"f\",\"arguments\":%s}]", args);
    return accepts(g, buf);
}

typedef struct {
    const char *params;
    const char *ok[6], *bad[6];
    const char *warn; /* a warning that must appear; "" = no warnings at all */
} schema_case;

/* the JSON-Schema that real tool catalogues use (AWS allOf wrappers,
 * OpenAPI $ref / nullable, pydantic anyOf, maps, formats) */
static const schema_case SCHEMA_CASES[] = {
    /* annotations are quiet */
    {"{\"type\": \"object\", \"title\": \"T\", \"$comment\": \"c\", \"x-aws-id\": 3, "
     "\"externalDocs\": {\"url\": \"u\"}, \"xml\": {\"name\": \"n\"}, \"discriminator\": "
     "{\"propertyName\": \"k\"}, \"properties\": {\"k\": {\"type\": \"string\", \"example\": "
     "\"a\", "
     "\"examples\": [\"b\"], \"readOnly\": false, \"writeOnly\": false, \"deprecated\": true}}}",
     {"{\"k\":\"a\"}", "{}"},
     {"{\"k\":1}"},
     ""},
    /* allOf merged: properties, required (also inside members), types */
    {"{\"allOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}, "
     "\"required\": [\"a\"]}, {\"properties\": {\"b\": {\"type\": \"integer\", \"minimum\": 1}}, "
     "\"required\": [\"b\"]}]}",
     {"{\"a\":\"x\",\"b\":2}", "{\"b\":1,\"a\":\"\"}"},
     {"{\"a\":\"x\"}", "{\"b\":2}", "{\"a\":\"x\",\"b\":0}", "{\"a\":1,\"b\":2}",
      "{\"a\":\"x\",\"b\":2,\"c\":1}"},
     ""},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}, \"b\": {}}, "
     "\"allOf\": [{\"required\": [\"a\"]}]}",
     {"{\"a\":\"x\"}"},
     {"{}", "{\"b\":1}"},
     ""},
    {"{\"type\": \"object\", \"properties\": {\"n\": {\"allOf\": [{\"type\": \"number\", "
     "\"minimum\": 0}, {\"type\": \"integer\", \"maximum\": 5}]}, \"e\": {\"allOf\": [{\"enum\": "
     "[\"a\", \"b\", \"c\"]}, {\"enum\": [\"b\", \"c\", \"d\"]}]}}}",
     {"{\"n\":5}", "{\"n\":0,\"e\":\"b\"}", "{\"e\":\"c\"}"},
     {"{\"n\":6}", "{\"n\":-1}", "{\"n\":1.5}", "{\"e\":\"a\"}", "{\"e\":\"d\"}"},
     ""},
    /* local $ref into definitions, $defs, components/schemas */
    {"{\"type\": \"object\", \"properties\": {\"loc\": {\"$ref\": \"#/definitions/Loc\"}, "
     "\"day\": {\"$ref\": \"#/$defs/Day\"}, \"c\": {\"$ref\": \"#/components/schemas/C\"}}, "
     "\"required\": [\"loc\"], \"definitions\": {\"Loc\": {\"type\": \"object\", \"properties\": "
     "{\"lat\": {\"type\": \"number\"}}, \"required\": [\"lat\"]}}, \"$defs\": {\"Day\": "
     "{\"type\": \"string\", \"format\": \"date\"}}, \"components\": {\"schemas\": {\"C\": "
     "{\"enum\": [\"x\"]}}}}",
     {"{\"loc\":{\"lat\":1.5}}", "{\"loc\":{\"lat\":0},\"day\":\"2024-02-29\",\"c\":\"x\"}"},
     {"{\"loc\":{}}", "{}", "{\"loc\":{\"lat\":1},\"day\":\"2024-13-01\"}",
      "{\"loc\":{\"lat\":1},\"c\":\"y\"}"},
     ""},
    /* a recursive schema is followed two levels deep, with a warning */
    {"{\"type\": \"object\", \"properties\": {\"root\": {\"$ref\": \"#/definitions/node\"}}, "
     "\"definitions\": {\"node\": {\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
     "\"string\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
     "\"#/definitions/node\"}}}, "
     "\"required\": [\"name\"]}}}",
     {"{\"root\":{\"name\":\"a\",\"kids\":[{\"name\":\"b\"}]}}"},
     {"{\"root\":{}}", "{\"root\":{\"name\":\"a\",\"kids\":[{}]}}",
      "{\"root\":{\"name\":\"a\",\"kids\":[{\"name\":\"b\",\"kids\":[1]}]}}"},
     "f.parameters.root.kids[].kids[]: recursive $ref '#/definitions/node' is enforced two "
     "levels deep; below, any object is allowed"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/definitions/x\"}}, "
     "\"definitions\": {\"x\": {\"$ref\": \"#/definitions/y\"}, \"y\": {\"$ref\": "
     "\"#/definitions/x\"}}}",
     {"{\"a\":1}"},
     {"{\"b\":1}"},
     "f.parameters.a: circular $ref"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/definitions/nope\"}, \"b\": "
     "{\"$ref\": \"other.json#/x\"}}}",
     {"{\"a\":1,\"b\":\"x\"}"},
     {"{\"c\":1}"},
     "f.parameters.a: $ref '#/definitions/nope' does not point into this tool's schema"},
    /* anyOf / oneOf alternatives, type lists, nullable */
    {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": [\"string\", \"null\"], "
     "\"maxLength\": 2}, \"i\": {\"type\": \"integer\", \"nullable\": true}, \"u\": {\"anyOf\": "
     "[{\"type\": \"string\", \"pattern\": \"^a+$\"}, {\"type\": \"integer\", \"minimum\": 5}, "
     "{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"maxItems\": 1}]}, \"c\": "
     "{\"oneOf\": [{\"const\": \"x\"}, {\"enum\": [\"y\", 1]}]}}}",
     {"{\"s\":\"ab\",\"i\":null}", "{\"s\":null,\"i\":3}", "{\"u\":\"aa\"}", "{\"u\":5}",
      "{\"u\":[true]}", "{\"c\":\"x\"}"},
     {"{\"s\":\"abc\"}", "{\"s\":1}", "{\"i\":\"a\"}", "{\"u\":\"b\"}", "{\"u\":4}", "{\"c\":2}"},
     ""},
    {"{\"type\": \"object\", \"properties\": {\"p\": {\"oneOf\": [{\"type\": \"object\", "
     "\"properties\": {\"a\": {\"type\": \"string\"}}}, {\"type\": \"object\", \"properties\": "
     "{\"b\": {\"type\": \"integer\"}}}]}}}",
     {"{\"p\":{\"a\":\"x\"}}", "{\"p\":{\"b\":1}}"},
     {"{\"p\":1}"},
     "f.parameters.p: anyOf/oneOf alternatives are two objects"},
    /* anyOf varying only "required": the object's own properties stay typed */
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}, \"b\": "
     "{\"type\": \"integer\"}}, \"anyOf\": [{\"required\": [\"a\"]}, {\"required\": [\"b\"]}]}",
     {"{\"a\":\"x\"}", "{\"b\":1}", "{}"},
     {"{\"a\":1}", "{\"b\":\"x\"}", "{\"c\":1}"},
     "f.parameters: anyOf/oneOf alternatives are two objects a grammar cannot tell apart by their "
     "first character; admitted as one object with the properties of both"},
    /* each alternative is the schema AND its branch: the union of the
     * branches keeps what they add and what they all require (Vercel's
     * createOrTransferDomain body) */
    {"{\"type\": \"object\", \"properties\": {\"body\": {\"properties\": {\"method\": "
     "{\"type\": \"string\"}}, \"oneOf\": [{\"additionalProperties\": false, \"properties\": "
     "{\"method\": {\"type\": \"string\"}, \"name\": {\"type\": \"string\"}, \"token\": "
     "{\"type\": \"string\"}}, \"required\": [\"method\", \"name\"], \"type\": \"object\"}, "
     "{\"additionalProperties\": false, \"properties\": {\"name\": {\"type\": \"string\"}, "
     "\"zone\": {\"type\": \"boolean\"}}, \"required\": [\"name\"], \"type\": "
     "\"object\"}]}}, \"required\": [\"body\"]}",
     {"{\"body\":{\"method\":\"add\",\"name\":\"a.com\"}}",
      "{\"body\":{\"name\":\"a.com\",\"zone\":true}}",
      "{\"body\":{\"name\":\"a.com\",\"token\":\"t\"}}"},
     {"{\"body\":{}}", "{\"body\":{\"method\":\"add\"}}", "{\"body\":{\"name\":\"a\",\"x\":1}}",
      "{\"body\":{\"name\":\"a\",\"zone\":1}}"},
     "f.parameters.body: anyOf/oneOf alternatives are two objects"},
    {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": "
     "\"date\", \"pattern\": \"^2\"}, \"h\": {\"type\": \"string\", \"format\": \"hostname\"}}}",
     {"{\"d\":\"2x\",\"h\":\"any thing\"}"},
     {"{\"d\":\"1999-01-01\"}"},
     "f.parameters.d: format 'date' is not enforced next to a pattern"},
    /* additionalProperties: typed map values, false, min/maxProperties */
    {"{\"type\": \"object\", \"properties\": {\"tags\": {\"type\": \"object\", "
     "\"additionalProperties\": {\"type\": \"integer\"}, \"minProperties\": 1, \"maxProperties\": "
     "2}, \"none\": {\"type\": \"object\", \"additionalProperties\": false}}}",
     {"{\"tags\":{\"a\":1}}", "{\"tags\":{\"a\":1,\"b\":-2}}", "{\"none\":{}}"},
     {"{\"tags\":{\"a\":\"x\"}}", "{\"tags\":{}}", "{\"tags\":{\"a\":1,\"b\":2,\"c\":3}}",
      "{\"none\":{\"a\":1}}"},
     ""},
    /* formats */
    {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": "
     "\"date-time\"}, \"t\": {\"type\": \"string\", \"format\": \"time\"}, \"u\": {\"type\": "
     "\"string\", \"format\": \"uuid\"}, \"ip\": {\"type\": \"string\", \"format\": \"ipv4\"}, "
     "\"e\": {\"type\": \"string\", \"format\": \"email\"}, \"w\": {\"type\": \"string\", "
     "\"format\": \"uri\"}}}",
     {"{\"d\":\"2024-05-01T10:20:30Z\",\"t\":\"23:59:59+01:00\"}",
      "{\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"192.168.0.255\"}",
      "{\"e\":\"bob.s@example.com\",\"w\":\"https://example.com/a?b=c\"}"},
     {"{\"d\":\"2024-05-01\"}", "{\"t\":\"24:00:00Z\"}", "{\"u\":\"123e4567\"}",
      "{\"ip\":\"300.1.1.1\"}", "{\"e\":\"bob\"}", "{\"w\":\"no scheme\"}"},
     ""},
};

static void test_schema_cases(void)
{
    for (size_t c = 0; c < sizeof SCHEMA_CASES / sizeof SCHEMA_CASES[0]; c++) {
        const schema_case *sc = &SCHEMA_CASES[c];
        nd_grammar *g = compile_params(sc->params);
        if (!g)
            continue;
        const char *w = nd_gram_warnings(g);
        if (!*sc->warn)
            CHECK_MSG(!*w, "case %zu: unexpected warnings: %s", c, w);
        else
            CHECK_MSG(strstr(w, sc->warn) != NULL, "case %zu: no '%s' in: %s", c, sc->warn, w);
        for (int i = 0; i < 6 && sc->ok[i]; i++)
            CHECK_MSG(accepts_args(g, sc->ok[i]), "case %zu: rejects %s", c, sc->ok[i]);
        for (int i = 0; i < 6 && sc->bad[i]; i++)
            CHECK_MSG(!accepts_args(g, sc->bad[i]), "case %zu: accepts %s", c, sc->bad[i]);
        nd_gram_free(g);
    }
}

static const char *TOOLS =
    "[{\"name\": \"set_lights\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"room\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 12},"
    "\"on\": {\"type\": \"boolean\"},"
    "\"level\": {\"type\": \"integer\", \"minimum\": 10, \"maximum\": 100},"
    "\"temp\": {\"type\": \"number\", \"exclusiveMinimum\": 0.5, \"maximum\": 30},"
    "\"mode\": {\"enum\": [\"warm\", \"cold\", 1, 12]},"
    "\"tag\": {\"type\": \"string\", \"pattern\": \"^@[a-z]+$\"},"
    "\"ids\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, "
    "\"maxItems\": 2},"
    "\"extra\": {\"type\": \"object\"}, \"any\": {}},"
    "\"required\": [\"room\", \"on\"]}}, {\"name\": \"noop\"}]";

static void test_texts(void)
{
    nd_grammar *g = compile(TOOLS);
    if (!g)
        return;
    CHECK(accepts(g, "[]"));
    CHECK(accepts(g, "[{\"name\":\"noop\",\"arguments\":{}}]"));
    CHECK(accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true}}]"));
    CHECK(accepts(g,
                  "[{\"name\":\"set_lights\",\"arguments\":{\"on\":false,\"room\":\"caf\\u00e9\","
                  "\"level\":100,\"temp\":0.51,\"mode\":12,\"tag\":\"@ab\",\"ids\":[1,-2],"
                  "\"extra\":{\"a\":[1,{\"b\":null}]},\"any\":\"x\"}},"
                  "{\"name\":\"noop\",\"arguments\":{}}]"));
    CHECK(!accepts(g, "[{\"name\":\"other\",\"arguments\":{}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\"}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"\",\"on\":true}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":1}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"level\":9}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"level\":101}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"temp\":0.5}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"mode\":2}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"tag\":\"ab\"}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"ids\":[]}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"ids\":[1,2,3]}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"room\":\"j\"}}]"));
    CHECK(!accepts(g, "[{\"name\":\"set_lights\",\"arguments\":{\"room\":\"k\",\"on\":true,"
                      "\"nope\":1}}]"));
    CHECK(!accepts(g, "[ ]"));
    CHECK(!accepts(g, "[{\"name\":\"noop\",\"arguments\":{}}"));
    nd_gram_require_call(g, 1);
    CHECK(!accepts(g, "[]"));
    nd_gram_free(g);
}

/* random walks: at every step some byte lowers the distance by exactly 1 */
static void test_dist_walks(nd_grammar *g)
{
    if (!g)
        return;
    nd_rng r;
    nd_rng_seed(&r, 5);
    int bad = 0, walks = 300;
    for (int w = 0; w < walks && bad < 5; w++) {
        nd_gram_state s, t;
        nd_gram_init(g, &s);
        char text[4096];
        int tn = 0;
        int free_steps = (int)nd_rng_below(&r, 120);
        for (int step = 0; step < 4000 && !nd_gram_done(&s); step++) {
            int d = nd_gram_dist(g, &s);
            unsigned char ok[256];
            int n_ok = 0, shorter = -1;
            for (int b = 0; b < 256; b++) {
                nd_gram_copy(&t, &s);
                if (nd_gram_feed(g, &t, (unsigned char)b)) {
                    ok[n_ok++] = (unsigned char)b;
                    if (nd_gram_dist(g, &t) == d - 1 && shorter < 0)
                        shorter = b;
                }
            }
            if (!n_ok || shorter < 0) {
                bad++;
                CHECK_MSG(0, "walk %d step %d: dist %d, %d bytes accepted, none shortens: %.*s", w,
                          step, d, n_ok, tn, text);
                break;
            }
            unsigned char b =
                step < free_steps ? ok[nd_rng_below(&r, (uint64_t)n_ok)] : (unsigned char)shorter;
            CHECK(nd_gram_feed(g, &s, b));
            if (tn < (int)sizeof text)
                text[tn++] = (char)b;
        }
        CHECK_MSG(nd_gram_done(&s), "walk %d did not finish", w);
    }
    nd_gram_free(g);
}

static void test_bad_tools(void)
{
    const char *bad[] = {"{}", "[1]", "[{\"description\": \"no name\"}]",
                         "[{\"name\": \"a\"}, {\"name\": \"a\"}]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nd_pj_doc *doc;
        CHECK(nd_pj_parse(bad[i], strlen(bad[i]), &doc, NULL) == 0);
        nd_grammar *g = NULL;
        CHECK_MSG(nd_gram_compile(nd_pj_root(doc), &g) != 0, "%s accepted", bad[i]);
        nd_gram_free(g);
        nd_pj_free(doc);
    }
    nd_grammar *g = compile("[{\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
                            "\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"(\", "
                            "\"zork\": 1}, \"n\": {\"type\": \"integer\", \"minimum\": 5, "
                            "\"maximum\": 1}}}}]");
    if (g) {
        const char *w = nd_gram_warnings(g);
        CHECK_MSG(strstr(w, "zork") && strstr(w, "pattern ignored") && strstr(w, "bounds"), "%s",
                  w);
        nd_gram_free(g);
    }
    /* mutually recursive definitions multiply nodes: refused at the node
     * bound (a frame holds a node id in 16 bits), not wrapped */
    {
        char big[8192];
        int n = snprintf(big, sizeof big,
                         "[{\"name\": \"t\", \"parameters\": {\"$ref\": "
                         "\"#/$defs/d0\", \"$defs\": {");
        for (int d = 0; d < 8; d++) {
            n += snprintf(big + n, sizeof big - (size_t)n,
                          "%s\"d%d\": {\"type\": \"object\", \"properties\": {", d ? ", " : "", d);
            for (int p = 0; p < 8; p++)
                n += snprintf(big + n, sizeof big - (size_t)n,
                              "%s\"p%d\": {\"$ref\": \"#/$defs/d%d\"}", p ? ", " : "", p,
                              (d + p) % 8);
            n += snprintf(big + n, sizeof big - (size_t)n, "}}");
        }
        snprintf(big + n, sizeof big - (size_t)n, "}}}]");
        nd_pj_doc *doc;
        CHECK(nd_pj_parse(big, strlen(big), &doc, NULL) == 0);
        nd_grammar *bg = NULL;
        int rc = nd_gram_compile(nd_pj_root(doc), &bg);
        CHECK_MSG(rc == ND_ELIMIT && strstr(nd_last_error(), "grammar nodes"), "rc %d: %s", rc,
                  nd_last_error());
        nd_gram_free(bg);
        nd_pj_free(doc);
    }
    /* a lookahead pattern is dropped with a warning naming tool and path;
     * the string is then unconstrained, not limited to "?!aws:..." */
    g = compile("[{\"name\": \"tag_res\", \"parameters\": {\"type\": \"object\", "
                "\"properties\": {\"key\": {\"type\": \"string\", \"pattern\": "
                "\"^(?!aws:)[a-z:]+$\"}}}}]");
    if (g) {
        const char *w = nd_gram_warnings(g);
        CHECK_MSG(strstr(w, "tag_res.parameters.key: pattern ignored") && strstr(w, "lookahead"),
                  "%s", w);
        CHECK(accepts(g, "[{\"name\":\"tag_res\",\"arguments\":{\"key\":\"env\"}}]"));
        CHECK(!accepts(g, "[{\"name\":\"tag_res\",\"arguments\":{\"key\":1}}]"));
        nd_gram_free(g);
    }
}

/* enums and objects beyond the old 64-entry limits: a 250-value currency
 * enum (USD, USDC and USDT: one value a prefix of others), an integer enum
 * whose values are prefixes of each other, an object with 150 properties
 * (any order, each at most once, the required ones enforced); past the
 * per-object bound a refusal names the tool and path */
static char *large_params(int nprops)
{
    size_t cap = 1 << 16;
    char *b = malloc(cap);
    if (!b)
        return NULL;
    int n = snprintf(b, cap,
                     "{\"type\": \"object\", \"properties\": {\"cur\": {\"type\": "
                     "\"string\", \"enum\": [\"USD\", \"USDC\", \"USDT\"");
    for (int i = 0; n < (int)cap - 64 && i < 247; i++)
        n += snprintf(b + n, cap - (size_t)n, ", \"%c%c%c\"", 'A' + i / 26 % 26, 'A' + i % 26,
                      'A' + (i * 7) % 26);
    n += snprintf(b + n, cap - (size_t)n, "]}, \"lvl\": {\"enum\": [100, 1, 12, 10, 2]}");
    for (int p = 0; n < (int)cap - 64 && p < nprops - 2; p++)
        n += snprintf(b + n, cap - (size_t)n, ", \"p%d\": {\"type\": \"integer\"}", p);
    snprintf(b + n, cap - (size_t)n, "}, \"required\": [\"cur\", \"p140\"]}");
    return b;
}

static void test_large_lists(void)
{
    char *params = large_params(152);
    char *tools = params ? malloc(strlen(params) + 64) : NULL;
    if (tools)
        sprintf(tools, "[{\"name\": \"f\", \"parameters\": %s}]", params);
    nd_grammar *g = tools ? compile(tools) : NULL;
    free(tools);
    CHECK_MSG(g != NULL, "250-value enum / 152 properties refused: %s", nd_last_error());
    if (g) {
        CHECK(accepts_args(g, "{\"cur\":\"USD\",\"p140\":1}"));
        CHECK(accepts_args(g, "{\"p140\":1,\"cur\":\"USDC\"}"));
        CHECK(accepts_args(g, "{\"cur\":\"USDT\",\"p149\":3,\"p140\":1,\"p0\":2,\"lvl\":1}"));
        CHECK(accepts_args(g, "{\"cur\":\"AAA\",\"p140\":1,\"lvl\":10}"));
        CHECK(accepts_args(g, "{\"cur\":\"JMG\",\"p140\":1,\"lvl\":100}"));
        CHECK(accepts_args(g, "{\"cur\":\"USD\",\"lvl\":12,\"p140\":1}"));
        CHECK(!accepts_args(g, "{\"cur\":\"US\",\"p140\":1}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USDX\",\"p140\":1}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USDCC\",\"p140\":1}"));
        CHECK(!accepts_args(g, "{\"cur\":\"usd\",\"p140\":1}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"lvl\":11}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"lvl\":1000}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"lvl\":3}"));
        CHECK(!accepts_args(g, "{\"cur\":\"USD\"}"));                       /* p140 required */
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p150\":1,\"p140\":1}")); /* undeclared */
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"p140\":2}")); /* twice */
        CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p14\":1,\"p14\":2,\"p140\":1}"));
        /* every property once: 152 entries, then no comma */
        size_t cap = 1 << 14;
        char *all = malloc(cap);
        if (all) {
            int n = snprintf(all, cap, "{\"cur\":\"EUR\",\"lvl\":2");
            for (int p = 149; p >= 0; p--)
                n += snprintf(all + n, cap - (size_t)n, ",\"p%d\":%d", p, p);
            snprintf(all + n, cap - (size_t)n, "}");
            CHECK_MSG(!accepts_args(g, all), "EUR is not in the enum");
            memcpy(all + 8, "USD", 3);
            CHECK_MSG(accepts_args(g, all), "all 152 properties");
            all[strlen(all) - 1] = ',';
            nd_gram_state s;
            nd_gram_init(g, &s);
            const char *pre = "[{\"name\":\"f\",\"arguments\":";
            int ok = 1;
            for (const char *p = pre; *p && ok; p++)
                ok = nd_gram_feed(g, &s, (unsigned char)*p);
            for (const char *p = all; *p && ok; p++)
                ok = nd_gram_feed(g, &s, (unsigned char)*p);
            CHECK_MSG(!ok, "a comma after every property was written");
            free(all);
        }
    }
    test_dist_walks(g);
    free(params);
    /* past the frame's 320 written-key bits: keys in declaration order,
     * with a warning naming tool and path */
    params = large_params(400);
    tools = params ? malloc(strlen(params) + 64) : NULL;
    if (tools)
        sprintf(tools, "[{\"name\": \"f\", \"parameters\": %s}]", params);
    g = tools ? compile(tools) : NULL;
    free(tools);
    free(params);
    CHECK_MSG(g != NULL, "400 properties refused: %s", nd_last_error());
    if (!g)
        return;
    CHECK_MSG(strstr(nd_gram_warnings(g), "f.parameters: 400 properties: more than 320, so the "
                                          "keys are admitted in declaration order only"),
              "%s", nd_gram_warnings(g));
    CHECK(accepts_args(g, "{\"cur\":\"USD\",\"p140\":1}"));
    CHECK(accepts_args(g, "{\"cur\":\"USDC\",\"lvl\":1,\"p0\":1,\"p140\":2,\"p397\":5}"));
    CHECK(accepts_args(g, "{\"cur\":\"USD\",\"p139\":0,\"p140\":1,\"p141\":1}"));
    CHECK(!accepts_args(g, "{\"p140\":1,\"cur\":\"USD\"}"));            /* out of order */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"p3\":1}"));   /* backwards */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p141\":1,\"p140\":1}")); /* skips p140 */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"p140\":2}")); /* twice */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p398\":1,\"p140\":1}")); /* undeclared */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\"}"));                       /* p140 required */
    CHECK(!accepts_args(g, "{\"cur\":\"USD\",\"p140\":1,\"lvl\":3}"));
    {
        size_t cap = 1 << 14;
        char *all = malloc(cap);
        if (all) {
            int n = snprintf(all, cap, "{\"cur\":\"USD\",\"lvl\":2");
            for (int p = 0; p < 398; p++)
                n += snprintf(all + n, cap - (size_t)n, ",\"p%d\":%d", p, p);
            snprintf(all + n, cap - (size_t)n, "}");
            CHECK_MSG(accepts_args(g, all), "all 400 properties in order");
            all[strlen(all) - 1] = ',';
            nd_gram_state s;
            nd_gram_init(g, &s);
            const char *pre = "[{\"name\":\"f\",\"arguments\":";
            int ok = 1;
            for (const char *p = pre; *p && ok; p++)
                ok = nd_gram_feed(g, &s, (unsigned char)*p);
            for (const char *p = all; *p && ok; p++)
                ok = nd_gram_feed(g, &s, (unsigned char)*p);
            CHECK_MSG(!ok, "a comma after the last property");
            free(all);
        }
    }
    test_dist_walks(g);
}

/* numbers: the schema's bounds, else at most ND_GRAM_FREE_INT_DIGITS (13)
 * integer digits and no non-zero digit more than 4 times in a row ("set
 * it to 21 degrees" must not become 211111111111111) */
static void test_number_bounds(void)
{
    nd_grammar *g = compile_params(
        "{\"type\": \"object\", \"properties\": {\"t\": {\"type\": \"number\"}, \"i\": {\"type\": "
        "\"integer\"}, \"pos\": {\"type\": \"integer\", \"minimum\": 0}, \"deg\": {\"type\": "
        "\"integer\", \"minimum\": -50, \"maximum\": 60}, \"big\": {\"type\": \"integer\", "
        "\"minimum\": 0, \"maximum\": 999999999999999}, \"any\": {}}}");
    if (!g)
        return;
    static const char *ok[] = {
        "{\"t\":21}",
        "{\"t\":21.5}",
        "{\"t\":-21}",
        "{\"i\":1000000}",
        "{\"i\":10000000000}",
        "{\"t\":0.3333}",
        "{\"i\":9999}",
        "{\"i\":1733368000000}",
        "{\"pos\":1111}",
        "{\"deg\":21}",
        "{\"deg\":-50}",
        "{\"big\":111111111111111}",
        "{\"big\":999999999999999}",
        "{\"any\":21}",
        "{\"any\":[1,2111]}",
    };
    static const char *bad[] = {
        "{\"t\":211111111111111}", /* the call: 15 digits, a run of 13 */
        "{\"t\":211111}",          /* five 1s in a row */
        "{\"i\":11111}",           /* five 1s */
        "{\"i\":-99999}",          /* five 9s */
        "{\"t\":0.33333}",         /* in the fraction too */
        "{\"i\":10000000000000}",  /* 14 integer digits */
        "{\"pos\":21111111}",      /* one side bounded: still capped */
        "{\"deg\":211}",           /* the schema's bound */
        "{\"deg\":-51}",
        "{\"any\":211111}", /* a value of any type: the same cap */
        "{\"any\":{\"x\":[211111]}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK_MSG(accepts_args(g, ok[i]), "number: rejects %s", ok[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!accepts_args(g, bad[i]), "number: accepts %s", bad[i]);
    /* a decoder that keeps offering "1" after "21" is told to close the
     * number within the run: the fifth 1 is refused, "}" is not */
    nd_gram_state s;
    nd_gram_init(g, &s);
    const char *pre = "[{\"name\":\"f\",\"arguments\":{\"t\":2111";
    int fed = 1;
    for (const char *p = pre; *p && fed; p++)
        fed = nd_gram_feed(g, &s, (unsigned char)*p);
    CHECK(fed);
    nd_gram_state t = s;
    CHECK_MSG(!nd_gram_feed(g, &t, '1') || !nd_gram_feed(g, &t, '1'), "a run of five 1s");
    t = s;
    CHECK(nd_gram_feed(g, &t, '}'));
    test_dist_walks(g);
    /* one bound past the cap: the cap widens to reach it */
    g = compile_params("{\"type\": \"object\", \"properties\": {\"n\": {\"type\": "
                       "\"integer\", \"minimum\": 100000000000000}}, \"required\": [\"n\"]}");
    if (g) {
        CHECK_MSG(!*nd_gram_warnings(g), "%s", nd_gram_warnings(g));
        CHECK(accepts_args(g, "{\"n\":100000000000000}"));
        CHECK(accepts_args(g, "{\"n\":123456789012345}"));
        CHECK(!accepts_args(g, "{\"n\":99999999999999}"));
        CHECK(!accepts_args(g, "{\"n\":111112345678901}"));
        test_dist_walks(g);
    }
}

static char *repeat(const char *unit, int times, const char *pre, const char *post)
{
    size_t u = strlen(unit), n = strlen(pre) + u * (size_t)times + strlen(post) + 1;
    char *s = malloc(n);
    if (!s)
        return NULL;
    strcpy(s, pre);
    for (int i = 0; i < times; i++)
        strcat(s, unit);
    strcat(s, post);
    return s;
}

/* strings: no cycle of 1..ND_GRAM_STR_PERIOD (8) ASCII characters repeated
 * over more than ND_GRAM_STR_PERIODIC (32) where no pattern says otherwise,
 * so a model repeating "YYYY..." or "b82?b82?..." must close the string;
 * characters counted decoded ("\u0059" is "Y", so re-serialised calls are
 * judged alike), a non-ASCII character ends a cycle */
static void test_string_repeats(void)
{
    nd_grammar *g = compile_params(
        "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\"}, \"p\": {\"type\": "
        "\"string\", \"pattern\": \"^a+$\"}, \"any\": {}, \"long\": {\"type\": \"string\", "
        "\"minLength\": 40}}}");
    if (!g)
        return;
    static const struct {
        const char *unit, *key;
        int times, ok;
    } cases[] = {
        {"Y", "s", 32, 1},        {"Y", "s", 33, 0},         {"b82?", "s", 8, 1},
        {"b82?", "s", 9, 0},      {"abcdefgh", "s", 4, 1},   {"abcdefgh", "s", 5, 0},
        {"\\u0059", "s", 32, 1},  {"\\u0059", "s", 33, 0},   {"Y\\u0059", "s", 16, 1},
        {"Y\\u0059", "s", 17, 0}, {"\\n", "s", 33, 0},       {"\x7f", "s", 33, 0},
        {"\\u007f", "s", 32, 1},  {"\\u007f", "s", 33, 0},   {"\xc3\xa9", "s", 40, 1},
        {"\\u00e9", "s", 40, 1},  {"ab", "any", 16, 1},      {"ab", "any", 17, 0},
        {"a", "p", 60, 1},        {"abcdefghi", "s", 10, 1}, /* period 9: not checked */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pre[16];
        snprintf(pre, sizeof pre, "{\"%s\":\"", cases[i].key);
        char *a = repeat(cases[i].unit, cases[i].times, pre, "\"}");
        if (!a)
            continue;
        CHECK_MSG(accepts_args(g, a) == cases[i].ok, "string repeats: %s %s", a,
                  cases[i].ok ? "rejected" : "accepted");
        free(a);
    }
    static const char *ok[] = {
        "{\"s\":\"123e4567-e89b-12d3-a456-426614174000\"}",
        "{\"s\":\"00000000-0000-0000-0000-000000000000\"}",
        "{\"s\":\"+1 555 555 5555, ext. 5555\"}",
        "{\"s\":\"hahahahahahahahaha, that was funny.\"}",
        "{\"long\":\"--------------------------------x-------\"}", /* 40: the cycle broken once */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK_MSG(accepts_args(g, ok[i]), "string: rejects %s", ok[i]);
    /* the decoder's view: after 32 Ys a 33rd is refused, closing or any
     * other byte is not */
    char *pre = repeat("Y", 32, "[{\"name\":\"f\",\"arguments\":{\"s\":\"", "");
    if (pre) {
        nd_gram_state s, t;
        nd_gram_init(g, &s);
        int fed = 1;
        for (const char *c = pre; *c && fed; c++)
            fed = nd_gram_feed(g, &s, (unsigned char)*c);
        CHECK(fed);
        t = s;
        CHECK_MSG(!nd_gram_feed(g, &t, 'Y'), "a 33rd Y");
        t = s;
        CHECK(nd_gram_feed(g, &t, '"'));
        t = s;
        CHECK(nd_gram_feed(g, &t, 'Z') && nd_gram_feed(g, &t, 'Y'));
        free(pre);
    }
    test_dist_walks(g);
}

/* anyOf / oneOf with more alternatives than the old limit of 64: a oneOf
 * of 150 consts (an enum written with a title per value), 100 object
 * shapes, mixed kinds */
static void test_many_alternatives(void)
{
    size_t cap = 1 << 16;
    char *p = malloc(cap);
    if (!p)
        return;
    int n = snprintf(p, cap, "{\"type\": \"object\", \"properties\": {\"c\": {\"oneOf\": [");
    for (int i = 0; i < 150; i++)
        n += snprintf(p + n, cap - (size_t)n, "%s{\"const\": \"C%03d\", \"title\": \"country %d\"}",
                      i ? ", " : "", i, i);
    n += snprintf(p + n, cap - (size_t)n, "]}, \"o\": {\"anyOf\": [");
    for (int i = 0; i < 100; i++)
        n +=
            snprintf(p + n, cap - (size_t)n,
                     "%s{\"type\": \"object\", \"properties\": {\"k%d\": {\"type\": \"integer\"}}}",
                     i ? ", " : "", i);
    n += snprintf(p + n, cap - (size_t)n, ", {\"type\": \"string\", \"maxLength\": 2}");
    for (int i = 0; i < 70; i++)
        n += snprintf(p + n, cap - (size_t)n, ", {\"const\": %d}", i * 3);
    snprintf(p + n, cap - (size_t)n, "]}}, \"required\": [\"c\"]}");
    char *tools = malloc(strlen(p) + 64);
    if (tools)
        sprintf(tools, "[{\"name\": \"f\", \"parameters\": %s}]", p);
    nd_grammar *g = tools ? compile(tools) : NULL;
    free(tools);
    free(p);
    CHECK_MSG(g != NULL, "anyOf/oneOf with more than 64 alternatives refused: %s", nd_last_error());
    if (!g)
        return;
    CHECK(accepts_args(g, "{\"c\":\"C000\"}"));
    CHECK(accepts_args(g, "{\"c\":\"C149\"}"));
    CHECK(accepts_args(g, "{\"c\":\"C077\",\"o\":\"ab\"}"));
    CHECK(accepts_args(g, "{\"c\":\"C064\",\"o\":207}"));
    CHECK(accepts_args(g, "{\"c\":\"C001\",\"o\":0}"));
    CHECK(accepts_args(g, "{\"c\":\"C001\",\"o\":{\"k99\":1}}"));
    CHECK(!accepts_args(g, "{\"c\":\"C150\"}"));
    CHECK(!accepts_args(g, "{\"c\":\"C00\"}"));
    CHECK(!accepts_args(g, "{\"c\":1}"));
    CHECK(!accepts_args(g, "{\"c\":\"C001\",\"o\":\"abc\"}"));
    CHECK(!accepts_args(g, "{\"c\":\"C001\",\"o\":208}"));
    CHECK(!accepts_args(g, "{\"c\":\"C001\",\"o\":true}"));
    CHECK(!accepts_args(g, "{}"));
    /* the 100 object shapes: one object with their keys, not any object */
    CHECK(accepts_args(g, "{\"c\":\"C001\",\"o\":{\"k3\":1,\"k97\":2}}"));
    CHECK(!accepts_args(g, "{\"c\":\"C001\",\"o\":{\"zz\":1}}"));
    CHECK(!accepts_args(g, "{\"c\":\"C001\",\"o\":{\"k5\":\"x\"}}"));
    const char *w = nd_gram_warnings(g);
    CHECK_MSG(strstr(w, "f.parameters.o: anyOf/oneOf alternatives are two objects") &&
                  strstr(w, "admitted as one object with the properties of both") &&
                  !strstr(strstr(w, "properties of both") + 1, "properties of both"),
              "one warning for the merged shapes: %s", w);
    test_dist_walks(g);
    /* two shapes sharing a key of different types; required: what both require */
    g = compile_params(
        "{\"type\": \"object\", \"properties\": {\"p\": {\"oneOf\": [{\"type\": "
        "\"object\", \"properties\": {\"a\": {\"type\": \"string\"}, \"id\": {\"type\": "
        "\"integer\"}}, \"required\": [\"a\", \"id\"], \"additionalProperties\": false}, "
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"id\": "
        "{\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"}}, \"required\": "
        "[\"id\"]}]}}, \"required\": [\"p\"]}");
    if (!g)
        return;
    static const char *ok[] = {"{\"p\":{\"a\":\"x\",\"id\":1}}",
                               "{\"p\":{\"a\":1,\"id\":2,\"b\":true}}", "{\"p\":{\"id\":3}}"};
    static const char *bad[] = {"{\"p\":{}}", "{\"p\":{\"a\":\"x\"}}",
                                "{\"p\":{\"id\":1,\"a\":true}}", "{\"p\":{\"id\":1,\"c\":1}}",
                                "{\"p\":1}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK_MSG(accepts_args(g, ok[i]), "object union: rejects %s", ok[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!accepts_args(g, bad[i]), "object union: accepts %s", bad[i]);
    test_dist_walks(g);
}

int main(void)
{
    test_regex();
    test_texts();
    test_dist_walks(compile(TOOLS));
    test_schema_cases();
    /* the walks' invariants over the new constructs too */
    for (size_t c = 0; c < sizeof SCHEMA_CASES / sizeof SCHEMA_CASES[0]; c++)
        test_dist_walks(compile_params(SCHEMA_CASES[c].params));
    test_bad_tools();
    test_large_lists();
    test_number_bounds();
    test_string_repeats();
    test_many_alternatives();
    return tu_finish("test_grammar_unit");
}
