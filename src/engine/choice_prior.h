/* The choice prior: where the answer chooses among fixed texts (which
 * tool to call, which value of an enum to write), the texts the turn
 * speaks of get a bonus added to the logits of the pieces that write them.
 *
 * Why: a small base writes well-formed calls long before it reads a tool
 * list reliably. Zero-shot, the built-in base answered "Brew an espresso,
 * 3 cups" with preheat_oven while brew_coffee was listed, "place a hold
 * on Dune" with pay_parking beside place_hold, and "start the washer,
 * normal cycle" with cycle "quick".
 *
 * Tools. A tool's r is the sum over the words of its name, description,
 * parameters' enum values and parameters' descriptions that the turn says
 * of 1 / (the number of tools with that word), twice that for a word of
 * its name (ND_CHOICE_NAME_WEIGHT), half for a parameter's description
 * (ND_CHOICE_PARAM_WEIGHT): a
 * word one tool owns counts 1, a word every tool has little. The turn's
 * quoted spans are values, not the request: their words count for no
 * tool (but a quoted tool name's). A tool's weight is r / max(1, the
 * largest r of the tools), so the best-said tool gets the full bonus once
 * it has a word of its own, and a tool that shares one word of several
 * with it gets a small part ("get user's saved shows":
 * get-users-saved-shows 1, get-users-top-tracks 0.14). Words are compared
 * lower-cased, a shorter word of 4+ bytes matching the start of a longer
 * one ("park", "parking"), 5 shared first bytes matching too ("watered",
 * "watering"). The bonus is
 * given where the first tool is named:
 *  - the reasoning's first words (the built-in base reasons "brew_coffee:
 *    ..."); where the model's own best first piece begins no tool's name
 *    (most often a refusal), with half the bonus (ND_CHOICE_OVER_REFUSAL):
 *    a refusal the model prefers by less becomes a call of the tool the
 *    turn speaks of. Why: the built-in base refused 56 of 267 held-out
 *    synthetic requests, and where the turn said a tool's words its
 *    refusal led the best name by 2 logits (median); chit-chat that says
 *    a tool's word ("thanks for the coffee") leads by 9 to 10, so half
 *    the bonus leaves it alone. A turn that says no tool's words gets no
 *    bonus, so its refusal stands. What it costs on BFCL's irrelevance
 *    queries: docs/engine.md;
 *  - else the call's first name, once the model has opened a call (a model
 *    that does not reason, or whose reasoning did not begin with a name;
 *    after one that did, the call follows its reasoning).
 *
 * Keys. An optional argument the turn names gets the key bonus where the
 * call writes its name (ND_CHOICE_KEY_BONUS).
 *
 * Enums. An enum or const string value the turn says (caseless, as whole
 * words, or a single word matched as above: "broiling" for "broil") gets
 * the enum bonus wherever a call writes one.
 *
 * Both stay priors: a model confident past the bonus keeps its pick. A
 * bonus of 0 is off: the decoder's picks are the model's. */
#ifndef ND_CHOICE_PRIOR_H
#define ND_CHOICE_PRIOR_H

#include <stdint.h>

#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "text/pyjson.h"

/* one word of a tool (index_words) */
typedef struct {
    const char *w; /* lower-cased, 0-terminated, in nd_choice_prior.words */
    int tool;
    float share;    /* 1 / (the tools with the same word), ND_CHOICE_NAME_WEIGHT times that for a
                     * word of the tool's name; 0 for a word its tool has twice */
    int from_name;  /* a word of the tool's name (not its description) */
    int from_param; /* a word of a parameter's description (ND_CHOICE_PARAM_WEIGHT) */
} nd_choice_word;

typedef struct {
    float tool_bonus;   /* the full bonus of a tool; 0: off */
    float enum_bonus;   /* the bonus of an enum value the turn says; 0: off */
    int n;              /* tools */
    char **name;        /* [n] tool names */
    nd_buf words;       /* the tools' words, 0-separated */
    nd_choice_word *tw; /* [ntw] the same, sorted by their first 4 bytes */
    size_t ntw;
    float *weight;                  /* [n] this turn's tool weights, 0 .. 1 */
    float gweight[ND_GRAM_MAX_ALT]; /* the same in the call grammar's order */
    nd_buf turn;                    /* the turn's text, lower-cased, 0-terminated */
    nd_buf turn_words;  /* its words as add_words makes them, ending with an empty one */
    float *biased;      /* [V] logits plus bonus (reasoning) */
    float *bonus;       /* [V] this call step's bonus per allowed piece */
    nd_buf named;       /* the reasoning's bytes so far while it names a tool */
    int naming;         /* the reasoning may still be naming its first tool */
    int reasoned;       /* the reasoning began with a tool's name this turn */
    int first_call;     /* the call's first name may get the tool bonus */
    float key_bonus;    /* the bonus of an optional argument the turn names; 0: off */
    uint64_t *key_mask; /* the call grammar's optional keys the turn names (nd_gram_key_marks) */
} nd_choice_prior;

/* The defaults, chosen on the built-in base's zero-shot scores
 * (docs/engine.md, "The choice prior"). */
#define ND_CHOICE_TOOL_BONUS 10.0f
#define ND_CHOICE_ENUM_BONUS 10.0f
/* what a word of a tool's name counts against one of its description
 * only: the name says what the tool does, a description also says where
 * it belongs (BFCL's "... allows users to book flights, manage credit
 * cards, and view budget information" made "information" choose an
 * airport tool). 2: BFCL multi-turn fine-tuned 4-bit names 77.5% ->
 * 78.8%, held-out real API sets zero-shot 77.3% -> 79.0%, the rest
 * within one example (docs/engine.md, "The choice prior"). */
#define ND_CHOICE_NAME_WEIGHT 2.0f
/* what a word of a parameter's description counts against one of the
 * tool's description (its enum values count as the description's): it
 * speaks of an argument more than of what the tool does. With them the
 * held-out synthetic sets zero-shot gained 3 points of tool names and
 * BFCL multi-turn fine-tuned 4-bit one example; at 1 BFCL's irrelevance
 * queries lost 5 refusals of 240, at 0.5 three (docs/engine.md). */
#define ND_CHOICE_PARAM_WEIGHT 0.5f
/* added to the pieces that write an optional argument's name the turn
 * says (its last word, caseless, maybe plural or ending a longer word:
 * "with 3 bedrooms" -> "bedrooms", not "max_rent"; "hashtags" -> "tags"),
 * once the call's required arguments are written (their order stays the
 * model's), and not to a piece that ends a value (a string cut short to
 * reach the key). On with the tool and enum bonuses. 3: zero-shot
 * held-out synthetic exact arguments 33.0% -> 33.7%, the rest within one
 * example; 6 moved nothing more (docs/engine.md, "The choice prior"). */
#define ND_CHOICE_KEY_BONUS 3.0f
/* the share of the tool bonus against the model's own first piece that
 * begins no name (0.3: 67% tool names on the held-out synthetic set, 0.5:
 * 70%, 1: 71%, with BFCL's irrelevance refusals alike; 1 turns chit-chat
 * into calls) */
#define ND_CHOICE_OVER_REFUSAL 0.5f

/* The bonuses NEEDLE_CHOICE_PRIOR asks for, b[] = {tool, enum, key}
 * (key: the reasoning prior's argument names, reason_prior.h): unset,
 * the defaults; "0" or "off", none; "TOOL,ENUM" or "TOOL,ENUM,KEY",
 * those (each 0 .. 100; KEY left out, its default). ND_EARG names the
 * variable and its value. */
int nd_choice_prior_setting(const char *env, float b[3]);
/* For the tools array `tools` (entries {name, description} or
 * {function: {...}}) and a model of V pieces. */
int nd_choice_prior_init(nd_choice_prior *p, const nd_pj *tools, int V, const float b[2]);
void nd_choice_prior_free(nd_choice_prior *p);
/* A tool entry's own fields: t, or its "function" object ({"type":
 * "function", "function": {...}}). */
const nd_pj *nd_choice_tool_fields(const nd_pj *t);
/* A new turn: the tools' weights for its text. */
int nd_choice_prior_turn(nd_choice_prior *p, const char *text);
/* The tool weights of the last turn (for tests): w[0..n). */
const float *nd_choice_prior_weights(const nd_choice_prior *p);
/* Whether the turn says the enum value lit (JSON text of len bytes). */
int nd_choice_prior_says(const nd_choice_prior *p, const char *lit, int len);

/* Reasoning. One step: the logits the pick reads (the model's own, or
 * with the tool bonus while the reasoning names its first tool); feed:
 * the piece picked. */
const float *nd_choice_prior_reason(nd_choice_prior *p, const needle_model *M, const float *logits,
                                    const uint8_t *allowed);
void nd_choice_prior_feed(nd_choice_prior *p, const needle_model *M, int t);

/* The call (grammar g: the tools in the context). begin: the call
 * starts; step: whether this step's pieces get bonuses (the state st is
 * in the first call's name with more than one tool left, or the enum
 * bonus is on), *enums whether values are weighed; name / value: the
 * bonus of piece t from the state after it, by the tools it leaves, or
 * by the enum value the path wrote (w: the largest said-weight of the
 * literal candidates along the piece's bytes, -1 none); add: the bonuses
 * to the allowed logits. */
void nd_choice_prior_call(nd_choice_prior *p, const nd_grammar *g);
/* Whether the turn says the optional argument name key[0..len) (JSON
 * text, quotes included): nd_gram_key_marks' question. */
int nd_choice_prior_says_key(void *p, const char *key, int len);
int nd_choice_prior_step(nd_choice_prior *p, const nd_gram_state *st, int *names, int *enums);
float nd_choice_prior_name(const nd_choice_prior *p, const nd_gram_state *after);
float nd_choice_prior_literal(const nd_choice_prior *p, const nd_grammar *g,
                              const nd_gram_state *s);
void nd_choice_prior_add(const nd_choice_prior *p, const uint8_t *allowed, int V, float *logits);

#endif
