/* needle finetune: LoRA training with upstream's options and output. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "train/batch.h"
#include "dist/dist.h"
#include "train/finetune.h"
#include "train/recommend.h"

static const char *finetune_usage = "usage: needle finetune DATA.jsonl [options]\n";
static const char *finetune_about =
    "LoRA fine-tune the frozen base checkpoint on JSONL tool-calling examples and\n"
    "write an adapter pickle that upstream's `needle build` (and ours) accepts.\n";
static const char *finetune_epilog =
    "Outputs are checked before training starts (writable, a regular file, not one of\n"
    "the inputs). SIGINT (Ctrl-C), SIGTERM and SIGHUP stop the run after the current\n"
    "step, write the adapter (or --full checkpoint) so far and print the command that\n"
    "resumes it (exit 1).\n";

static volatile int stop_flag;
static void on_stop_signal(int sig)
{
    stop_flag = sig;
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void set_stop_handlers(int on)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on ? on_stop_signal : SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(stop_signals[i], &sa, NULL);
    }
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case -1: return "--stop-after";
    case 0: return "stopped on another rank";
    default: return "a signal";
    }
}

/* Print a word for a POSIX shell ('...' quoting when needed). */
static void put_shell_word(FILE *f, const char *w)
{
    int plain = *w != 0;
    for (const char *p = w; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *p))
            plain = 0;
    if (plain) {
        fputs(w, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = w; *p; p++) {
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
    fputc('\'', f);
}

/* The command that continues a stopped run: this one with --resume OUT. */
static void print_resume_command(int argc, char **argv, const char *out, int ranks)
{
    fprintf(stderr, "needle: to continue: ");
    if (ranks > 1)
        fprintf(stderr, "mpirun -np %d ", ranks);
    fprintf(stderr, "needle");
    for (int i = 0; i < argc; i++) {
        /* --stop-after would stop the resumed run at once */
        if ((!strcmp(argv[i], "--resume") || !strcmp(argv[i], "--stop-after")) && i + 1 < argc) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--resume=", 9) || !strncmp(argv[i], "--stop-after=", 13))
            continue; /* the same, joined to its value */
        fputc(' ', stderr);
        put_shell_word(stderr, argv[i]);
    }
    fprintf(stderr, " --resume ");
    put_shell_word(stderr, out);
    fputc('\n', stderr);
}

static void emit_line(void *ctx, const char *line)
{
    int *tty = ctx;
    if (*tty)
        fprintf(stderr, "\r\033[K");
    printf("%s\n", line);
    fflush(stdout);
}

static void status_bar(void *ctx, long step, long total, double loss, double tps, double eta)
{
    int *tty = ctx;
    if (!*tty)
        return;
    int width = 30, fill = total ? (int)((double)width * step / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r\033[K  [%s] %ld/%ld  loss %.4f  %.0f tok/s  ETA %02d:%02d", bar, step,
            total, loss, tps, (int)(eta / 60), (int)eta % 60);
    fflush(stderr);
}

/* The checkpoint's recommended settings for those the user did not give
 * (LoRA runs only), a line each saying what was chosen and why. */
static int apply_recommended(nd_finetune_opts *o, const int given[ND_REC_N])
{
    nd_recommend rec;
    if (nd_recommend_read(o->checkpoint, &rec))
        return cli_fail(NULL);
    if (!nd_recommend_count(&rec))
        return 0;
    if (o->full) {
        printf("  %-9s --full: the checkpoint's recommended fine-tune settings are for LoRA "
               "runs, not applied\n",
               "settings");
        return 0;
    }
    for (int i = 0; i < ND_REC_N; i++) {
        if (!rec.has[i])
            continue;
        double *d = i == ND_REC_LR ? &o->lr : i == ND_REC_LORA_ALPHA ? &o->alpha : NULL;
        int *n = i == ND_REC_LORA_RANK    ? &o->rank
                 : i == ND_REC_EPOCHS     ? &o->epochs
                 : i == ND_REC_BATCH_SIZE ? &o->batch_size
                                          : NULL;
        double now = d ? *d : (double)*n;
        if (given[i]) {
            printf("  %-9s %s %g (%s given; the checkpoint recommends %g)\n", "settings",
                   nd_recommend_key(i), now, nd_recommend_flag(i), rec.value[i]);
            continue;
        }
        if (d)
            *d = rec.value[i];
        else
            *n = (int)rec.value[i];
        printf("  %-9s %s %g (recommended by the checkpoint; %s to override)\n", "settings",
               nd_recommend_key(i), rec.value[i], nd_recommend_flag(i));
    }
    fflush(stdout);
    return 0;
}

static int finetune_ranked(nd_finetune_opts *op, nd_dist *dist, int argc, char **argv,
                           const char *tok_flag, const char *device, const char *precision,
                           const char *ckdir, const char *out, long long threads,
                           long long generate, long long workers, const char *gen_model,
                           const char *save_dtype, int ckpt_given, const int *given);

int cli_finetune(int argc, char **argv)
{
    nd_finetune_opts o;
    nd_finetune_defaults(&o);
    const char *tok_flag = NULL, *device = "auto", *precision = NULL, *ckdir = "checkpoints",
               *out = NULL;
    long long threads = 0, generate = 0, workers = 8, save_every = 0, stop_after = 0, seed = 0;
    const char *gen_model = NULL, *save_dtype = NULL, *batching = NULL;
    int ckpt_given = 0, given[ND_REC_N] = {0};
    cli_opt opts[] = {
        CLI_OPT_CHECKPOINT(&o.checkpoint,
                           "base checkpoint (default checkpoints/needle2.pkl when it is there, "
                           "else the nano base installed with needle, said in the first lines; an "
                           "explicit path that is missing is downloaded from Hugging Face as "
                           "upstream does)"),
        CLI_OPT_TOKENIZER(&tok_flag, CLI_TOKENIZER_HELP),
        {"--epochs", CLI_INT, &o.epochs, 1, 1000000, "N", NULL, "passes over the data (default 3)",
         0, 0},
        {"--batch-size", CLI_INT, &o.batch_size, 1, 65536, "N", NULL,
         "examples per step (default 16)", 0, 0},
        {"--lr", CLI_FLOAT, &o.lr, 0, 0, "X", NULL,
         "peak learning rate (default 1e-4; warmup then cosine)", CLI_LO_OPEN | CLI_NO_HI, 0},
        {"--lora-rank", CLI_INT, &o.rank, 1, 4096, "N", NULL, "adapter rank (default 16)", 0, 0},
        {"--lora-alpha", CLI_FLOAT, &o.alpha, 0, 0, "X", NULL,
         "adapter alpha; scale = alpha/rank (default 32).\nA checkpoint may recommend its own "
         "--lr, --lora-rank, --lora-alpha, --epochs and --batch-size (`needle convert "
         "--recommend`): used when the flag is not given, printed; a flag always wins",
         CLI_LO_OPEN | CLI_NO_HI, 0},
        {"--max-len", CLI_INT, &o.max_len, 2, 1 << 20, "N", NULL,
         "cap on the sequence length (default 1024)", 0, 0},
        {"--val-split", CLI_FLOAT, &o.val_split, 0, 1, "X", NULL, "held-out fraction (default 0.1)",
         CLI_HI_OPEN, 0},
        {"--checkpoint-dir", CLI_DIR, &ckdir, 0, 0, "D", NULL,
         "where the default output goes (default checkpoints)", 0, 0},
        {"--generate", CLI_I64, &generate, 0, 100000000, "N", NULL,
         "first generate N more examples for the data's tools with a chat service (as `needle "
         "generate-data --augment DATA`, OPENROUTER_API_KEY / OPENROUTER_URL) and train on "
         "DATA.augmented.jsonl (default 0 = off)",
         0, 0},
        {"--model", CLI_STR, &gen_model, 0, 0, "NAME", NULL,
         "chat model for --generate (default deepseek/deepseek-v4-flash)", 0, 0},
        {"--workers", CLI_I64, &workers, 1, 1024, "N", NULL,
         "concurrent requests for --generate (default 8)", 0, 0},
        {"--out", CLI_PATH, &out, 0, 0, "PATH", NULL,
         "adapter path (default D/needle_lora.pkl, or D/needle_lora.safetensors for a "
         "safetensors base); a name ending in .safetensors is written in upstream 3.x's format",
         0, 0},
        {"--save-every", CLI_I64, &save_every, 1, (double)(1LL << 40), "N", NULL,
         "also write the adapter every N steps (crash safety)", 0, 0},
        {"--resume", CLI_PATH, &o.resume, 0, 0, "ADAPTER", NULL,
         "continue from an adapter (and its optimiser state); the run must use the settings "
         "recorded in it (base checkpoint, --seed, --batch-size, --epochs, --val-split, "
         "--max-len, --lora-rank, --lora-alpha, --lr): differences are listed and refused. With "
         "--full: a checkpoint written by a stopped --full run (Ctrl-C or --save-every; it holds "
         "the optimiser state as the extra key needle_c_state), --checkpoint still the base; the "
         "resumed run matches an uninterrupted one bit for bit",
         0, 0},
        {"--resume-override", CLI_FLAG, &o.resume_override, 0, 0, NULL, NULL,
         "resume even when those settings differ (the schedule and the train/validation split "
         "then change; the adapter's rank and scale are kept)",
         0, 0},
        {"--stop-after", CLI_I64, &stop_after, 1, (double)(1LL << 40), "N", NULL,
         "stop as Ctrl-C does once N steps are done (save, print the resume command, exit 1): "
         "time-boxed runs, resume tests",
         0, 0},
        {"--skip-bad", CLI_FLAG, &o.skip_bad, 0, 0, NULL, NULL,
         "skip (and count) invalid JSONL lines instead of failing", 0, 0},
        {"--full", CLI_FLAG, &o.full, 0, 0, NULL, NULL,
         "train every base parameter instead of an adapter; --out is then a checkpoint (for "
         "pre-training small bases)",
         0, 0},
        {"--save-dtype", CLI_ENUM, &save_dtype, 0, 0, "T", "float16|float32",
         "--full: float32 (default) or float16 params in the final checkpoint (upstream's "
         "float16 format; saves before the end stay float32 with the optimiser state so a resume "
         "is exact)",
         0, 0},
        {"--loss-log", CLI_PATH, &o.loss_log, 0, 0, "FILE", NULL,
         "one JSON line per step {step, epoch, lr, loss} and per validation {step, epoch, "
         "val_loss}, flushed as written; a --resume keeps the lines up to the resumed step and "
         "appends (plot it with `needle plot-loss FILE --out curve.svg`)",
         0, 0},
        {"--qat", CLI_FLAG, &o.qat, 0, 0, NULL, NULL,
         "quantisation-aware: every step trains through the CQ quantise-dequantise (and FP16 "
         "rounding) `needle build` applies, gradients straight through, so the archive keeps "
         "what the fine-tune learned. A Needle 3 base always trains through 3.x's deployed "
         "numerics (CQ 4-bit weights, 8-bit activations and q/k/v, gradients straight through), "
         "--qat or not",
         0, 0},
        {"--no-qat", CLI_FLAG, &o.no_qat, 0, 0, NULL, NULL,
         "Needle 3 base: fine-tune in float instead", 0, 0},
        {"--bits", CLI_INT, &o.bits, 2, 4, "N", NULL,
         "--qat width 2, 3 or 4 (build's --bits; default: the config's weight_bits map, else 4); "
         "build the archive at the same width",
         0, 0},
        {"--batching", CLI_ENUM, &batching, 0, 0, "M", "shared|packed|padded",
         "shared (default): each example at its own length, the prefix examples of a batch share "
         "(system + tools) run once, logits only at target positions; packed: own lengths, "
         "nothing shared; padded: upstream's B x fit_max_len batches. Same loss and gradients up "
         "to float rounding, same batches and schedule",
         0, 0},
        {"--group-by-tools", CLI_FLAG, &o.group_by_tools, 0, 0, NULL, NULL,
         "put examples of one tool set into the same batches (then shuffle the batches): more "
         "sharing, different batches",
         0, 0},
        {"--act-memory", CLI_FLOAT, &o.act_budget_mb, 0, 0, "MB", NULL,
         "memory for kept layer activations (default 1024: a needle2 run stays under 2 GB); "
         "layers that do not fit are recomputed in the backward (slower, same numbers)",
         CLI_NO_HI, 0},
        {"--seed", CLI_I64, &seed, 0, (double)(1LL << 62), "N", NULL, "random seed (default 0)", 0,
         0},
        CLI_OPT_THREADS(&threads),
        CLI_OPT_DEVICE(&device, "auto|cpu|cuda[:N]|vulkan[:N] (default auto: CUDA, else a Vulkan "
                                "GPU, else the CPU; software Vulkan such as lavapipe only as "
                                "vulkan:N; the backend used is printed)"),
        CLI_OPT_PRECISION(&precision),
    };
    cli_cmd cmd = {
        "finetune", finetune_usage, finetune_about, finetune_epilog, opts, CLI_NOPTS(opts), 1, {0},
        0};
    CLI_PARSE(&cmd, argc, argv);
    o.data = cmd.n_pos ? cmd.pos[0] : NULL;
    ckpt_given = cli_opts_given(&cmd, "--checkpoint");
    for (int k = 0; k < ND_REC_N; k++)
        given[k] = cli_opts_given(&cmd, nd_recommend_flag(k));
    if (batching)
        o.batching = nd_batching_parse(batching);
    if (cli_opts_given(&cmd, "--save-every"))
        o.save_every = (long)save_every;
    if (cli_opts_given(&cmd, "--stop-after"))
        o.stop_after = (long)stop_after;
    if (cli_opts_given(&cmd, "--seed"))
        o.seed = (uint64_t)seed;
    if (!o.data)
        return cli_usage_error("finetune", "missing DATA.jsonl");
    /* `mpirun -np N needle finetune ...`: one of N ranks (dist/dist.h) */
    nd_dist *dist = NULL;
    if (nd_dist_open(&dist))
        return cli_fail(NULL);
    int rc = finetune_ranked(&o, dist, argc, argv, tok_flag, device, precision, ckdir, out, threads,
                             generate, workers, gen_model, save_dtype, ckpt_given, given);
    if (dist && rc && !nd_dist_shared(dist))
        nd_dist_abort(dist, rc); /* the other ranks would wait for this one */
    nd_dist_close(dist);
    return rc;
}

/* The rest of cli_finetune, on one rank (or the only process). */
static int finetune_ranked(nd_finetune_opts *op, nd_dist *dist, int argc, char **argv,
                           const char *tok_flag, const char *device, const char *precision,
                           const char *ckdir, const char *out, long long threads,
                           long long generate, long long workers, const char *gen_model,
                           const char *save_dtype, int ckpt_given, const int *given)
{
    nd_finetune_opts o = *op;
    int rank = nd_dist_rank(dist);
    /* rank 0 alone prints; the others' errors still reach stderr */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "needle: rank %d: cannot send its output to /dev/null\n", rank);
        return 1;
    }
    o.dist = dist;
    char basebuf[4096];
    if (!ckpt_given)
        o.checkpoint = cli_default_base(stdout, "--checkpoint PATH", basebuf, sizeof basebuf);
    if (save_dtype) {
        if (!o.full)
            return cli_usage_error("finetune",
                                   "--save-dtype applies to --full checkpoints (adapters are "
                                   "float32, as upstream's)");
        o.save_f16 = !strcmp(save_dtype, "float16");
    }
    if (o.bits && !o.qat)
        return cli_usage_error("finetune", "--bits is the --qat width: give --qat too");
    if (o.qat && o.no_qat)
        return cli_usage_error("finetune", "--qat and --no-qat together");
    char outbuf[4096], tokbuf[4096], genbuf[4096];
    if (generate > 0) {
        if (cli_generate_augment(o.data, (long)generate, gen_model, (int)workers, genbuf,
                                 sizeof genbuf))
            return 1;
        o.data = genbuf;
    }
    if (!out) {
        /* a safetensors base (by content, or by name before a download)
         * gets a safetensors adapter, as upstream 3.x writes */
        int st = ckpt_file_is_safetensors(o.checkpoint) || ckpt_path_is_safetensors(o.checkpoint);
        snprintf(outbuf, sizeof outbuf, "%s/needle_lora.%s", ckdir, st ? "safetensors" : "pkl");
        /* upstream's os.makedirs(exist_ok=True), but only once the adapter
         * is written: a run that fails early leaves no empty directory */
        o.out_dir = ckdir;
        out = outbuf;
        /* as os.makedirs: parents too; said now if it cannot be made */
        if (nd_dir_creatable(ckdir, "checkpoint directory"))
            return cli_fail(NULL);
    }
    o.out = out;
    /* --resume X --out X is the usual way to continue: the adapter is read
     * whole before anything is written; every other input must differ */
    if (cli_check_output(out, "training data", o.data, "base checkpoint", o.checkpoint, "tokenizer",
                         tok_flag, "tokenizer ($NEEDLE_TOKENIZER)",
                         tok_flag ? NULL : getenv("NEEDLE_TOKENIZER"), (const char *)NULL))
        return 1;
    if (o.loss_log && cli_check_output(o.loss_log, "training data", o.data, "base checkpoint",
                                       o.checkpoint, "output", out, "resumed run", o.resume,
                                       "tokenizer", tok_flag, (const char *)NULL))
        return 1;
    FILE *df = fopen(o.data, "rb");
    if (!df) {
        fprintf(stderr, "needle: %s: cannot open the training data\n", o.data);
        return 1;
    }
    fclose(df);
    char ckbuf[4096];
    if (cli_fetch_checkpoint(o.checkpoint, ckbuf, sizeof ckbuf)) {
        if (!ckpt_given)
            cli_default_base_hint();
        return 1;
    }
    o.checkpoint = ckbuf;
    if (apply_recommended(&o, given))
        return 1;
    o.tokenizer = cli_tokenizer_path(tok_flag, o.checkpoint, tokbuf, sizeof tokbuf);
    if (!o.tokenizer)
        return 1;
    o.be = cli_backend("finetune", device, precision, (int)threads);
    if (!o.be)
        return 1;
    int tty = rank == 0 && isatty(fileno(stderr));
    o.emit = emit_line;
    o.status = status_bar;
    o.ctx = &tty;
    o.stop = &stop_flag;
    set_stop_handlers(1);
    int rc = nd_finetune(&o);
    if (tty)
        fprintf(stderr, "\r\033[K");
    set_stop_handlers(0);
    if (!rc)
        return 0;
    if (rank != 0 && nd_dist_shared(dist) == 1)
        return 1; /* rank 0 says it */
    if (rc == ND_EINTERRUPT) {
        fprintf(stderr, "needle: %s: %s\n", signal_name(stop_flag), nd_last_error());
        print_resume_command(argc, argv, out, nd_dist_size(dist));
        return 1;
    }
    if (rank != 0)
        fprintf(stderr, "needle: rank %d: %s\n", rank, nd_last_error());
    return rank != 0 ? 1 : cli_fail(NULL);
}
