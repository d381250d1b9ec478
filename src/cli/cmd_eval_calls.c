/* needle eval-calls: run a .cact (or a checkpoint's float weights) on
 * held-out tool-calling examples and score the calls (src/eval/callscore.h
 * has the rules). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "engine/from_checkpoint.h"
#include "eval/calldata.h"
#include "eval/callscore.h"
#include "needle.h"

static const char *eval_calls_usage =
    "usage: needle eval-calls --weights X.cact DATA.jsonl [options]\n"
    "       needle eval-calls --checkpoint X.pkl [--lora A.pkl] [--tokenizer M]\n"
    "                         DATA.jsonl [options]\n"
    "options: [--json] [--limit N] [--predictions OUT.jsonl] [--skip-bad]\n"
    "         [--threads N] [--max-new-tokens N] [--require-call]\n";
static const char *eval_calls_about =
    "Answers every example's query with the engine (as `needle run`: the example's\n"
    "system and tools, a fresh conversation) and scores the calls against its\n"
    "\"answers\". DATA is upstream's training JSONL (query, tools, answers or\n"
    "function_calls, optional system). Per example:\n"
    "  valid JSON   the engine answered (success) with a call list that parses,\n"
    "               every call names a declared tool and its arguments satisfy\n"
    "               that tool's schema (the decoder's grammar accepts it)\n"
    "  tool name    the multiset of predicted tool names equals the expected one\n"
    "  exact args   the predicted calls equal the expected ones as a multiset of\n"
    "               (name, arguments); values compared as JSON: key order ignored,\n"
    "               numbers by value (3 == 3.0), strings exactly, true != 1\n"
    "  refusal      on examples expecting no call ([]): the prediction is []\n"
    "  false refusal on examples expecting calls: the prediction is []\n"
    "An answer that is not a call list (engine error, cut off) is wrong on every\n"
    "metric and neither kind of refusal. Figures are counts and percentages over\n"
    "all examples, those expecting calls and those expecting none.\n";

typedef struct {
    nd_callscore_totals t;
    size_t engine_errors;
    double seconds;
} report;

/* JSON string of s (ASCII escapes for controls, '"' and '\\'). */
static int put_str(nd_buf *b, const char *s)
{
    int rc = nd_buf_put(b, "\"", 1);
    for (; *s && !rc; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            rc = nd_buf_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            rc = nd_buf_put(b, esc, 6);
        } else {
            rc = nd_buf_put(b, (const char *)&c, 1);
        }
    }
    return rc ? rc : nd_buf_put(b, "\"", 1);
}

#define PUT(b, s) nd_buf_put(b, s, strlen(s))

static int put_bool(nd_buf *b, const char *key, int v, int present)
{
    int rc = PUT(b, key);
    return rc ? rc : PUT(b, present ? (v ? "true" : "false") : "null");
}

/* One --predictions line. */
static int prediction_line(nd_buf *b, const nd_call_example *e, const nd_pj *predicted,
                           const nd_pj *reasoning, const nd_call_verdict *v)
{
    char num[48];
    snprintf(num, sizeof num, "{\"line\":%zu,\"query\":", e->line);
    int rc = PUT(b, num);
    if (!rc)
        rc = nd_pj_dump(e->query, 1, b);
    if (!rc)
        rc = PUT(b, ",\"expected\":");
    if (!rc)
        rc = nd_pj_dump(e->expected, 1, b);
    if (!rc)
        rc = PUT(b, ",\"predicted\":");
    if (!rc)
        rc = predicted ? nd_pj_dump(predicted, 1, b) : PUT(b, "null");
    if (!rc)
        rc = PUT(b, ",\"reasoning\":");
    if (!rc)
        rc = reasoning ? nd_pj_dump(reasoning, 1, b) : PUT(b, "null");
    if (!rc)
        rc = put_bool(b, ",\"expects_call\":", v->expects_call, 1);
    if (!rc)
        rc = put_bool(b, ",\"valid\":", v->valid, 1);
    if (!rc)
        rc = put_bool(b, ",\"tool_name\":", v->names_ok, 1);
    if (!rc)
        rc = put_bool(b, ",\"exact_args\":", v->args_ok, 1);
    int refused = v->parsed && !v->called;
    if (!rc)
        rc = put_bool(b, ",\"refusal\":", refused, !v->expects_call);
    if (!rc)
        rc = put_bool(b, ",\"false_refusal\":", refused, v->expects_call);
    if (!rc)
        rc = PUT(b, ",\"error\":");
    if (!rc)
        rc = v->why[0] ? put_str(b, v->why) : PUT(b, "null");
    return rc ? rc : PUT(b, "}\n");
}

/* The call list the engine answered, or NULL with *err saying why. */
static nd_pj_doc *envelope_calls(const char *env, int len, const char **err, char *msg, size_t cap)
{
    nd_pj_doc *doc = NULL;
    if (nd_pj_parse(env, (size_t)len, &doc, NULL)) {
        snprintf(msg, cap, "the envelope is not JSON: %s", nd_last_error());
        *err = msg;
        return NULL;
    }
    const nd_pj *root = nd_pj_root(doc), *ok = nd_pj_get(root, "success");
    if (!ok || ok->type != ND_PJ_TRUE) {
        const nd_pj *code = nd_pj_get(root, "error_code"), *e = nd_pj_get(root, "error");
        snprintf(msg, cap, "%s%s%s", code && code->type == ND_PJ_STRING ? code->str : "no success",
                 e && e->type == ND_PJ_STRING ? ": " : "",
                 e && e->type == ND_PJ_STRING ? e->str : "");
        *err = msg;
        nd_pj_free(doc);
        return NULL;
    }
    return doc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void rate(char *out, size_t cap, size_t k, size_t n)
{
    if (n)
        snprintf(out, cap, "%zu/%zu (%.1f%%)", k, n, 100.0 * (double)k / (double)n);
    else
        snprintf(out, cap, "-");
}

static void print_table(const report *r)
{
    const nd_callscore_totals *t = &r->t;
    size_t n[3] = {t->examples[0] + t->examples[1], t->examples[1], t->examples[0]};
    const size_t *rows[3] = {t->valid, t->names_ok, t->args_ok};
    const char *names[3] = {"valid JSON", "tool name", "exact args"};
    char c[3][48];
    printf("%-14s %-20s %-20s %-20s\n", "", "all", "expect call", "expect no call");
    printf("%-14s %-20zu %-20zu %-20zu\n", "examples", n[0], n[1], n[2]);
    for (int k = 0; k < 3; k++) {
        rate(c[0], sizeof c[0], rows[k][0] + rows[k][1], n[0]);
        rate(c[1], sizeof c[1], rows[k][1], n[1]);
        rate(c[2], sizeof c[2], rows[k][0], n[2]);
        printf("%-14s %-20s %-20s %-20s\n", names[k], c[0], c[1], c[2]);
    }
    rate(c[2], sizeof c[2], t->refused[0], n[2]);
    printf("%-14s %-20s %-20s %-20s\n", "refusal", "", "", c[2]);
    rate(c[1], sizeof c[1], t->refused[1], n[1]);
    printf("%-14s %-20s %-20s %-20s\n", "false refusal", "", c[1], "");
    printf("engine errors: %zu; %.1f s (%.2f examples/s)\n", r->engine_errors, r->seconds,
           r->seconds > 0 ? (double)n[0] / r->seconds : 0.0);
}

static void json_metric(const char *key, size_t k, size_t n, int last)
{
    printf("\"%s\": {\"count\": %zu, \"rate\": ", key, k);
    if (n)
        printf("%.6g}%s", (double)k / (double)n, last ? "" : ", ");
    else
        printf("null}%s", last ? "" : ", ");
}

static void json_group(const char *key, const report *r, int g)
{
    const nd_callscore_totals *t = &r->t;
    size_t n = g < 0 ? t->examples[0] + t->examples[1] : t->examples[g];
#define SEL(a) (g < 0 ? (a)[0] + (a)[1] : (a)[g])
    printf("\"%s\": {\"examples\": %zu, ", key, n);
    json_metric("valid_json", SEL(t->valid), n, 0);
    json_metric("tool_name", SEL(t->names_ok), n, 0);
    json_metric("exact_args", SEL(t->args_ok), n, g < 0);
    if (g == 0)
        json_metric("refusal", t->refused[0], n, 1);
    if (g == 1)
        json_metric("false_refusal", t->refused[1], n, 1);
    printf("}");
#undef SEL
}

static void print_json(const report *r, const nd_call_set *set, const char *data)
{
    nd_buf b = {0};
    put_str(&b, data);
    printf("{\"data\": %s, \"lines\": %zu, \"skipped_bad\": %zu, \"skipped_no_query\": %zu, "
           "\"engine_errors\": %zu, \"seconds\": %.3f, ",
           b.p ? b.p : "\"\"", set->lines, set->bad, set->no_query, r->engine_errors, r->seconds);
    nd_buf_free(&b);
    json_group("all", r, -1);
    printf(", ");
    json_group("call", r, 1);
    printf(", ");
    json_group("no_call", r, 0);
    printf("}\n");
}

/* The session for e: the previous one rewound when system and tools are
 * the same, else a new one. */
static int session_for(needle_model *m, const nd_call_example *e, int require_call,
                       needle_session **s, const nd_call_example **cur)
{
    if (*s && *cur && !strcmp((*cur)->tools_json, e->tools_json) && !(*cur)->system == !e->system &&
        (!e->system || !strcmp((*cur)->system, e->system))) {
        *cur = e;
        return needle_session_reset(*s) < 0 ? nd_error(ND_EFORMAT, "%s", needle_session_error(*s))
                                            : ND_OK;
    }
    needle_session_free(*s);
    *cur = NULL;
    *s = needle_session_new(m, e->system, e->tools_json);
    if (!*s)
        return nd_error(ND_EFORMAT, "%s", needle_thread_error());
    if (require_call)
        needle_session_require_call(*s, 1);
    *cur = e;
    return ND_OK;
}

/* Run and score every example; per-example lines go to `pred` (may be
 * NULL). Returns 0, or 1 after printing why. */
static int run_all(needle_model *m, nd_call_set *set, const char *data, int skip_bad,
                   int require_call, int max_new, nd_atomic_file *pred, report *r)
{
    int cap = 1 << 20, status = 0;
    char *env = malloc((size_t)cap);
    if (!env) {
        fprintf(stderr, "needle: out of memory\n");
        return 1;
    }
    needle_session *s = NULL;
    const nd_call_example *cur = NULL;
    int tty = isatty(fileno(stderr));
    size_t step = set->n >= 100 ? set->n / 10 : 0;
    double t0 = now_s();
    for (size_t i = 0; i < set->n && !status; i++) {
        const nd_call_example *e = &set->ex[i];
        if (session_for(m, e, require_call, &s, &cur)) {
            nd_error_prefix(ND_EFORMAT, "%s:%zu: tools", data, e->line);
            if (!skip_bad) {
                status = cli_fail(NULL);
                break;
            }
            if (!set->bad++)
                snprintf(set->first_bad, sizeof set->first_bad, "%s", nd_last_error());
            continue;
        }
        char msg[512];
        const char *err = NULL;
        nd_pj_doc *calls_doc = NULL;
        const nd_pj *calls = NULL, *reasoning = NULL;
        int len = needle_session_complete(s, e->query->str, max_new, env, cap);
        if (len < 0) {
            snprintf(msg, sizeof msg, "%s", needle_session_error(s));
            err = msg;
        } else if ((calls_doc = envelope_calls(env, len, &err, msg, sizeof msg))) {
            calls = nd_pj_get(nd_pj_root(calls_doc), "function_calls");
            reasoning = nd_pj_get(nd_pj_root(calls_doc), "reasoning");
        }
        if (!calls && !err)
            err = "the envelope has no function_calls";
        nd_buf text = {0};
        if (calls && nd_pj_dump(calls, 1, &text)) {
            fprintf(stderr, "needle: out of memory\n");
            status = 1;
        }
        nd_call_verdict v;
        if (!status &&
            nd_callscore_example(e->expected, calls ? text.p : NULL, text.n, e->tools, err, &v)) {
            nd_error_prefix(ND_EFORMAT, "%s:%zu", data, e->line);
            status = cli_fail(NULL);
        }
        if (!status) {
            r->engine_errors += calls == NULL;
            nd_callscore_add(&r->t, &v);
            if (pred) {
                nd_buf line = {0};
                int rc = prediction_line(&line, e, calls, reasoning, &v);
                if (!rc)
                    rc = nd_atomic_write(pred, line.p, line.n);
                nd_buf_free(&line);
                if (rc)
                    status = cli_fail(NULL);
            }
        }
        nd_buf_free(&text);
        nd_pj_free(calls_doc);
        if (tty)
            fprintf(stderr, "\rneedle eval-calls: %zu/%zu", i + 1, set->n);
        else if (step && (i + 1) % step == 0)
            fprintf(stderr, "needle eval-calls: %zu/%zu examples, %.1f s\n", i + 1, set->n,
                    now_s() - t0);
    }
    if (tty && set->n)
        fputc('\n', stderr);
    r->seconds = now_s() - t0;
    needle_session_free(s);
    free(env);
    return status;
}

/* $NEEDLE_TOKENIZER, else tokenizer.model beside the checkpoint (as build;
 * a missing file is reported by the loader, naming the path). */
static const char *default_tokenizer(const char *ckpt, char *buf, size_t cap)
{
    const char *env = getenv("NEEDLE_TOKENIZER");
    if (env && *env)
        return env;
    const char *slash = strrchr(ckpt, '/');
    int dir = slash ? (int)(slash - ckpt) + 1 : 0;
    snprintf(buf, cap, "%.*stokenizer.model", dir, ckpt);
    return buf;
}

int cli_eval_calls(int argc, char **argv)
{
    const char *weights = NULL, *data = NULL, *pred_path = NULL, *ckpt = NULL, *lora = NULL,
               *tok = NULL;
    long long limit = 0, threads = 0, max_new = 256;
    int json = 0, skip_bad = 0, require_call = 0;
    cli_opt opts[] = {
        {"--weights", CLI_PATH, &weights, 0, 0, "PATH", NULL, ".cact archive (needle build)", 0, 0},
        CLI_OPT_CHECKPOINT(&ckpt, "instead of --weights: the checkpoint's float weights, no "
                                  "quantisation, through the same engine, decoder and grammar "
                                  "(scores a fine-tune before `needle build`)"),
        {"--lora", CLI_PATH, &lora, 0, 0, "PATH", NULL,
         "with --checkpoint: merge this adapter first, exactly as `needle build --lora` does", 0,
         0},
        CLI_OPT_TOKENIZER(&tok, "with --checkpoint: SentencePiece .model or blob (default "
                                "$NEEDLE_TOKENIZER, else tokenizer.model beside the checkpoint)"),
        {"--json", CLI_FLAG, &json, 0, 0, NULL, NULL,
         "print the report as one JSON object instead of a table", 0, 0},
        {"--limit", CLI_I64, &limit, 1, (double)(1LL << 40), "N", NULL,
         "score only the first N examples", 0, 0},
        {"--predictions", CLI_PATH, &pred_path, 0, 0, "PATH", NULL,
         "write one JSON line per example: line, query, expected, predicted (null without an "
         "answer), reasoning, expects_call, valid, tool_name, exact_args, refusal (null on call "
         "examples), "
         "false_refusal (null on no-call examples), error",
         0, 0},
        {"--skip-bad", CLI_FLAG, &skip_bad, 0, 0, NULL, NULL,
         "count and skip invalid lines instead of failing", 0, 0},
        CLI_OPT_THREADS(&threads),
        {"--max-new-tokens", CLI_I64, &max_new, 1, 1 << 20, "N", NULL,
         "generation budget per example (default 256)", 0, 0},
        {"--require-call", CLI_FLAG, &require_call, 0, 0, NULL, NULL,
         "the answer must be at least one call (tool_choice \"required\"): tests tool and "
         "argument choice alone; no-call examples then always fail",
         0, 0},
    };
    cli_cmd cmd = {
        "eval-calls", eval_calls_usage, eval_calls_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    data = cmd.n_pos ? cmd.pos[0] : NULL;
    if (weights && ckpt)
        return cli_usage_error("eval-calls",
                               "give --weights X.cact or --checkpoint X.pkl, not both");
    if (!weights && !ckpt)
        return cli_usage_error("eval-calls",
                               "--weights X.cact (or --checkpoint X.pkl) is required");
    if ((lora || tok) && !ckpt)
        return cli_usage_error("eval-calls",
                               "%s goes with --checkpoint (a .cact has both merged in)",
                               lora ? "--lora" : "--tokenizer");
    char tokbuf[4096];
    if (ckpt && !tok)
        tok = default_tokenizer(ckpt, tokbuf, sizeof tokbuf);
    if (!data)
        return cli_usage_error("eval-calls", "a DATA.jsonl file is required");
    if (pred_path &&
        (cli_check_output(pred_path, "data", data, "weights", weights, "checkpoint", ckpt,
                          "adapter", lora, "tokenizer", tok, (const char *)NULL) ||
         (nd_check_writable(pred_path) && cli_fail(NULL))))
        return 1;

    nd_call_set set;
    if (nd_calldata_load(data, skip_bad, (size_t)limit, &set))
        return cli_fail(NULL);
    if (!set.n) {
        fprintf(stderr, "needle: %s: no examples (%zu lines, %zu without \"query\", %zu bad)\n",
                data, set.lines, set.no_query, set.bad);
        nd_call_set_free(&set);
        return 1;
    }
    if (threads > 0)
        nd_backend_cpu((int)threads);
    needle_model *m =
        weights ? needle_model_load(weights) : nd_model_from_checkpoint(ckpt, lora, tok);
    if (!m) {
        fprintf(stderr, "needle: %s\n", needle_thread_error());
        nd_call_set_free(&set);
        return 1;
    }
    nd_atomic_file af, *pred = NULL;
    if (pred_path) {
        if (nd_atomic_open(&af, pred_path)) {
            needle_model_free(m);
            nd_call_set_free(&set);
            return cli_fail(NULL);
        }
        pred = &af;
    }
    report r;
    memset(&r, 0, sizeof r);
    int status = run_all(m, &set, data, skip_bad, require_call, (int)max_new, pred, &r);
    if (pred) {
        if (status)
            nd_atomic_abort(pred);
        else if (nd_atomic_commit(pred))
            status = cli_fail(NULL);
    }
    if (!status) {
        if (set.bad)
            fprintf(stderr, "needle: warning: skipped %zu bad line%s (first: %s)\n", set.bad,
                    set.bad == 1 ? "" : "s", set.first_bad);
        if (json)
            print_json(&r, &set, data);
        else
            print_table(&r);
    }
    needle_model_free(m);
    nd_call_set_free(&set);
    return status;
}
