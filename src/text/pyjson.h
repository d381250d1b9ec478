/* JSON with Python's semantics: parse like json.loads and serialise like
 * json.dumps(v, ensure_ascii=True) (or ensure_ascii=False, Needle 3), which
 * is what upstream's training data rendering depends on byte for byte.
 *
 * - Object key order is kept; a repeated key keeps its first position and
 *   takes the last value (Python dict assignment).
 * - Integers are kept as their decimal text (any size; "-0" becomes "0");
 *   like Python 3.11, more than 4300 digits is an error.
 * - Numbers with a fraction or exponent are doubles, printed as Python's
 *   repr (shortest round-trip: 10.0, 1e-05, 1e+16, -0.0); NaN, Infinity and
 *   -Infinity are accepted and printed as Python does.
 * - Strings are UTF-8; a lone surrogate escape (\ud800) is kept as its
 *   3-byte generalised UTF-8 form so it re-serialises as \ud800.
 * - Input must be valid UTF-8; raw control characters inside strings are
 *   rejected (json.loads strict mode). */
#ifndef ND_PYJSON_H
#define ND_PYJSON_H

#include <stddef.h>

typedef enum {
    ND_PJ_NULL,
    ND_PJ_FALSE,
    ND_PJ_TRUE,
    ND_PJ_INT,
    ND_PJ_FLOAT,
    ND_PJ_STRING,
    ND_PJ_ARRAY,
    ND_PJ_OBJECT,
} nd_pj_type;

typedef struct nd_pj nd_pj;

typedef struct {
    const char *key;
    size_t key_len;
    nd_pj *val;
} nd_pj_member;

struct nd_pj {
    nd_pj_type type;
    size_t len;        /* STRING/INT: bytes of str; ARRAY/OBJECT: element count */
    const char *str;   /* STRING: UTF-8 (NUL-terminated); INT: decimal text */
    double num;        /* FLOAT */
    nd_pj **items;     /* ARRAY */
    nd_pj_member *obj; /* OBJECT */
};

typedef struct nd_pj_doc nd_pj_doc;

/* Parse one JSON text (surrounding whitespace allowed). On error returns
 * ND_EFORMAT / ND_ELIMIT with a message "column C: problem" (C = 1-based
 * byte column) and sets *err_col when non-NULL. */
int nd_pj_parse(const char *text, size_t len, nd_pj_doc **doc, size_t *err_col);
const nd_pj *nd_pj_root(const nd_pj_doc *doc);
void nd_pj_free(nd_pj_doc *doc);

/* Member of an object by key (NULL if absent or v is not an object). */
const nd_pj *nd_pj_get(const nd_pj *v, const char *key);

/* Python truthiness (None, False, 0, 0.0, "", [], {} are false). */
int nd_pj_truthy(const nd_pj *v);

/* Growable byte buffer; zero-initialise. Contents stay NUL-terminated. */
typedef struct {
    char *p;
    size_t n, cap;
} nd_buf;

int nd_buf_put(nd_buf *b, const char *s, size_t n);
void nd_buf_free(nd_buf *b);

/* Append json.dumps(v) to out: compact = separators (",", ":"), otherwise
 * Python's default (", ", ": "). */
int nd_pj_dump(const nd_pj *v, int compact, nd_buf *out);

/* json.dumps(v, ensure_ascii=...): with ensure_ascii = 0 non-ASCII text is
 * written as raw UTF-8 (Needle 3's rendering); nd_pj_dump is ensure_ascii=1. */
int nd_pj_dump_ex(const nd_pj *v, int compact, int ensure_ascii, nd_buf *out);

/* Python's str.strip() with no argument, on UTF-8 text: narrows [*s, *s+*n)
 * to drop leading and trailing str.isspace() characters. */
void nd_py_strip(const char **s, size_t *n);

/* Python repr() of a double into buf (>= 32 bytes); returns the length. */
int nd_pj_float_repr(double x, char *buf);

#endif
