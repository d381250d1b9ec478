/* needle run --checkpoint X.pkl --query TEXT: upstream's plain greedy
 * continuation from a checkpoint's float weights (needle/model/run.py):
 * print "prompt: <repr>", then stream the decoded continuation. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/eval.h"
#include "model/params.h"
#include "text/pyjson.h"
#include "text/render.h"
#include "text/tokenizer.h"

static const char *run_checkpoint_usage =
    "usage: needle run --checkpoint X.pkl|X.safetensors [--query TEXT] [--max-len N]\n"
    "                  [--seed N] [--tools JSON|FILE] [--no-constrained] [--tokenizer M]\n"
    "                  [--device D] [--threads N]\n";
static const char *run_checkpoint_about =
    "Upstream's `needle run`: greedy plain-text continuation of TEXT (default \"The\n"
    "most surprising thing about\") from the checkpoint's float weights. Prints\n"
    "`prompt: '<TEXT>'`, then the continuation as it is decoded, then a newline;\n"
    "stops at EOS, after --max-len new tokens (default 512) or at the model's\n"
    "max_seq_len. Needle 2: each step runs the float forward over the whole\n"
    "prefix (as upstream does), so long continuations of big models are slow.\n"
    "Needle 3 (on the CPU): the engine's incremental float forward (KV cache,\n"
    "sliding-window and global layers, conv-tap state), the same logits.\n";

/* Python's repr() of a str, for the "prompt: ..." line: single quotes
 * unless the text holds ' and no ", escapes for controls. */
static void print_py_repr(const char *s)
{
    char q = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
    putchar(q);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == (unsigned char)q)
            printf("\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", stdout);
        else if (*p == '\r')
            fputs("\\r", stdout);
        else if (*p == '\t')
            fputs("\\t", stdout);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
    putchar(q);
}

typedef struct {
    float *last; /* logits of the last position [V] */
    int V;       /* how many: the model's output vocabulary */
} last_row;

static int keep_last_row(void *ctx, int seq, const float *logits, int len, int V)
{
    (void)seq;
    last_row *lr = ctx;
    memcpy(lr->last, logits + (size_t)(len - 1) * V, sizeof(float) * (size_t)V);
    lr->V = V;
    return 0;
}

/* 3.x's build_prompt: the query alone when the tools file holds a falsy
 * value, else render_example({"query", "tools"})'s prompt */
static int tools_prompt(const char *query, const char *path, nd_buf *out)
{
    unsigned char *text = NULL;
    size_t len = 0;
    nd_pj_doc *doc = NULL;
    int rc = nd_read_file(path, 0, &text, &len);
    if (rc) /* the message names the file */
        return nd_error_prefix(rc, "--tools");
    if ((rc = nd_pj_parse((const char *)text, len, &doc, NULL))) {
        free(text);
        return nd_error_prefix(rc, "--tools %s", path);
    }
    const nd_pj *tools = nd_pj_root(doc);
    if (nd_pj_truthy(tools)) {
        nd_pj q = {ND_PJ_STRING, strlen(query), query, 0.0, NULL, NULL};
        nd_pj_member mem[2] = {{"query", 5, &q}, {"tools", 5, (nd_pj *)tools}};
        nd_pj ex = {ND_PJ_OBJECT, 2, NULL, 0.0, NULL, mem};
        nd_buf target = {0};
        rc = nd_render_example_gen(&ex, 3, out, &target);
        nd_buf_free(&target);
        if (rc)
            nd_error_prefix(rc, "--tools %s", path);
    }
    nd_pj_free(doc);
    free(text);
    return rc;
}

/* jnp.argmax: the first index of the maximum */
static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The tokenizer against the model's vocabulary: a Needle 3 model takes
 * 3.x's get_tokenizer(vocab_size) rule (at most vocab_size pieces), a
 * Needle 2 one exactly vocab_size. 1 (printed) when it does not fit. */
static int run_check_vocab(const nd_tokenizer *tok, int gen3, int V, const char *tok_path,
                           const char *ckpt)
{
    if (gen3) {
        if (nd_render_check_vocab(tok, 3, V, tok_path))
            return cli_fail(NULL);
    } else if (nd_tokenizer_vocab_size(tok) != V) {
        fprintf(stderr, "needle: tokenizer %s has %d pieces but %s has vocab_size %d\n", tok_path,
                nd_tokenizer_vocab_size(tok), ckpt, V);
        return 1;
    }
    return 0;
}

/* [BOS] + encode(prompt) at the start of a buffer of
 * min(max_seq_len, prompt + max_len) ids (*ids, the caller frees it).
 * 1 (printed) when it cannot be made. */
static int run_prompt_ids(const san_model *m, const nd_tokenizer *tok, const char *prompt,
                          long long max_len, int32_t **ids, size_t *n_prompt, size_t *buf_len)
{
    int gen3 = m->cfg.generation == 3;
    nd_idvec enc = {0};
    int status = 1;
    if (nd_tokenizer_encode(tok, prompt, strlen(prompt), &enc)) {
        cli_fail(NULL);
        goto done;
    }
    *n_prompt = enc.n + 1;
    *buf_len = *n_prompt + (size_t)max_len;
    if (m->cfg.max_seq_len > 0 && *buf_len > (size_t)m->cfg.max_seq_len)
        *buf_len = (size_t)m->cfg.max_seq_len;
    if (*n_prompt >= *buf_len) {
        fprintf(stderr, "needle: prompt (%zu tokens) does not fit in max_seq_len=%d\n", *n_prompt,
                m->cfg.max_seq_len);
        goto done;
    }
    *ids = malloc(sizeof **ids * *buf_len);
    if (!*ids) {
        fprintf(stderr, "needle: out of memory\n");
        goto done;
    }
    /* 3.x uses its fixed special ids, not the tokenizer model's */
    (*ids)[0] = gen3 ? ND_V3_BOS_ID : nd_tokenizer_bos_id(tok);
    memcpy(*ids + 1, enc.v, sizeof **ids * enc.n);
    status = 0;
done:
    nd_idvec_free(&enc);
    return status;
}

/* The next token's logits into lr->last: with the KV cache (kv not NULL)
 * the tokens not run yet (the prompt, then the last one; *fed counts
 * those run), else upstream's full forward over ids[0..n). */
static int run_next_logits(const san_model *m, const nd_backend *be, nd_kv_state *kv, int32_t *ids,
                           size_t n, size_t *fed, last_row *lr)
{
    if (kv) {
        int rc = nd_kv_forward(kv, ids + *fed, (int)(n - *fed), lr->last, 0);
        if (!rc)
            *fed = n;
        return rc;
    }
    size_t start[2] = {0, n};
    int line = 1;
    token_seqs one = {ids, start, &line, 1};
    san_eval_result r;
    int rc = san_eval(m, be, &one, 1, keep_last_row, lr, &r);
    if (!rc)
        san_eval_result_free(&r);
    return rc;
}

/* Greedy decoding from ids[0..n_prompt) until EOS or buf_len ids, the
 * continuation streamed to stdout as it is decoded (decode everything so
 * far, print what is new). row: [V_out] floats. */
static int run_greedy(const san_model *m, const nd_backend *be, nd_kv_state *kv,
                      const nd_tokenizer *tok, int32_t *ids, size_t n_prompt, size_t buf_len,
                      float *row, int eos)
{
    char *text = NULL;
    size_t n = n_prompt, printed = 0, fed = 0;
    last_row lr = {row, m->dims.V_out};
    int rc = ND_OK;
    while (n < buf_len) {
        if ((rc = run_next_logits(m, be, kv, ids, n, &fed, &lr)))
            break;
        int next = argmax(row, lr.V);
        if (next == eos)
            break;
        ids[n++] = next;
        free(text);
        text = NULL;
        size_t len;
        if ((rc = nd_tokenizer_decode(tok, ids + n_prompt, n - n_prompt, &text, &len)))
            break;
        if (len > printed) {
            fwrite(text + printed, 1, len - printed, stdout);
            fflush(stdout);
            printed = len;
        }
    }
    free(text);
    return rc;
}

int cli_run_checkpoint(int argc, char **argv)
{
    const char *ckpt = NULL, *query = NULL, *tok_flag = NULL, *device = "cpu", *tools = NULL;
    long long max_len = 512, seed = 0, threads = 0;
    int no_constrained = 0;
    cli_opt opts[] = {
        CLI_OPT_CHECKPOINT(&ckpt, "the checkpoint (pickle or safetensors; a missing one is "
                                  "downloaded from Hugging Face as upstream does)"),
        {"--query", CLI_STR, &query, 0, 0, "TEXT", NULL,
         "the text to continue (default \"The most surprising thing about\")", 0, 0},
        {"--max-len", CLI_I64, &max_len, 1, 1 << 20, "N", NULL, "new tokens at most (default 512)",
         0, 0},
        {"--tools", CLI_PATH, &tools, 0, 0, "FILE", NULL,
         "Needle 3 (3.x's run.py): the prompt becomes the 3.x chat template of {query, tools} "
         "read from FILE (a JSON list; empty: the bare query). Needle 2 ignores it",
         0, 0},
        {"--seed", CLI_I64, &seed, 0, (double)INT64_MAX, "N", NULL,
         "accepted for upstream's command lines; upstream's plain mode ignores it (greedy "
         "decoding draws nothing)",
         0, 0},
        {"--no-constrained", CLI_FLAG, &no_constrained, 0, 0, NULL, NULL,
         "accepted for upstream's command lines and ignored (tool calls: use --weights X.cact)", 0,
         0},
        CLI_OPT_TOKENIZER(&tok_flag, CLI_TOKENIZER_HELP),
        CLI_OPT_DEVICE(&device, "auto|cpu|cuda[:N]|vulkan[:N] (default cpu)"),
        CLI_OPT_THREADS(&threads),
    };
    cli_cmd cmd = {"run --checkpoint",
                   run_checkpoint_usage,
                   run_checkpoint_about,
                   NULL,
                   opts,
                   CLI_NOPTS(opts),
                   CLI_MAX_POS,
                   {0},
                   0};
    CLI_PARSE(&cmd, argc, argv);
    if (cmd.n_pos)
        return cli_usage_error("run",
                               "unexpected argument '%s' (with --checkpoint the text goes in "
                               "--query)",
                               cmd.pos[0]);
    if (!ckpt)
        return cli_usage_error("run", "--checkpoint X.pkl is required");
    const char *prompt = query ? query : "The most surprising thing about";

    char ckbuf[4096], tokbuf[4096];
    if (cli_fetch_checkpoint(ckpt, ckbuf, sizeof ckbuf))
        return 1;
    ckpt = ckbuf;
    const char *tok_path = cli_tokenizer_path(tok_flag, ckpt, tokbuf, sizeof tokbuf);
    if (!tok_path)
        return 1;
    const nd_backend *be = cli_backend("run", device, NULL, (int)threads);
    if (!be)
        return 1;
    san_model m;
    if (ckpt_load(ckpt, &m, NULL))
        return cli_fail(NULL);
    int gen3 = m.cfg.generation == 3;
    nd_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    float *row = NULL;
    nd_buf rendered = {0};
    nd_kv_state kv;
    int kv_on = 0, status = 1;
    if (san_model_to_backend(&m, be) || nd_tokenizer_load(tok_path, &tok)) {
        cli_fail(NULL);
        goto done;
    }
    int V = m.dims.V;
    if (run_check_vocab(tok, gen3, V, tok_path, ckpt))
        goto done;
    if (gen3 && tools) {
        if (tools_prompt(prompt, tools, &rendered)) {
            cli_fail(NULL);
            goto done;
        }
        if (rendered.p)
            prompt = rendered.p;
    }
    size_t n_prompt, buf_len;
    if (run_prompt_ids(&m, tok, prompt, max_len, &ids, &n_prompt, &buf_len))
        goto done;
    row = malloc(sizeof *row * (size_t)V);
    if (!row) {
        fprintf(stderr, "needle: out of memory\n");
        goto done;
    }
    int eos = gen3 ? ND_V3_EOS_ID : nd_tokenizer_eos_id(tok);
    /* Needle 3 on the host: the engine's incremental float forward (each
     * step runs the new token only; the logits are the full forward's) */
    if (gen3 && !be->device) {
        if (nd_kv_init(&kv, &m, be, ND_SESSION_CHUNK, 0)) {
            cli_fail(NULL);
            goto done;
        }
        kv_on = 1;
    }

    printf("prompt: ");
    print_py_repr(prompt);
    putchar('\n');
    fflush(stdout);
    if (run_greedy(&m, be, kv_on ? &kv : NULL, tok, ids, n_prompt, buf_len, row, eos)) {
        cli_fail(NULL);
        goto done;
    }
    putchar('\n');
    fflush(stdout);
    status = 0;
done:
    if (kv_on)
        nd_kv_free(&kv);
    nd_buf_free(&rendered);
    free(row);
    free(ids);
    nd_tokenizer_free(tok);
    san_model_free(&m);
    return status;
}
