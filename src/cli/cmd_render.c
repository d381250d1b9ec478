/* needle render: show how JSONL examples become training text and tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "io/jsonl.h"
#include "text/pyjson.h"
#include "text/render.h"
#include "text/tokenizer.h"

static void put_json_str(const char *s, size_t n)
{
    nd_pj v = {ND_PJ_STRING, n, s, 0, NULL, NULL};
    nd_buf b = {0};
    if (nd_pj_dump(&v, 1, &b) == 0)
        fwrite(b.p, 1, b.n, stdout);
    nd_buf_free(&b);
}

static void print_example(const nd_example *ex, const nd_tokenizer *tok, const nd_token_set *ts,
                          size_t row, size_t len, size_t n_prompt, int json)
{
    const int32_t *ids = ts ? ts->ids + row * ts->max_len : NULL;
    const float *mask = ts ? ts->mask + row * ts->max_len : NULL;
    if (json) {
        printf("{\"line\":%zu,\"prompt\":", ex->line);
        put_json_str(ex->prompt, ex->prompt_len);
        printf(",\"target\":");
        put_json_str(ex->target, ex->target_len);
        if (ts) {
            printf(",\"length\":%zu,\"n_prompt\":%zu,\"truncated\":%s,\"ids\":[", len, n_prompt,
                   len > ts->max_len ? "true" : "false");
            for (size_t i = 0; i < ts->max_len; i++)
                printf(i ? ",%d" : "%d", (int)ids[i]);
            printf("],\"mask\":[");
            for (size_t i = 0; i < ts->max_len; i++)
                printf(i ? ",%d" : "%d", (int)mask[i]);
            printf("]");
        }
        printf("}\n");
        return;
    }
    printf("=== line %zu ===\n--- prompt ---\n", ex->line);
    fwrite(ex->prompt, 1, ex->prompt_len, stdout);
    printf("\n--- target ---\n");
    fwrite(ex->target, 1, ex->target_len, stdout);
    printf("\n");
    if (!ts)
        return;
    size_t shown = len < ts->max_len ? len : ts->max_len;
    printf("--- tokens: %zu (prompt %zu incl. BOS, target %zu incl. EOS)", len, n_prompt,
           len - n_prompt);
    if (len > ts->max_len)
        printf(", TRUNCATED to %zu", ts->max_len);
    printf(" ---\n");
    for (size_t i = 0; i < shown; i++) {
        size_t pl;
        const char *p = nd_tokenizer_piece(tok, ids[i], &pl);
        printf("%5zu %6d %d ", i, (int)ids[i], (int)mask[i]);
        /* Keep one token per line: show control bytes in the piece escaped. */
        for (size_t k = 0; k < pl; k++) {
            unsigned char c = (unsigned char)p[k];
            if (c < 0x20 || c == 0x7f)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        putchar('\n');
    }
}

int cli_render(int argc, char **argv)
{
    const char *tok_path = NULL;
    long long line = 0, cap = 1024, gen = 2;
    int skip_bad = 0, json = 0;
    cli_opt copts[] = {
        CLI_OPT_TOKENIZER(&tok_path, ".model or tokenizer blob (default: $NEEDLE_TOKENIZER; "
                                     "without one only the text is shown)"),
        {"--generation", CLI_I64, &gen, 2, 3, "G", NULL,
         "the model generation whose template to use: 2 (Needle 2, the default) or 3 (Needle 3: "
         "<think> only with reasoning, system/reasoning stripped, raw non-ASCII in the JSON)",
         0, 0},
        {"--line", CLI_I64, &line, 1, (double)(1LL << 40), "N", NULL,
         "only the example on line N of the file", 0, 0},
        {"--max-len", CLI_I64, &cap, 1, 1 << 24, "N", NULL,
         "cap for the sequence length (default 1024)", 0, 0},
        {"--skip-bad", CLI_FLAG, &skip_bad, 0, 0, NULL, NULL,
         "skip and count invalid lines instead of failing", 0, 0},
        {"--json", CLI_FLAG, &json, 0, 0, NULL, NULL,
         "one JSON object per example: line, prompt, target, ids, mask (padded to max_len), "
         "length, truncated",
         0, 0},
    };
    cli_cmd cmd = {
        "render",
        "usage: needle render DATA.jsonl [--tokenizer M.model] [--line N] [--max-len N]\n"
        "                     [--generation 2|3] [--skip-bad] [--json]\n",
        "Prints each example's rendered prompt and target (the chat template used\n"
        "for fine-tuning) and, with a tokenizer, its token ids and loss mask exactly\n"
        "as training builds them: [BOS] + enc(prompt) + enc(target) + [EOS], mask 0\n"
        "on BOS and prompt, 1 on target and EOS, cut/padded to the dataset's max_len.\n",
        NULL,
        copts,
        CLI_NOPTS(copts),
        1,
        {0},
        0};
    CLI_PARSE(&cmd, argc, argv);
    const char *data = cmd.n_pos ? cmd.pos[0] : NULL;
    if (!data)
        return cli_usage_error("render", "missing DATA.jsonl");
    if (!tok_path && getenv("NEEDLE_TOKENIZER") && *getenv("NEEDLE_TOKENIZER"))
        tok_path = getenv("NEEDLE_TOKENIZER");

    nd_tokenizer *tok = NULL;
    if (tok_path && nd_tokenizer_load(tok_path, &tok))
        return cli_fail(NULL);
    nd_jsonl_opts opts = {.skip_bad = skip_bad, .generation = (int)gen};
    nd_dataset ds;
    if (nd_jsonl_load(data, &opts, &ds)) {
        nd_tokenizer_free(tok);
        return cli_fail(NULL);
    }
    nd_token_set ts = {0};
    int rc = 0;
    if (tok && nd_dataset_tokenize(&ds, tok, (size_t)cap, &ts))
        rc = cli_fail(data);
    size_t found = 0;
    for (size_t i = 0; i < ds.n && !rc; i++) {
        if (line && ds.ex[i].line != (size_t)line)
            continue;
        found++;
        size_t len = 0, n_prompt = 0;
        if (tok) { /* re-encode for the untruncated length (cheap; display only) */
            nd_idvec iv = {0};
            if (nd_render_encode(tok, NULL, ds.generation, &ds.ex[i], &iv, &n_prompt))
                rc = cli_fail(data);
            len = iv.n;
            nd_idvec_free(&iv);
        }
        if (!rc)
            print_example(&ds.ex[i], tok, tok ? &ts : NULL, i, len, n_prompt, json);
    }
    if (!rc && ds.n == 0) {
        fprintf(stderr,
                "needle: %s: no examples (%zu lines: %zu blank, %zu without \"query\", %zu "
                "invalid)\n",
                data, ds.lines, ds.blank, ds.no_query, ds.bad);
        rc = 1;
    }
    if (!rc && line && !found) {
        fprintf(stderr,
                "needle: %s:%lld holds no example (blank, no \"query\", skipped or "
                "past the end)\n",
                data, line);
        rc = 1;
    }
    if (!rc) {
        fprintf(stderr,
                "render: %zu examples from %zu lines (%zu blank, %zu without \"query\" "
                "skipped, %zu invalid skipped)",
                ds.n, ds.lines, ds.blank, ds.no_query, ds.bad);
        if (tok)
            fprintf(stderr, "; max_len %zu (longest %zu tokens), %zu truncated", ts.max_len,
                    ts.longest, ts.truncated);
        fprintf(stderr, "\n");
        if (ds.bad)
            fprintf(stderr, "render: first invalid line: %s\n", ds.first_bad);
        if (!tok)
            fprintf(stderr, "render: no tokenizer given (--tokenizer or NEEDLE_TOKENIZER): "
                            "text only\n");
    }
    nd_token_set_free(&ts);
    nd_dataset_free(&ds);
    nd_tokenizer_free(tok);
    return rc;
}
