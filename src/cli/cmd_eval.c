/* needle eval: next-token loss of a checkpoint on token sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/mem.h"
#include "backend/backend.h"
#include "cli/cli.h"
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

static const char *eval_help =
    "usage: needle eval --checkpoint CKPT.pkl DATA.jsonl [--tokenizer M] [--max-len N]\n"
    "                   [--lora ADAPTER] [--grad-norms [--lora-rank R --seed S]] [--json]\n"
    "                   [--qat [--bits N] | --no-qat]\n"
    "       needle eval --checkpoint CKPT.pkl --tokens FILE [--json] [--logits OUT.bin]\n"
    "                   [--qat (Needle 3)]\n"
    "                   [--batching shared|packed|padded]\n"
    "       common: [--batch-size B] [--threads N] [--device D] [--precision P]\n"
    "\n"
    "JSONL: per-example masked loss (target tokens only) and the overall loss exactly\n"
    "as upstream's loss_fn over all examples as one batch (sum of masked CE / masked\n"
    "positions). --tokens: mean next-token cross-entropy of each token-id sequence\n"
    "(one per line, all positions count) and the overall mean.\n"
    "\n"
    "  --lora ADAPTER   apply an adapter (ours or upstream's) to the base\n"
    "  --qat            evaluate the weights the archive holds: the (merged) weights\n"
    "                   through `needle build`'s CQ quantise-dequantise and FP16\n"
    "                   rounding, as `needle finetune --qat` trains them (JSONL).\n"
    "                   A Needle 3 model: 3.x's deployed numerics (CQ 4-bit weights,\n"
    "                   8-bit activations and q/k/v), which its JSONL loss and\n"
    "                   --grad-norms use by default, as finetune trains; with\n"
    "                   --tokens/--logits it asks for them (default there: float)\n"
    "  --no-qat         Needle 3 model: JSONL loss and --grad-norms in float\n"
    "  --bits N         --qat width 2, 3 or 4 (build's --bits; default: the config's\n"
    "                   weight_bits map, else 4)\n"
    "  --grad-norms     also report the L2 norm of the gradient of the overall loss\n"
    "                   w.r.t. each LoRA A and B (of --lora, or of a fresh adapter\n"
    "                   from --lora-rank (16) / --lora-alpha (32) / --seed (0)) and\n"
    "                   their global norm\n"
    "  --tokenizer M    SentencePiece model (default $NEEDLE_TOKENIZER, else\n"
    "                   tokenizer.model beside the checkpoint)\n"
    "  --max-len N      cap on the sequence length (default 1024)\n"
    "  --batching M     shared (default): each example at its own length, common\n"
    "                   prefixes (system + tools) run once, logits only at target\n"
    "                   positions; packed: own lengths, nothing shared; padded:\n"
    "                   upstream's batches of B x fit_max_len. Same numbers, up to\n"
    "                   float rounding\n"
    "  --json           print one JSON object: {\"examples\": [{\"loss\", \"tokens\"}...],\n"
    "                   \"mean_loss\"}; tokens = predicted positions (length - 1)\n"
    "  --logits OUT     write every sequence's float32 logits [len, V], little-endian,\n"
    "                   back to back (written atomically)\n"
    "  --batch-size B   sequences per forward pass (default 16)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --precision P    fp32|tf32|bf16: the CUDA backend's GEMMs (default fp32)\n"
    "  --device D       auto|cpu|cuda[:N]|vulkan[:N] (default auto: CUDA, else a Vulkan GPU,\n"
    "                   else the CPU)\n";

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

int cli_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *tokens = NULL, *logits_path = NULL, *device = "auto",
               *precision = NULL;
    jsonl_args ja = {.batch = 16, .max_len = 1024, .rank = 16, .alpha = 32};
    int json = 0;
    long long batch = 16, threads = 0, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(eval_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--grad-norms")) {
            ja.grad_norms = 1;
            continue;
        }
        if (!strcmp(a, "--qat")) {
            ja.qat = 1;
            continue;
        }
        if (!strcmp(a, "--no-qat")) {
            ja.no_qat = 1;
            continue;
        }
        if (a[0] != '-') {
            if (ja.data)
                return cli_usage_error("eval", "unexpected argument '%s'", a);
            ja.data = a;
            continue;
        }
        if (i + 1 >= argc)
            return cli_usage_error("eval", "%s needs a value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--checkpoint"))
            ckpt = val;
        else if (!strcmp(a, "--tokens"))
            tokens = val;
        else if (!strcmp(a, "--logits"))
            logits_path = val;
        else if (!strcmp(a, "--device"))
            device = val;
        else if (!strcmp(a, "--precision"))
            precision = val;
        else if (!strcmp(a, "--tokenizer"))
            ja.tok_flag = val;
        else if (!strcmp(a, "--lora"))
            ja.lora_path = val;
        else if (!strcmp(a, "--batching")) {
            if ((ja.batching = nd_batching_parse(val)) < 0)
                return cli_usage_error("eval", "--batching must be shared, packed or padded");
        } else if (!strcmp(a, "--bits")) {
            if (cli_parse_int(a, val, 2, 4, &v))
                return 2;
            ja.bits = (int)v;
        } else if (!strcmp(a, "--batch-size")) {
            if (cli_parse_int(a, val, 1, 1 << 16, &batch))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, val, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(a, "--max-len")) {
            if (cli_parse_int(a, val, 2, 1 << 20, &v))
                return 2;
            ja.max_len = (int)v;
        } else if (!strcmp(a, "--lora-rank")) {
            if (cli_parse_int(a, val, 1, 4096, &v))
                return 2;
            ja.rank = (int)v;
        } else if (!strcmp(a, "--lora-alpha")) {
            if (cli_parse_double(a, val, &ja.alpha) || ja.alpha <= 0)
                return cli_usage_error("eval", "--lora-alpha must be positive");
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_int(a, val, 0, 1LL << 62, &ja.seed))
                return 2;
        } else
            return cli_usage_error("eval", "unknown option '%s'", a);
    }
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
    if (ja.lora_path) {
        /* the same merge as `needle build` (dtype rounding included) */
        lora_merge_info li;
        int bad = lora_merge_file(&m, pv_dict_get(tree, "params"), ja.lora_path, &li);
        pv_decref(tree);
        if (bad) {
            san_model_free(&m);
            return cli_fail(NULL);
        }
    }
    token_seqs seqs;
    if (token_file_read(tokens, m.dims.V, &seqs)) {
        san_model_free(&m);
        return cli_fail(NULL);
    }
    logits_out lo = {0};
    if (logits_path && nd_atomic_open(&lo.af, logits_path)) {
        token_seqs_free(&seqs);
        san_model_free(&m);
        return cli_fail(NULL);
    }
    san_eval_result r;
    /* Needle 3 --qat: 3.x's quant=True forward on cq_ste(weights) (after
     * any --lora merge); without flags the float forward */
    nd_fq3_numerics fq3;
    int quant3 = m.cfg.generation == 3 && ja.qat;
    int rc = ND_OK;
    if (quant3) {
        nd_fq3_defaults(&fq3);
        fq3.act_bits = m.cfg.act_bits;
        fq3.kv_bits = m.cfg.kv_bits;
        nd_backend_sync(be);
        if (!(rc = nd_fq3_validate(&fq3)))
            rc = nd_fq3_model_weights(&m, &fq3, m.mem, m.mem);
    }
    if (!rc)
        rc = san_eval_quant(&m, &m.w, quant3 ? &fq3 : NULL, be, &seqs, (int)batch,
                            logits_path ? write_logits : NULL, &lo, &r);
    if (logits_path) {
        if (rc) {
            nd_atomic_abort(&lo.af);
        } else if ((rc = nd_atomic_commit(&lo.af))) {
            lo.failed = 1;
            san_eval_result_free(&r);
        }
    }
    if (rc) {
        token_seqs_free(&seqs);
        san_model_free(&m);
        return cli_fail(lo.failed ? NULL : tokens);
    }
    double mean = r.total_positions ? r.total_loss / (double)r.total_positions : 0.0;
    if (json) {
        printf("{\"examples\": [");
        for (int i = 0; i < seqs.count; i++)
            printf("%s{\"loss\": %.9g, \"tokens\": %d}", i ? ", " : "",
                   r.positions[i] ? r.loss_sum[i] / r.positions[i] : 0.0, r.positions[i]);
        printf("], \"mean_loss\": %.9g}\n", mean);
    } else {
        for (int i = 0; i < seqs.count; i++)
            printf("seq %d (line %d): loss %.6f over %d tokens\n", i + 1, seqs.line[i],
                   r.positions[i] ? r.loss_sum[i] / r.positions[i] : 0.0, r.positions[i]);
        printf("mean loss %.6f over %ld tokens (%d sequences)\n", mean, r.total_positions,
               seqs.count);
    }
    int status = isfinite(mean) ? 0 : nonfinite_loss(ckpt, ja.lora_path, mean);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "  %-9s %.0f tokens/s forward  (%ld tokens in %.3f s)  peak RSS %.1f MB\n",
            "speed", r.seconds > 0 ? (double)r.tokens / r.seconds : 0.0, r.tokens, r.seconds,
            nd_maxrss_mb(ru.ru_maxrss));
    san_eval_result_free(&r);
    token_seqs_free(&seqs);
    san_model_free(&m);
    return status;
}
