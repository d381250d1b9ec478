/* The reasoning prior: while the reasoning writes its plan of a call
 * ("preheat_oven: temperature 213, mode \"bake\""), the pieces that write
 * one of the named tool's own argument names get a bonus, and its values
 * get the copy prior's bonuses (copy_prior.h) as a call's values do.
 * Where the form leaves no choice, it is kept: after "NAME: " and ", "
 * only an argument's name (while the tool has one left), a value that
 * begins as its type allows, and an enum's own values.
 *
 * Why: the call follows the reasoning. Zero-shot, the built-in base named
 * the right tool and then planned arguments it had seen in training
 * ("preheat_oven: dish \"public\"", "pay_parking: par \"parking\", hours
 * 3003") or a run of one piece ("degrororororo..."); its call copied the
 * plan. Given the reasoning its training data holds for the same
 * requests, the same base writes 98.7% of the held-out synthetic calls
 * with the right tools and 81.3% with exact arguments (its own reasoning:
 * 57.3% / 20.3%; docs/engine.md, "The reasoning prior").
 *
 * The plan's form is the one the built-in base learned (tools/
 * gen_toolcall_corpus.py): NAME ": " then "KEY VALUE" items joined by
 * ", ", each VALUE a JSON value optionally followed by ' from "SAID"',
 * and "; then " before the next call's NAME. The prior reads the
 * reasoning's bytes as they are picked and acts only while they follow
 * that form after a listed tool's name: other reasoning (a refusal's
 * "The user wants: ...", another model's own style) is left as the model
 * writes it, from the first byte that leaves the form to the end of the
 * reasoning. A bonus of 0 and a copy prior that is off leave the model's
 * picks as they are. */
#ifndef ND_REASON_PRIOR_H
#define ND_REASON_PRIOR_H

#include <stdint.h>

#include "engine/choice_prior.h"
#include "engine/copy_prior.h"
#include "engine/model_internal.h"
#include "text/pyjson.h"

/* the parser's states: the plan's parts */
enum {
    RP_NAME,   /* a tool's name, up to its colon */
    RP_COLON,  /* the space after the colon */
    RP_KEY,    /* an argument's name, up to its space */
    RP_VALUE,  /* a value, not begun */
    RP_STRING, /* a string value's characters */
    RP_NUMBER, /* a number's characters */
    RP_WORD,   /* true, false or null */
    RP_NESTED, /* an array or object value */
    RP_AFTER,  /* what follows a value: ", ", " from \"", "; then " */
    RP_SAID,   /* the words of ' from "..."' */
    RP_OFF,    /* out of the form: nothing more is read */
};

/* where the plan is (reason_prior.c's parser) */
typedef struct {
    uint8_t st;    /* RP_* */
    uint8_t esc;   /* in a string: the last byte was a backslash */
    uint8_t quote; /* in a nested value: inside a string */
    uint8_t nb;    /* bytes in b[] */
    uint8_t then;  /* the name is a later call's, after "; then " */
    int16_t depth; /* brackets open in a nested value */
    int16_t tool;  /* the tool named (index), -1 none */
    int16_t last;  /* the last argument planned (index), -1 none */
    uint64_t used; /* the tool's first 64 arguments already planned */
    char b[64];    /* a name, an argument name or a separator so far */
} nd_reason_pos;

/* one top-level argument of a tool */
typedef struct {
    char *name;
    uint8_t types; /* the JSON kinds its value may begin as (reason_prior.c's T_*); 0 any */
    int nenum;     /* its enum, when every value is a plain ASCII string: */
    char **enums;  /* [nenum] the values */
    uint8_t *said; /* [nenum] this turn says the value (nd_choice_prior_says) */
} nd_reason_key;

typedef struct {
    char *name;
    int nkeys;
    nd_reason_key *keys; /* [nkeys] in their declared order */
    uint64_t req;        /* which of the first 64 are required */
    int nreq;
    int *req_order; /* [nreq] the required ones (indices) in "required"'s order */
} nd_reason_tool;

typedef struct {
    float key_bonus;      /* added to a piece that writes an argument name; 0: off */
    float enum_bonus;     /* added to a piece that writes an enum value the turn says */
    int id_end;           /* the piece that ends the reasoning */
    int n;                /* tools */
    nd_reason_tool *tool; /* [n] */
    int active;           /* this turn is a request (not a tool's result) */
    nd_reason_pos at;
    nd_buf value;  /* the value being written, from its first byte (after a string's quote) */
    float *biased; /* [V] logits plus bonuses */
    uint8_t *mark; /* [V] this step's verdict on each piece (reason_prior.c's M_*) */
    int nkeyed;    /* how many pieces write an argument name */
} nd_reason_prior;

/* The default key bonus, chosen on the built-in base's zero-shot scores
 * (docs/engine.md, "The reasoning prior"). */
#define ND_REASON_KEY_BONUS 10.0f

/* For the tools array `tools` (as nd_choice_prior_init takes it) and a
 * model of V pieces whose reasoning ends with piece id_end; key_bonus 0:
 * off (the reasoning is the model's). */
int nd_reason_prior_init(nd_reason_prior *p, const nd_pj *tools, int V, int id_end,
                         float key_bonus);
void nd_reason_prior_free(nd_reason_prior *p);
/* A new turn; active: it is a request (the prior acts on its reasoning);
 * choice: the choice prior, its turn set (which enum values it says, and
 * its enum bonus). */
void nd_reason_prior_turn(nd_reason_prior *p, int active, const nd_choice_prior *choice);
/* One reasoning step: the logits the pick reads (logits, or a biased
 * copy); feed: the piece picked. The copy prior c gives the values'
 * bonuses (its sources set for the turn); feed marks the words a value
 * copied as taken (nd_copy_prior_take), for the call's other values
 * (c may be NULL: none). */
const float *nd_reason_prior_logits(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c,
                                    const float *logits, const uint8_t *allowed);
void nd_reason_prior_feed(nd_reason_prior *p, const needle_model *M, nd_copy_prior *c, int t);
/* The parser alone (for the tests): one byte of reasoning. */
void nd_reason_prior_step(const nd_reason_prior *p, nd_reason_pos *s, unsigned char b);
/* The copy prior's kind of the byte position s is at: ND_GRAM_IN_STRING,
 * ND_GRAM_IN_NUMBER, ND_GRAM_AT_VALUE or 0. */
int nd_reason_prior_kind(const nd_reason_pos *s);

#endif
