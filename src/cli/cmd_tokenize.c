/* needle tokenize: text lines -> ids (like spm_encode --output_format=id),
 * or ids -> text with --decode. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "text/tokenizer.h"

const char *cli_tokenizer_path(const char *flag_value, const char *checkpoint, char *buf, size_t n)
{
    if (flag_value)
        return flag_value;
    const char *env = getenv("NEEDLE_TOKENIZER");
    if (env && *env)
        return env;
    if (checkpoint) {
        const char *slash = strrchr(checkpoint, '/');
        size_t dir = slash ? (size_t)(slash - checkpoint) + 1 : 0;
        if (dir + sizeof "tokenizer.model" <= n) {
            memcpy(buf, checkpoint, dir);
            memcpy(buf + dir, "tokenizer.model", sizeof "tokenizer.model");
            FILE *f = fopen(buf, "rb");
            if (f) {
                fclose(f);
                return buf;
            }
            /* upstream fetches its tokenizer when it has none: beside the
             * checkpoint, where the next run finds it */
            if (cli_fetch_tokenizer(buf, 2) == 0)
                return buf;
        }
    }
    fprintf(stderr,
            "needle: no tokenizer: pass --tokenizer PATH or set NEEDLE_TOKENIZER%s.\n"
            "  Upstream's tokenizer is on Hugging Face: Cactus-Compute/needle2, file\n"
            "  tokenizer/tokenizer.model; this repository ships models/tokenizer.model\n"
            "  for the demo models.\n",
            checkpoint ? " (or put tokenizer.model beside the checkpoint)" : "");
    return NULL;
}

static int load(const char *flag, nd_tokenizer **tok)
{
    char buf[4096];
    const char *path = cli_tokenizer_path(flag, NULL, buf, sizeof buf);
    if (!path)
        return 1;
    if (nd_tokenizer_load(path, tok))
        return cli_fail(NULL);
    return 0;
}

/* Read all of stdin (for --whole). */
static ssize_t slurp(char **buf, size_t *cap)
{
    size_t n = 0, got;
    for (;;) {
        if (*cap - n < 65536) {
            size_t nc = *cap ? *cap * 2 : 65536;
            char *p = realloc(*buf, nc);
            if (!p)
                return -1;
            *buf = p;
            *cap = nc;
        }
        got = fread(*buf + n, 1, *cap - n, stdin);
        n += got;
        if (got == 0)
            return ferror(stdin) ? -1 : (ssize_t)n;
    }
}

static int encode_stream(const nd_tokenizer *tok, int pieces, int timing, int whole)
{
    char *line = NULL;
    size_t cap = 0, bytes = 0, tokens = 0;
    ssize_t got;
    nd_idvec ids = {0};
    struct timespec t0, t1;
    double secs = 0;
    int rc = 0, done = 0;
    nd_tok_cache *cache = nd_tok_cache_new(); /* NULL is fine: uncached */
    while (!done && (got = whole ? slurp(&line, &cap) : getline(&line, &cap, stdin)) >= 0) {
        size_t n = (size_t)got;
        done = whole;
        if (n && line[n - 1] == '\n' && !whole)
            n--;
        ids.n = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (nd_tokenizer_encode_cached(tok, cache, line, n, &ids)) {
            rc = cli_fail("encode");
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        bytes += n;
        tokens += ids.n;
        for (size_t i = 0; i < ids.n; i++) {
            if (i)
                putchar(' ');
            if (pieces) {
                size_t pl;
                const char *p = nd_tokenizer_piece(tok, ids.v[i], &pl);
                fwrite(p, 1, pl, stdout);
            } else {
                printf("%d", (int)ids.v[i]);
            }
        }
        putchar('\n');
    }
    free(line);
    nd_idvec_free(&ids);
    nd_tok_cache_free(cache);
    if (!rc && ferror(stdin)) {
        fprintf(stderr, "needle: reading stdin: %s\n", strerror(errno));
        rc = 1;
    }
    if (timing)
        fprintf(stderr, "tokenize: %zu bytes -> %zu tokens in %.3f s encode time (%.1f MB/s)\n",
                bytes, tokens, secs, secs > 0 ? (double)bytes / secs / 1e6 : 0.0);
    return rc;
}

static int decode_stream(const nd_tokenizer *tok)
{
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    nd_idvec ids = {0};
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        ids.n = 0;
        char *p = line, *end;
        for (;;) {
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
                p++;
            if (!*p)
                break;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= nd_tokenizer_vocab_size(tok) ||
                (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
                fprintf(stderr, "needle: stdin line %zu: '%.*s' is not a token id in [0, %d)\n",
                        lineno, (int)strcspn(p, " \t\r\n"), p, nd_tokenizer_vocab_size(tok));
                rc = 1;
                break;
            }
            if (nd_idvec_push(&ids, (int32_t)v)) {
                rc = cli_fail(NULL);
                break;
            }
            p = end;
        }
        char *text;
        size_t len;
        if (!rc && nd_tokenizer_decode(tok, ids.v, ids.n, &text, &len) == 0) {
            fwrite(text, 1, len, stdout);
            putchar('\n');
            free(text);
        } else if (!rc) {
            rc = cli_fail("decode");
        }
    }
    free(line);
    nd_idvec_free(&ids);
    return rc;
}

int cli_tokenize(int argc, char **argv)
{
    const char *tok_path = NULL;
    const char *blob_out = NULL;
    int decode = 0, pieces = 0, timing = 0, whole = 0;
    cli_opt opts[] = {
        CLI_OPT_TOKENIZER(
            &tok_path, "SentencePiece .model or .cact tokenizer blob (default: $NEEDLE_TOKENIZER)"),
        {"--decode", CLI_FLAG, &decode, 0, 0, NULL, NULL,
         "read space-separated ids per line and print the text", 0, 0},
        {"--pieces", CLI_FLAG, &pieces, 0, 0, NULL, NULL, "print piece strings instead of ids", 0,
         0},
        {"--whole", CLI_FLAG, &whole, 0, 0, NULL, NULL,
         "encode all of stdin as one text (newlines included) instead of line by line", 0, 0},
        {"--export-blob", CLI_PATH, &blob_out, 0, 0, "FILE", NULL,
         "write the tokenizer as a .cact tokenizer blob to FILE instead of reading stdin", 0, 0},
        {"--time", CLI_FLAG, &timing, 0, 0, NULL, NULL,
         "report bytes, tokens and throughput on stderr", 0, 0},
    };
    cli_cmd cmd = {"tokenize",
                   "usage: needle tokenize [--tokenizer M.model] [--decode] [--pieces] [--time]\n",
                   "Reads stdin line by line. Without --decode, prints each line's token ids\n"
                   "separated by spaces (as `spm_encode --output_format=id`); with --decode,\n"
                   "reads space-separated ids per line and prints the text.\n",
                   NULL,
                   opts,
                   CLI_NOPTS(opts),
                   0,
                   {0},
                   0};
    CLI_PARSE(&cmd, argc, argv);
    if (blob_out &&
        cli_check_output(blob_out, "tokenizer", tok_path, "tokenizer ($NEEDLE_TOKENIZER)",
                         tok_path ? NULL : getenv("NEEDLE_TOKENIZER"), (const char *)NULL))
        return 1;
    nd_tokenizer *tok;
    int rc = load(tok_path, &tok);
    if (rc)
        return rc;
    if (blob_out) {
        unsigned char *blob = NULL;
        size_t len;
        if (nd_tokenizer_write_blob(tok, &blob, &len) || nd_write_file_atomic(blob_out, blob, len))
            rc = cli_fail(NULL);
        free(blob);
        nd_tokenizer_free(tok);
        return rc;
    }
    rc = decode ? decode_stream(tok) : encode_stream(tok, pieces, timing, whole);
    nd_tokenizer_free(tok);
    if (fflush(stdout) != 0 && !rc) {
        fprintf(stderr, "needle: writing stdout: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}
