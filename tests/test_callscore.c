/* eval-calls scoring (src/eval/callscore.c): hand-made expected/predicted
 * pairs, each with its verdicts worked out by hand, then the totals of the
 * whole set against hand counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "eval/callscore.h"
#include "testutil.h"
#include "text/pyjson.h"

static const char *TOOLS =
    "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}},"
    "{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"minutes\":{\"type\":\"number\",\"minimum\":1}},\"required\":[\"minutes\"]}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"send\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"to\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}}}]";

static nd_pj_doc *parse(const char *s)
{
    nd_pj_doc *d = NULL;
    if (nd_pj_parse(s, strlen(s), &d, NULL)) {
        fprintf(stderr, "test JSON does not parse: %s: %s\n", s, nd_last_error());
        exit(2);
    }
    return d;
}

static int equal(const char *a, const char *b)
{
    nd_pj_doc *x = parse(a), *y = parse(b);
    int r = nd_json_equal(nd_pj_root(x), nd_pj_root(y));
    nd_pj_free(x);
    nd_pj_free(y);
    return r;
}

typedef struct {
    const char *what, *expected, *predicted; /* predicted NULL: engine error */
    int parsed, valid, names_ok, args_ok, called;
} pair;

/* W = get_weather, T = set_timer */
#define W_PARIS "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}"
#define W_PARIS_SWAPPED                                                                            \
    "{\"name\":\"get_weather\",\"arguments\":{\"unit\":\"c\",\"city\":\"Paris\"}}"
#define W_OSLO "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"
#define T_3 "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":3}}"
#define T_3F "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":3.0}}"
#define T_3_5 "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":3.5}}"

static const pair PAIRS[] = {
    /* what, expected, predicted, parsed valid names args called */
    {"identical", "[" W_PARIS "]", "[" W_PARIS "]", 1, 1, 1, 1, 1},
    {"key order", "[" W_PARIS "]", "[" W_PARIS_SWAPPED "]", 1, 1, 1, 1, 1},
    {"3 vs 3.0", "[" T_3 "]", "[" T_3F "]", 1, 1, 1, 1, 1},
    {"3 vs 3.5", "[" T_3 "]", "[" T_3_5 "]", 1, 1, 1, 0, 1},
    {"wrong value", "[" W_PARIS "]", "[" W_OSLO "]", 1, 1, 1, 0, 1},
    {"string case", "[" W_OSLO "]",
     "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"oslo\"}}]", 1, 1, 1, 0, 1},
    {"missing call", "[" W_PARIS "," T_3 "]", "[" W_PARIS "]", 1, 1, 0, 0, 1},
    {"extra call", "[" W_PARIS "]", "[" W_PARIS "," T_3 "]", 1, 1, 0, 0, 1},
    {"order of calls", "[" W_PARIS "," T_3 "]", "[" T_3F "," W_PARIS_SWAPPED "]", 1, 1, 1, 1, 1},
    {"repeat counted", "[" W_PARIS "," W_OSLO "]", "[" W_PARIS "," W_PARIS "]", 1, 1, 1, 0, 1},
    {"right tool wrong tool", "[" W_OSLO "]", "[" T_3 "]", 1, 1, 0, 0, 1},
    {"correct refusal", "[]", "[]", 1, 1, 1, 1, 0},
    {"false refusal", "[" W_PARIS "]", "[]", 1, 1, 0, 0, 0},
    {"spurious call", "[]", "[" T_3 "]", 1, 1, 0, 0, 1},
    {"malformed JSON", "[" W_PARIS "]", "[{\"name\":\"get_weather\",\"arguments\":{\"city\":", 0, 0,
     0, 0, 0},
    {"malformed, no call expected", "[]", "[", 0, 0, 0, 0, 0},
    {"not a call list", "[]", "{\"name\":\"x\"}", 0, 0, 0, 0, 0},
    {"unknown tool", "[" W_PARIS "]",
     "[{\"name\":\"get_wether\",\"arguments\":{\"city\":\"Paris\"}}]", 1, 0, 0, 0, 1},
    /* expected names a tool that is not declared: equal, but not valid */
    {"unknown tool, matching", "[{\"name\":\"nope\",\"arguments\":{}}]",
     "[{\"name\":\"nope\",\"arguments\":{}}]", 1, 0, 1, 1, 1},
    {"schema: enum", "[" W_PARIS "]",
     "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"k\"}}]", 1, 0, 1, 0,
     1},
    {"schema: required", "[" W_PARIS "]", "[{\"name\":\"get_weather\",\"arguments\":{}}]", 1, 0, 1,
     0, 1},
    {"schema: minimum", "[" T_3 "]", "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":0}}]", 1,
     0, 1, 0, 1},
    {"schema: integer", "[{\"name\":\"send\",\"arguments\":{\"n\":2}}]",
     "[{\"name\":\"send\",\"arguments\":{\"n\":2.5}}]", 1, 0, 1, 0, 1},
    {"wrapped function tool", "[{\"name\":\"send\",\"arguments\":{\"to\":\"Ana\",\"n\":2}}]",
     "[{\"name\":\"send\",\"arguments\":{\"n\":2,\"to\":\"Ana\"}}]", 1, 1, 1, 1, 1},
    /* equal values, but the grammar writes an integer without a fraction */
    {"integer written 2.0", "[{\"name\":\"send\",\"arguments\":{\"n\":2}}]",
     "[{\"name\":\"send\",\"arguments\":{\"n\":2.0}}]", 1, 0, 1, 1, 1},
    {"no arguments key", "[{\"name\":\"send\",\"arguments\":{}}]", "[{\"name\":\"send\"}]", 1, 1, 1,
     1, 1},
    {"extra key in call", "[{\"name\":\"send\",\"arguments\":{}}]",
     "[{\"name\":\"send\",\"arguments\":{},\"id\":1}]", 1, 0, 1, 1, 1},
    {"whitespace is fine", "[" T_3 "]",
     " [ { \"arguments\" : { \"minutes\" : 3 } , \"name\" : "
     "\"set_timer\" } ] ",
     1, 1, 1, 1, 1},
    {"engine error", "[" T_3 "]", NULL, 0, 0, 0, 0, 0},
    {"engine error, no call expected", "[]", NULL, 0, 0, 0, 0, 0},
};

int main(void)
{
    /* value equality */
    CHECK(equal("{\"a\":1,\"b\":[1,2]}", "{\"b\":[1,2],\"a\":1}"));
    CHECK(!equal("[1,2]", "[2,1]"));
    CHECK(equal("3", "3.0"));
    CHECK(equal("3.0", "3"));
    CHECK(equal("-0.0", "0"));
    CHECK(equal("1e2", "100"));
    CHECK(!equal("3", "3.5"));
    CHECK(!equal("3", "\"3\""));
    CHECK(!equal("true", "1"));
    CHECK(!equal("null", "false"));
    CHECK(equal("null", "null"));
    CHECK(!equal("\"a\"", "\"A\""));
    CHECK(equal("\"\\u00e9\"", "\"\xc3\xa9\""));
    CHECK(!equal("{\"a\":1}", "{\"a\":1,\"b\":2}"));
    CHECK(!equal("{\"a\":1,\"c\":2}", "{\"a\":1,\"b\":2}"));
    /* exact beyond 2^53: 2^53 + 1 is not the double 2^53 */
    CHECK(equal("9007199254740992", "9007199254740992.0"));
    CHECK(!equal("9007199254740993", "9007199254740992.0"));
    CHECK(equal("123456789012345678901234567890", "123456789012345678901234567890"));

    nd_pj_doc *tools_doc = parse(TOOLS);
    const nd_pj *tools = nd_pj_root(tools_doc);
    nd_callscore_totals tot = {0};
    size_t n = sizeof PAIRS / sizeof PAIRS[0];
    for (size_t i = 0; i < n; i++) {
        const pair *p = &PAIRS[i];
        nd_pj_doc *e = parse(p->expected);
        nd_call_verdict v;
        int rc = nd_callscore_example(nd_pj_root(e), p->predicted,
                                      p->predicted ? strlen(p->predicted) : 0, tools,
                                      "max_new_tokens", &v);
        CHECK_MSG(rc == 0, "%s: %s", p->what, nd_last_error());
        CHECK_MSG(v.expects_call == (strcmp(p->expected, "[]") != 0), "%s", p->what);
        CHECK_MSG(v.parsed == p->parsed, "%s: parsed %d", p->what, v.parsed);
        CHECK_MSG(v.valid == p->valid, "%s: valid %d (%s)", p->what, v.valid, v.why);
        CHECK_MSG(v.names_ok == p->names_ok, "%s: names_ok %d", p->what, v.names_ok);
        CHECK_MSG(v.args_ok == p->args_ok, "%s: args_ok %d", p->what, v.args_ok);
        CHECK_MSG(v.called == p->called, "%s: called %d", p->what, v.called);
        CHECK_MSG(v.valid == !v.why[0], "%s: why '%s'", p->what, v.why);
        nd_callscore_add(&tot, &v);
        nd_pj_free(e);
    }
    /* the reasons name the fault */
    {
        nd_pj_doc *e = parse("[" W_PARIS "]");
        nd_call_verdict v;
        nd_callscore_example(nd_pj_root(e), "[{\"name\":\"get_wether\",\"arguments\":{}}]", 38,
                             tools, NULL, &v);
        CHECK_MSG(strstr(v.why, "get_wether") && strstr(v.why, "not a declared tool"), "%s", v.why);
        const char *bad = "[" T_3 ",{\"name\":\"get_weather\",\"arguments\":{}}]";
        nd_callscore_example(nd_pj_root(e), bad, strlen(bad), tools, NULL, &v);
        CHECK_MSG(strstr(v.why, "call 1 (get_weather)") && strstr(v.why, "schema"), "%s", v.why);
        nd_callscore_example(nd_pj_root(e), NULL, 0, tools, "max_new_tokens", &v);
        CHECK_MSG(strstr(v.why, "max_new_tokens") != NULL, "%s", v.why);
        nd_pj_free(e);
    }
    /* bad expected data is an error, not a score */
    {
        nd_call_verdict v;
        const char *bad_expected[] = {"{}", "[1]", "[{\"arguments\":{}}]",
                                      "[{\"name\":\"x\",\"arguments\":[]}]"};
        for (size_t k = 0; k < 4; k++) {
            nd_pj_doc *e = parse(bad_expected[k]);
            CHECK_MSG(nd_callscore_example(nd_pj_root(e), "[]", 2, tools, NULL, &v) == ND_EFORMAT,
                      "%s", bad_expected[k]);
            nd_pj_free(e);
        }
    }

    /* totals, counted by hand from the table: 25 pairs expect calls, 5 not */
    CHECK(n == 30);
    CHECK(tot.examples[1] == 25 && tot.examples[0] == 5);
    /* no-call: correct refusal valid; spurious call valid; the rest not */
    CHECK(tot.valid[0] == 2 && tot.names_ok[0] == 1 && tot.args_ok[0] == 1);
    CHECK(tot.refused[0] == 1);
    /* call: valid 15 of 25; names right 18; args right 10 */
    CHECK_MSG(tot.valid[1] == 15, "%zu", tot.valid[1]);
    CHECK_MSG(tot.names_ok[1] == 18, "%zu", tot.names_ok[1]);
    CHECK_MSG(tot.args_ok[1] == 10, "%zu", tot.args_ok[1]);
    CHECK(tot.refused[1] == 1);
    nd_pj_free(tools_doc);
    return tu_finish("test_callscore");
}
