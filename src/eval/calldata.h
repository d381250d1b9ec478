/* Held-out tool-calling examples for needle eval-calls, read from
 * upstream's training JSONL (docs/formats.md §3.1): per line an object with "query",
 * "tools", "answers" (alias "function_calls"; absent = []) and optional
 * "system". Like training, "tools" and "answers" may also be JSON text in a
 * string, blank lines are ignored and lines without "query" skipped. */
#ifndef ND_CALLDATA_H
#define ND_CALLDATA_H

#include <stddef.h>

#include "text/pyjson.h"

typedef struct {
    size_t line;           /* 1-based line in the file */
    const nd_pj *query;    /* string */
    const char *system;    /* NULL when absent or falsy */
    const nd_pj *tools;    /* array */
    const nd_pj *expected; /* call list (nd_calls_check passed) */
    char *tools_json;      /* what the engine is given: the compact dump */
    nd_pj_doc *docs[3];    /* the line, and "tools" / "answers" given as text */
} nd_call_example;

typedef struct {
    nd_call_example *ex;
    size_t n;
    size_t lines;        /* lines read */
    size_t blank;        /* empty after strip */
    size_t no_query;     /* objects without "query" */
    size_t bad;          /* invalid lines skipped under skip_bad */
    char first_bad[512]; /* message for the first of them */
} nd_call_set;

/* Read up to `limit` examples (0 = all). Errors read "PATH:LINE: field:
 * problem"; with skip_bad an invalid line is counted and skipped. */
int nd_calldata_load(const char *path, int skip_bad, size_t limit, nd_call_set *out);
void nd_call_set_free(nd_call_set *s);

#endif
