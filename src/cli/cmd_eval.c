/* needle eval: next-token loss of a checkpoint on token sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/mem.h"
#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/eval.h"
#include "model/lora.h"
#include "model/lora_merge.h"
#include "io/jsonl.h"
#include "text/render.h"
#include "text/tokenizer.h"
#include "train/evaluate.h"

static const char *eval_usage =
    "usage: needle eval --checkpoint CKPT.pkl DATA.jsonl [--tokenizer M] [--max-len N]\n"
    "                   [--lora ADAPTER] [--grad-norms [--lora-rank R --seed S]] [--json]\n"
    "                   [--qat [--bits N] | --no-qat]\n"
    "       needle eval --checkpoint CKPT.pkl --tokens FILE [--json] [--logits OUT.bin]\n"
    "                   [--qat (Needle 3)]\n"
    "                   [--batching shared|packed|padded]\n"
    "       common: [--batch-size B] [--threads N] [--device D] [--precision P]\n";
static const char *eval_about =
    "JSONL: per-example masked loss (target tokens only) and the overall loss exactly\n"
    "as upstream's loss_fn over all examples as one batch (sum of masked CE / masked\n"
    "positions). --tokens: mean next-token cross-entropy of each token-id sequence\n"
    "(one per line, all positions count) and the overall mean.\n";

typedef struct {
    nd_atomic_file af;
    int failed; /* the error is the output's (its message names it) */
} logits_out;

static int write_logits(void *ctx, int seq, const float *logits, int len, int V)
{
    (void)seq;
    logits_out *lo = ctx;
    int rc = nd_atomic_write(&lo->af, logits, sizeof(float) * (size_t)len * V);
    if (rc)
        lo->failed = 1;
    return rc;
}

/* A loss that is not finite means the weights (or the adapter) are broken:
 * print the numbers, but fail. */
static int nonfinite_loss(const char *ckpt, const char *lora, double mean)
{
    fprintf(stderr,
            "needle: %s: the loss is not finite (%g): the checkpoint%s has NaN/Inf weights or "
            "overflows\n",
            ckpt, mean, lora ? " or the adapter" : "");
    return 1;
}

static double l2(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

typedef struct {
    const char *ckpt, *data, *tok_flag, *lora_path;
    int json, grad_norms, batch, max_len, rank, batching;
    int qat, bits; /* --qat: the archive's weights at build's --bits */
    int no_qat;    /* --no-qat: a Needle 3 model's loss in float (default: 3.x's numerics) */
    double alpha;
    long long seed;
} jsonl_args;

static int eval_jsonl(const jsonl_args *a, san_model *m, const nd_backend *be)
{
    char tokbuf[4096];
    const char *tpath = cli_tokenizer_path(a->tok_flag, a->ckpt, tokbuf, sizeof tokbuf);
    if (!tpath)
        return 1;
    nd_tokenizer *tok = NULL;
    nd_dataset ds = {0};
    nd_token_set ts = {0};
    san_lora lora = {0};
    nd_batcher bt = {0};
    nd_masked_eval ev = {0};
    int rc = 1, have_lora = 0;
    if (nd_tokenizer_load(tpath, &tok)) {
        cli_fail(NULL);
        goto done;
    }
    /* the chat template and tokenizer rules follow the model's generation */
    if (m->cfg.generation == 3) {
        if (nd_render_check_vocab(tok, 3, m->dims.V, tpath)) {
            cli_fail(NULL);
            goto done;
        }
    } else if (nd_tokenizer_vocab_size(tok) != m->dims.V) {
        fprintf(stderr, "needle: tokenizer %s has %d pieces but the checkpoint's vocab is %d\n",
                tpath, nd_tokenizer_vocab_size(tok), m->dims.V);
        goto done;
    }
    nd_jsonl_opts jo = {.generation = m->cfg.generation};
    if (nd_jsonl_load(a->data, &jo, &ds)) {
        cli_fail(NULL);
        goto done;
    }
    if (nd_dataset_tokenize(&ds, tok, (size_t)a->max_len, &ts)) {
        cli_fail(a->data);
        goto done;
    }
    if (a->lora_path) {
        if (san_lora_load(&lora, m, a->lora_path, NULL)) {
            cli_fail(NULL);
            goto done;
        }
        have_lora = 1;
    } else if (a->grad_norms) {
        if (san_lora_create(&lora, m, a->rank, (float)a->alpha)) {
            cli_fail(NULL);
            goto done;
        }
        san_lora_init(&lora, (uint64_t)a->seed);
        have_lora = 1;
    }
    int B = a->batch < (int)ts.n ? a->batch : (int)ts.n;
    if (have_lora && san_lora_to_backend(&lora, be)) {
        cli_fail(NULL);
        goto done;
    }
    /* size the activations for the batches eval will run (consecutive runs
     * of B examples): one prefix group may hold many examples */
    long max_rows = 0, max_items = 0, max_group = 0;
    size_t *order = malloc(sizeof *order * (ts.n ? ts.n : 1));
    if (!order) {
        nd_error(ND_ENOMEM, "out of memory");
        cli_fail(NULL);
        goto done;
    }
    for (size_t i = 0; i < ts.n; i++)
        order[i] = i;
    int caps_rc =
        nd_batch_caps(&ts, a->batching, order, ts.n, B, &max_rows, &max_items, &max_group, NULL);
    free(order);
    if (caps_rc) {
        nd_error(ND_ENOMEM, "out of memory");
        cli_fail(NULL);
        goto done;
    }
    if (nd_batcher_create(&bt, m, be, have_lora ? &lora : NULL, &ts, B, a->batching, 0, max_rows,
                          max_items, max_group, ND_ACT_BUDGET_MB) ||
        (m->cfg.generation == 3 ? !a->no_qat && nd_trainer_set_quant3(&bt.tr)
                                : a->qat && nd_trainer_set_qat(&bt.tr, a->bits)) ||
        nd_eval_masked(&bt, a->grad_norms, &ev)) {
        cli_fail(a->data);
        goto done;
    }
    double mean = ev.total_loss / (ev.total_positions > 1 ? ev.total_positions : 1);
    if (a->json) {
        printf("{\"examples\": [");
        for (size_t i = 0; i < ev.n; i++)
            printf("%s{\"loss\": %.9g, \"tokens\": %.0f}", i ? ", " : "",
                   ev.positions[i] > 0 ? ev.loss_sum[i] / ev.positions[i] : 0.0, ev.positions[i]);
        printf("], \"mean_loss\": %.9g", mean);
    } else {
        for (size_t i = 0; i < ev.n; i++)
            printf("example %zu (line %zu): loss %.6f over %.0f target tokens\n", i + 1,
                   ds.ex[i].line, ev.positions[i] > 0 ? ev.loss_sum[i] / ev.positions[i] : 0.0,
                   ev.positions[i]);
        printf("mean loss %.6f over %.0f target tokens (%zu examples, seq_len %zu)\n", mean,
               ev.total_positions, ev.n, ts.max_len);
    }
    if (a->grad_norms) {
        double global = l2(ev.lora_grad, lora.numel);
        if (a->json)
            printf(", \"grad_norms\": {\"global\": %.9g", global);
        else
            printf("grad norm (global) %.6g\n", global);
        for (int t = 0; t < LORA_NTARGETS; t++) {
            if (!lora.t[t].present)
                continue;
            double na =
                l2(ev.lora_grad + lora.t[t].a_off, (size_t)lora.L * lora.t[t].in * lora.rank);
            double nb =
                l2(ev.lora_grad + lora.t[t].b_off, (size_t)lora.L * lora.rank * lora.t[t].out);
            if (a->json)
                printf(", \"%s\": {\"A\": %.9g, \"B\": %.9g}", san_lora_target_name(t), na, nb);
            else
                printf("grad norm %s  A %.6g  B %.6g\n", san_lora_target_name(t), na, nb);
        }
        if (a->json)
            printf("}");
    }
    if (a->json)
        printf("}\n");
    rc = isfinite(mean) ? 0 : nonfinite_loss(a->ckpt, a->lora_path, mean);
done:
    nd_masked_eval_free(&ev);
    nd_batcher_free(&bt);
    san_lora_free(&lora);
    nd_token_set_free(&ts);
    nd_dataset_free(&ds);
    nd_tokenizer_free(tok);
    return rc;
}

typedef struct {
    const char *ckpt, *tokens, *logits_path;
    int json, batch;
} tokens_args;

/* The forward over every sequence (3.x's quantised numerics for a Needle 3
 * model with --qat), the logits streamed to --logits and committed only
 * when all of it went through. */
static int tokens_forward(const tokens_args *a, int qat, san_model *m, const nd_backend *be,
                          const token_seqs *seqs, logits_out *lo, san_eval_result *r)
{
    /* Needle 3 --qat: 3.x's quant=True forward on cq_ste(weights) (after
     * any --lora merge); without flags the float forward */
    nd_fq3_numerics fq3;
    int quant3 = m->cfg.generation == 3 && qat;
    int rc = ND_OK;
    if (quant3) {
        nd_fq3_defaults(&fq3);
        fq3.act_bits = m->cfg.act_bits;
        fq3.kv_bits = m->cfg.kv_bits;
        nd_backend_sync(be);
        if (!(rc = nd_fq3_validate(&fq3)))
            rc = nd_fq3_model_weights(m, &fq3, m->mem, m->mem);
        san_model_upload(m); /* the ops' copy follows the host's (a no-op on the CPU) */
    }
    if (!rc)
        rc = san_eval_quant(m, &m->w, quant3 ? &fq3 : NULL, be, seqs, a->batch,
                            a->logits_path ? write_logits : NULL, lo, r);
    if (a->logits_path) {
        if (rc) {
            nd_atomic_abort(&lo->af);
        } else if ((rc = nd_atomic_commit(&lo->af))) {
            lo->failed = 1;
            san_eval_result_free(r);
        }
    }
    return rc;
}

/* each sequence's loss and the overall mean (returned), as text or JSON */
static double print_token_losses(const token_seqs *seqs, const san_eval_result *r, int json)
{
    double mean = r->total_positions ? r->total_loss / (double)r->total_positions : 0.0;
    if (json) {
        printf("{\"examples\": [");
        for (int i = 0; i < seqs->count; i++)
            printf("%s{\"loss\": %.9g, \"tokens\": %d}", i ? ", " : "",
                   r->positions[i] ? r->loss_sum[i] / r->positions[i] : 0.0, r->positions[i]);
        printf("], \"mean_loss\": %.9g}\n", mean);
    } else {
        for (int i = 0; i < seqs->count; i++)
            printf("seq %d (line %d): loss %.6f over %d tokens\n", i + 1, seqs->line[i],
                   r->positions[i] ? r->loss_sum[i] / r->positions[i] : 0.0, r->positions[i]);
        printf("mean loss %.6f over %ld tokens (%d sequences)\n", mean, r->total_positions,
               seqs->count);
    }
    return mean;
}

/* --tokens: the adapter merged as `needle build` merges it (dtype rounding
 * included; tree is the checkpoint's pickle, which that needs), then each
 * sequence's loss and the speed. Frees tree and the model. */
static int eval_tokens(const tokens_args *a, const jsonl_args *ja, san_model *m, pv *tree,
                       const nd_backend *be)
{
    if (ja->lora_path) {
        lora_merge_info li;
        int bad = lora_merge_file(m, pv_dict_get(tree, "params"), ja->lora_path, &li);
        pv_decref(tree);
        if (bad) {
            san_model_free(m);
            return cli_fail(NULL);
        }
    }
    token_seqs seqs;
    if (token_file_read(a->tokens, m->dims.V, &seqs)) {
        san_model_free(m);
        return cli_fail(NULL);
    }
    logits_out lo = {0};
    if (a->logits_path && nd_atomic_open(&lo.af, a->logits_path)) {
        token_seqs_free(&seqs);
        san_model_free(m);
        return cli_fail(NULL);
    }
    san_eval_result r;
    if (tokens_forward(a, ja->qat, m, be, &seqs, &lo, &r)) {
        token_seqs_free(&seqs);
        san_model_free(m);
        return cli_fail(lo.failed ? NULL : a->tokens);
    }
    double mean = print_token_losses(&seqs, &r, a->json);
    int status = isfinite(mean) ? 0 : nonfinite_loss(a->ckpt, ja->lora_path, mean);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "  %-9s %.0f tokens/s forward  (%ld tokens in %.3f s)  peak RSS %.1f MB\n",
            "speed", r.seconds > 0 ? (double)r.tokens / r.seconds : 0.0, r.tokens, r.seconds,
            nd_maxrss_mb(ru.ru_maxrss));
    san_eval_result_free(&r);
    token_seqs_free(&seqs);
    san_model_free(m);
    return status;
}

int cli_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *tokens = NULL, *logits_path = NULL, *device = "auto",
               *precision = NULL;
    jsonl_args ja = {.batch = 16, .max_len = 1024, .rank = 16, .alpha = 32};
    int json = 0;
    long long batch = 16, threads = 0;
    const char *batching = NULL;
    cli_opt opts[] = {
        CLI_OPT_CHECKPOINT(&ckpt, "the checkpoint to evaluate (required)"),
        {"--tokens", CLI_PATH, &tokens, 0, 0, "FILE", NULL,
         "token-id sequences, one per line, instead of DATA.jsonl", 0, 0},
        {"--lora", CLI_PATH, &ja.lora_path, 0, 0, "ADAPTER", NULL,
         "apply an adapter (ours or upstream's) to the base", 0, 0},
        {"--qat", CLI_FLAG, &ja.qat, 0, 0, NULL, NULL,
         "evaluate the weights the archive holds: the (merged) weights through `needle build`'s "
         "CQ quantise-dequantise and FP16 rounding, as `needle finetune --qat` trains them "
         "(JSONL). A Needle 3 model: 3.x's deployed numerics (CQ 4-bit weights, 8-bit activations "
         "and q/k/v), which its JSONL loss and --grad-norms use by default, as finetune trains; "
         "with --tokens/--logits it asks for them (default there: float)",
         0, 0},
        {"--no-qat", CLI_FLAG, &ja.no_qat, 0, 0, NULL, NULL,
         "Needle 3 model: JSONL loss and --grad-norms in float", 0, 0},
        {"--bits", CLI_INT, &ja.bits, 2, 4, "N", NULL,
         "--qat width 2, 3 or 4 (build's --bits; default: the config's weight_bits map, else 4)", 0,
         0},
        {"--grad-norms", CLI_FLAG, &ja.grad_norms, 0, 0, NULL, NULL,
         "also report the L2 norm of the gradient of the overall loss w.r.t. each LoRA A and B "
         "(of --lora, or of a fresh adapter from --lora-rank (16) / --lora-alpha (32) / --seed "
         "(0)) and their global norm",
         0, 0},
        {"--lora-rank", CLI_INT, &ja.rank, 1, 4096, "R", NULL,
         "rank of the fresh adapter of --grad-norms (default 16)", 0, 0},
        {"--lora-alpha", CLI_FLOAT, &ja.alpha, 0, 0, "X", NULL,
         "alpha of the fresh adapter of --grad-norms (default 32)", CLI_LO_OPEN | CLI_NO_HI, 0},
        {"--seed", CLI_I64, &ja.seed, 0, (double)(1LL << 62), "S", NULL,
         "seed of the fresh adapter of --grad-norms (default 0)", 0, 0},
        CLI_OPT_TOKENIZER(&ja.tok_flag, CLI_TOKENIZER_HELP),
        {"--max-len", CLI_INT, &ja.max_len, 2, 1 << 20, "N", NULL,
         "cap on the sequence length (default 1024)", 0, 0},
        {"--batching", CLI_ENUM, &batching, 0, 0, "M", "shared|packed|padded",
         "shared (default): each example at its own length, common prefixes (system + tools) run "
         "once, logits only at target positions; packed: own lengths, nothing shared; padded: "
         "upstream's batches of B x fit_max_len. Same numbers, up to float rounding",
         0, 0},
        {"--json", CLI_FLAG, &json, 0, 0, NULL, NULL,
         "print one JSON object: {\"examples\": [{\"loss\", \"tokens\"}...], \"mean_loss\"}; "
         "tokens = predicted positions (length - 1)",
         0, 0},
        {"--logits", CLI_PATH, &logits_path, 0, 0, "OUT", NULL,
         "write every sequence's float32 logits [len, V], little-endian, back to back (written "
         "atomically)",
         0, 0},
        {"--batch-size", CLI_I64, &batch, 1, 1 << 16, "B", NULL,
         "sequences per forward pass (default 16)", 0, 0},
        CLI_OPT_THREADS(&threads),
        CLI_OPT_PRECISION(&precision),
        CLI_OPT_DEVICE(&device, CLI_DEVICE_HELP),
    };
    cli_cmd cmd = {"eval", eval_usage, eval_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    ja.data = cmd.n_pos ? cmd.pos[0] : NULL;
    if (batching)
        ja.batching = nd_batching_parse(batching);
    if (!ckpt)
        return cli_usage_error("eval", "--checkpoint is required");
    if (!tokens == !ja.data)
        return cli_usage_error("eval", "give either DATA.jsonl or --tokens FILE");
    if (ja.data && logits_path)
        return cli_usage_error("eval", "--logits works with --tokens input");
    if (tokens && ja.grad_norms)
        return cli_usage_error("eval", "--grad-norms works with JSONL input");
    if (ja.bits && !ja.qat)
        return cli_usage_error("eval", "--bits is the --qat width: give --qat too");
    if (ja.qat && ja.no_qat)
        return cli_usage_error("eval", "--qat and --no-qat together");

    if (cli_check_output(logits_path, "checkpoint", ckpt, "token file", tokens, "adapter",
                         ja.lora_path, (const char *)NULL))
        return 1;
    const nd_backend *be = cli_backend("eval", device, precision, (int)threads);
    if (!be)
        return 1;
    san_model m;
    pv *tree = NULL; /* kept for --tokens --lora: the merge needs the stored dtypes */
    if (ckpt_load(ckpt, &m, tokens && ja.lora_path ? &tree : NULL))
        return cli_fail(NULL);
    if (san_model_to_backend(&m, be)) {
        pv_decref(tree);
        san_model_free(&m);
        return cli_fail(NULL);
    }
    char bl[512];
    fprintf(stderr, "  %-9s %s\n", "backend", nd_backend_line(be, bl, sizeof bl));
    const char *bad = NULL;
    if (m.cfg.generation == 3 && ja.bits)
        bad = "--bits: a Needle 3 model's numerics use 3.x's fixed 4-bit CQ weights";
    else if (m.cfg.generation != 3 && tokens && ja.qat)
        bad = "--qat works with JSONL input (or a Needle 3 model's --tokens)";
    if (bad) {
        pv_decref(tree);
        san_model_free(&m);
        return cli_usage_error("eval", "%s", bad);
    }
    if (ja.data) {
        ja.ckpt = ckpt;
        ja.json = json;
        ja.batch = (int)batch;
        int rc = eval_jsonl(&ja, &m, be);
        san_model_free(&m);
        return rc;
    }
    tokens_args ta = {ckpt, tokens, logits_path, json, (int)batch};
    return eval_tokens(&ta, &ja, &m, tree, be);
}
