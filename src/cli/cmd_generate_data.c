/* needle generate-data: synthesise tool-calling examples with an
 * OpenAI-compatible chat-completions service (upstream's generate-data,
 * OPENROUTER_API_KEY / OPENROUTER_URL), keeping only examples whose calls
 * satisfy their tools' schemas and that render. Also `finetune --generate`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "gen/chat_reply.h"
#include "gen/examples.h"
#include "io/jsonl.h"
#include "text/pyjson.h"
#ifdef NEEDLE_HAVE_CURL
#include "net/curl_dl.h"

#include "net/generate.h"
#endif

#define DEFAULT_URL "https://openrouter.ai/api/v1/chat/completions"
#define DEFAULT_MODEL "deepseek/deepseek-v4-flash"

static const char generate_usage[] =
    "usage: needle generate-data (--tools TOOLS.json | --augment DATA.jsonl) [options]\n";
static const char generate_about[] =
    "Ask a chat model (OpenAI-compatible chat completions; OpenRouter by default)\n"
    "for tool-calling examples. Each request asks for --batch-size examples; every\n"
    "example is checked against its tools' JSON schemas and rendered before it is\n"
    "kept, duplicates (same query, case and surrounding space aside, and answers)\n"
    "are dropped. Requests continue until --num-samples are kept or 3x the requests\n"
    "1.3x the samples need have been sent.\n";
static const char generate_epilog[] =
    "environment:\n"
    "  OPENROUTER_API_KEY  bearer token (required; never printed or written)\n"
    "  OPENROUTER_URL      chat-completions endpoint (default " DEFAULT_URL ")\n"
    "\n"
    "Prints a progress line per request (stderr) and a summary: requested, kept,\n"
    "dropped invalid, dropped duplicate, unparsable replies, failed requests.\n"
    "The output is written whole (a temporary file beside it, then renamed). When\n"
    "no example is kept it exits 1 saying why and leaves the output as it was.\n"
    "A reply over 64 MiB is abandoned. Text quoted from the service is printed\n"
    "with the key (and any piece of it, and Bearer tokens) replaced by ***.\n";

typedef struct {
    long num_samples;
    int batch_size, workers, max_retries;
    double retry_base, timeout, temperature;
    unsigned long long seed;
    const char *model;
} gen_params;

static void gen_params_default(gen_params *p, int workers)
{
    p->num_samples = 100;
    p->batch_size = 25;
    p->workers = workers;
    p->max_retries = 5;
    p->retry_base = 1.0;
    p->timeout = 180;
    p->temperature = 0.9;
    p->seed = 0;
    p->model = DEFAULT_MODEL;
}

/* Input data kept for --augment: its documents and the tools they use. */
typedef struct {
    nd_pj_doc **docs;
    size_t n_docs;
    nd_pj tools; /* array over members of docs */
} augment_data;

static void augment_free(augment_data *a)
{
    for (size_t i = 0; i < a->n_docs; i++)
        nd_pj_free(a->docs[i]);
    free(a->docs);
    free(a->tools.items);
}

static int push_doc(augment_data *a, nd_pj_doc *d)
{
    nd_pj_doc **p = realloc(a->docs, (a->n_docs + 1) * sizeof *p);
    if (!p) {
        nd_pj_free(d);
        return ND_ENOMEM;
    }
    a->docs = p;
    a->docs[a->n_docs++] = d;
    return 0;
}

/* upstream's _collect_tools: each tool name once, first definition wins */
static int collect_tools(augment_data *a, const nd_pj *tools, const char *path, size_t line)
{
    if (tools && tools->type == ND_PJ_STRING) {
        nd_pj_doc *d;
        if (nd_pj_parse(tools->str, tools->len, &d, NULL))
            return nd_error_prefix(ND_EFORMAT, "%s:%zu: \"tools\" string is not JSON", path, line);
        int rc = push_doc(a, d);
        if (rc)
            return rc;
        tools = nd_pj_root(d);
    }
    if (!tools)
        return 0;
    if (tools->type != ND_PJ_ARRAY)
        return nd_error(ND_EFORMAT, "%s:%zu: \"tools\" must be an array", path, line);
    for (size_t i = 0; i < tools->len; i++) {
        const nd_pj *name = nd_pj_get(tools->items[i], "name");
        if (!name || name->type != ND_PJ_STRING)
            continue;
        int seen = 0;
        for (size_t j = 0; j < a->tools.len && !seen; j++) {
            const nd_pj *o = nd_pj_get(a->tools.items[j], "name");
            seen = o->len == name->len && !memcmp(o->str, name->str, name->len);
        }
        if (seen)
            continue;
        nd_pj **items = realloc(a->tools.items, (a->tools.len + 1) * sizeof *items);
        if (!items)
            return ND_ENOMEM;
        a->tools.items = items;
        a->tools.items[a->tools.len++] = tools->items[i];
    }
    return 0;
}

static int load_augment(const char *path, augment_data *a)
{
    memset(a, 0, sizeof *a);
    a->tools.type = ND_PJ_ARRAY;
    nd_lines *r;
    int rc = nd_lines_open(path, 0, &r);
    if (rc)
        return rc;
    const char *line;
    size_t len, lineno;
    while ((rc = nd_lines_next(r, &line, &len, &lineno)) == 1) {
        while (len && strchr(" \t\r\n\f\v", line[len - 1]))
            len--;
        if (strspn(line, " \t\r\n\f\v") >= len)
            continue;
        nd_pj_doc *d;
        if (nd_pj_parse(line, len, &d, NULL)) {
            rc = nd_error_prefix(ND_EFORMAT, "%s:%zu", path, lineno);
            break;
        }
        if (nd_pj_root(d)->type != ND_PJ_OBJECT) {
            nd_pj_free(d);
            rc = nd_error(ND_EFORMAT, "%s:%zu: not a JSON object", path, lineno);
            break;
        }
        if ((rc = push_doc(a, d)) ||
            (rc = collect_tools(a, nd_pj_get(nd_pj_root(d), "tools"), path, lineno)))
            break;
    }
    nd_lines_close(r);
    if (rc > 0)
        rc = 0;
    if (!rc && !a->tools.len)
        rc = nd_error(ND_EFORMAT, "%s: no tool schemas found in the examples", path);
    return rc;
}

/* Output name for --augment: path.replace(".jsonl", "") + ".augmented.jsonl" */
static void augmented_name(const char *path, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = path; *p && k + 1 < n;) {
        if (!strncmp(p, ".jsonl", 6)) {
            p += 6;
            continue;
        }
        out[k++] = *p++;
    }
    out[k] = 0;
    snprintf(out + k, n - k, ".augmented.jsonl");
}

#ifdef NEEDLE_HAVE_CURL
static int write_output(const char *out, const augment_data *old, const nd_gen_set *set)
{
    nd_atomic_file af;
    int rc = nd_atomic_open(&af, out);
    if (rc)
        return rc;
    nd_buf b = {0};
    for (size_t i = 0; old && !rc && i < old->n_docs; i++) {
        const nd_pj *root = nd_pj_root(old->docs[i]);
        if (root->type != ND_PJ_OBJECT)
            continue; /* a "tools" string's document */
        b.n = 0;
        rc = nd_pj_dump(root, 0, &b);
        if (!rc)
            rc = nd_buf_put(&b, "\n", 1);
        if (!rc)
            rc = nd_atomic_write(&af, b.p, b.n);
    }
    nd_buf_free(&b);
    for (size_t i = 0; !rc && i < nd_gen_size(set); i++) {
        size_t n;
        const char *line = nd_gen_line(set, i, &n);
        rc = nd_atomic_write(&af, line, n);
        if (!rc)
            rc = nd_atomic_write(&af, "\n", 1);
    }
    if (rc) {
        nd_atomic_abort(&af);
        return rc;
    }
    return nd_atomic_commit(&af);
}

/* Generate for `tools` and write out (old examples first when augmenting).
 * Returns 0 or 1 after printing the error. */
static int generate_and_write(const gen_params *p, const nd_pj *tools, const augment_data *old,
                              const char *out)
{
    const char *key = getenv("OPENROUTER_API_KEY");
    if (!key || !key[0]) {
        fprintf(stderr, "needle: set OPENROUTER_API_KEY to generate data\n");
        return 1;
    }
    const char *url = getenv("OPENROUTER_URL");
    if (!url || !url[0])
        url = DEFAULT_URL;
    if (nd_check_writable(out))
        return cli_fail(NULL);
    nd_gen_set *set;
    if (nd_gen_set_new(tools, &set))
        return cli_fail(NULL);
    if (nd_gen_warnings(set)[0])
        fprintf(stderr, "  %-9s tools: %s\n", "warning", nd_gen_warnings(set));
    for (size_t i = 0; old && i < old->n_docs; i++)
        nd_gen_seen(set, nd_pj_root(old->docs[i]));
    if (nd_curl_load()) {
        nd_gen_set_free(set);
        return cli_fail(NULL);
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        nd_gen_set_free(set);
        fprintf(stderr, "needle: cannot initialise libcurl\n");
        return 1;
    }
    nd_generate_opts o = {
        .chat = {.url = url,
                 .api_key = key,
                 .max_active = p->workers,
                 .max_retries = p->max_retries,
                 .timeout_s = p->timeout,
                 .retry_base_s = p->retry_base,
                 .retry_max_s = 120,
                 .seed = p->seed},
        .model = p->model,
        .temperature = p->temperature,
        .num_samples = p->num_samples,
        .batch_size = p->batch_size,
        .refusals = 3,
        .progress = stderr,
    };
    nd_generate_stats st;
    int rc = nd_generate(&o, tools, set, &st);
    curl_global_cleanup();
    if (rc) {
        nd_gen_set_free(set);
        return cli_fail("generate-data");
    }
    const nd_gen_counts counts = *nd_gen_get_counts(set), *c = &counts;
    /* quoted reply text: the key (or a piece of it) redacted before printing */
    char first_invalid[256], first_unparsable[256];
    snprintf(first_invalid, sizeof first_invalid, "%s", nd_gen_first_invalid(set));
    snprintf(first_unparsable, sizeof first_unparsable, "%s", nd_gen_first_unparsable(set));
    nd_redact(first_invalid, key);
    nd_redact(first_unparsable, key);
    if (first_invalid[0])
        fprintf(stderr, "  %-9s first invalid example: %s\n", "note", first_invalid);
    if (first_unparsable[0] && nd_gen_size(set))
        fprintf(stderr, "  %-9s first unparsable reply: %s\n", "note", first_unparsable);
    printf("  %-9s requested %ld  kept %zu  dropped invalid %zu  dropped duplicate %zu  "
           "unparsable replies %zu  failed requests %d  requests %d\n",
           "summary", p->num_samples, c->kept, c->invalid, c->duplicate, c->unparsable, st.failed,
           st.submitted);
    fflush(stdout);
    if (!nd_gen_size(set)) {
        /* nothing new: say why, and leave `out` as it was (an older file
         * there is not replaced by an empty or unchanged copy) */
        nd_gen_set_free(set);
        if (st.failed == st.submitted)
            fprintf(stderr,
                    "needle: generate-data: every request failed (%d; the first: %s); "
                    "nothing written\n",
                    st.failed, st.first_error);
        else if (c->unparsable == c->replies)
            fprintf(stderr,
                    "needle: generate-data: no examples: %zu repl%s, all unparsable (the "
                    "first, %s)%s%s; %s not written\n",
                    c->replies, c->replies == 1 ? "y" : "ies", first_unparsable,
                    st.failed ? "; failed requests: " : "", st.failed ? st.first_error : "", out);
        else
            fprintf(stderr,
                    "needle: generate-data: no examples: %zu repl%s, %zu unparsable, %zu "
                    "examples invalid, %zu duplicate, %d requests failed%s%s%s%s; %s not "
                    "written\n",
                    c->replies, c->replies == 1 ? "y" : "ies", c->unparsable, c->invalid,
                    c->duplicate, st.failed, first_invalid[0] ? "; first invalid example: " : "",
                    first_invalid, first_unparsable[0] ? "; first unparsable reply: " : "",
                    first_unparsable, out);
        return 1;
    }
    size_t old_n = 0;
    for (size_t i = 0; old && i < old->n_docs; i++)
        old_n += nd_pj_root(old->docs[i])->type == ND_PJ_OBJECT;
    rc = write_output(out, old, set);
    size_t total = old_n + nd_gen_size(set);
    nd_gen_set_free(set);
    if (rc)
        return cli_fail(NULL);
    printf("  %-9s %zu examples  %s\n", "wrote", total, out);
    fflush(stdout);
    return 0;
}
#else
static int generate_and_write(const gen_params *p, const nd_pj *tools, const augment_data *old,
                              const char *out)
{
    (void)p, (void)tools, (void)old, (void)out;
    fprintf(stderr, "needle: this needle was built without libcurl (libcurl4-openssl-dev): "
                    "data generation is not available\n");
    return 1;
}
#endif

int cli_generate_augment(const char *data, long n, const char *model, int workers, char *out,
                         size_t out_n)
{
    gen_params p;
    gen_params_default(&p, workers);
    p.num_samples = n;
    if (model)
        p.model = model;
    augmented_name(data, out, out_n);
    if (cli_check_output(out, "training data", data, (const char *)NULL))
        return 1;
    augment_data a;
    if (load_augment(data, &a)) {
        augment_free(&a);
        return cli_fail(NULL);
    }
    int rc = generate_and_write(&p, &a.tools, &a, out);
    augment_free(&a);
    return rc;
}

int cli_generate_data(int argc, char **argv)
{
    gen_params p;
    gen_params_default(&p, 16);
    const char *tools_path = NULL, *augment = NULL, *out = NULL;
    long long num = p.num_samples, seed = 0;
    cli_opt opts[] = {
        {"--tools", CLI_PATH, &tools_path, 0, 0, "PATH", NULL,
         "JSON array of tool schemas to generate for", 0, 0},
        {"--augment", CLI_PATH, &augment, 0, 0, "PATH", NULL,
         "JSONL data: generate for the tools its examples use and write the old examples "
         "followed by the new ones",
         0, 0},
        {"--num-samples", CLI_I64, &num, 1, 100000000, "N", NULL, "examples wanted (default 100)",
         0, 0},
        {"--batch-size", CLI_INT, &p.batch_size, 1, 10000, "N", NULL,
         "examples asked for per request (default 25)", 0, 0},
        {"--workers", CLI_INT, &p.workers, 1, 1024, "N", NULL, "concurrent requests (default 16)",
         0, 0},
        {"--model", CLI_STR, &p.model, 0, 0, "NAME", NULL,
         "model name sent to the service (default " DEFAULT_MODEL ")", 0, 0},
        {"--output", CLI_PATH, &out, 0, 0, "PATH", NULL,
         "default needle_data.jsonl (--tools) or DATA.augmented.jsonl (--augment)", 0, 0},
        {"--max-retries", CLI_INT, &p.max_retries, 0, 30, "N", NULL,
         "retries of a request after 429, 5xx or a transport error (default 5; exponential "
         "backoff with jitter, or the server's Retry-After), then it counts as failed",
         0, 0},
        {"--retry-base", CLI_FLOAT, &p.retry_base, 0, 600, "S", NULL,
         "first backoff in seconds (default 1)", 0, 0},
        {"--timeout", CLI_FLOAT, &p.timeout, 0, 86400, "S", NULL,
         "seconds per request (default 180)", CLI_LO_OPEN, 0},
        {"--temperature", CLI_FLOAT, &p.temperature, 0, 2, "X", NULL,
         "sampling temperature (default 0.9)", 0, 0},
        {"--seed", CLI_I64, &seed, 0, (double)(1LL << 62), "N", NULL,
         "backoff jitter seed (default 0)", 0, 0},
    };
    cli_cmd cmd = {"generate-data",
                   generate_usage,
                   generate_about,
                   generate_epilog,
                   opts,
                   CLI_NOPTS(opts),
                   0,
                   {0},
                   0};
    CLI_PARSE(&cmd, argc, argv);
    p.num_samples = (long)num;
    p.seed = (unsigned long long)seed;
    if (!tools_path == !augment)
        return cli_usage_error("generate-data",
                               "pass --tools <schemas.json> or --augment <data.jsonl>");
    if (augment) {
        char outbuf[4096];
        if (!out)
            augmented_name(augment, outbuf, sizeof outbuf), out = outbuf;
        if (cli_check_output(out, "data to augment", augment, (const char *)NULL))
            return 1;
        augment_data a;
        if (load_augment(augment, &a)) {
            augment_free(&a);
            return cli_fail(NULL);
        }
        int rc = generate_and_write(&p, &a.tools, &a, out);
        augment_free(&a);
        return rc;
    }
    if (!out)
        out = "needle_data.jsonl";
    if (cli_check_output(out, "tools", tools_path, (const char *)NULL))
        return 1;
    unsigned char *text;
    size_t len;
    if (nd_read_file(tools_path, 64 << 20, &text, &len))
        return cli_fail(NULL);
    nd_pj_doc *doc;
    size_t col = 0;
    if (nd_pj_parse((const char *)text, len, &doc, &col)) {
        free(text);
        fprintf(stderr, "needle: %s: not JSON: %s\n", tools_path, nd_last_error());
        return 1;
    }
    free(text);
    if (nd_pj_root(doc)->type != ND_PJ_ARRAY) {
        nd_pj_free(doc);
        fprintf(stderr, "needle: %s: expected a JSON array of tool schemas\n", tools_path);
        return 1;
    }
    int rc = generate_and_write(&p, nd_pj_root(doc), NULL, out);
    nd_pj_free(doc);
    return rc;
}
