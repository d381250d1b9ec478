/* Synthetic training examples from a chat model (upstream finetune.py's
 * generate_examples / _parse_array / _dedup_key): the prompt that asks for
 * a JSON array of {"query", "reasoning", "answers"} objects, tolerant
 * parsing of the reply, and a strict gate on what is kept -- every answer
 * must satisfy its tools' JSON schemas (the engine's tool-call grammar,
 * engine/grammar.h) and the example must render (text/render.h) -- plus
 * de-duplication by normalised query and answers. No network here: the
 * requests themselves are net/generate.c's. */
#ifndef ND_GEN_EXAMPLES_H
#define ND_GEN_EXAMPLES_H

#include <stddef.h>

#include "text/pyjson.h"

/* The system turn of every request. */
extern const char nd_gen_system_prompt[];

/* The user turn: the schemas as JSON, n examples wanted, about `refusals`
 * of them off-topic (answers []). Appended to out. */
int nd_gen_user_prompt(const nd_pj *tools, int n, int refusals, nd_buf *out);

typedef struct {
    size_t replies;    /* replies offered */
    size_t unparsable; /* replies with no JSON array of examples in them */
    size_t offered;    /* array elements seen */
    size_t kept;       /* examples accepted */
    size_t invalid;    /* dropped: not an example, schema violation, does not render */
    size_t duplicate;  /* dropped: same normalised query + answers as a kept one */
} nd_gen_counts;

typedef struct nd_gen_set nd_gen_set;

/* An empty set of examples for these tools (the parsed tools array; the
 * grammar is compiled from it, and it is copied into every kept example).
 * The tools value must outlive the set. */
int nd_gen_set_new(const nd_pj *tools, nd_gen_set **out);
void nd_gen_set_free(nd_gen_set *s);

/* Parse one reply and keep its valid, new examples, at most until the set
 * holds `cap` examples (0 = no cap; the rest are neither kept nor counted).
 * Returns how many were kept. The reply may wrap the array in prose or a
 * ```json fence. */
size_t nd_gen_add_reply(nd_gen_set *s, const char *text, size_t len, size_t cap);

/* Mark an already-seen example (e.g. a line of the data being augmented) so
 * generated copies of it count as duplicates. Not kept, not counted. */
void nd_gen_seen(nd_gen_set *s, const nd_pj *example);

size_t nd_gen_size(const nd_gen_set *s);
/* Kept example i as one JSONL line (json.dumps with Python's default
 * separators, no newline): {"query", "reasoning"?, "answers", "tools"}. */
const char *nd_gen_line(const nd_gen_set *s, size_t i, size_t *len);
const nd_gen_counts *nd_gen_get_counts(const nd_gen_set *s);
/* Warnings of the schema compiler (keywords it does not enforce), "" if none. */
const char *nd_gen_warnings(const nd_gen_set *s);
/* Why the first dropped-invalid example was dropped ("" if none). */
const char *nd_gen_first_invalid(const nd_gen_set *s);
/* Why the first unparsable reply was (which reply, what was wrong, how it
 * began; "" if none). Quotes the reply: redact before printing. */
const char *nd_gen_first_unparsable(const nd_gen_set *s);

#endif
