/* The copy prior: while a call writes a string or number value, pieces
 * that copy a span of the turn's own words get a bonus added to their
 * logits before the grammar-masked pick.
 *
 * Why: a small base chooses the right tool long before it copies values
 * reliably; its misses are values made up from words it saw in training
 * ("DataSet1.csv" -> "puth_watchlist_eek"), cut short ("limit 33" -> 3) or
 * run on ("8dba3a6a-..." -> "8dba6a6a6a..."). The grammar keeps a value
 * well formed; this keeps it close to what the user said. It stays a
 * prior: the model's own logits still choose where a value starts, where
 * it ends, and whether it is a copy at all (dates reformatted, words the
 * user did not say).
 *
 * The source is the turn's text, the system text, and the turn's text
 * with numbers said in words written as digits and thousands separators
 * dropped ("two hundred and ninety-six grams" -> "296 grams", "1,500" ->
 * "1500"). A copy starts at a word's start (the byte before it is no
 * letter or digit); a number copies a whole number of the text ("8" of
 * "8bdf" is none). Three bonuses:
 *
 *  - start: a value's first bytes that start a copy, after the value's
 *    quote; a piece that writes the quote and first bytes that start no
 *    copy loses it (relative to the rest, the same as every other piece
 *    gaining it), so the quote alone and the quote joined with a copy's
 *    first bytes stay as the model ranks them. Letters are compared
 *    without case there and where a value ends ("ZETA" for "Zeta Corp"
 *    keeps its logit);
 *  - inside: a value so far that is a copy stopping inside a word
 *    ("6dcc" of "6dcccc96", "29" of "296"; a string needs two bytes to
 *    say which word): the pieces that go on copying (large: the word is
 *    not done);
 *  - edge: where a copy may end, or go on past a word's end over a space
 *    or a joining character, both the pieces that go on copying and
 *    those that close the value.
 *
 * An inside bonus of 0 is off: the decoder's picks are the model's. */
#ifndef ND_COPY_PRIOR_H
#define ND_COPY_PRIOR_H

#include <stdint.h>

#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "text/pyjson.h"

typedef struct {
    nd_buf src;        /* the source texts, each followed by a 0 byte */
    float bonus;       /* added to the logit of a piece that copies inside a word; 0: off */
    float edge_bonus;  /* the same where a copy may end, or go on past a word's end */
    float start_bonus; /* the same for a value's first bytes that start a copy */
    float quote_bonus; /* added to start_bonus where the copy starts a quoted span */
    float name_bonus;  /* added to start_bonus where the turn names the argument before it */
    char key[32];      /* the argument being written: its name's last word, lower case */
    int key_n;         /* its length; 0: none (nd_copy_prior_key) */
    int inside;        /* the value so far is a copy that stops inside a word */
    int closes;        /* the value so far is a copy that may end here */
    uint8_t *mark;     /* [V] tokens that continue a copy this step */
    uint8_t *taken;    /* [src.n] a copy starting there was written already (take) */
    int32_t *quote;    /* [src.n] a quoted span's end at its start, -1 inside one, else 0 */
} nd_copy_prior;

/* The defaults, chosen on the built-in base's fine-tuned and zero-shot
 * scores (docs/engine.md, "The copy prior"): an edge bonus past ~8 makes
 * values run on past their end. */
#define ND_COPY_EDGE_BONUS 6.0f
#define ND_COPY_INSIDE_BONUS 20.0f
#define ND_COPY_START_BONUS 12.0f
#define ND_COPY_QUOTE_BONUS 4.0f
#define ND_COPY_NAME_BONUS 3.0f
#define ND_COPY_N_BONUS 5

/* The bonuses NEEDLE_COPY_PRIOR asks for, as b[] = {edge, inside,
 * start, quote, name}: unset, the defaults; "0" or "off", none;
 * "EDGE,INSIDE,START[,QUOTE[,NAME]]", those (each 0 .. 100, INSIDE > 0;
 * those left out keep their defaults). ND_EARG names the variable and its
 * value. */
int nd_copy_prior_setting(const char *env, float b[ND_COPY_N_BONUS]);
/* Allocate for model M with bonuses b (nd_copy_prior_setting's); an
 * inside bonus of 0 makes every later call a no-op. */
int nd_copy_prior_init(nd_copy_prior *c, const needle_model *M, const float b[ND_COPY_N_BONUS]);

void nd_copy_prior_free(nd_copy_prior *c);
/* An argument name's last word key[0..n), lower-cased, into out[0..cap):
 * its length, 0 when there is none or it does not fit ("daily_budget" ->
 * "budget", "maxResults" -> "results", "num1" -> "num1"). */
int nd_name_last_word(const char *key, int n, char *out, int cap);
/* The argument the call is writing (its name; NULL: none), for the name
 * bonus: a copy the turn names the argument before ("a=2", "base of 10",
 * "height 5") gets it where it starts. */
void nd_copy_prior_key(nd_copy_prior *c, const char *key, int n);
/* nd_copy_prior_key for the argument a call's JSON call[0..len) writes
 * or opens next: end is where its value starts (a string's opening quote,
 * a number's first byte), or len when the call is in no value; the key
 * is the last "KEY": before end (within 256 bytes). With end == len, a
 * key still being written or still to come ("...,\"lim", "...,") is
 * none yet, and a key the call ends with ("...,\"limit\"") is that one.
 * Why: a piece such as `":2` ends a key and begins its value; the key
 * before it was taken for the value's. */
void nd_copy_prior_call_key(nd_copy_prior *c, const char *call, int len, int end);
/* The sources of one turn (system may be NULL). */
int nd_copy_prior_set(nd_copy_prior *c, const char *turn_text, const char *system);

/* One decoding step: begin clears the marks; the grammar's walk over the
 * vocabulary calls token for each accepted piece t (path[0..len), with
 * inval[k] the value the call is in after k of its bytes: 0 or an
 * ND_GRAM_IN_* kind; pre[0..npre) the value written before the piece),
 * which marks a piece that opens or closes a value where that value is a
 * copy; mark marks the pieces that go on copying inside the value the
 * state is in (pos, value[0..n): nd_gram_value_pos's answer); add adds
 * the bonus to the marked allowed logits. */
void nd_copy_prior_begin(nd_copy_prior *c, int V, int pos, const unsigned char *value, int n);
void nd_copy_prior_token(nd_copy_prior *c, int t, const unsigned char *pre, int npre,
                         const unsigned char *path, int len, const signed char *inval);
void nd_copy_prior_mark(nd_copy_prior *c, const needle_model *M, int pos,
                        const unsigned char *value, int n, const uint8_t *allowed);
void nd_copy_prior_add(const nd_copy_prior *c, const uint8_t *allowed, int V, float *logits);

/* A value v[0..n) is written: the first span of each source text it
 * copies no longer starts a copy (until untake), so the next value is
 * copied from other words. Why: a plan's arguments copy different words
 * of the request ("zone 7702 for one hour": hours is not 7702 again). */
void nd_copy_prior_take(nd_copy_prior *c, const unsigned char *v, int n, int numeric);
void nd_copy_prior_untake(nd_copy_prior *c);

/* Where the quoted span whose first byte is s[st] ends (the byte of its
 * closing quote), or st when none starts there: ' " ` or curly quotes,
 * the opening one after no letter or digit, the closing one before none,
 * on one line, within 256 bytes ("Zeta Corp's" holds no closing quote).
 * s is 0-terminated. */
size_t nd_quoted_end(const char *s, size_t st);
/* The next quoted span of s[0..len) starting at or after *at, as the
 * priors read a text's spans left to right (none inside another, and a
 * closing quote opens none): its first byte in *st, its closing quote's
 * byte returned, *at moved past it; len when there is none. */
size_t nd_quoted_next(const char *s, size_t len, size_t *at, size_t *st);

/* A string value v[0..n) so far runs on: its last ND_COPY_RUN_ON bytes
 * occur earlier in it too (overlapping or not) and the source does not
 * hold them twice. The decoder then closes the value. Why: the base's
 * misses ran on for hundreds of bytes ("a canceled buy order forlorng a
 * canceled buy order forlorving a canceled buy ...", "ininin...Inin...")
 * past the grammar's guard against a strict cycle (ND_GRAM_STR_PERIODIC);
 * 10% of BFCL's zero-shot answers held such a value. Real values rarely
 * repeat 16 bytes the user did not. 0 when the prior is off. */
#define ND_COPY_RUN_ON 16
int nd_copy_prior_runs_on(const nd_copy_prior *c, const unsigned char *v, int n);

/* A string value v[0..n) so far is a whole quoted span of the source,
 * copied from its start, and no longer quoted span begins with it. The
 * decoder then closes the value. Why: zero-shot the base ran on past the
 * closing quote ("Google' filed", "LeBron James' from", "Queen'") in 45
 * of BFCL's 1,096 single-turn answers; of 430 expected values in the
 * evaluation files that begin with a quoted span, 425 end with it. 0 when
 * the prior is off. */
int nd_copy_prior_quote_done(const nd_copy_prior *c, const unsigned char *v, int n);

/* A string value v[0..n) so far is a whole #tag or @mention of the source
 * ('#' or '@' after no letter or digit, then letters, digits and '_' up to
 * a byte that is none), and no longer tag of the source begins with it.
 * The decoder closes an array's string item then. Why: fine-tuned on
 * BFCL's Twitter API the base wrote tags ["#CarMaintenance and tag "] and
 * ["#Journey, #SmoothRide, #Grateful"]; every one of the 26 tags and
 * mentions in BFCL's expected array items is a whole tag. 0 when the
 * prior is off. */
int nd_copy_prior_tag_done(const nd_copy_prior *c, const unsigned char *v, int n);

/* Append `text` with numbers said in words as digits and the thousands
 * separators of digit groups dropped (exposed for the tests). */
int nd_copy_numbers_as_digits(const char *text, nd_buf *out);

#endif
