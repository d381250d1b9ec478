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
#include "core/rng.h"
#include "core/status.h"
#include "model/san.h"
#include "train/optim.h"
#include "train/trainer.h"

static const char *bench_help =
    "usage: needle bench forward|train|decode|finetune [--preset tiny|needle2] [--batch B]\n"
    "                            [--seq T]\n"
    "                            [--iters|--steps N] [--threads N] [--device D]\n"
    "                            [--precision fp32|tf32|bf16] [--qat-bits N]\n"
    "\n"
    "forward: times the float32 forward pass (logits included) on random weights.\n"
    "decode:  engine prefill/decode tokens/s on a .cact (needle bench decode --help).\n"
    "finetune: LoRA steps on a JSONL file per batching mode (needle bench finetune --help).\n"
    "train:   times a full LoRA training step (merge, forward, loss, backward with\n"
    "         layer recomputation, AdamW), rank 16, every position a target.\n"
    "Prints min/median seconds, tokens/s, achieved GFLOP/s counting matmul and\n"
    "attention FLOPs, and peak RSS. Defaults: needle2, batch 16, seq 128, 5 iters.\n";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Multiply-adds x2 of every GEMM and of attention (causal: ~T^2/2 pairs). */
static double forward_flops(const san_model *m, int B, int T)
{
    const san_dims *D = &m->dims;
    double N = (double)B * T, d = D->d, n = D->n;
    double per_layer =
        d * (2.0 * D->q_dim + 2.0 * D->kv_dim) + (double)D->q_dim * d + n * d * (2 * n + n * n);
    double attn = (double)B * D->H * ((double)T * (T + 1) / 2.0) * D->hd * 2.0;
    double eng = m->cfg.n_sites * 2.0 * D->eng_dim * d;
    return 2.0 * (N * (per_layer * D->L + eng + d * D->V) + attn * D->L);
}

int cli_bench(int argc, char **argv)
{
    const char *what = NULL, *preset = "needle2", *device = "auto", *precision = NULL;
    long long B = 16, T = 128, iters = 5, threads = 0, qat_bits = 0;
    if (argc > 1 && !strcmp(argv[1], "decode"))
        return cli_bench_decode(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "finetune"))
        return cli_bench_finetune(argc - 1, argv + 1);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(bench_help, stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (what)
                return cli_usage_error("bench", "unexpected argument '%s'", a);
            what = a;
            continue;
        }
        if (i + 1 >= argc)
            return cli_usage_error("bench", "%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--precision"))
            precision = v;
        else if (!strcmp(a, "--batch")) {
            if (cli_parse_int(a, v, 1, 4096, &B))
                return 2;
        } else if (!strcmp(a, "--seq")) {
            if (cli_parse_int(a, v, 1, 1 << 16, &T))
                return 2;
        } else if (!strcmp(a, "--iters") || !strcmp(a, "--steps")) {
            if (cli_parse_int(a, v, 1, 10000, &iters))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, v, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(a, "--qat-bits")) { /* train as finetune --qat --bits N */
            if (cli_parse_int(a, v, 2, 4, &qat_bits))
                return 2;
        } else
            return cli_usage_error("bench", "unknown option '%s'", a);
    }
    if (!what || (strcmp(what, "forward") && strcmp(what, "train")))
        return cli_usage_error("bench", "expected a benchmark name: forward or train");
    int train = !strcmp(what, "train");
    san_config cfg;
    if (san_config_preset(&cfg, preset))
        return cli_usage_error("bench", "%s", nd_last_error());
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
    for (long long i = -1; i < iters && !rc; i++) { /* i = -1: warm-up (page faults, BLAS) */
        /* the CPU's peak right now, so drift on a shared host cancels (a
         * device backend's peak is not measured here) */
        if (i >= 0)
            peak[i] = be->device ? 0 : bench_fma_peak(0.2, &isa);
        double t0 = nd_wtime(), loss;
        if (train) {
            rc = nd_trainer_step(&tr, tok, mask, (int)B, 1, &loss, NULL);
            if (!rc)
                rc = nd_adamw_step(&opt, lora.mem, tr.lora_g, NULL, NULL);
            if (!rc)
                nd_trainer_merge(&tr);
        } else {
            rc = san_forward(&m, &m.w, &acts, tok);
        }
        nd_backend_sync(be);
        if (i >= 0)
            sec[i] = nd_wtime() - t0;
    }
    if (!rc) {
        /* Model FLOPs of a LoRA step: the forward plus the input-gradient
         * backward (2 x forward; frozen weights get no weight gradient; the
         * adapter's rank-16 GEMMs are small and not counted). A recomputed
         * forward (remat) is extra hardware work, reported separately. */
        double fwd = forward_flops(&m, (int)B, (int)T);
        double flops = train ? 2 * fwd : fwd;
        /* each step against the peak probed just before it, then medians */
        for (long long i = 0; i < iters; i++)
            ratio[i] = peak[i] > 0 ? flops / sec[i] / 1e9 / peak[i] : 0;
        qsort(sec, (size_t)iters, sizeof *sec, cmp_double);
        qsort(peak, (size_t)iters, sizeof *peak, cmp_double);
        qsort(ratio, (size_t)iters, sizeof *ratio, cmp_double);
        double med = sec[iters / 2];
        /* recomputed layers run their forward twice */
        double hw = train ? flops + fwd * (m.dims.L - tr.kept_layers) / m.dims.L : flops;
        char keep[64];
        snprintf(keep, sizeof keep, " (%d of %d layers' activations kept)", tr.kept_layers,
                 m.dims.L);
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
               what, preset, B, T, where, sec[0], med, (double)(B * T) / med, flops / med / 1e9,
               hw / med / 1e9, train ? keep : "", nd_maxrss_mb(ru.ru_maxrss));
        if (tr.qat && tr.qat->calls > 1) /* the first call quantised the whole base */
            printf("  qat W%lld: %.1f ms a step requantising the adapted projections\n", qat_bits,
                   (tr.qat->seconds - first_qat) / (double)(tr.qat->calls - 1) * 1e3);
        if (ratio[iters / 2] > 0)
            printf("  fp32 FMA peak probed before each iteration (%s, %d threads): %.1f GFLOP/s "
                   "median; model FLOPs reach %.1f%% of it (median of per-iteration ratios; "
                   "min %.1f%%, max %.1f%%)\n",
                   isa, be->threads, peak[iters / 2], 100 * ratio[iters / 2], 100 * ratio[0],
                   100 * ratio[iters - 1]);
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
