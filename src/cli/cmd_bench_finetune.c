/* needle bench finetune: LoRA steps on a real JSONL file, timed, with
 * what the batching computes against upstream's padded batches. */
#include <math.h>
#include "core/mem.h"
#include "core/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "train/batch.h"
#include "train/finetune.h"
#include "train/run.h"

static const char *bf_usage =
    "usage: needle bench finetune DATA.jsonl --checkpoint CKPT.pkl [--tokenizer M]\n"
    "                             [--batching shared|packed|padded] [--group-by-tools]\n"
    "                             [--batch-size 16] [--steps 4] [--max-len 1024]\n"
    "                             [--seed 0] [--act-memory MB] [--threads N]\n"
    "                             [--no-qat]\n";
static const char *bf_about =
    "Times the first --steps LoRA steps (rank 16: merge, forward, loss, backward,\n"
    "AdamW) of an epoch over DATA (shuffled by --seed as finetune does, no\n"
    "hold-out) and prints, for the whole epoch: real tokens, the tokens upstream's\n"
    "padded batches compute, the rows this batching computes; per step: seconds\n"
    "(min/median) and rows; the epoch's time projected from the measured seconds\n"
    "per computed row; peak RSS. The steps are finetune's (train/run.h): a\n"
    "Needle 3 base trains through 3.x's deployed numerics as finetune does\n"
    "(--no-qat: float). Run it once per --batching to compare (each run\n"
    "is its own process, so peak RSS is per mode). Realistic data:\n"
    "  tools/gen_realistic_data.py /tmp/real.jsonl\n"
    "  needle init /tmp/n2.pkl --preset needle2\n"
    "  needle bench finetune /tmp/real.jsonl --checkpoint /tmp/n2.pkl \\\n"
    "      --tokenizer models/tokenizer.model --batching padded --steps 2\n";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cli_bench_finetune(int argc, char **argv)
{
    const char *data = NULL, *ckpt = NULL, *tok_flag = NULL;
    long long B = 16, steps = 4, max_len = 1024, seed = 0, threads = 0;
    double act_mb = ND_ACT_BUDGET_MB;
    int mode = ND_BATCH_SHARED, group = 0, no_qat = 0;
    const char *batching = NULL;
    cli_opt opts[] = {
        CLI_OPT_CHECKPOINT(&ckpt, "the base checkpoint (required)"),
        CLI_OPT_TOKENIZER(&tok_flag, CLI_TOKENIZER_HELP),
        {"--batching", CLI_ENUM, &batching, 0, 0, "M", "shared|packed|padded",
         "how batches are computed, as finetune's --batching (default shared)", 0, 0},
        {"--group-by-tools", CLI_FLAG, &group, 0, 0, NULL, NULL,
         "batches of one tool set, as finetune's --group-by-tools", 0, 0},
        {"--batch-size", CLI_I64, &B, 1, 4096, "N", NULL, "examples per step (default 16)", 0, 0},
        {"--steps", CLI_I64, &steps, 1, 1 << 20, "N", NULL, "steps timed (default 4)", 0, 0},
        {"--max-len", CLI_I64, &max_len, 2, 1 << 20, "N", NULL,
         "cap on the sequence length (default 1024)", 0, 0},
        {"--seed", CLI_I64, &seed, 0, (double)(1LL << 62), "N", NULL, "shuffle seed (default 0)", 0,
         0},
        {"--act-memory", CLI_FLOAT, &act_mb, 0, 0, "MB", NULL,
         "memory for kept layer activations, as finetune's --act-memory", CLI_NO_HI, 0},
        CLI_OPT_THREADS(&threads),
        {"--no-qat", CLI_FLAG, &no_qat, 0, 0, NULL, NULL,
         "Needle 3 base: train in float instead of 3.x's deployed numerics", 0, 0},
    };
    cli_cmd cmd = {"bench finetune", bf_usage, bf_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    data = cmd.n_pos ? cmd.pos[0] : NULL;
    if (batching)
        mode = nd_batching_parse(batching);
    if (!data || !ckpt)
        return cli_usage_error("bench", "finetune needs DATA.jsonl and --checkpoint");
    char tokbuf[4096];
    const char *tpath = cli_tokenizer_path(tok_flag, ckpt, tokbuf, sizeof tokbuf);
    if (!tpath)
        return 1;
    const nd_backend *be = nd_backend_get("auto", (int)threads);
    if (!be)
        return cli_fail(NULL);
    /* finetune's run (train/run.h): one epoch, no hold-out, nothing saved;
     * the same data, batches and numerics (Needle 3's unless --no-qat) */
    nd_finetune_opts o;
    nd_finetune_defaults(&o);
    o.data = data;
    o.checkpoint = ckpt;
    o.tokenizer = tpath;
    o.out = NULL;
    o.epochs = 1;
    o.batch_size = (int)B;
    o.max_len = (int)max_len;
    o.val_split = 0;
    o.seed = (uint64_t)seed;
    o.batching = mode;
    o.group_by_tools = group;
    o.act_budget_mb = act_mb;
    o.no_qat = no_qat;
    o.be = be;
    nd_run *r = NULL;
    double *sec = NULL, *rows_of = NULL;
    int rc = 1;
    if (nd_run_open(&r, &o) || nd_run_plan(r)) {
        cli_fail(NULL);
        goto done;
    }
    if (steps > r->spe)
        steps = r->spe;
    sec = malloc(sizeof *sec * (size_t)steps);
    rows_of = malloc(sizeof *rows_of * (size_t)steps);
    if (!sec || !rows_of) {
        fprintf(stderr, "needle: out of memory\n");
        goto done;
    }
    const nd_trainer *tr = &r->bt.tr;
    double real = r->real_tokens, padded = r->padded_rows, epoch_rows = r->epoch_rows;
    char bl[512];
    printf("  %-9s %s\n", "backend", nd_backend_line(be, bl, sizeof bl));
    printf("  %-9s %s  d=%d L=%d  %zu examples, batch %lld, fit_max_len %zu, %ld steps an epoch\n",
           "data", data, r->m.dims.d, r->m.dims.L, r->N, B, r->ts.max_len, r->spe);
    printf("  %-9s %s%s: epoch = %.0fk real tokens, %.0fk padded (upstream), %.0fk computed "
           "(%.2fx fewer than padded)\n",
           "batching", nd_batching_name(mode), group ? " + group-by-tools" : "", real / 1e3,
           padded / 1e3, epoch_rows / 1e3, padded / epoch_rows);
    if (r->m.cfg.generation == 3)
        printf("  %-9s %s\n", "numerics",
               tr->quant3 ? "Needle 3 (CQ 4-bit weights, quantised activations and KV, as "
                            "finetune; --no-qat for float)"
                          : "float (--no-qat)");
    printf("  %-9s %d of %d layers' activations kept (%.0f MB of activations)\n", "memory",
           tr->kept_layers, r->m.dims.L, (double)tr->acts.bytes / 1048576.0);
    double t_sum = 0, r_sum = 0;
    for (long s = 0; s < steps; s++) {
        nd_run_step_info si;
        double t0 = nd_wtime();
        if (nd_run_step(r, &si)) {
            cli_fail(NULL);
            goto done;
        }
        sec[s] = nd_wtime() - t0;
        rows_of[s] =
            mode == ND_BATCH_PADDED ? (double)B * (double)r->ts.max_len : (double)tr->plan.rows;
        t_sum += sec[s];
        r_sum += rows_of[s];
        printf("  %-9s %ld/%lld  %.2f s  %.0f rows  loss %.4f over %.0f targets\n", "step", s + 1,
               steps, sec[s], rows_of[s], si.loss, si.masked);
        fflush(stdout);
    }
    qsort(sec, (size_t)steps, sizeof *sec, cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double per_row = t_sum / r_sum;
    printf("  %-9s min %.2f s  median %.2f s  (%.0f computed rows/s, %.0f real tokens/s)\n",
           "steps", sec[0], sec[steps / 2], 1.0 / per_row, (real / epoch_rows) / per_row);
    printf("  %-9s %.1f min projected (%.3f ms per computed row x %.0fk rows)\n", "epoch",
           per_row * epoch_rows / 60.0, per_row * 1e3, epoch_rows / 1e3);
    printf("  %-9s %.0f MB peak RSS\n", "rss", nd_maxrss_mb(ru.ru_maxrss));
    rc = 0;
done:
    free(sec);
    free(rows_of);
    nd_run_close(r);
    return rc;
}
