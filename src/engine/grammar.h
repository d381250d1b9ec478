/* Tool-call grammar: the declared tools' JSON schemas compiled into a
 * byte-level pushdown automaton over the compact JSON text of a call list
 *
 *   [{"name":<declared name>,"arguments":{...}}, ...]   or   []
 *
 * (no whitespace outside strings, as training renders answers). The state
 * is a small value type (a stack of frames) so the decoder can copy it
 * while testing a vocabulary piece's bytes; every accepted prefix can still
 * be completed, and nd_gram_dist gives the fewest bytes that complete it.
 *
 * Enforced keywords: type (object, string, integer, number, boolean, null,
 * array, or a list of them), nullable (OpenAPI), properties, required,
 * additionalProperties (false: no other keys; a schema: the values of an
 * object without declared properties), minProperties / maxProperties (on
 * such maps), enum, const, minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (number or draft-4 boolean), minLength, maxLength,
 * pattern (see regex.h; strings with a pattern are limited to printable
 * ASCII), format (date, time, date-time, uuid, ipv4, email, uri as
 * patterns), items, minItems, maxItems; allOf (merged: properties and
 * required united, bounds tightened, types and enums intersected), local
 * $ref ("#/definitions/..", "#/$defs/..", "#/components/schemas/..", any
 * JSON pointer into the tool's parameters schema; a recursive one is
 * followed two levels deep), anyOf / oneOf (alternatives; oneOf's "exactly
 * one" cannot be enforced by a grammar and is read as anyOf).
 *
 * Enums may have any number of values (sorted when compiled: the decoder
 * narrows the candidates by binary search, byte by byte), and objects any
 * number of properties: up to ND_GRAM_MAX_PROPS (320, the keys a frame can
 * mark as written) in any order, more in declaration order only, with a
 * warning naming tool and path.
 *
 * Objects with declared properties admit only those. An object without
 * properties, or a value without a type, admits any JSON value. Numbers
 * are written without exponent, at most 15 digits. Alternatives are told
 * apart by their first byte: two of the same kind (two object shapes, two
 * string patterns) widen to any value of that kind, with a warning.
 *
 * Nothing is silently mis-read: what cannot be enforced (a pattern with
 * lookaround or back-references, a non-local $ref, unknown keywords such
 * as not / if / patternProperties / multipleOf / uniqueItems) is dropped
 * with a warning naming the tool and the JSON path. Annotations are quiet:
 * description, title, default, example(s), $schema, $id, $comment,
 * readOnly, writeOnly, deprecated, discriminator, xml, externalDocs,
 * contentMediaType, contentEncoding, and x-* extensions. */
#ifndef ND_GRAMMAR_H
#define ND_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "text/pyjson.h"

#define ND_GRAM_DEPTH 24
#define ND_GRAM_MAX_ALT 64 /* tools in one grammar (anyOf/oneOf: any number) */

typedef struct nd_grammar nd_grammar;

typedef struct {
    uint16_t node;
    uint8_t kind, phase;
    int32_t count;  /* literal/key position, string chars, array items */
    int32_t cur;    /* object: current property; call: chosen tool */
    uint64_t mask;  /* call: tool candidates; literal/key: candidate range */
    uint64_t re[5]; /* string pattern state (ND_RE_WORDS); object: used properties */
    uint8_t esc;    /* string: 1 after '\\', 2..5 = \u hex digits left + 1 */
    uint8_t u8left; /* string: UTF-8 continuation bytes still expected */
    uint8_t u8lo, u8hi;
    uint8_t nlen;
    char num[23];
} nd_gram_frame;

typedef struct {
    int depth;
    nd_gram_frame f[ND_GRAM_DEPTH];
} nd_gram_state;

/* Compile from the parsed tools array (each {"name", "parameters"?, ...}, or
 * {"type": "function", "function": {...}}). Warnings about ignored schema
 * keywords are collected (nd_gram_warnings). */
int nd_gram_compile(const nd_pj *tools, nd_grammar **out);
/* Check every tool of a catalogue of any size as nd_gram_compile would
 * (the same errors, naming tools[i]; a name declared twice) and append
 * its warnings (newline-separated) to `warnings`, without keeping a
 * grammar: retrieval compiles the rendered subset's. */
int nd_gram_validate(const nd_pj *tools, nd_buf *warnings);
void nd_gram_free(nd_grammar *g);
/* "" or newline-separated warnings */
const char *nd_gram_warnings(const nd_grammar *g);
int nd_gram_num_tools(const nd_grammar *g);
/* Disallow the empty list [] (at least one call; no effect without tools). */
void nd_gram_require_call(nd_grammar *g, int on);

void nd_gram_init(const nd_grammar *g, nd_gram_state *s);
/* Feed one byte; 1 = accepted (state advanced), 0 = rejected (state is then
 * unspecified: feed a copy). */
int nd_gram_feed(const nd_grammar *g, nd_gram_state *s, unsigned char b);
/* 1 once the whole call list has been closed. */
int nd_gram_done(const nd_gram_state *s);
/* Where the next byte goes, for the copy prior (copy_prior.h):
 * ND_GRAM_IN_STRING, a string's characters (its quote written);
 * ND_GRAM_IN_NUMBER, a number's (*num, *nlen: its bytes so far);
 * ND_GRAM_AT_VALUE, a property's value, not begun (its key's colon
 * written); else 0. */
enum { ND_GRAM_IN_STRING = 1, ND_GRAM_IN_NUMBER, ND_GRAM_AT_VALUE };
int nd_gram_value_pos(const nd_gram_state *s, const char **num, int *nlen);
/* 1 between an argument array's items or inside a number or literal
 * item (not a string's: its own rules close it), else 0 */
int nd_gram_in_array(const nd_gram_state *s);
/* 1 inside a string that is an argument array's item, else 0 */
int nd_gram_string_item(const nd_gram_state *s);
/* Where a call's tool name is written, for the tool prior (tool_prior.h):
 * the number of the call the state is in (1 = the first), once its "{"
 * is written and until its name is done, with *cands the bitmask of the
 * grammar's tools (nd_gram_tool_name's order) the bytes so far leave;
 * after the name (its arguments), the call's number with the one tool;
 * 0 outside a call. */
int nd_gram_naming(const nd_gram_state *s, uint64_t *cands);
/* Inside an enum or const value, for the choice prior: 1, with the
 * candidates the bytes so far leave as lits[*lo .. *hi) (JSON texts,
 * quotes included, of lens[]); else 0. */
int nd_gram_literal(const nd_grammar *g, const nd_gram_state *s, char *const **lits,
                    const int **lens, int *lo, int *hi);
/* An object's optional keys a caller favours (the choice prior's: those
 * the turn says): said(ctx, key, len) for each optional property of each
 * object (its first 64; key the JSON text, quotes included) sets its bit
 * in (*mask)[node] (malloc'ed, one word per node; free it). */
int nd_gram_key_marks(const nd_grammar *g, int (*said)(void *ctx, const char *key, int len),
                      void *ctx, uint64_t **mask);
/* Where an object's key is written (the innermost frame is an object
 * with declared properties, its key's opening quote written, its colon
 * not yet): 1 when every required key is written and a key the bytes so
 * far leave, not written yet, has its bit in mask[node], else 0; -1
 * anywhere else. */
int nd_gram_key_marked(const nd_grammar *g, const nd_gram_state *s, const uint64_t *mask);
/* The grammar's i-th tool's name as JSON text (quotes included). */
const char *nd_gram_tool_name(const nd_grammar *g, int i, int *len);
/* Fewest bytes that complete the call list from this state (known limit:
 * inside a string with a pattern, a character that has to be escaped --
 * quote, backslash, \b \f \n \r \t -- counts as one byte, not two). */
int nd_gram_dist(const nd_grammar *g, const nd_gram_state *s);

/* Append one random call list the grammar accepts (compact JSON, what the
 * decoder may let a model write): a seeded walk over the accepted bytes,
 * free while shorter than soft_len bytes (with a pull towards closing
 * values), then along shortest completions. An error (ND_EFORMAT, with the
 * bytes so far) means the grammar broke its promise: a dead end or no way
 * to close. */
int nd_gram_sample(const nd_grammar *g, nd_rng *r, int soft_len, nd_buf *out);

/* Copy only the live part of a state. */
static inline void nd_gram_copy(nd_gram_state *dst, const nd_gram_state *src)
{
    dst->depth = src->depth;
    for (int i = 0; i < src->depth; i++)
        dst->f[i] = src->f[i];
}

#endif
