/* JSONL training data: one example per line, read the way upstream's
 * finetune.py reads it (Python text mode, line.strip(), json.loads, lines
 * without "query" skipped), but with errors that name file:line instead of
 * a traceback, and with counts of what was skipped. */
#ifndef ND_JSONL_H
#define ND_JSONL_H

#include <stddef.h>

/* ---- line reader ---- */

/* Lines end at "\n", "\r\n" or "\r" (Python's universal newlines). */
typedef struct nd_lines nd_lines;

int nd_lines_open(const char *path, size_t max_line, nd_lines **out);
/* Same over n bytes in memory (not copied: they must outlive the reader);
 * `name` is used in messages. chunk: most bytes added to the buffer per
 * read (0 = as from a file); small values exercise the buffering. */
int nd_lines_open_mem(const void *data, size_t n, const char *name, size_t max_line,
                      size_t chunk, nd_lines **out);
/* Returns 1 with the next line (without its terminator; valid until the
 * next call), 0 at end of file, or a negative code. A line longer than
 * max_line gives ND_ELIMIT; calling again resumes after that line. */
int nd_lines_next(nd_lines *r, const char **line, size_t *len, size_t *lineno);
void nd_lines_close(nd_lines *r);

/* ---- dataset ---- */

typedef struct {
    char *prompt, *target; /* rendered text (render.h), NUL-terminated */
    size_t prompt_len, target_len;
    size_t line; /* 1-based line number in the file */
} nd_example;

typedef struct {
    nd_example *ex;
    size_t n;
    size_t lines;        /* lines read */
    size_t blank;        /* empty after strip: ignored, as upstream */
    size_t no_query;     /* objects without "query": skipped, as upstream */
    size_t bad;          /* invalid lines skipped under skip_bad */
    char first_bad[512]; /* message for the first of them */
    int generation;      /* the chat template the examples were rendered with (render.h) */
} nd_dataset;

typedef struct {
    int skip_bad;    /* count invalid lines instead of failing */
    size_t max_line; /* bytes; 0 = 16 MiB */
    size_t read_chunk; /* memory input only: bytes per read, 0 = default */
    int generation;    /* chat template: 2 (Needle 2), 3 (Needle 3), 0 = 2 */
} nd_jsonl_opts;

/* Load and render every example. Errors read "PATH:LINE: problem". */
int nd_jsonl_load(const char *path, const nd_jsonl_opts *opts, nd_dataset *out);
/* Same from n bytes in memory; `name` stands for the path in messages. */
int nd_jsonl_load_mem(const void *data, size_t n, const char *name, const nd_jsonl_opts *opts,
                      nd_dataset *out);
void nd_dataset_free(nd_dataset *d);

#endif
