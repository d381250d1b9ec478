/* A small regex engine for JSON-schema "pattern" constraints: Thompson NFA
 * over ASCII characters with state sets as 320-bit masks, so a decoding
 * state can carry "where the pattern is" by value.
 *
 * Supported: literals, escapes (\d \w \s \D \W \S \n \t \r \f \v and
 * escaped punctuation), '.', character classes with ranges and negation,
 * groups (also (?:...) and named (?<n>...) / (?P<n>...)), alternation, the
 * quantifiers * + ? {m} {m,} {m,n} (lazy forms match the same strings), and
 * anchors ^ at the start / $ at the end of a top-level branch (^a|b$ is
 * (^a)|(b$)). As JSON Schema says, a pattern without anchors may match
 * anywhere in the string.
 *
 * Everything else is refused with ND_EUNSUPPORTED, never read as literal
 * text: lookahead/lookbehind (?= (?! (?<= (?<!, inline flags, back-references
 * \1 \k<n>, word boundaries \b \B, any other letter or digit escape (\u \x
 * \p ...), anchors inside groups, non-ASCII characters, and a quantifier
 * with nothing to repeat. */
#ifndef ND_REGEX_H
#define ND_REGEX_H

#include <stdint.h>

#define ND_RE_MAX_STATES 320
#define ND_RE_WORDS (ND_RE_MAX_STATES / 64)

typedef struct {
    uint64_t w[ND_RE_WORDS];
} nd_re_set;

typedef struct {
    int n, start, accept;
    struct {
        int eps[2];      /* epsilon targets (-1 none) */
        int next;        /* char-edge target (-1 none) */
        uint64_t cls[2]; /* characters 0..127 of the char edge */
    } st[ND_RE_MAX_STATES];
    nd_re_set closure[ND_RE_MAX_STATES];
    int dist[ND_RE_MAX_STATES]; /* fewest characters from the state to accept */
} nd_regex;

/* Compile; on failure returns ND_EUNSUPPORTED / ND_ELIMIT with a message. */
int nd_re_compile(const char *pattern, nd_regex *re);
nd_re_set nd_re_initial(const nd_regex *re);
/* Advance by one character (0..127); an empty set means no match possible. */
nd_re_set nd_re_step(const nd_regex *re, nd_re_set s, int ch);
int nd_re_empty(nd_re_set s);
int nd_re_accepts(const nd_regex *re, nd_re_set s);
/* Fewest further characters to reach a match (large if none). */
int nd_re_dist(const nd_regex *re, nd_re_set s);
/* Fewest further characters t with lo <= t <= hi (hi = INT_MAX: no
 * bound) after which a match is possible, counting only characters a JSON
 * string under a pattern can hold; -1 if there is none. Exact, unlike
 * nd_re_dist, when a minimum length also applies. */
int nd_re_len_min(const nd_regex *re, nd_re_set s, int lo, int hi);
/* Whole-string match (for tests). */
int nd_re_match(const nd_regex *re, const char *s);

#endif
