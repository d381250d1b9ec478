/* needle grammar: compile a tools file into the call grammar as `needle run`
 * does, report what was ignored or refused, and print random call lists
 * the grammar accepts. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "core/status.h"
#include "engine/grammar.h"
#include "text/pyjson.h"

static const char *grammar_usage =
    "usage: needle grammar --tools tools.json [--sample N] [--seed S] [--require-call]\n"
    "                      [--length L]\n";
static const char *grammar_about =
    "Compiles the tools' JSON schemas into the call grammar exactly as `needle run`\n"
    "does and prints, on stderr, every schema part that is not enforced (a line\n"
    "per tool and JSON path, e.g. `get.parameters.id: pattern ignored: ...`) and a\n"
    "summary: tools, warnings, compile time (the best of 5 compiles). A set the\n"
    "grammar refuses (bad JSON, a tool without a name, over a size limit) exits 1\n"
    "with the reason.\n"
    "(`run` with more than 5 tools and a retrieval head checks every tool but\n"
    "compiles only the tools retrieval puts in the prompt, per query; this\n"
    "command compiles all of them, or with more than 64 checks each one.)\n";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int count_lines(const char *w)
{
    int n = 0;
    for (const char *p = w; *p; p++)
        if (*p == '\n')
            n++;
    return *w ? n + 1 : 0;
}

static void print_warnings(const char *w)
{
    for (const char *p = w; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        fprintf(stderr, "needle: warning: %.*s\n", (int)n, p);
        p += n + (e ? 1 : 0);
    }
}

int cli_grammar(int argc, char **argv)
{
    const char *tools = NULL;
    long long n_sample = 0, seed = 0, length = 160;
    int require_call = 0;
    cli_opt opts[] = {
        {"--tools", CLI_PATH, &tools, 0, 0, "PATH", NULL,
         "JSON array of tools {name, description, parameters}", 0, 0},
        {"--sample", CLI_I64, &n_sample, 0, 1000000000, "N", NULL,
         "print N random call lists the grammar accepts, one compact JSON array per line on "
         "stdout: what the decoder may let a model write (a seeded walk over the accepted bytes)",
         0, 0},
        {"--seed", CLI_I64, &seed, 0, (double)(1LL << 62), "S", NULL,
         "random seed of --sample (default 0)", 0, 0},
        {"--require-call", CLI_FLAG, &require_call, 0, 0, NULL, NULL,
         "no empty list [] (tool_choice \"required\")", 0, 0},
        {"--length", CLI_I64, &length, 0, 1 << 20, "L", NULL,
         "bytes of free choice per sample before it heads for the shortest completion (default "
         "160)",
         0, 0},
    };
    cli_cmd cmd = {"grammar", grammar_usage, grammar_about, NULL, opts, CLI_NOPTS(opts), 0, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    if (!tools)
        return cli_usage_error("grammar", "--tools tools.json is required");
    unsigned char *tj;
    size_t tl;
    if (nd_read_file(tools, 64u << 20, &tj, &tl))
        return cli_fail(NULL); /* the message names the file */
    nd_pj_doc *doc = NULL;
    size_t col = 0;
    int rc = nd_pj_parse((const char *)tj, tl, &doc, &col);
    free(tj);
    if (rc) {
        fprintf(stderr, "needle: %s: tools JSON: %s\n", tools, nd_last_error());
        return 1;
    }
    const nd_pj *root = nd_pj_root(doc);
    if (root && root->type == ND_PJ_ARRAY && root->len > ND_GRAM_MAX_ALT) {
        /* a catalogue: as a session does, every tool is checked, and only
         * the tools retrieval renders are compiled together, per query */
        nd_buf w = {0};
        double t0 = now_ms();
        rc = nd_gram_validate(root, &w);
        double ms = now_ms() - t0;
        if (!rc) {
            print_warnings(w.p ? w.p : "");
            fprintf(stderr,
                    "grammar: %zu tools checked (a catalogue: `run` compiles the retrieved "
                    "ones per query), %d warnings, in %.3f ms\n",
                    root->len, count_lines(w.p ? w.p : ""), ms);
        } else {
            fprintf(stderr, "needle: %s: refused: %s\n", tools, nd_last_error());
        }
        nd_buf_free(&w);
        nd_pj_free(doc);
        if (!rc && n_sample > 0) {
            fprintf(stderr,
                    "needle: %s: --sample needs at most %d tools (one grammar); sample a "
                    "subset\n",
                    tools, ND_GRAM_MAX_ALT);
            return 1;
        }
        return rc ? 1 : 0;
    }
    nd_grammar *g = NULL;
    /* the compile time is the best of 5 (a busy machine's scheduling noise
     * is not the compiler's) */
    double ms = 0;
    for (int k = 0; k < 5; k++) {
        nd_gram_free(g);
        g = NULL;
        double t0 = now_ms();
        rc = nd_gram_compile(nd_pj_root(doc), &g);
        double t = now_ms() - t0;
        ms = k == 0 || t < ms ? t : ms;
        if (rc)
            break;
    }
    if (rc) {
        fprintf(stderr, "needle: %s: refused: %s\n", tools, nd_last_error());
        nd_pj_free(doc);
        return 1;
    }
    const char *w = nd_gram_warnings(g);
    print_warnings(w);
    fprintf(stderr, "grammar: %d tools, %d warnings, compiled in %.3f ms\n", nd_gram_num_tools(g),
            count_lines(w), ms);
    nd_gram_require_call(g, require_call);
    int status = 0;
    if (n_sample > 0) {
        nd_rng r;
        nd_rng_seed(&r, (uint64_t)seed);
        nd_buf b = {0};
        for (long long i = 0; i < n_sample; i++) {
            b.n = 0;
            if (b.p)
                b.p[0] = 0;
            if (nd_gram_sample(g, &r, (int)length, &b)) {
                fprintf(stderr, "needle: %s: sample %lld: %s\n", tools, i + 1, nd_last_error());
                status = 1;
                break;
            }
            fwrite(b.p, 1, b.n, stdout);
            fputc('\n', stdout);
        }
        nd_buf_free(&b);
        if (fflush(stdout)) {
            perror("needle: grammar: stdout");
            status = 1;
        }
    }
    nd_gram_free(g);
    nd_pj_free(doc);
    return status;
}
