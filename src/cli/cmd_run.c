/* needle run: load a .cact, declare tools, answer a query with a
 * grammar-constrained tool call; print the envelope JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "core/tuning.h"
#include "needle.h"

static const char *run_usage =
    "usage: needle run [--weights X.cact] --tools tools.json [--system S]\n"
    "                  [--tool-index PATH] [--max-new-tokens N] [--kv-window N]\n"
    "                  [--interactive] [QUERY]\n"
    "       needle run --checkpoint X.pkl [--query TEXT] [--max-len N] ...\n"
    "                  (upstream's plain greedy continuation; see\n"
    "                  `needle run --checkpoint X --help`)\n";
static const char *run_about =
    "Prints one JSON envelope per turn: type (call|respond), success, error,\n"
    "error_code, function_calls, reasoning, confidence (the archive's confidence\n"
    "head and the call's minimum token probability, whichever is lower),\n"
    "prefill_tps, decode_tps, peak_ram_mb.\n";

static int turn(needle_session *s, const char *q, int max_new, char *buf, int cap)
{
    int rc = needle_session_complete(s, q, max_new, buf, cap);
    const char *note = strstr(needle_session_warnings(s), "tool retrieval: the ");
    if (note) /* this query's retrieved tools did not all fit */
        fprintf(stderr, "needle: warning: %.*s\n", (int)strcspn(note, "\n"), note);
    if (rc < 0) {
        if (buf[0])
            printf("%s\n", buf);
        fprintf(stderr, "needle: %s\n", needle_session_error(s));
        fflush(stdout);
        return 1;
    }
    printf("%s\n", buf);
    fflush(stdout);
    return 0;
}

int cli_run(int argc, char **argv)
{
    const char *weights = NULL, *tools = NULL, *system = NULL, *query = NULL, *index = NULL;
    long long max_new = 256;
    int interactive = 0;
    /* upstream's invocation: a checkpoint instead of an archive */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--checkpoint"))
            return cli_run_checkpoint(argc, argv);
    long long kvw = 0;
    cli_opt opts[] = {
        {"--weights", CLI_PATH, &weights, 0, 0, "PATH", NULL,
         ".cact archive (needle build); default: the built-in base (needle-nano.cact beside the "
         "program or library, ../share/needle, or $NEEDLE_BASE_WEIGHTS)",
         0, 0},
        {"--tools", CLI_PATH, &tools, 0, 0, "PATH", NULL,
         "JSON array of tools {name, description, parameters}", 0, 0},
        {"--system", CLI_STR, &system, 0, 0, "TEXT", NULL, "system facts (optional)", 0, 0},
        {"--tool-index", CLI_PATH, &index, 0, 0, "PATH", NULL,
         "with more than 5 tools, keep the tool embeddings of retrieval in this file (reused "
         "while the tools and the model match, else rebuilt)",
         0, 0},
        {"--max-new-tokens", CLI_I64, &max_new, 1, 1 << 20, "N", NULL,
         "generation budget per turn (default 256)", 0, 0},
        {"--kv-window", CLI_I64, &kvw, 1, 1 << 24, "N", NULL,
         "keep and attend to the last N positions (plus the pinned system + tools prefix) "
         "instead of the archive's kv_window: 256 is the small-memory choice (as "
         "$NEEDLE_KV_WINDOW)",
         0, 0},
        {"--interactive", CLI_FLAG, &interactive, 0, 0, NULL, NULL,
         "keep the session: read follow-ups from stdin, one per line (after a call, a line is the "
         "tool result); ':reset' rewinds to the tools, ':quit' or EOF ends",
         0, 0},
    };
    cli_cmd cmd = {
        "run", run_usage,       run_about, "Schema warnings (ignored keywords) go to stderr.\n",
        opts,  CLI_NOPTS(opts), 1,         {0},
        0};
    CLI_PARSE(&cmd, argc, argv);
    query = cmd.n_pos ? cmd.pos[0] : NULL;
    if (kvw) { /* in place of $NEEDLE_KV_WINDOW, which main() read */
        nd_tuning t = *nd_tuning_get();
        snprintf(t.kv_window, sizeof t.kv_window, "%lld", kvw);
        if (nd_tuning_use(&t))
            return cli_fail(NULL);
    }
    char base[4096];
    if (!weights) {
        if (needle_default_weights_path(base, sizeof base)) {
            fprintf(stderr, "needle: run: no --weights given and %s\n", needle_thread_error());
            return 1;
        }
        weights = base;
        fprintf(stderr, "weights   %s (the built-in base; --weights X.cact for another)\n",
                weights);
    }
    if (!tools)
        return cli_usage_error("run", "--tools tools.json is required");
    if (!query && !interactive)
        return cli_usage_error("run", "a query is required (or --interactive)");
    unsigned char *tj;
    size_t tl;
    int rc = nd_read_file(tools, 64u << 20, &tj, &tl);
    if (rc)
        return cli_fail(NULL); /* the message names the file */
    needle_model *m = needle_model_load(weights);
    if (!m) {
        free(tj);
        fprintf(stderr, "needle: %s\n", needle_thread_error());
        return 1;
    }
    needle_session *s = needle_session_new_with_index(m, system, (const char *)tj, index);
    free(tj);
    if (!s) {
        fprintf(stderr, "needle: %s\n", needle_thread_error());
        needle_model_free(m);
        return 1;
    }
    const char *w = needle_session_warnings(s);
    if (*w) {
        const char *p = w;
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            fprintf(stderr, "needle: warning: %.*s\n", (int)n, p);
            p += n + (e ? 1 : 0);
        }
    }
    int cap = 1 << 20;
    char *buf = malloc((size_t)cap);
    int status = 0;
    if (!buf) {
        fprintf(stderr, "needle: out of memory\n");
        status = 1;
    }
    if (buf && query)
        status = turn(s, query, (int)max_new, buf, cap);
    if (buf && interactive) {
        char line[65536];
        while (fgets(line, sizeof line, stdin)) {
            size_t n = strlen(line);
            while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
                line[--n] = 0;
            if (!strcmp(line, ":quit"))
                break;
            if (!strcmp(line, ":reset")) {
                needle_session_reset(s);
                continue;
            }
            if (!n)
                continue;
            status |= turn(s, line, (int)max_new, buf, cap);
        }
    }
    free(buf);
    needle_session_free(s);
    needle_model_free(m);
    return status;
}
