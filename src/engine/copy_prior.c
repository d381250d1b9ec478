/* The copy prior (copy_prior.h): a bonus for tokens that copy the turn's
 * words into a call's value. */
#include "engine/copy_prior.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* What a piece gets this step (nd_copy_prior.mark[]): a kind and flags.
 * The kinds: the edge bonus, the inside bonus, the start bonus (a value's
 * first bytes that start a copy, after its quote), the start bonus taken
 * away (a piece that writes a value's first bytes, quote and all, that
 * start no copy: relative to the rest, the same as every other piece
 * gaining it), or none of those for a piece that writes a value's quote
 * and the first bytes of a copy (they keep the model's rank against the
 * quote alone). The flags add the quote bonus (inside a quoted span's
 * copy from its start, or at that start) and the name bonus (a copy where
 * the turn names the argument: "a=2", "base of 10"). */
enum { K_NONE, K_EDGE, K_INSIDE, K_START, K_NOT_START, K_OPEN };
#define F_QUOTED 8
#define F_NAMED 16

static float bonus_of(const nd_copy_prior *c, uint8_t m)
{
    float b = 0.0f;
    switch (m & 7) {
    case K_EDGE: b = c->edge_bonus; break;
    case K_INSIDE: b = c->bonus; break;
    case K_START: b = c->start_bonus; break;
    case K_NOT_START: return -c->start_bonus;
    default: break;
    }
    return b + (m & F_QUOTED ? c->quote_bonus : 0.0f) + (m & F_NAMED ? c->name_bonus : 0.0f);
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int is_alpha(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_alnum(int c)
{
    return is_digit(c) || is_alpha(c);
}

int nd_copy_prior_setting(const char *env, float b[ND_COPY_N_BONUS])
{
    b[0] = ND_COPY_EDGE_BONUS;
    b[1] = ND_COPY_INSIDE_BONUS;
    b[2] = ND_COPY_START_BONUS;
    b[3] = ND_COPY_QUOTE_BONUS;
    b[4] = ND_COPY_NAME_BONUS;
    if (!env || !*env)
        return ND_OK;
    if (!strcmp(env, "0") || !strcmp(env, "off")) {
        b[0] = b[1] = b[2] = b[3] = b[4] = 0.0f;
        return ND_OK;
    }
    /* three to five numbers; those left out keep their defaults */
    const char *p = env;
    int ok = 1, i = 0;
    for (; i < ND_COPY_N_BONUS && ok; i++) {
        char *end;
        double v = strtod(p, &end);
        ok = end != p && v >= 0 && v <= 100 &&
             (*end == ',' ? i < ND_COPY_N_BONUS - 1 : *end == '\0' && i >= 2);
        b[i] = (float)v;
        p = end + 1;
        if (ok && *end == '\0')
            break;
    }
    if (!ok || b[1] <= 0.0f)
        return nd_error(
            ND_EARG,
            "NEEDLE_COPY_PRIOR='%s': expected 0 (off) or EDGE,INSIDE,START[,QUOTE[,NAME]] "
            "bonuses (each 0..100, INSIDE > 0; the default is %g,%g,%g,%g,%g)",
            env, (double)ND_COPY_EDGE_BONUS, (double)ND_COPY_INSIDE_BONUS,
            (double)ND_COPY_START_BONUS, (double)ND_COPY_QUOTE_BONUS, (double)ND_COPY_NAME_BONUS);
    return ND_OK;
}

int nd_copy_prior_init(nd_copy_prior *c, const needle_model *M, const float b[ND_COPY_N_BONUS])
{
    memset(c, 0, sizeof *c);
    c->edge_bonus = b[0];
    c->bonus = b[1];
    c->start_bonus = b[2];
    c->quote_bonus = b[3];
    c->name_bonus = b[4];
    if (c->bonus == 0.0f)
        return ND_OK;
    int V = M->m.dims.V;
    if (!(c->mark = calloc((size_t)V, 1)))
        return nd_error(ND_ENOMEM, "copy prior: out of memory");
    return ND_OK;
}

void nd_copy_prior_free(nd_copy_prior *c)
{
    nd_buf_free(&c->src);
    free(c->mark);
    free(c->taken);
    free(c->quote);
    memset(c, 0, sizeof *c);
}

/* ---- numbers said in words ---- */

static const char *const SMALL[] = {"zero",    "one",     "two",       "three",    "four",
                                    "five",    "six",     "seven",     "eight",    "nine",
                                    "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                    "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
static const char *const TENS[] = {"twenty", "thirty",  "forty",  "fifty",
                                   "sixty",  "seventy", "eighty", "ninety"};

/* the word at s of length n, compared without case */
static int word_is(const char *s, int n, const char *w)
{
    if ((int)strlen(w) != n)
        return 0;
    for (int i = 0; i < n; i++) {
        int ch = s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i];
        if (ch != w[i])
            return 0;
    }
    return 1;
}

/* the value of a number word: 0..19, 20..90, 100, 1000, 1000000; else -1 */
static long word_value(const char *s, int n)
{
    for (int i = 0; i < 20; i++)
        if (word_is(s, n, SMALL[i]))
            return i;
    for (int i = 0; i < 8; i++)
        if (word_is(s, n, TENS[i]))
            return 20 + 10L * i;
    if (word_is(s, n, "hundred"))
        return 100;
    if (word_is(s, n, "thousand"))
        return 1000;
    if (word_is(s, n, "million"))
        return 1000000;
    return -1;
}

/* One number phrase starting at a word at s ("two hundred and ninety-six",
 * "twenty one", "forty-two thousand"): its value and length, or 0 bytes
 * when s starts no number word. Words are joined by one space or hyphen;
 * "and" only between a hundred and what follows. A word that cannot
 * extend the number ("twenty twenty") ends it before that word. */
static int number_phrase(const char *s, long *value)
{
    long total = 0, cur = 0;
    int pos = 0, end = 0, any = 0, after_hundred = 0;
    for (;;) {
        int n = 0;
        while (is_alpha(s[pos + n]))
            n++;
        if (!n)
            break;
        long w = word_value(s + pos, n);
        if (w < 0 && any && after_hundred && word_is(s + pos, n, "and") && s[pos + n] == ' ') {
            int m = 0;
            while (is_alpha(s[pos + n + 1 + m]))
                m++;
            long nx = word_value(s + pos + n + 1, m);
            if (nx > 0 && nx < 100) {
                pos += n + 1;
                after_hundred = 0;
                continue;
            }
        }
        if (w < 0)
            break;
        if (w == 0) { /* "zero" is a number on its own only */
            if (!any)
                end = pos + n;
            any = 1;
            break;
        }
        if (w < 20) {
            if (cur % 100 != 0 && !(cur % 100 >= 20 && cur % 10 == 0 && w < 10))
                break; /* units after units or after a teen */
            cur += w;
        } else if (w < 100) {
            if (cur % 100 != 0)
                break;
            cur += w;
        } else if (w == 100) {
            if (!any || cur == 0 || cur >= 100)
                break;
            cur *= 100;
        } else {
            if (!any || (cur == 0 && total == 0) || cur >= w)
                break;
            total += cur * w;
            cur = 0;
        }
        any = 1;
        after_hundred = w == 100 || w >= 1000;
        pos += n;
        end = pos;
        if ((s[pos] == ' ' || s[pos] == '-') && is_alpha(s[pos + 1]))
            pos++;
        else
            break;
    }
    *value = total + cur;
    return any ? end : 0;
}

/* numbers said in words, as digits */
static int words_as_digits(const char *text, nd_buf *out)
{
    int rc = ND_OK;
    size_t i = 0, len = strlen(text);
    while (i < len && !rc) {
        long v;
        int n;
        if (is_alpha(text[i]) && (i == 0 || !is_alnum(text[i - 1])) &&
            (n = number_phrase(text + i, &v)) > 0 && !is_alnum(text[i + (size_t)n])) {
            char d[24];
            int k = snprintf(d, sizeof d, "%ld", v);
            rc = nd_buf_put(out, d, (size_t)k);
            i += (size_t)n;
        } else {
            rc = nd_buf_put(out, text + i, 1);
            i++;
        }
    }
    return rc;
}

/* "1,500" -> "1500": a comma between a digit and a group of three. Run
 * after words_as_digits, so its digits count too, and a second pass finds
 * nothing more to do (a removal only lengthens a run of digits, and a
 * comma before a run of four or more stays). */
static int drop_group_commas(const char *text, size_t len, nd_buf *out)
{
    int rc = ND_OK;
    for (size_t i = 0; i < len && !rc; i++)
        if (!(text[i] == ',' && i > 0 && is_digit(text[i - 1]) && i + 3 < len &&
              is_digit(text[i + 1]) && is_digit(text[i + 2]) && is_digit(text[i + 3]) &&
              !is_digit(text[i + 4])))
            rc = nd_buf_put(out, text + i, 1);
    return rc;
}

int nd_copy_numbers_as_digits(const char *text, nd_buf *out)
{
    nd_buf words = {0};
    int rc = words_as_digits(text, &words);
    if (!rc && words.n)
        rc = drop_group_commas(words.p, words.n, out);
    nd_buf_free(&words);
    return rc;
}

static int mark_quoted_spans(nd_copy_prior *c);

int nd_copy_prior_set(nd_copy_prior *c, const char *turn_text, const char *system)
{
    if (c->bonus == 0.0f)
        return ND_OK;
    c->src.n = 0;
    c->key_n = 0;
    free(c->taken);
    free(c->quote);
    c->taken = NULL;
    c->quote = NULL;
    int rc = nd_buf_put(&c->src, turn_text, strlen(turn_text) + 1);
    if (!rc && system)
        rc = nd_buf_put(&c->src, system, strlen(system) + 1);
    if (!rc) {
        nd_buf digits = {0};
        rc = nd_copy_numbers_as_digits(turn_text, &digits);
        if (!rc && digits.n && strcmp(digits.p, turn_text))
            rc = nd_buf_put(&c->src, digits.p, digits.n + 1);
        nd_buf_free(&digits);
    }
    if (!rc && !(c->taken = calloc(c->src.n + 1, 1)))
        rc = ND_ENOMEM;
    if (!rc)
        rc = mark_quoted_spans(c);
    return rc ? nd_error(rc, "copy prior: out of memory") : ND_OK;
}

/* Whether a value may end before src[e]: a string at a word's end, a
 * number where no digit (or decimal point and digit) follows. */
static int may_end_before(const char *s, int numeric)
{
    if (numeric) /* "8" is no number of "8bdf" */
        return !is_alnum((unsigned char)s[0]) && !(s[0] == '.' && is_digit(s[1]));
    return !is_alnum((unsigned char)s[0]);
}

/* whether a copy of n bytes that s follows stops inside a word. A
 * string's first letter counts too: the built-in base, zero-shot, wrote
 * "bil" for "basil" and "car" for "cactus" when only two letters said
 * the word (nd_copy_prior_mark lets a capital go on in capitals) */
static int stops_inside(const char *s, int n, int numeric)
{
    return n >= 1 && !may_end_before(s, numeric);
}

/* The end of the source's run of bytes at st up to a space, a quote or a
 * line's end, less trailing punctuation ("callback." ends before the
 * point), and whether the run is one compound value: an id, a date, a
 * URL or an address, which has a joining character and a digit, or "://"
 * or "@" ("8dba3a6a-07df-...", "doc_91047", "2026-01-09", "me@host"). */
static size_t compound_end(const char *s, size_t st)
{
    size_t e = st;
    int digit = 0, join = 0, url = 0;
    while (s[e] && !strchr(" \t\n\r\"'", s[e])) {
        digit |= is_digit((unsigned char)s[e]);
        join |= e > st && strchr(",-_./:@+&=#", s[e]) && is_alnum((unsigned char)s[e + 1]);
        url |= s[e] == '@' || (s[e] == ':' && s[e + 1] == '/' && s[e + 2] == '/');
        e++;
    }
    while (e > st && strchr(".,;:!?)]}", s[e - 1]))
        e--;
    return (digit && join) || url ? e : st;
}

/* whether a string copy of src[st .. st + n) stops inside a compound
 * value (compound_end): a joining character inside it goes on as inside
 * a word does */
static int inside_compound(const char *s, size_t st, int n)
{
    return n >= 2 && st + (size_t)n < compound_end(s, st);
}

/* The quote mark that ends the source's bytes before st, when it opens a
 * quoted span: ' " or ` (or a curly opening quote) after no letter or
 * digit, before a byte that is no space: its closing byte(s), else NULL. */
static const char *quote_closer(const char *s, size_t st)
{
    static const char *const curly[][2] = {{"\xE2\x80\x98", "\xE2\x80\x99"},
                                           {"\xE2\x80\x9C", "\xE2\x80\x9D"}};
    if (!s[st] || s[st] == ' ' || s[st] == '\n')
        return NULL;
    if (st >= 1 && s[st - 1] && strchr("'\"`", s[st - 1]) &&
        (st == 1 || !is_alnum((unsigned char)s[st - 2])))
        return s[st - 1] == '\'' ? "'" : s[st - 1] == '"' ? "\"" : "`";
    for (int k = 0; k < 2 && st >= 3; k++)
        if (!memcmp(s + st - 3, curly[k][0], 3) && (st == 3 || !is_alnum((unsigned char)s[st - 4])))
            return curly[k][1];
    return NULL;
}

/* Where the quoted span starting at st ends (the byte of its closing
 * quote), or st when st starts none. The closing quote follows a byte
 * that is no space and comes before no letter or digit ("Zeta Corp's"
 * has no closing quote at its apostrophe), on the same line, within
 * QUOTED_MAX bytes. Why: users quote the names and texts they want used
 * ('final_report.pdf', 'Tire pressures are optimal!'); the base, reading
 * "pdf" or "Tire" as a word of its own, wrote "pdf" or stopped at the
 * first space. */
#define QUOTED_MAX 256
size_t nd_quoted_end(const char *s, size_t st)
{
    const char *q = quote_closer(s, st);
    if (!q)
        return st;
    size_t nq = strlen(q);
    for (size_t e = st + 1; s[e] && s[e] != '\n' && e - st <= QUOTED_MAX; e++)
        if (!strncmp(s + e, q, nq) && s[e - 1] != ' ' &&
            (!is_alnum((unsigned char)s[e + nq]) || strchr(".?!", s[e - 1])))
            return e;
    return st;
}

size_t nd_quoted_next(const char *s, size_t len, size_t *at, size_t *st)
{
    for (size_t k = *at; k < len; k++) {
        size_t e = nd_quoted_end(s, k);
        if (e != k) {
            *st = k;
            *at = e + 2; /* past the closing quote and the byte after it, which
                          * that quote would open ("'Hi!'. Now") */
            return e;
        }
    }
    *at = len;
    return len;
}

/* c->quote[]: at a quoted span's start its end (nd_quoted_end), -1
 * inside a quoted span (no copy starts there: 'old_report.pdf' is one
 * value, not "report.pdf" too), else 0 */
static int mark_quoted_spans(nd_copy_prior *c)
{
    const char *s = c->src.p;
    size_t L = c->src.n;
    if (!(c->quote = calloc(L + 1, sizeof *c->quote)))
        return ND_ENOMEM;
    size_t at = 0, st, e;
    while ((e = nd_quoted_next(s, L, &at, &st)) < L) {
        c->quote[st] = (int32_t)e;
        for (size_t k = st + 1; k < e; k++)
            c->quote[k] = -1;
    }
    return ND_OK;
}

/* where the quoted span starting at st ends, or st when st starts none */
static size_t quoted_end(const nd_copy_prior *c, size_t st)
{
    return c->quote && c->quote[st] > 0 ? (size_t)c->quote[st] : st;
}

/* whether a string copy of src[st .. st + n) stops inside a compound
 * value or inside a quoted span: it goes on as inside a word does */
static int inside_span(const nd_copy_prior *c, size_t st, int n)
{
    return inside_compound(c->src.p, st, n) || (n >= 1 && st + (size_t)n < quoted_end(c, st));
}

/* whether a copy that ends a word at s may go on past it: a space, or a
 * character that joins words into one value ("2107 Channing", "a.b",
 * "x-y", "me@host", "http://", "id1,id2"), then a letter or digit; not a
 * comma and a space, a sentence's end or a bracket ("Zeta Corp, I am
 * curious ..." is not one value) */
static int joins(const char *s)
{
    return s[0] && strchr(" ,-_./:@+&=#", s[0]) && is_alnum((unsigned char)s[1]);
}

/* mark the allowed tokens whose bytes are a prefix of s[0 .. max) */
static void mark_prefixes(nd_copy_prior *c, const needle_model *M, const char *s, size_t max,
                          const uint8_t *allowed, uint8_t level)
{
    int node = 0;
    for (int k = 0; s[k] && k < PIECE_MAX && (size_t)k < max; k++) {
        int ch = M->trie[node].child;
        while (ch >= 0 && M->trie[ch].byte != (unsigned char)s[k])
            ch = M->trie[ch].sibling;
        if (ch < 0)
            break;
        node = ch;
        for (int t = M->trie[node].tok; t >= 0; t = M->tok_next[t])
            if (allowed[t] && (!c->mark[t] || bonus_of(c, c->mark[t]) < bonus_of(c, level)))
                c->mark[t] = level;
    }
}

/* mark_prefixes' inside bonus for the word at s written in capitals */
static void mark_capitals(nd_copy_prior *c, const needle_model *M, const char *s,
                          const uint8_t *allowed)
{
    char up[PIECE_MAX + 1];
    int k = 0;
    for (; s[k] && k < PIECE_MAX; k++)
        up[k] = s[k] >= 'a' && s[k] <= 'z' ? (char)(s[k] - 32) : s[k];
    up[k] = 0;
    mark_prefixes(c, M, up, SIZE_MAX, allowed, K_INSIDE);
}

/* whether s starts a number of at least n bytes that no letter follows
 * ("8" of "8bdf" is none) */
static int number_span(const char *s, int n)
{
    int e = s[0] == '-' ? 1 : 0;
    while (is_digit(s[e]) || (s[e] == '.' && is_digit(s[e + 1])))
        e++;
    return e >= n && e > 0 && !is_alpha((unsigned char)s[e]);
}

static int lower(int ch)
{
    return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch;
}

/* v[0..n) equals s[0..n), ASCII letters compared without case */
static int same_nocase(const char *s, const unsigned char *v, int n)
{
    for (int i = 0; i < n; i++)
        if (lower((unsigned char)s[i]) != lower(v[i]))
            return 0;
    return 1;
}

/* whether a copy may start at s[st]: a word's start (for a number, a
 * whole number of at least n bytes) */
static int copy_start(const nd_copy_prior *c, size_t st, int numeric, int n)
{
    const char *s = c->src.p;
    if (!s[st] || (st > 0 && is_alnum((unsigned char)s[st - 1])) || (c->taken && c->taken[st]) ||
        (!numeric && c->quote && c->quote[st] < 0))
        return 0;
    if (numeric && st > 0 && s[st - 1] == '-' && (st == 1 || !is_alnum((unsigned char)s[st - 2])))
        return 0; /* "c = -4": the copy starts at its sign (not so "1-4", "2020-01") */
    return !numeric || number_span(s + st, n);
}

static int named_start(const nd_copy_prior *c, size_t st);

/* words that join an argument's name to its value: "base of 10",
 * "priority is 3", "set to 21" */
static const char *const NAME_JOINERS[] = {"of", "is", "to", "as", "at", "equals", "be"};

/* whether s[b..e) is the key's last word, caseless, maybe plural */
static int names_key(const nd_copy_prior *c, const char *s, size_t b, size_t e)
{
    size_t kn = (size_t)c->key_n;
    if (e - b != kn && !(e - b == kn + 1 && lower((unsigned char)s[e - 1]) == 's'))
        return 0;
    for (size_t i = 0; i < kn; i++)
        if (lower((unsigned char)s[b + i]) != c->key[i])
            return 0;
    return 1;
}

/* Whether the turn names the argument being written (nd_copy_prior_key)
 * just before src[st]: its name's last word, then "=" or ":" or a joining
 * word, or nothing ("height 5"), then the copy, maybe after "$", "#" or
 * an opening quote. A name of one or two letters ("a", "x") counts only
 * before "=" or ":". */
static int named_start(const nd_copy_prior *c, size_t st)
{
    if (c->key_n <= 0)
        return 0;
    const char *s = c->src.p;
    size_t i = st;
    while (i > 0 && s[i - 1] && strchr(" $#'\"", s[i - 1]))
        i--;
    int sym = i > 0 && (s[i - 1] == '=' || s[i - 1] == ':');
    if (sym)
        i--;
    else {
        size_t b = i;
        while (b > 0 && is_alpha((unsigned char)s[b - 1]))
            b--;
        for (size_t w = 0; w < sizeof NAME_JOINERS / sizeof NAME_JOINERS[0] && b < i; w++)
            if (i - b == strlen(NAME_JOINERS[w]) && word_is(s + b, (int)(i - b), NAME_JOINERS[w])) {
                i = b;
                break;
            }
    }
    while (i > 0 && s[i - 1] == ' ')
        i--;
    size_t b = i;
    while (b > 0 && is_alnum((unsigned char)s[b - 1]))
        b--;
    if (b == i || (c->key_n < 3 && !sym))
        return 0;
    return names_key(c, s, b, i);
}

int nd_name_last_word(const char *key, int n, char *out, int cap)
{
    int e = n, b;
    while (e > 0 && !is_alnum((unsigned char)key[e - 1]))
        e--;
    for (b = e; b > 0 && is_alnum((unsigned char)key[b - 1]); b--)
        if (b < e && key[b] >= 'A' && key[b] <= 'Z' && key[b - 1] >= 'a' && key[b - 1] <= 'z')
            break; /* a camelCase word starts at key[b] */
    if (e - b <= 0 || e - b >= cap)
        return 0;
    for (int i = b; i < e; i++)
        out[i - b] = (char)lower((unsigned char)key[i]);
    return e - b;
}

void nd_copy_prior_key(nd_copy_prior *c, const char *key, int n)
{
    c->key_n = key && n > 0 ? nd_name_last_word(key, n, c->key, (int)sizeof c->key) : 0;
}

void nd_copy_prior_call_key(nd_copy_prior *c, const char *call, int len, int end)
{
    if (end < 0 || end > len)
        end = len;
    if (end == len && end > 0 && call[end - 1] != ':') {
        /* not in a value: a key being written, or still to come, is none
         * yet (a piece such as `":2` writes a key's end and a value's
         * first byte; the key before it is not this value's) */
        int q = end - 1, closed = call[q] == '"';
        if (closed)
            q--;
        while (q >= 0 && !(call[q] == '"' && (q == 0 || call[q - 1] != '\\')))
            q--;
        if (call[end - 1] == '{' || call[end - 1] == ',' ||
            (q >= 1 && (call[q - 1] == '{' || call[q - 1] == ','))) {
            if (closed && q >= 1 && q < end - 1)
                nd_copy_prior_key(c, call + q + 1, end - 2 - q);
            else
                nd_copy_prior_key(c, NULL, 0);
            return;
        }
    }
    for (int j = end - 2; j >= 1 && j >= end - 256; j--) {
        if (call[j] != '"' || call[j + 1] != ':')
            continue;
        int k = j - 1;
        while (k >= 0 && !(call[k] == '"' && (k == 0 || call[k - 1] != '\\')))
            k--;
        if (k >= 0)
            nd_copy_prior_key(c, call + k + 1, j - k - 1);
        return;
    }
    nd_copy_prior_key(c, NULL, 0);
}

/* a source span at a word's start that begins with v[0..n) and, when
 * closed, ends there at a word's end (a quoted span's copy: at its
 * closing quote); letters compared without case here (a value's first
 * bytes and its end), so "ZETA" for "Zeta Corp" is no made-up value: the
 * model's own casing stands. 0 where none; else the best such span's
 * mark for a piece that opens the value with it (K_OPEN and its flags:
 * F_QUOTED where it starts a quoted span, F_NAMED where the turn names
 * the argument before it). */
static int is_copy(const nd_copy_prior *c, const unsigned char *v, int n, int numeric, int closed)
{
    const char *s = c->src.p;
    size_t L = c->src.n;
    int found = 0;
    for (size_t st = 0; st + (size_t)n < L; st++) {
        if (!copy_start(c, st, numeric, n) || !same_nocase(s + st, v, n))
            continue;
        size_t qe = numeric ? st : quoted_end(c, st);
        if (closed && (qe > st ? st + (size_t)n < qe : !may_end_before(s + st + n, numeric)))
            continue;
        int m = K_OPEN | (qe > st ? F_QUOTED : 0) | (named_start(c, st) ? F_NAMED : 0);
        if (!found || bonus_of(c, (uint8_t)m) > bonus_of(c, (uint8_t)found))
            found = m;
    }
    return found;
}

static int plain_bytes(const unsigned char *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i] == '\\' || v[i] == '"' || v[i] == 0)
            return 0; /* escaped bytes are not the source's bytes */
    return 1;
}

void nd_copy_prior_begin(nd_copy_prior *c, int V, int pos, const unsigned char *value, int n)
{
    if (c->bonus == 0.0f)
        return;
    memset(c->mark, 0, (size_t)V);
    c->inside = 0;
    c->closes = 0;
    if (!pos || !c->src.n || !plain_bytes(value, n))
        return;
    /* the pieces that close the value at once all ask this (is_copy
     * scans the whole source): once a step */
    c->closes = n > 0 && is_copy(c, value, n, pos == ND_GRAM_IN_NUMBER, 1);
    const char *s = c->src.p;
    int numeric = pos == ND_GRAM_IN_NUMBER;
    for (size_t st = 0; st + (size_t)n < c->src.n && !c->inside; st++)
        if (copy_start(c, st, numeric, n) && !memcmp(s + st, value, (size_t)n) &&
            (stops_inside(s + st + n, n, numeric) || (!numeric && inside_span(c, st, n))))
            c->inside = 1;
}

/* inside a string or a number (not a value still to begin) */
static int in_value(signed char v)
{
    return v == ND_GRAM_IN_STRING || v == ND_GRAM_IN_NUMBER;
}

void nd_copy_prior_token(nd_copy_prior *c, int t, const unsigned char *pre, int npre,
                         const unsigned char *path, int len, const signed char *inval)
{
    if (c->bonus == 0.0f || !c->src.n)
        return;
    int a = in_value(inval[0]) ? 0 : -1, b = len, closed = 0, kind = inval[0];
    for (int k = 1; k <= len; k++) {
        if (!in_value(inval[k - 1]) && in_value(inval[k])) {
            if (a >= 0)
                break; /* a second value in one piece: judge the first */
            kind = inval[k];
            a = kind == ND_GRAM_IN_NUMBER ? k - 1 : k; /* a number's first byte is its own */
        } else if (in_value(inval[k - 1]) && !in_value(inval[k])) {
            b = k - 1;
            closed = 1;
            break;
        }
    }
    if (in_value(inval[0]) && !closed)
        return; /* inside a value: nd_copy_prior_mark's case */
    if (a < 0 || (a == b && !in_value(inval[0])))
        return; /* no value, or only a string's opening quote */
    unsigned char v[2 * PIECE_MAX + 24];
    int n = 0;
    if (in_value(inval[0])) {
        if (npre > PIECE_MAX + 23)
            return; /* a long value: judged only by its continuations */
        memcpy(v, pre, (size_t)npre);
        n = npre;
    }
    memcpy(v + n, path + a, (size_t)(b - a));
    n += b - a;
    int copy = 0; /* is_copy's answer */
    if (closed && a == b)
        copy = c->closes;
    else if (plain_bytes(v, n))
        copy = is_copy(c, v, n, kind == ND_GRAM_IN_NUMBER, closed);
    if (!in_value(inval[0])) /* a value's first bytes */
        c->mark[t] = copy ? (uint8_t)copy : K_NOT_START;
    else if (copy) /* goes on inside the word, then may close: the inside bonus */
        c->mark[t] = c->inside && b > a ? K_INSIDE : K_EDGE;
}

void nd_copy_prior_mark(nd_copy_prior *c, const needle_model *M, int pos,
                        const unsigned char *value, int n, const uint8_t *allowed)
{
    if (c->bonus == 0.0f || !c->src.n || !pos || !plain_bytes(value, n))
        return;
    const char *s = c->src.p;
    size_t L = c->src.n;
    int numeric = pos == ND_GRAM_IN_NUMBER;
    for (size_t st = 0; st + (size_t)n < L; st++) {
        if (!copy_start(c, st, numeric, n) || (n == 0 && (s[st] == ' ' || s[st] == '\n')))
            continue;
        if (memcmp(s + st, value, (size_t)n))
            continue;
        /* a quoted span's copy is marked up to its closing quote only */
        size_t qe = numeric ? st : quoted_end(c, st);
        size_t max = qe > st + (size_t)n ? qe - st - (size_t)n : SIZE_MAX;
        if (n == 0)
            mark_prefixes(
                c, M, s + st, max, allowed,
                (uint8_t)(K_START | (qe > st ? F_QUOTED : 0) | (named_start(c, st) ? F_NAMED : 0)));
        else if (stops_inside(s + st + n, n, numeric) || (!numeric && inside_span(c, st, n))) {
            mark_prefixes(c, M, s + st + n, max, allowed,
                          (uint8_t)(K_INSIDE | (qe > st + (size_t)n ? F_QUOTED : 0)));
            if (n == 1 && value[0] >= 'A' && value[0] <= 'Z')
                mark_capitals(c, M, s + st + n, allowed); /* "Z" of "Zeta": "ZETA" too */
        } else if (may_end_before(s + st + n, numeric) && joins(s + st + n))
            mark_prefixes(c, M, s + st + n, max, allowed, K_EDGE);
    }
}

void nd_copy_prior_add(const nd_copy_prior *c, const uint8_t *allowed, int V, float *logits)
{
    if (c->bonus == 0.0f)
        return;
    for (int t = 0; t < V; t++)
        if (c->mark[t] && allowed[t])
            logits[t] += bonus_of(c, c->mark[t]);
}

void nd_copy_prior_take(nd_copy_prior *c, const unsigned char *v, int n, int numeric)
{
    if (c->bonus == 0.0f || !c->taken || n <= 0 || !plain_bytes(v, n))
        return;
    const char *s = c->src.p;
    size_t L = c->src.n, text_end = 0;
    for (size_t st = 0; st + (size_t)n < L; st++) {
        if (st < text_end)
            continue; /* this source text has given its span */
        if (copy_start(c, st, numeric, n) && same_nocase(s + st, v, n) &&
            may_end_before(s + st + n, numeric)) {
            c->taken[st] = 1;
            text_end = st + strlen(s + st); /* on to the next text */
        }
    }
}

void nd_copy_prior_untake(nd_copy_prior *c)
{
    if (c->taken)
        memset(c->taken, 0, c->src.n + 1);
}

/* how often the source holds v[0..n) */
static int source_count(const nd_copy_prior *c, const unsigned char *v, int n, int max)
{
    int count = 0;
    for (size_t st = 0; st + (size_t)n <= c->src.n && count < max; st++)
        count += !memcmp(c->src.p + st, v, (size_t)n);
    return count;
}

int nd_copy_prior_runs_on(const nd_copy_prior *c, const unsigned char *v, int n)
{
    enum { K = ND_COPY_RUN_ON };
    if (c->bonus == 0.0f || n <= K)
        return 0;
    const unsigned char *tail = v + n - K;
    for (int i = 0; i + K < n; i++) /* an earlier start, overlaps allowed */
        if (!memcmp(v + i, tail, K))
            return source_count(c, tail, K, 2) < 2;
    return 0;
}

int nd_copy_prior_quote_done(const nd_copy_prior *c, const unsigned char *v, int n)
{
    if (c->bonus == 0.0f || !c->quote || n <= 0)
        return 0;
    const char *s = c->src.p;
    int whole = 0;
    for (size_t st = 0; st < c->src.n; st++) {
        if (c->quote[st] <= 0 || c->quote[st] - (int32_t)st < n || memcmp(s + st, v, (size_t)n))
            continue;
        if (c->quote[st] - (int32_t)st > n)
            return 0; /* a longer quoted span goes on from here ('john1234') */
        whole = 1;
    }
    return whole;
}

static int is_tag_byte(unsigned char b)
{
    return is_alnum(b) || b == '_';
}

int nd_copy_prior_tag_done(const nd_copy_prior *c, const unsigned char *v, int n)
{
    if (c->bonus == 0.0f || n < 2 || (v[0] != '#' && v[0] != '@'))
        return 0;
    for (int i = 1; i < n; i++)
        if (!is_tag_byte(v[i]))
            return 0;
    const char *s = c->src.p;
    size_t L = c->src.n;
    int whole = 0;
    for (size_t st = 0; st + (size_t)n <= L; st++) {
        if (memcmp(s + st, v, (size_t)n) || (st > 0 && is_alnum((unsigned char)s[st - 1])))
            continue;
        if (st + (size_t)n < L && is_tag_byte((unsigned char)s[st + n]))
            return 0; /* a longer tag goes on from here (#Journey / #JourneyHome) */
        whole = 1;
    }
    return whole;
}
