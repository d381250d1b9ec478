/* needle bench: timing of the model's hot paths on random weights.
 * Benchmarks live here, never in the timed test suite. */
#include <math.h>
#include "core/mem.h"
#include "core/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "core/rng.h"
#include "core/status.h"
#include "model/san.h"
#include "train/optim.h"
#include "train/trainer.h"

static const char *bench_usage =
    "usage: needle bench forward|train|decode|finetune\n"
    "                            [--preset tiny|needle2|tiny3|tiny3b|needle3]\n"
    "                            [--batch B] [--seq T]\n"
    "                            [--iters|--steps N] [--threads N] [--device D]\n"
    "                            [--precision fp32|tf32|bf16] [--qat-bits N] [--quant]\n";
static const char *bench_about =
    "forward: times the float32 forward pass (logits included) on random weights.\n"
    "decode:  engine prefill/decode tokens/s on a .cact (needle bench decode --help).\n"
    "finetune: LoRA steps on a JSONL file per batching mode (needle bench finetune --help).\n"
    "train:   times a full LoRA training step (merge, forward, loss, backward with\n"
    "         layer recomputation, AdamW), rank 16, every position a target.\n"
    "Prints min/median seconds, tokens/s, achieved GFLOP/s counting matmul and\n"
    "attention FLOPs, and peak RSS. Defaults: needle2, batch 16, seq 128, 5 iters.\n"
    "Needle 3 presets (needle3 is the released shape, random weights) run the\n"
    "float numerics (finetune --no-qat); --quant runs 3.x's training numerics\n"
    "(finetune's default on a Needle 3 base: fake-quantised forward,\n"
    "straight-through backward). --qat-bits is for Needle 2 presets.\n";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Query-key pairs of one causal sequence of T rows, a query seeing at most
 * `window` keys (0: all). */
static double attn_pairs(int T, int window)
{
    if (window <= 0 || window >= T)
        return (double)T * (T + 1) / 2.0;
    return (double)window * (window + 1) / 2.0 + (double)(T - window) * window;
}

/* The attention part of forward_flops (q.k and p.v over each query's keys). */
static double attention_flops(const san_model *m, int B, int T)
{
    const san_dims *D = &m->dims;
    const san_config *c = &m->cfg;
    if (c->generation != 3)
        return 2.0 * (double)B * D->H * ((double)T * (T + 1) / 2.0) * D->hd * 2.0 * D->L;
    double attn = 0;
    for (int l = 0; l < D->L; l++)
        attn += (double)B * D->H * attn_pairs(T, san_layer_is_local(c, l) ? c->sliding_window : 0) *
                (D->hd + D->v_hd);
    return 2.0 * attn;
}

/* Needle 3 (model/block.c layer_forward3): the mHC projections, q/k/v/gate
 * and out, the q/k/v conv taps, the Hadamard MLP's three Kronecker factor
 * pairs (n * (ba + bb) each) and its rank-8 cond, attention over each
 * layer's span (sliding window on local layers; q.k at qk head dim, p.v at
 * the value head dim), the engram projections and the logits (V_out). */
static double forward_flops3(const san_model *m, int B, int T)
{
    const san_dims *D = &m->dims;
    const san_config *c = &m->cfg;
    double N = (double)B * T, d = D->d, n = D->n;
    double per_layer =
        n * d * (2 * n + n * n) + d * ((double)D->q_dim + D->k_dim + D->v_dim + D->gate_dim) +
        (double)D->o_dim * d + (double)c->qkv_conv_taps * (D->q_dim + D->k_dim + D->v_dim) +
        3.0 * D->hada_n * (D->hada_ba + D->hada_bb) + (double)SAN_HADA_COND_RANK * (d + D->hada_n);
    double eng = c->n_sites * 2.0 * D->eng_dim * d;
    return 2.0 * N * (per_layer * D->L + eng + d * D->V_out) + attention_flops(m, B, T);
}

/* Multiply-adds x2 of every GEMM and of attention (causal: ~T^2/2 pairs). */
static double forward_flops(const san_model *m, int B, int T)
{
    const san_dims *D = &m->dims;
    if (m->cfg.generation == 3)
        return forward_flops3(m, B, T);
    double N = (double)B * T, d = D->d, n = D->n;
    double per_layer =
        d * (2.0 * D->q_dim + 2.0 * D->kv_dim) + (double)D->q_dim * d + n * d * (2 * n + n * n);
    double attn = (double)B * D->H * ((double)T * (T + 1) / 2.0) * D->hd * 2.0;
    double eng = m->cfg.n_sites * 2.0 * D->eng_dim * d;
    return 2.0 * (N * (per_layer * D->L + eng + d * D->V) + attn * D->L);
}

/* What a run measured and on what, for the report. */
typedef struct {
    const char *what, *preset, *isa;
    long long B, T, iters, qat_bits;
    int train;
    const san_model *m;
    const nd_trainer *tr;
    const nd_backend *be;
    double *sec, *peak, *ratio; /* per iteration (sorted here) */
    double first_qat, first_q3;
    long first_q3_calls;
} bench_run;

static void bench_report(const bench_run *r)
{
    const san_model *m = r->m;
    const nd_trainer *tr = r->tr;
    const nd_backend *be = r->be;
    long long B = r->B, T = r->T, iters = r->iters;
    int train = r->train;
    double *sec = r->sec, *peak = r->peak, *ratio = r->ratio;
    /* Model FLOPs of a LoRA step: the forward plus the input-gradient
     * backward (2 x forward; frozen weights get no weight gradient; the
     * adapter's rank-16 GEMMs are small and not counted). A recomputed
     * forward (remat) is extra hardware work, reported separately. */
    double fwd = forward_flops(m, (int)B, (int)T);
    double flops = train ? 2 * fwd : fwd;
    /* each step against the peak probed just before it, then medians */
    for (long long i = 0; i < iters; i++)
        ratio[i] = peak[i] > 0 ? flops / sec[i] / 1e9 / peak[i] : 0;
    qsort(sec, (size_t)iters, sizeof *sec, cmp_double);
    qsort(peak, (size_t)iters, sizeof *peak, cmp_double);
    qsort(ratio, (size_t)iters, sizeof *ratio, cmp_double);
    double med = sec[iters / 2];
    /* recomputed layers run their forward twice; with lanes saved at
     * every k-th layer, the layers between run it once more */
    int L = m->dims.L, every = tr->acts.lane_every > 1 ? tr->acts.lane_every : 1;
    int seg = every > 1 ? L - (L + every - 1) / every : 0;
    double hw = train ? flops + fwd * (L - tr->kept_layers + seg) / L : flops;
    char keep[160];
    snprintf(keep, sizeof keep,
             " (%d of %d layers' activations kept, lanes saved every %d layer%s, logits "
             "%ld rows at a time)",
             tr->kept_layers, L, every, every > 1 ? "s" : "", tr->logit_rows);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char where[64];
    if (be->device)
        snprintf(where, sizeof where, "device=%s", be->name);
    else
        snprintf(where, sizeof where, "threads=%d", be->threads);
    printf("%s %s B=%lld T=%lld %s: min %.4f s  median %.4f s  "
           "%.0f tokens/s (median)  %.1f model GFLOP/s  %.1f hardware GFLOP/s%s  "
           "peak RSS %.1f MB\n",
           r->what, r->preset, B, T, where, sec[0], med, (double)(B * T) / med, flops / med / 1e9,
           hw / med / 1e9, train ? keep : "", nd_maxrss_mb(ru.ru_maxrss));
    printf("  model FLOPs a %s: %.9g (attention %.9g)\n", train ? "step" : "forward", flops,
           (train ? 2 : 1) * attention_flops(m, (int)B, (int)T));
    if (tr->qat && tr->qat->calls > 1) /* the first call quantised the whole base */
        printf("  qat W%lld: %.1f ms a step requantising the adapted projections\n", r->qat_bits,
               (tr->qat->seconds - r->first_qat) / (double)(tr->qat->calls - 1) * 1e3);
    if (tr->quant3 && tr->quant3_calls > r->first_q3_calls) /* set_quant3 did the whole base */
        printf("  3.x training numerics: %.1f ms a step re-quantising the adapted projections\n",
               (tr->quant3_seconds - r->first_q3) / (double)(tr->quant3_calls - r->first_q3_calls) *
                   1e3);
    if (ratio[iters / 2] > 0)
        printf("  fp32 FMA peak probed before each iteration (%s, %d threads): %.1f GFLOP/s "
               "median; model FLOPs reach %.1f%% of it (median of per-iteration ratios; "
               "min %.1f%%, max %.1f%%)\n",
               r->isa, be->threads, peak[iters / 2], 100 * ratio[iters / 2], 100 * ratio[0],
               100 * ratio[iters - 1]);
}

/* one line of progress on stderr: a needle3-shape step can take minutes */
/* user + system CPU seconds of the process so far (all its threads) */
static double bench_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* cpu: the CPU seconds the step took (on a shared machine, what the code
 * costs; with threads it includes their waits at barriers) */
static void bench_progress(long long i, long long iters, double dt, double cpu)
{
    struct rusage ru_now;
    char label[48];
    getrusage(RUSAGE_SELF, &ru_now);
    if (i < 0)
        snprintf(label, sizeof label, "warm-up");
    else
        snprintf(label, sizeof label, "%lld of %lld", i + 1, iters);
    fprintf(stderr, "  %-9s %s: %.3f s (CPU %.3f s), peak RSS so far %.1f MB\n", "step", label, dt,
            cpu, nd_maxrss_mb(ru_now.ru_maxrss));
}

int cli_bench(int argc, char **argv)
{
    const char *what = NULL, *preset = "needle2", *device = "auto", *precision = NULL;
    long long B = 16, T = 128, iters = 5, threads = 0, qat_bits = 0;
    int quant3 = 0;
    if (argc > 1 && !strcmp(argv[1], "decode"))
        return cli_bench_decode(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "finetune"))
        return cli_bench_finetune(argc - 1, argv + 1);
    cli_opt opts[] = {
        {"--preset", CLI_STR, &preset, 0, 0, "P", "tiny needle2 tiny3 tiny3b needle3",
         "model shape, random weights (default needle2)", 0, 0},
        {"--batch", CLI_I64, &B, 1, 4096, "B", NULL, "sequences per step (default 16)", 0, 0},
        {"--seq", CLI_I64, &T, 1, 1 << 16, "T", NULL, "tokens per sequence (default 128)", 0, 0},
        {"--iters", CLI_I64, &iters, 1, 10000, "N", NULL,
         "timed iterations after one warm-up (default 5)", 0, 0},
        {"--steps", CLI_I64, &iters, 1, 10000, "N", NULL, "the same as --iters", 0, 0},
        CLI_OPT_THREADS(&threads),
        CLI_OPT_DEVICE(&device, CLI_DEVICE_HELP),
        CLI_OPT_PRECISION(&precision),
        {"--qat-bits", CLI_I64, &qat_bits, 2, 4, "N", NULL,
         "train: a Needle 2 preset trains as finetune --qat --bits N", 0, 0},
        {"--quant", CLI_FLAG, &quant3, 0, 0, NULL, NULL,
         "train on a Needle 3 preset: 3.x's training numerics (fake-quantised forward, "
         "straight-through backward)",
         0, 0},
    };
    cli_cmd cmd = {"bench", bench_usage, bench_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    what = cmd.n_pos ? cmd.pos[0] : NULL;
    if (!what || (strcmp(what, "forward") && strcmp(what, "train")))
        return cli_usage_error("bench", "expected a benchmark name: forward or train");
    int train = !strcmp(what, "train");
    san_config cfg;
    if (san_config_preset(&cfg, preset))
        return cli_usage_error("bench", "%s", nd_last_error());
    if (quant3 && (!train || cfg.generation != 3))
        return cli_usage_error("bench", "--quant is for train on a Needle 3 preset");
    if (qat_bits && cfg.generation == 3)
        return cli_usage_error("bench", "--qat-bits is for Needle 2 presets (Needle 3: --quant)");
    const nd_backend *be = cli_backend("bench", device, precision, (int)threads);
    if (!be)
        return 1;
    san_model m;
    if (san_model_create(&m, &cfg))
        return cli_fail(NULL);
    san_model_init_random(&m, 1);
    if (san_model_to_backend(&m, be)) {
        san_model_free(&m);
        return cli_fail(NULL);
    }
    san_acts acts = {0};
    san_lora lora = {0};
    nd_trainer tr = {0};
    nd_adamw opt = {0};
    float *mask = NULL;
    if (train) {
        if (san_lora_create(&lora, &m, 16, 32.0f) || san_lora_to_backend(&lora, be) ||
            nd_trainer_create(&tr, &m, be, &lora, (int)B, (int)T, 0, -1) ||
            (qat_bits && nd_trainer_set_qat(&tr, (int)qat_bits)) ||
            (quant3 && nd_trainer_set_quant3(&tr)) ||
            nd_adamw_init(&opt, lora.numel, 1e-4f, 1000)) {
            san_model_free(&m);
            return cli_fail(NULL);
        }
        san_lora_init(&lora, 1);
        mask = malloc(sizeof *mask * (size_t)(B * T));
        for (long long i = 0; i < B * T; i++)
            mask[i] = 1.0f;
    } else if (san_acts_create(&acts, be, &m, (int)B, (int)T, 0, 0)) {
        san_model_free(&m);
        return cli_fail(NULL);
    }
    int32_t *tok = malloc(sizeof *tok * (size_t)(B * T));
    nd_rng rng;
    nd_rng_seed(&rng, 7);
    for (long long i = 0; i < B * T; i++)
        tok[i] = (int32_t)nd_rng_below(&rng, (uint64_t)cfg.vocab_size);
    /* per iteration: seconds, the FMA peak probed just before, their ratio */
    double *sec = malloc(3 * sizeof *sec * (size_t)iters);
    double *peak = sec ? sec + iters : NULL, *ratio = sec ? sec + 2 * iters : NULL;
    const char *isa = "none";
    char bl[512];
    fprintf(stderr, "  %-9s %s\n", "backend", nd_backend_line(be, bl, sizeof bl));
    const char *forced = getenv("OPENBLAS_CORETYPE");
    if (forced && *forced)
        fprintf(stderr, "  %-9s OPENBLAS_CORETYPE=%s picks the BLAS kernels, not this CPU\n",
                "note", forced);
    fprintf(stderr, "  %-9s %s %s  batch %lld x seq %lld  %.2fM params  %lld iters (+1 warmup)\n",
            "bench", what, preset, B, T, (double)m.numel / 1e6, iters);
    int rc = !sec ? nd_error(ND_ENOMEM, "out of memory") : 0;
    double first_qat = tr.qat ? tr.qat->seconds : 0;
    double first_q3 = tr.quant3_seconds;
    long first_q3_calls = tr.quant3_calls;
    for (long long i = -1; i < iters && !rc; i++) { /* i = -1: warm-up (page faults, BLAS) */
        /* the CPU's peak right now, so drift on a shared host cancels (a
         * device backend's peak is not measured here) */
        if (i >= 0)
            peak[i] = be->device ? 0 : bench_fma_peak(0.2, &isa);
        double t0 = nd_wtime(), c0 = bench_cpu_seconds(), loss;
        if (train) {
            rc = nd_trainer_step(&tr, tok, mask, (int)B, 1, &loss, NULL);
            /* AdamW on the host: the gradients there, the adapter back */
            float *g = rc ? NULL : nd_backend_map(be, tr.lora_g, sizeof(float) * lora.numel, 1);
            if (!rc)
                rc = g ? nd_adamw_step(&opt, lora.mem, g, NULL, NULL)
                       : nd_error(ND_ENOMEM, "out of memory");
            nd_backend_unmap(be, tr.lora_g, g, sizeof(float) * lora.numel, 0);
            san_lora_upload(&lora);
            if (!rc)
                nd_trainer_merge(&tr);
        } else {
            rc = san_forward(&m, &m.w, &acts, tok);
        }
        nd_backend_sync(be);
        double dt = nd_wtime() - t0;
        if (i >= 0)
            sec[i] = dt;
        if (!rc)
            bench_progress(i, iters, dt, bench_cpu_seconds() - c0);
    }
    if (!rc) {
        bench_run run = {what, preset, isa, B,    T,     iters,     qat_bits, train,         &m,
                         &tr,  be,     sec, peak, ratio, first_qat, first_q3, first_q3_calls};
        bench_report(&run);
    }
    free(sec);
    free(tok);
    free(mask);
    nd_adamw_free(&opt);
    nd_trainer_free(&tr);
    san_lora_free(&lora);
    san_acts_free(&acts);
    san_model_free(&m);
    return rc ? cli_fail(NULL) : 0;
}
