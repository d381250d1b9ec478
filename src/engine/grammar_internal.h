/* Internals shared by the grammar's compiler (grammar_compile.c), its
 * number rules (grammar_num.c) and its byte-level runtime (grammar.c). */
#ifndef ND_GRAMMAR_INTERNAL_H
#define ND_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "engine/grammar.h"
#include "engine/regex.h"

/* K_GOBJ: an object with any keys, values of node `item` (N_ANY for the
 * built-in one), min_items..max_items entries (min/maxProperties);
 * K_ALT: one of nalt alternatives, told apart by their first byte */
enum { K_ANY, K_OBJ, K_GOBJ, K_STR, K_INT, K_NUM, K_LIT, K_ARR, K_GARR, K_ALT };
/* built-in nodes */
enum { N_ANY, N_STR, N_NUM, N_TFN, N_GOBJ, N_GARR, N_BUILTIN };

enum { FR_TOP, FR_CALL, FR_OBJ, FR_GOBJ, FR_STR, FR_NUM, FR_LIT, FR_ARR, FR_GARR, FR_ANY, FR_ALT };
enum { R_REJ, R_ACC, R_ACC_POP, R_POP, R_RETRY };

#define MAX_CALLS 16
#define ND_GRAM_MAX_NODES 20000   /* < 65536: nd_gram_frame.node is 16 bits */
#define ND_GRAM_MAX_PATTERNS 1024 /* compiled patterns (about 8 KB each) */
#define ND_GRAM_MAX_WARN 100      /* warning lines kept */
#define MAX_DIGITS 15
/* A number the schema does not bound on both sides (no minimum, or no
 * maximum): at most ND_GRAM_FREE_INT_DIGITS digits before the point, and
 * no non-zero digit more than ND_GRAM_MAX_RUN times in a row, so a model
 * that keeps repeating a digit ("21" -> 211111111111111) is stopped. Zeros
 * may repeat (1000000); a bound past 13 digits (minimum 1e14) widens the
 * cap to reach it. */
#define ND_GRAM_FREE_INT_DIGITS 13
#define ND_GRAM_MAX_RUN 4
/* A string without a pattern may not end in a cycle of 1..ND_GRAM_STR_PERIOD
 * bytes repeated over more than ND_GRAM_STR_PERIODIC bytes ("YYYY...",
 * "b82?b82?..."): a model that keeps repeating a token has to close the
 * string or write something else instead of running to the token limit.
 * Real values rarely repeat that long (a UUID's longest run is 12 bytes,
 * a phone number's 10). */
#define ND_GRAM_STR_PERIOD 8
#define ND_GRAM_STR_PERIODIC 32
/* an object frame keeps the set of properties already written in its
 * (otherwise string-only) pattern words; an object with more properties
 * admits its keys in declaration order (the frame keeps the last one) */
#define ND_GRAM_PROP_WORDS ((int)(sizeof(((nd_gram_frame *)0)->re) / sizeof(uint64_t)))
#define ND_GRAM_MAX_PROPS (ND_GRAM_PROP_WORDS * 64)

typedef struct {
    int kind, minlen;
    /* object */
    int nprops;
    char **key; /* serialised with quotes (no key is a prefix of another) */
    int *keylen, *prop;
    int *ord;     /* property indices in byte order of their keys */
    uint8_t *req; /* req[i]: property i is required */
    uint64_t required[sizeof(((nd_gram_frame *)0)->re) / sizeof(uint64_t)]; /* req as bits */
    /* more than ND_GRAM_MAX_PROPS properties: keys in declaration order;
     * next_req[k] = the first required index >= k, else nprops */
    int ordered;
    int *next_req;
    /* string */
    int min_len, max_len;
    nd_regex *re;
    /* number */
    double lo, hi;
    int lo_ex, hi_ex;
    /* literal (sorted by bytes once compiled: the candidates that share a
     * prefix are a range, found by binary search) */
    int nlit;
    char **lit;
    int *litlen;
    /* array (and K_GOBJ: value node, entry bounds) */
    int item, min_items, max_items;
    /* alternatives (K_ALT) */
    int nalt;
    int *alt;
    /* bytes a value of this node can start with */
    uint64_t first[4];
} gnode;

typedef struct {
    char *name; /* serialised with quotes */
    int namelen, args;
} gtool;

struct nd_grammar {
    gnode *nodes;
    int n_nodes, cap_nodes;
    gtool *tools;
    int n_tools;
    int call_fixed; /* len of {"name": + ,"arguments": + } */
    int require_call;
    nd_buf warn;
    /* while compiling one tool: its parameters schema (the base of local
     * $refs) and the $ref targets on the path being compiled */
    int n_re;   /* compiled patterns */
    int n_warn; /* warning lines */
    const nd_pj *c_root;
    const nd_pj *c_refs[64];
    int c_nrefs;
};

static const char PFX1[] = "{\"name\":";
static const char PFX2[] = ",\"arguments\":";

/* numbers (grammar_num.c): a literal prefix t[0..len) of node n's number */
int nd_gram_num_short(const gnode *n, const char *t, int len);
int nd_gram_num_syntax(const gnode *n, const char *t, int len);
int nd_gram_num_minlen(const gnode *n);

#endif
