/* libFuzzer target: a JSONL training file from memory, through the line
 * reader (universal newlines, over-long lines, small reads), the strip,
 * the JSON parser and the chat-template rendering of every example, then
 * tokenised and packed with the repository's tokenizer (loaded once).
 *
 * Input: one option byte, then the file. Option bits: 0 skip_bad;
 * 1-3 max_line (default, 1, 2, 7, 16, 64, 200, 1000 bytes); 4-7 bytes per
 * read (default, 1, 2, 3, 5, 8, 13, 64, ...). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/jsonl.h"
#include "text/render.h"
#include "text/tokenizer.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

static nd_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *p = getenv("NEEDLE_FUZZ_TOKENIZER");
    if (!p || !*p)
        p = NEEDLE_SOURCE_DIR "/models/tokenizer.model";
    if (nd_tokenizer_load(p, &tok) != 0) {
        fprintf(stderr, "fuzz_jsonl: no tokenizer at %s: rendering only\n", p);
        tok = NULL;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const size_t max_line[8] = {0, 1, 2, 7, 16, 64, 200, 1000};
    static const size_t chunk[16] = {0, 1, 2, 3, 5, 8, 13, 64, 100, 255, 256, 1000, 4096, 0, 0, 0};
    nd_jsonl_opts o = {.skip_bad = data[0] & 1,
                       .max_line = max_line[(data[0] >> 1) & 7],
                       .read_chunk = chunk[data[0] >> 4]};
    nd_dataset d;
    if (nd_jsonl_load_mem(data + 1, size - 1, "fuzz.jsonl", &o, &d) != 0)
        return 0;
    if (d.n + d.blank + d.no_query + d.bad != d.lines)
        abort(); /* every line is counted once */
    for (size_t i = 0; i < d.n; i++)
        if (!d.ex[i].prompt || !d.ex[i].target || d.ex[i].line < 1 || d.ex[i].line > d.lines)
            abort();
    if (tok) {
        nd_token_set ts;
        if (nd_dataset_tokenize(&d, tok, 256, &ts) == 0) {
            if (ts.n != d.n || ts.max_len > 256 || ts.truncated > ts.n)
                abort();
            nd_token_set_free(&ts);
        }
    }
    nd_dataset_free(&d);
    return 0;
}
