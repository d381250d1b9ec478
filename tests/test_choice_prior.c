/* The choice prior (src/engine/choice_prior.h): NEEDLE_CHOICE_PRIOR's
 * parsing; the tools' weights for a turn (a word one tool owns, one two
 * tools share, relative to the best-said tool, stop words, camelCase
 * names, prefixes, numbers, the {"type":"function"} form); which enum values a turn says; the
 * grammar's naming and literal accessors along a call's bytes, and the call-side functions on them;
 * the reasoning's bonus with a hand-made vocabulary (toward the heavier tool, over a refusal within
 * the bonus); nd_error keeping a message passed as its own argument. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/choice_prior.h"
#include "engine/reason_prior.h"
#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "testutil.h"

static int near(float a, float b)
{
    return fabsf(a - b) < 1e-6f;
}

static void test_setting(void)
{
    float b[3] = {-1.0f, -1.0f, -1.0f};
    CHECK(nd_choice_prior_setting(NULL, b) == ND_OK && b[0] == 10.0f && b[1] == 10.0f &&
          b[2] == ND_REASON_KEY_BONUS);
    b[0] = b[1] = b[2] = -1.0f;
    CHECK(nd_choice_prior_setting("", b) == ND_OK && b[0] == 10.0f && b[1] == 10.0f &&
          b[2] == ND_REASON_KEY_BONUS);
    CHECK(ND_CHOICE_TOOL_BONUS == 10.0f && ND_CHOICE_ENUM_BONUS == 10.0f);
    CHECK(nd_choice_prior_setting("0", b) == ND_OK && b[0] == 0.0f && b[1] == 0.0f && b[2] == 0.0f);
    b[0] = b[1] = b[2] = -1.0f;
    CHECK(nd_choice_prior_setting("off", b) == ND_OK && b[0] == 0.0f && b[1] == 0.0f &&
          b[2] == 0.0f);
    /* two values leave the key bonus at its default */
    CHECK(nd_choice_prior_setting("3,7", b) == ND_OK && b[0] == 3.0f && b[1] == 7.0f &&
          b[2] == ND_REASON_KEY_BONUS);
    CHECK(nd_choice_prior_setting("0,2.5", b) == ND_OK && b[0] == 0.0f && b[1] == 2.5f);
    CHECK(nd_choice_prior_setting("100,0", b) == ND_OK && b[0] == 100.0f && b[1] == 0.0f);
    CHECK(nd_choice_prior_setting("1,2,3", b) == ND_OK && b[0] == 1.0f && b[1] == 2.0f &&
          b[2] == 3.0f);
    CHECK(nd_choice_prior_setting("10,10,0", b) == ND_OK && b[0] == 10.0f && b[1] == 10.0f &&
          b[2] == 0.0f);
    static const char *const bad[] = {"abc",  "5",      "1,2,3,4", "-1,2",  "101,1",  "1,",
                                      ",1",   "1,2x",   "1,101",   "on",    "nan,1",  "1;2",
                                      " 3,7", "3, 7",   "0x10,5",  "1e1,2", "+1,2",   ".",
                                      "1,2,", "1,2,-3", "1,2,101", "1,,3",  "1,2,3x", "1,2, 3"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        nd_error(ND_OK, "%s", "");
        b[2] = -1.0f;
        CHECK_MSG(nd_choice_prior_setting(bad[k], b) == ND_EARG, "'%s' accepted", bad[k]);
        CHECK_MSG(strstr(nd_last_error(), "NEEDLE_CHOICE_PRIOR") != NULL &&
                      strstr(nd_last_error(), bad[k]) != NULL,
                  "'%s': message \"%s\"", bad[k], nd_last_error());
        CHECK(b[2] == ND_REASON_KEY_BONUS);
        CHECK(b[0] == 10.0f && b[1] == 10.0f); /* refused: the defaults, no half-read value */
    }
}

/* ---- the tools' weights ---- */

static const char *const TOOLS =
    "[{\"name\":\"brew_coffee\",\"description\":\"Brew coffee for you\"},"
    "{\"name\":\"preheat_oven\",\"description\":\"Preheat the oven\"},"
    "{\"name\":\"start_washer\",\"description\":\"Start the washer\"},"
    "{\"name\":\"start_dryer\",\"description\":\"Start the dryer\"},"
    "{\"name\":\"getUserTracks\",\"description\":\"List saved songs\"},"
    "{\"type\":\"function\",\"function\":{\"name\":\"pay_parking\","
    "\"description\":\"Pay for parking\"}},"
    "{\"name\":\"garden_watering\",\"description\":\"Set a schedule\"},"
    "{\"name\":\"log_feeding\",\"description\":\"Log a pet feeding\"},"
    "{\"name\":\"play_hits\",\"description\":\"Play the 2024 hits\"}]";
enum { BREW, OVEN, WASHER, DRYER, TRACKS, PARKING, WATERING, FEEDING, HITS, NTOOLS };

/* the weights for a turn, against want[NTOOLS] */
static void weights_are(nd_choice_prior *p, const char *turn, const float *want)
{
    CHECK(nd_choice_prior_turn(p, turn) == ND_OK);
    const float *w = nd_choice_prior_weights(p);
    for (int i = 0; i < NTOOLS; i++)
        CHECK_MSG(fabsf(w[i] - want[i]) < 1e-6f, "\"%s\": tool %d (%s) weighs %g, want %g", turn, i,
                  p->name[i], (double)w[i], (double)want[i]);
}

static void test_weights(void)
{
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(TOOLS, strlen(TOOLS), &doc, NULL) == 0);
    nd_choice_prior p;
    const float on[2] = {10.0f, 10.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 16, on) == ND_OK);
    CHECK(p.n == NTOOLS);
    CHECK(p.name[PARKING] && !strcmp(p.name[PARKING], "pay_parking")); /* the function form */
    CHECK(p.name[TRACKS] && !strcmp(p.name[TRACKS], "getUserTracks"));

    /* a word one tool owns: the full weight; words said twice count once */
    weights_are(&p, "coffee", (const float[NTOOLS]){[BREW] = 1.0f});
    weights_are(&p, "Brew an espresso, 3 cups", (const float[NTOOLS]){[BREW] = 1.0f});
    weights_are(&p, "preheat it", (const float[NTOOLS]){[OVEN] = 1.0f});
    /* a word two tools share (in each tool's name and description: still
     * one word of each, its name's): a name's word counts 2, so 2/2 each */
    weights_are(&p, "start it now", (const float[NTOOLS]){[WASHER] = 1.0f, [DRYER] = 1.0f});
    /* past 1, relative to the best-said tool's r: washer 1 + 2, dryer 1 */
    weights_are(&p, "START the washer", (const float[NTOOLS]){[WASHER] = 1.0f, [DRYER] = 1.0f / 3});
    weights_are(&p, "brew coffee, then preheat",
                (const float[NTOOLS]){[BREW] = 1.0f, [OVEN] = 0.5f});
    weights_are(&p, "brew coffee, preheat the oven",
                (const float[NTOOLS]){[BREW] = 1.0f, [OVEN] = 1.0f});
    /* stop words ("for", "you", "the", "get", "set") say nothing */
    weights_are(&p, "for you, the get set", (const float[NTOOLS]){0});
    /* compared lower-cased: "Set" in garden_watering's description, "Get"
     * in a turn are stop words too */
    weights_are(&p, "Set it up", (const float[NTOOLS]){0});
    weights_are(&p, "Get The tracks", (const float[NTOOLS]){[TRACKS] = 1.0f});
    /* camelCase names split ("getUserTracks": "user", "tracks") */
    weights_are(&p, "show my tracks", (const float[NTOOLS]){[TRACKS] = 1.0f});
    weights_are(&p, "which user", (const float[NTOOLS]){[TRACKS] = 1.0f});
    /* a function-form tool, a 4+-byte word beginning a longer one */
    weights_are(&p, "park the car", (const float[NTOOLS]){[PARKING] = 1.0f});
    weights_are(&p, "parkings", (const float[NTOOLS]){[PARKING] = 1.0f});
    /* 4 shared bytes without either word ending there: none */
    weights_are(&p, "parks", (const float[NTOOLS]){0});
    /* 5 shared first bytes: the same word */
    weights_are(&p, "I watered them", (const float[NTOOLS]){[WATERING] = 1.0f});
    /* "fed" is too short to begin "feeding"; "feed" does */
    weights_are(&p, "I fed the cat", (const float[NTOOLS]){0});
    weights_are(&p, "feed the cat", (const float[NTOOLS]){[FEEDING] = 1.0f});
    /* 3-byte words match whole only ("log", "pet"; "pay" for parking) */
    weights_are(&p, "logs", (const float[NTOOLS]){0});
    weights_are(&p, "pet", (const float[NTOOLS]){[FEEDING] = 1.0f});
    /* numbers only are no words ("2024" is in play_hits' description) */
    weights_are(&p, "from 2024", (const float[NTOOLS]){0});
    weights_are(&p, "hits of 2024", (const float[NTOOLS]){[HITS] = 1.0f});
    weights_are(&p, "", (const float[NTOOLS]){0});
    nd_choice_prior_free(&p);

    /* three tools sharing a word: a third each */
    const char *three = "[{\"name\":\"a_lamp\"},{\"name\":\"b_lamp\"},{\"name\":\"c_lamp\","
                        "\"description\":\"kitchen\"}]";
    nd_pj_doc *d3;
    CHECK(nd_pj_parse(three, strlen(three), &d3, NULL) == 0);
    CHECK(nd_choice_prior_init(&p, nd_pj_root(d3), 16, on) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "the lamp") == ND_OK);
    const float *w = nd_choice_prior_weights(&p);
    CHECK(near(w[0], 2.0f / 3) && near(w[1], 2.0f / 3) && near(w[2], 2.0f / 3)); /* names' */
    CHECK(nd_choice_prior_turn(&p, "the kitchen lamp") == ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK(near(w[0], 0.4f) && near(w[1], 0.4f) && w[2] == 1.0f); /* 2/3 of c's 5/3 */
    nd_choice_prior_free(&p);
    nd_pj_free(d3);

    /* off: nothing kept, nothing weighed, nothing said */
    const float off[2] = {0.0f, 0.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 16, off) == ND_OK);
    CHECK(p.n == 0 && p.biased == NULL);
    CHECK(nd_choice_prior_turn(&p, "brew coffee, normal") == ND_OK);
    CHECK(!nd_choice_prior_says(&p, "\"normal\"", 8));
    CHECK(p.naming == 0);
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
}

/* a choice prior with the default tool and enum bonuses over the tools
 * JSON text `tools` (*doc: their parse, for the caller to free) */
static void prior_over(const char *tools, nd_pj_doc **doc, nd_choice_prior *p)
{
    CHECK(nd_pj_parse(tools, strlen(tools), doc, NULL) == 0);
    const float on[2] = {ND_CHOICE_TOOL_BONUS, ND_CHOICE_ENUM_BONUS};
    CHECK(nd_choice_prior_init(p, nd_pj_root(*doc), 16, on) == ND_OK);
}

/* A tool's name outweighs its description, and a quoted value's words
 * choose no tool (BFCL's multi-turn cases: "information" in an airport
 * tool's description tied it with send_message; "dispatch the message
 * 'The latest stock price ...'" chose a stock tool). */
static void test_names_and_quotes(void)
{
    const char *tools =
        "[{\"name\":\"send_message\",\"description\":\"Send a message to a user\"},"
        "{\"name\":\"nearest_airport\",\"description\":\"Flights and budget information\"},"
        "{\"name\":\"get_stock_price\",\"description\":\"The latest price of a stock\"}]";
    nd_pj_doc *doc;
    nd_choice_prior p;
    prior_over(tools, &doc, &p);
    const float *w;
    /* "message" (send_message's name: 2) against "information" (1) */
    CHECK(nd_choice_prior_turn(&p, "get this information to them as a message") == ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK_MSG(w[0] == 1.0f && near(w[1], 0.5f) && w[2] == 0.0f, "weights %g %g %g", (double)w[0],
              (double)w[1], (double)w[2]);
    /* the quoted text's "latest", "stock", "price" count for nothing */
    CHECK(nd_choice_prior_turn(&p, "dispatch the message 'The latest stock price is $15.'") ==
          ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK_MSG(w[0] == 1.0f && w[1] == 0.0f && w[2] == 0.0f, "weights %g %g %g", (double)w[0],
              (double)w[1], (double)w[2]);
    /* the same words unquoted, and quotes that open no span (after a
     * letter: "stock's"), count */
    CHECK(nd_choice_prior_turn(&p, "the latest stock price") == ND_OK);
    CHECK(nd_choice_prior_weights(&p)[2] == 1.0f);
    CHECK(nd_choice_prior_turn(&p, "the stock's latest price, don't wait") == ND_OK);
    CHECK(nd_choice_prior_weights(&p)[2] == 1.0f);
    /* double and curly quotes too */
    CHECK(nd_choice_prior_turn(&p, "message \"latest stock price\" now") == ND_OK);
    CHECK(nd_choice_prior_weights(&p)[2] == 0.0f);
    CHECK(nd_choice_prior_turn(&p, "message \xE2\x80\x9Clatest stock price\xE2\x80\x9D now") ==
          ND_OK);
    CHECK(nd_choice_prior_weights(&p)[2] == 0.0f);
    /* a quoted tool name is the request: it counts (any case) */
    CHECK(nd_choice_prior_turn(&p, "call 'Get_Stock_Price' for me") == ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK(w[2] == 1.0f && w[0] == 0.0f);
    /* an unclosed quote blanks nothing */
    CHECK(nd_choice_prior_turn(&p, "send 'the stock price") == ND_OK);
    CHECK(nd_choice_prior_weights(&p)[2] == 1.0f);
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
}

/* A tool's parameters speak for it too: an enum value as a word of its
 * description, a parameter's description at ND_CHOICE_PARAM_WEIGHT (BFCL:
 * "How much fuel I have right now?" chose get_current_speed over
 * displayCarStatus, whose option lists "fuel"). */
static void test_param_words(void)
{
    const char *tools =
        "[{\"name\":\"display_status\",\"description\":\"Displays the vehicle's status\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"option\":{\"type\":\"string\","
        "\"enum\":[\"fuel\",\"battery\"]},\"unit\":{\"type\":\"string\","
        "\"description\":\"Gallons or liters\"}}}},"
        "{\"name\":\"get_speed\",\"description\":\"The vehicle's speed\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"unit\":{\"type\":\"string\","
        "\"description\":\"Miles or kilometers of speed\"}}}}]";
    nd_pj_doc *doc;
    nd_choice_prior p;
    prior_over(tools, &doc, &p);
    static const struct {
        const char *turn;
        float w0, w1;
    } cases[] = {
        {"how much fuel is left", 1.0f, 0.0f}, /* an enum value: a description's word */
        {"in kilometers", 0.0f, 0.5f},         /* a parameter's description: half */
        {"fuel in kilometers", 1.0f, 0.5f},    /* the two */
        {"speed and fuel", 0.5f, 1.0f},        /* "speed": the name's 2, not 2.5 */
        {"the battery in liters", 1.0f, 0.0f}, /* 1 + 0.5 of display_status's own */
        {"vehicle", 0.5f, 0.5f},               /* descriptions as before */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CHECK(nd_choice_prior_turn(&p, cases[k].turn) == ND_OK);
        const float *w = nd_choice_prior_weights(&p);
        CHECK_MSG(near(w[0], cases[k].w0) && near(w[1], cases[k].w1), "\"%s\": weights %g %g",
                  cases[k].turn, (double)w[0], (double)w[1]);
    }
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
}

/* ---- enum values the turn says ---- */

static int says(const nd_choice_prior *p, const char *lit)
{
    return nd_choice_prior_says(p, lit, (int)strlen(lit));
}

static void test_says(void)
{
    const char *tools = "[{\"name\":\"f\"}]";
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(tools, strlen(tools), &doc, NULL) == 0);
    nd_choice_prior p;
    const float on[2] = {0.0f, 10.0f}; /* the enum bonus alone */
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 4, on) == ND_OK);
    CHECK(!says(&p, "\"normal\"")); /* no turn yet */

    CHECK(nd_choice_prior_turn(&p, "start the washer normal cycle") == ND_OK);
    CHECK(says(&p, "\"Normal\"") && says(&p, "\"normal\"") && says(&p, "\"NORMAL\""));
    CHECK(says(&p, "\"cycle\"")); /* at the turn's end */
    CHECK(says(&p, "\"start\"")); /* at its start */
    CHECK(says(&p, "\"normal cycle\""));
    CHECK(!says(&p, "\"quick\"") && !says(&p, "\"heavy\""));
    CHECK(!says(&p, "\"cycle normal\""));
    CHECK(says(&p, "\"wash\""));                         /* 4+ bytes beginning a word of the turn */
    CHECK(!says(&p, "\"was\""));                         /* 3 only whole */
    CHECK(says(&p, "\"washers\""));                      /* a word of the turn begins it */
    CHECK(!says(&p, "normal") && !says(&p, "\"normal")); /* no JSON string */
    CHECK(!says(&p, "\"\"") && !says(&p, "\" \"") && !says(&p, "\"-\"")); /* nothing to say */

    CHECK(nd_choice_prior_turn(&p, "concatenate the files") == ND_OK);
    CHECK(!says(&p, "\"cat\"") && !says(&p, "\"nate\"") && !says(&p, "\"ten\""));
    CHECK(says(&p, "\"files\"") && says(&p, "\"Concatenate\""));

    CHECK(nd_choice_prior_turn(&p, "Donate 20 dollars to the Red CROSS, please") == ND_OK);
    CHECK(says(&p, "\"Red Cross\"") && says(&p, "\"red cross\"") && says(&p, "\"RED CROSS\""));
    CHECK(!says(&p, "\"Red Crescent\"") && !says(&p, "\"Blue Cross\""));
    CHECK(!says(&p, "\"the red\"x")); /* no closing quote last */

    /* a single word matched as tool words are */
    CHECK(nd_choice_prior_turn(&p, "preheat for broiling at 3") == ND_OK);
    CHECK(says(&p, "\"broil\"") && says(&p, "\"Broil\""));
    CHECK(!says(&p, "\"broiler oven\"")); /* more than one word: whole words only */
    CHECK(!says(&p, "\"bake\""));

    /* literals other than strings are never said */
    CHECK(nd_choice_prior_turn(&p, "true 3 null") == ND_OK);
    CHECK(!says(&p, "true") && !says(&p, "3") && !says(&p, "null"));
    CHECK(says(&p, "\"true\"") && says(&p, "\"3\"")); /* as strings, whole words */
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
}

/* ---- the grammar's accessors, and the call-side functions on them ---- */

static const char *const CALL_TOOLS =
    "[{\"name\":\"brew_coffee\",\"description\":\"Brew coffee\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"cups\":{\"type\":\"integer\"}}}},"
    "{\"name\":\"start_washer\",\"description\":\"Start the washer\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"cycle\":"
    "{\"type\":\"string\",\"enum\":[\"hot\",\"heavy\",\"normal\"]}},\"required\":[\"cycle\"]}},"
    "{\"name\":\"start_dryer\",\"description\":\"Start the dryer\"}]";

/* the grammar's index of a tool */
static int gram_index(const nd_grammar *g, const char *name)
{
    for (int i = 0; i < nd_gram_num_tools(g); i++) {
        int len;
        const char *q = nd_gram_tool_name(g, i, &len);
        if (q && len == (int)strlen(name) + 2 && !memcmp(q + 1, name, strlen(name)))
            return i;
    }
    fprintf(stderr, "no tool %s in the grammar\n", name);
    abort();
}

static void feed(const nd_grammar *g, nd_gram_state *st, const char *bytes)
{
    for (const char *c = bytes; *c; c++)
        CHECK_MSG(nd_gram_feed(g, st, (unsigned char)*c), "byte '%c' of \"%s\" rejected", *c,
                  bytes);
}

static void test_grammar(void)
{
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(CALL_TOOLS, strlen(CALL_TOOLS), &doc, NULL) == 0);
    nd_grammar *g = NULL;
    CHECK(nd_gram_compile(nd_pj_root(doc), &g) == ND_OK);
    CHECK(nd_gram_num_tools(g) == 3);
    int len = 0;
    const char *q = nd_gram_tool_name(g, 0, &len);
    CHECK(q && len >= 2 && q[0] == '"' && q[len - 1] == '"');
    CHECK(nd_gram_tool_name(g, 3, &len) == NULL && nd_gram_tool_name(g, -1, &len) == NULL);
    const uint64_t brew = 1ull << gram_index(g, "brew_coffee"),
                   washer = 1ull << gram_index(g, "start_washer"),
                   dryer = 1ull << gram_index(g, "start_dryer"), all = brew | washer | dryer;
    CHECK(brew != washer && washer != dryer && brew != dryer);

    nd_gram_state st;
    uint64_t c = 0;
    char *const *lits;
    const int *lens;
    int lo = -1, hi = -1;
    nd_gram_init(g, &st);
    CHECK(nd_gram_naming(&st, &c) == 0);
    feed(g, &st, "[");
    CHECK(nd_gram_naming(&st, &c) == 0);
    feed(g, &st, "{");
    CHECK(nd_gram_naming(&st, &c) == 1 && (c & all) == all); /* the call opened */
    feed(g, &st, "\"name\":");
    CHECK(nd_gram_naming(&st, &c) == 1 && (c & all) == all);
    feed(g, &st, "\"");
    CHECK(nd_gram_naming(&st, &c) == 1 && c == all);
    feed(g, &st, "start_");
    CHECK(nd_gram_naming(&st, &c) == 1 && c == (washer | dryer));
    feed(g, &st, "w");
    CHECK(nd_gram_naming(&st, &c) == 1 && c == washer);
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 0); /* a name is no literal */
    feed(g, &st, "asher\"");
    CHECK(nd_gram_naming(&st, &c) == 1 && c == washer);
    feed(g, &st, ",\"arguments\":{\"cycle\":");
    CHECK(nd_gram_naming(&st, &c) == 1 && c == washer);          /* its arguments: still call 1 */
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 0); /* the value not begun */
    feed(g, &st, "\"");
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 1 && hi - lo == 3);
    for (int i = lo; i < hi && i >= 0; i++)
        CHECK(lens[i] >= 2 && lits[i][0] == '"' && lits[i][lens[i] - 1] == '"');
    feed(g, &st, "h");
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 1 && hi - lo == 2);
    for (int i = lo; i < hi && i >= 0; i++)
        CHECK(lits[i][1] == 'h');
    feed(g, &st, "e");
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 1 && hi - lo == 1 && lens[lo] == 7 &&
          !memcmp(lits[lo], "\"heavy\"", 7));
    feed(g, &st, "avy\"");
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 0); /* past its end */
    feed(g, &st, "}}");
    CHECK(nd_gram_naming(&st, &c) == 0); /* between calls */
    CHECK(nd_gram_literal(g, &st, &lits, &lens, &lo, &hi) == 0);
    feed(g, &st, ",{");
    CHECK(nd_gram_naming(&st, &c) == 2);
    feed(g, &st, "\"name\":\"brew_coffee\"");
    CHECK(nd_gram_naming(&st, &c) == 2 && c == brew);
    feed(g, &st, ",\"arguments\":{\"cups\":2}}]");
    CHECK(nd_gram_done(&st) && nd_gram_naming(&st, &c) == 0);

    /* the call side: names weighed in the first call's name while more
     * than one tool is left, by the heaviest tool a piece leaves */
    nd_choice_prior p;
    const float b[2] = {10.0f, 10.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 8, b) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "start the washer, heavy cycle") == ND_OK);
    nd_choice_prior_call(&p, g);
    CHECK(p.first_call == 1);
    /* washer: "start" 1 + "washer" 2 + its enum value "heavy" 1; dryer: "start" 1 */
    CHECK(p.gweight[gram_index(g, "start_washer")] == 1.0f &&
          near(p.gweight[gram_index(g, "start_dryer")], 1.0f / 4) &&
          p.gweight[gram_index(g, "brew_coffee")] == 0.0f);
    int names = -1, enums = -1;
    nd_gram_init(g, &st);
    feed(g, &st, "[{\"name\":\"");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 1 && enums == 1);
    nd_gram_state after = st;
    feed(g, &after, "start_d");
    CHECK(near(nd_choice_prior_name(&p, &after), 1.0f / 4));
    after = st;
    feed(g, &after, "start_");
    CHECK(nd_choice_prior_name(&p, &after) == 1.0f); /* washer is still possible */
    after = st;
    feed(g, &after, "brew");
    CHECK(nd_choice_prior_name(&p, &after) == 0.0f);
    /* the heaviest left, whatever the grammar's order */
    CHECK(nd_choice_prior_turn(&p, "start the dryer") == ND_OK);
    nd_choice_prior_call(&p, g);
    after = st;
    feed(g, &after, "start_");
    CHECK(nd_choice_prior_name(&p, &after) == 1.0f);
    after = st;
    feed(g, &after, "start_w");
    CHECK(near(nd_choice_prior_name(&p, &after), 1.0f / 3));
    CHECK(nd_choice_prior_turn(&p, "start the washer, heavy cycle") == ND_OK);
    nd_choice_prior_call(&p, g);
    feed(g, &st, "start_washer\",\"arguments\":{\"cycle\":");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 0 && enums == 1);
    CHECK(nd_choice_prior_literal(&p, g, &st) == -1.0f); /* no literal yet */
    feed(g, &st, "\"");
    CHECK(nd_choice_prior_literal(&p, g, &st) == 1.0f); /* "heavy" still possible */
    after = st;
    feed(g, &after, "ho");
    CHECK(nd_choice_prior_literal(&p, g, &after) == 0.0f);
    after = st;
    feed(g, &after, "n");
    CHECK(nd_choice_prior_literal(&p, g, &after) == 0.0f);
    feed(g, &st, "hea");
    CHECK(nd_choice_prior_literal(&p, g, &st) == 1.0f);
    feed(g, &st, "vy\"}},{");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 0);
    CHECK(p.first_call == 0); /* the second call's name gets nothing */
    feed(g, &st, "\"name\":\"");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 0);

    /* the bonuses added where allowed only */
    float lg[8] = {0};
    uint8_t ok[8] = {1, 0, 1, 0, 0, 0, 0, 0};
    for (int t = 0; t < 8; t++)
        p.bonus[t] = (float)t;
    nd_choice_prior_add(&p, ok, 8, lg);
    CHECK(lg[0] == 0.0f && lg[1] == 0.0f && lg[2] == 2.0f && lg[3] == 0.0f);

    /* a reasoning that named a tool: the call follows it */
    p.reasoned = 1;
    nd_choice_prior_call(&p, g);
    CHECK(p.first_call == 0);
    nd_gram_init(g, &st);
    feed(g, &st, "[{\"name\":\"");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 0 && enums == 1);
    /* a new turn clears it */
    CHECK(nd_choice_prior_turn(&p, "start the washer") == ND_OK);
    nd_choice_prior_call(&p, g);
    CHECK(p.first_call == 1);
    nd_choice_prior_free(&p);

    /* the tool bonus off: never names; the enum bonus off: never enums */
    const float enum_only[2] = {0.0f, 10.0f}, tool_only[2] = {10.0f, 0.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 8, enum_only) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "start the washer, heavy cycle") == ND_OK);
    nd_choice_prior_call(&p, g);
    nd_gram_init(g, &st);
    feed(g, &st, "[{\"name\":\"");
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 0 && enums == 1);
    nd_choice_prior_free(&p);
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 8, tool_only) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "start the washer, heavy cycle") == ND_OK);
    nd_choice_prior_call(&p, g);
    CHECK(nd_choice_prior_step(&p, &st, &names, &enums) == 1 && names == 1 && enums == 0);
    nd_choice_prior_free(&p);
    nd_gram_free(g);
    nd_pj_free(doc);
}

/* ---- the reasoning, with a hand-made vocabulary ---- */

#define SP "\xe2\x96\x81" /* U+2581, a piece's space */

static const char *const VOCAB[] = {
    "<unk>", SP "brew",         SP "preheat", "_coffee", "_oven", SP "The",          SP,
    "brew",  SP "start",        "_washer",    "_dryer",  ":",     SP "brew_coffee:", SP "pre",
    "_coff", SP "brew_coffees",
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

static void put32(nd_buf *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    nd_buf_put(b, (const char *)x, 4);
}

/* a tokenizer blob (docs/formats.md §4.3): <unk> then normal pieces */
static nd_tokenizer *build_tokenizer(void)
{
    nd_buf b = {0};
    put32(&b, V);
    put32(&b, 0xffffffffu); /* pad */
    put32(&b, 0xffffffffu); /* eos */
    put32(&b, 0xffffffffu); /* bos */
    put32(&b, 0);           /* unk */
    nd_buf_put(&b, "\0\0\0\0", 4);
    for (int i = 0; i < V; i++) {
        size_t n = strlen(VOCAB[i]);
        unsigned char rec[7] = {
            0, 0, 0, 0, (unsigned char)(i ? 0 : 1), (unsigned char)n, (unsigned char)(n >> 8)};
        nd_buf_put(&b, (const char *)rec, 7);
        nd_buf_put(&b, VOCAB[i], n);
    }
    nd_tokenizer *t = NULL;
    CHECK(nd_tokenizer_from_blob((const unsigned char *)b.p, b.n, &t) == ND_OK);
    nd_buf_free(&b);
    return t;
}

static void zero(float *lg)
{
    for (int t = 0; t < V; t++)
        lg[t] = 0.0f;
}

static int argmax(const float *lg, const uint8_t *ok)
{
    int best = -1;
    for (int t = 0; t < V; t++)
        if (ok[t] && (best < 0 || lg[t] > lg[best]))
            best = t;
    return best;
}

#define L(piece) lg[find(piece)]

/* Optional keys the turn names: nd_choice_prior_says_key's words, and
 * where the grammar says a key so named is being written. */
static void test_keys(void)
{
    const char *tools = "[{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"city\":{\"type\":\"string\"},"
                        "\"max_rent\":{\"type\":\"integer\"},\"bedrooms\":{\"type\":\"integer\"},"
                        "\"tags\":{\"type\":\"string\"},\"maxLines\":{\"type\":\"integer\"},"
                        "\"id\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]";
    nd_pj_doc *doc;
    nd_choice_prior p;
    prior_over(tools, &doc, &p);
    CHECK(p.key_bonus == ND_CHOICE_KEY_BONUS);
    CHECK(nd_choice_prior_turn(&p, "Homes in Lagos with 3 Bedrooms, #sun hashtags, last 5 lines, "
                                   "my ID") == ND_OK);
    static const struct {
        const char *key;
        int said;
    } keys[] = {
        {"\"bedrooms\"", 1},                  /* caseless */
        {"\"bedroom\"", 1},                   /* plural */
        {"\"max_rent\"", 0},                  /* "rent" is not said */
        {"\"tags\"", 1},                      /* ending "hashtags" */
        {"\"maxLines\"", 1},                  /* camelCase: "lines" */
        {"\"id\"", 0},                        /* under 3 bytes: too short to say */
        {"\"city\"", 0},     {"\"ages\"", 0}, /* "ages" ends no word of the turn */
        {"\"sun\"", 1},                       /* 3 bytes, a whole word ("#sun") */
        {"\"un\"", 0},       {"no quotes", 0},
    };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        CHECK_MSG(nd_choice_prior_says_key(&p, keys[k].key, (int)strlen(keys[k].key)) ==
                      keys[k].said,
                  "%s: want %d", keys[k].key, keys[k].said);

    nd_grammar *g = NULL;
    CHECK(nd_gram_compile(nd_pj_root(doc), &g) == ND_OK);
    nd_choice_prior_call(&p, g);
    CHECK(p.key_mask != NULL);
    nd_gram_state st;
    nd_gram_init(g, &st);
    feed(g, &st, "[{\"name\":\"search\",\"arguments\":{");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == -1); /* no key begun */
    feed(g, &st, "\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == 0); /* city, required, not written */
    feed(g, &st, "city\":");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == -1); /* at the value */
    feed(g, &st, "\"Lagos\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == -1);
    feed(g, &st, ",\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == 1); /* bedrooms, tags, maxLines left */
    nd_gram_state m = st;
    feed(g, &m, "max");
    CHECK(nd_gram_key_marked(g, &m, p.key_mask) == 1); /* maxLines, not max_rent */
    feed(g, &m, "_");
    CHECK(nd_gram_key_marked(g, &m, p.key_mask) == 0); /* max_rent */
    feed(g, &st, "bedrooms\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == 1); /* complete, before its colon */
    feed(g, &st, ":3,\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == 1); /* tags, maxLines */
    feed(g, &st, "tags\":\"x\",\"maxLines\":5,\"");
    CHECK(nd_gram_key_marked(g, &st, p.key_mask) == 0); /* those written: max_rent, id left */
    nd_gram_free(g);

    /* off with the other bonuses: no mask */
    nd_choice_prior_free(&p);
    const float off[2] = {0.0f, 0.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 16, off) == ND_OK);
    CHECK(p.key_bonus == 0.0f);
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
}

static void test_reason(void)
{
    needle_model M;
    memset(&M, 0, sizeof M);
    M.m.dims.V = V;
    M.tok = build_tokenizer();
    if (!M.tok)
        return;
    unsigned char pb[PIECE_MAX];
    int plen;
    CHECK(nd_piece_bytes(M.tok, find(SP "brew"), pb, &plen) && plen == 5 &&
          !memcmp(pb, " brew", 5));

    const char *tools = "[{\"name\":\"brew_coffee\",\"description\":\"Brew coffee\"},"
                        "{\"name\":\"preheat_oven\",\"description\":\"Preheat the oven\"},"
                        "{\"name\":\"start_washer\",\"description\":\"Start the washer\"},"
                        "{\"name\":\"start_dryer\",\"description\":\"Start the dryer\"}]";
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(tools, strlen(tools), &doc, NULL) == 0);
    nd_choice_prior p;
    const float b[2] = {10.0f, 10.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), V, b) == ND_OK);
    uint8_t ok[V];
    memset(ok, 1, sizeof ok);
    float lg[V];
    const float *r;

    /* the model begins with preheat_oven's name; the turn speaks of
     * brew_coffee: its pieces get the bonus and win */
    CHECK(nd_choice_prior_turn(&p, "Brew an espresso, 3 cups") == ND_OK);
    CHECK(p.naming == 1);
    zero(lg);
    L(SP "preheat") = 5.0f, L(SP "The") = 1.0f, L(SP "brew") = 0.5f, L("brew") = 0.25f;
    L(SP "brew_coffees") = 1.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r != lg);
    CHECK(r[find(SP "brew")] == 10.5f && r[find("brew")] == 10.25f);
    CHECK(r[find(SP "brew_coffee:")] == 10.0f); /* the name, then no name byte */
    CHECK(r[find(SP "brew_coffees")] == 1.0f);  /* a longer name than the tool's */
    CHECK(r[find(SP "preheat")] == 5.0f && r[find(SP "pre")] == 0.0f); /* weight 0 */
    CHECK(r[find(SP "The")] == 1.0f && r[find("_coffee")] == 0.0f && r[find(":")] == 0.0f);
    CHECK(r[find("<unk>")] == 0.0f);
    CHECK(r[find(SP)] == 0.0f); /* the space alone says no tool */
    CHECK(argmax(r, ok) == find(SP "brew"));
    /* what is not allowed gets nothing */
    ok[find(SP "brew")] = 0;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r[find(SP "brew")] == 0.5f && argmax(r, ok) == find("brew"));
    ok[find(SP "brew")] = 1;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    nd_choice_prior_feed(&p, &M, argmax(r, ok));
    /* a name begun is no tool named yet: a reasoning that drifts off ("brew
     * the ...") leaves the call's first name its bonus */
    CHECK(p.naming == 1 && p.reasoned == 0 && p.named.n == 4 && !memcmp(p.named.p, "brew", 4));
    /* on inside the name: "_coffee" goes on with brew_coffee, "_oven" makes
     * no name, nor a space */
    zero(lg);
    L("_oven") = 3.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r[find("_coffee")] == 10.0f && r[find("_coff")] == 10.0f && r[find("_oven")] == 3.0f);
    CHECK(r[find(SP "brew")] == 0.0f && r[find(SP)] == 0.0f);
    CHECK(argmax(r, ok) == find("_coffee"));
    nd_choice_prior_feed(&p, &M, find("_coffee"));
    CHECK(p.naming == 0 && p.reasoned == 1 && p.named.n == 11); /* the name is done */
    zero(lg);
    L(":") = 1.0f;
    CHECK(nd_choice_prior_reason(&p, &M, lg, ok) == lg); /* the model's own logits */

    /* the model's best first piece is no tool's name (a refusal): the
     * said tool's name gets half the bonus, and wins within it */
    CHECK(nd_choice_prior_turn(&p, "Brew an espresso, 3 cups") == ND_OK);
    CHECK(p.reasoned == 0 && p.named.n == 0 && p.naming == 1);
    zero(lg);
    L(SP "The") = 2.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r != lg && r[find(SP "The")] == 2.0f && r[find(SP "brew")] == 5.0f);
    CHECK(argmax(r, ok) == find(SP "brew"));
    nd_choice_prior_feed(&p, &M, find(SP "brew"));
    zero(lg);
    L("_oven") = 3.0f; /* once a name has begun, the whole bonus */
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r[find("_coffee")] == 10.0f && argmax(r, ok) == find("_coffee"));
    /* a refusal surer than half the bonus stands, and once begun it is
     * no name: no bonus after it, whatever the model would name later */
    CHECK(nd_choice_prior_turn(&p, "Brew an espresso, 3 cups") == ND_OK);
    zero(lg);
    L(SP "The") = 5.5f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(argmax(r, ok) == find(SP "The"));
    nd_choice_prior_feed(&p, &M, find(SP "The"));
    CHECK(p.reasoned == 0 && p.naming == 0);
    L(SP "brew") = 9.0f; /* now it would name one: too late */
    CHECK(nd_choice_prior_reason(&p, &M, lg, ok) == lg);

    /* a name two tools begin with: the heavier wins over the model's
     * lighter pick, a confident model keeps its own */
    CHECK(nd_choice_prior_turn(&p, "start the washer") == ND_OK);
    zero(lg);
    L(SP "start") = 1.0f, L(SP "preheat") = 2.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r[find(SP "start")] == 11.0f && r[find(SP "preheat")] == 2.0f);
    CHECK(argmax(r, ok) == find(SP "start"));
    nd_choice_prior_feed(&p, &M, find(SP "start"));
    CHECK(p.naming == 1);
    zero(lg);
    L("_dryer") = 4.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(r[find("_washer")] == 10.0f && near(r[find("_dryer")], 4.0f + 10.0f / 3)); /* 1, 1/3 */
    CHECK(argmax(r, ok) == find("_washer"));
    L("_dryer") = 20.0f;
    r = nd_choice_prior_reason(&p, &M, lg, ok);
    CHECK(argmax(r, ok) == find("_dryer"));
    /* the reasoning named a tool: the call's name is not weighed again */
    nd_choice_prior_feed(&p, &M, find("_washer"));
    CHECK(p.reasoned == 1 && p.naming == 0);

    /* the turn speaks of no tool: the model's own logits */
    CHECK(nd_choice_prior_turn(&p, "what time is it") == ND_OK);
    zero(lg);
    L(SP "preheat") = 5.0f;
    CHECK(nd_choice_prior_reason(&p, &M, lg, ok) == lg);
    nd_choice_prior_free(&p);

    /* the tool bonus off: the model's own logits, nothing named */
    const float enum_only[2] = {0.0f, 10.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), V, enum_only) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "Brew an espresso, 3 cups") == ND_OK);
    zero(lg);
    L(SP "preheat") = 5.0f;
    CHECK(nd_choice_prior_reason(&p, &M, lg, ok) == lg);
    nd_choice_prior_feed(&p, &M, find(SP "brew"));
    CHECK(p.reasoned == 0);
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
    nd_tokenizer_free(M.tok);
}

/* nd_error with the last message as its argument keeps it */
/* Names and enum values the grammar keeps escaped ("r\u00e9server",
 * "say\"hi") are compared as the strings they are; a catalogue of many
 * tools sharing words counts every owner (the words are indexed by their
 * first bytes, not compared all with all). */
static void test_escapes_and_catalogue(void)
{
    const char *tools = "[{\"name\":\"r\\u00e9server\",\"description\":\"book a table\"},"
                        "{\"name\":\"say\\\"hi\",\"description\":\"greet\"},"
                        "{\"name\":\"plain_tool\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"mode\":{\"enum\":[\"caf\\u00e9\",\"tea\\\"pot\","
                        "\"plain\"]}}}}]";
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(tools, strlen(tools), &doc, NULL) == 0);
    nd_grammar *g = NULL;
    CHECK(nd_gram_compile(nd_pj_root(doc), &g) == ND_OK);
    nd_choice_prior p;
    const float on[2] = {10.0f, 10.0f};
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 8, on) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "r\xc3\xa9server une table") == ND_OK);
    const float *w = nd_choice_prior_weights(&p);
    CHECK(w[0] == 1.0f && w[1] == 0.0f && w[2] == 0.0f);
    nd_choice_prior_call(&p, g);
    CHECK(p.gweight[gram_index(g, "r\\u00e9server")] == 1.0f);
    CHECK(nd_choice_prior_turn(&p, "greet them") == ND_OK);
    nd_choice_prior_call(&p, g);
    CHECK(p.gweight[gram_index(g, "say\\\"hi")] == 1.0f);
    CHECK(nd_choice_prior_turn(&p, "a caf\xc3\xa9 and a tea\"pot") == ND_OK);
    CHECK(says(&p, "\"caf\\u00e9\""));
    CHECK(says(&p, "\"tea\\\"pot\""));
    CHECK(!says(&p, "\"plain\""));
    CHECK(!says(&p, "\"caf\\u00e\"")); /* no JSON string: never said */
    nd_choice_prior_free(&p);
    nd_gram_free(g);
    nd_pj_free(doc);

    /* 300 tools that all have "alpha", one that alone has "omega" */
    nd_buf big = {0};
    nd_buf_put(&big, "[", 1);
    for (int i = 0; i < 300; i++) {
        char t[96];
        int n = snprintf(t, sizeof t, "%s{\"name\":\"tool_%d\",\"description\":\"alpha%s\"}",
                         i ? "," : "", i, i == 7 ? " omega" : "");
        nd_buf_put(&big, t, (size_t)n);
    }
    nd_buf_put(&big, "]", 1);
    CHECK(nd_pj_parse(big.p, big.n, &doc, NULL) == 0);
    CHECK(nd_choice_prior_init(&p, nd_pj_root(doc), 8, on) == ND_OK);
    CHECK(nd_choice_prior_turn(&p, "alpha") == ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK(near(w[0], 1.0f / 300) && near(w[299], 1.0f / 300));
    CHECK(nd_choice_prior_turn(&p, "alpha omega") == ND_OK);
    w = nd_choice_prior_weights(&p);
    CHECK(w[7] == 1.0f && near(w[8], 1.0f / 300 / (1.0f + 1.0f / 300)));
    nd_choice_prior_free(&p);
    nd_pj_free(doc);
    nd_buf_free(&big);
}

static void test_error_alias(void)
{
    CHECK(nd_error(ND_EARG, "first message") == ND_EARG);
    CHECK(nd_error(ND_EFORMAT, "%s", nd_last_error()) == ND_EFORMAT);
    CHECK_MSG(!strcmp(nd_last_error(), "first message"), "got \"%s\"", nd_last_error());
    CHECK(nd_error(ND_EFORMAT, "tools: %s (%d)", nd_last_error(), 2) == ND_EFORMAT);
    CHECK_MSG(!strcmp(nd_last_error(), "tools: first message (2)"), "got \"%s\"", nd_last_error());
}

int main(void)
{
    test_setting();
    test_weights();
    test_names_and_quotes();
    test_param_words();
    test_says();
    test_grammar();
    test_keys();
    test_reason();
    test_escapes_and_catalogue();
    test_error_alias();
    return tu_finish("test_choice_prior");
}
