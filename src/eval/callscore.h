/* Scoring tool calls: one example's expected call list against the list a
 * model predicted (needle eval-calls). Upstream has no call-level
 * evaluation (its finetune.py reports validation loss only), so the rules
 * are ours:
 *
 * - tool name: the multiset of predicted tool names equals the expected
 *   one (order ignored, repeats counted);
 * - exact arguments: the predicted calls equal the expected ones as a
 *   multiset of (name, arguments), values compared JSON-normalised
 *   (nd_json_equal: key order ignored, 3 == 3.0, strings byte-exact);
 * - refusal: the prediction is [] (no call);
 * - valid: the prediction is a JSON array of {"name", "arguments"} objects
 *   and the example's tools' grammar (engine/grammar.h: the decoder's own
 *   schema constraint) accepts its compact form, i.e. every call names a
 *   declared tool and its arguments satisfy that tool's schema.
 *
 * A prediction that does not parse as a call list is wrong on every
 * metric (it is neither a correct nor a false refusal). */
#ifndef ND_CALLSCORE_H
#define ND_CALLSCORE_H

#include <stddef.h>

#include "text/pyjson.h"

/* 1 when a and b are equal JSON values: objects as key sets (order
 * ignored), arrays in order, numbers by value (an integer equals a float
 * of the same exact value), strings byte for byte, true/false/null by
 * type (true is not 1). */
int nd_json_equal(const nd_pj *a, const nd_pj *b);

/* Is v a call list: an array of objects with a string "name" and, when
 * present, an object "arguments" (absent reads as {})? ND_OK, else
 * ND_EFORMAT with a message naming the element and field. */
int nd_calls_check(const nd_pj *v);

typedef struct {
    int expects_call; /* the expected list is non-empty */
    int parsed;       /* the prediction is a call list (nd_calls_check) */
    int valid;        /* parsed and accepted by the tools' grammar */
    int called;       /* parsed and non-empty */
    int names_ok;     /* tool-name multisets equal */
    int args_ok;      /* (name, arguments) multisets equal */
    char why[256];    /* why the prediction is not valid ("" when it is) */
} nd_call_verdict;

/* Score one example. expected: a call list (nd_calls_check must pass);
 * predicted: the model's call-list JSON text (NULL: the engine gave none,
 * e.g. an error; then `why` names `engine_error`); tools: the example's
 * tools array. Returns ND_OK, or an error for bad expected/tools (the
 * data's fault, not the prediction's). */
int nd_callscore_example(const nd_pj *expected, const char *predicted, size_t predicted_len,
                         const nd_pj *tools, const char *engine_error, nd_call_verdict *v);

/* Running totals; index [0] = examples expecting no call, [1] = expecting
 * calls. */
typedef struct {
    size_t examples[2];
    size_t valid[2];
    size_t names_ok[2];
    size_t args_ok[2];
    size_t refused[2]; /* predicted []: [0] correct refusals, [1] false refusals */
} nd_callscore_totals;

void nd_callscore_add(nd_callscore_totals *t, const nd_call_verdict *v);

#endif
