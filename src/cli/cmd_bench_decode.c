/* needle bench decode: prefill and decode speed of the engine on a .cact,
 * against upstream's published numbers. */
#include "core/mem.h"
#include "core/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_internal.h"

static const char *bd_usage =
    "usage: needle bench decode --weights X.cact [--prompt N] [--gen N] [--iters N]\n"
    "                           [--threads N] [--chunk N] [--float]\n";
static const char *bd_about =
    "Loads the archive as the engine does (mapped, quantised matmuls on its CQ\n"
    "blobs; --float or NEEDLE_FLOAT=1: dequantised to float32), then times\n"
    "the prefill of an N-token prompt (default 256: a tool-calling prompt's size)\n"
    "and greedy decoding of --gen tokens (default 128) one at a time with the KV\n"
    "cache. Prints tokens/s (best and median of --iters, default 3; one cache\n"
    "reset between rounds as a session resets it, the first round's fresh\n"
    "pages printed apart), peak RSS,\n"
    "weight bytes read per decoded token, and the ratio to upstream's published\n"
    "4300 prefill / 850 decode tokens/s and ~28 MB RAM. --chunk: most prompt\n"
    "tokens one forward runs at once (default: a session's chunk).\n"
    "For the needle2 shape at 4 bits on random weights:\n"
    "  needle init /tmp/n2.pkl --preset needle2\n"
    "  needle build /tmp/n2.pkl --bits 4 --out /tmp/n2.cact\n"
    "  needle bench decode --weights /tmp/n2.cact\n"
    "Needle 3 archives (tag 0x05E12A84) run the same way (the needle3 preset;\n"
    "a bench-only archive needs no tokenizer: needle build ... --no-tokenizer);\n"
    "upstream's figures are Needle 2's, so no ratio is printed for them.\n";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of n times (sorts them) */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* float path: every float32 matrix once (the whole embedding for the
 * logits), one row per engram table */
static size_t float_bytes_per_token(const san_model *m)
{
    const san_dims *D = &m->dims;
    size_t floats = m->numel;
    for (int s = 0; s < m->cfg.n_sites; s++)
        floats -= (size_t)D->eng_tables * (size_t)(m->cfg.engram_slots - 1) * (size_t)D->eng_sub;
    return floats * sizeof(float);
}

int cli_bench_decode(int argc, char **argv)
{
    const char *weights = NULL;
    long long P = 256, G = 128, iters = 3, threads = 0, chunk = ND_SESSION_CHUNK;
    int as_float = 0;
    cli_opt opts[] = {
        {"--weights", CLI_PATH, &weights, 0, 0, "X.cact", NULL, "the archive (required)", 0, 0},
        {"--prompt", CLI_I64, &P, 1, 1 << 20, "N", NULL, "prompt tokens prefilled (default 256)", 0,
         0},
        {"--gen", CLI_I64, &G, 1, 1 << 20, "N", NULL, "tokens decoded greedily (default 128)", 0,
         0},
        {"--iters", CLI_I64, &iters, 1, 1000, "N", NULL,
         "runs; best and median are printed (default 3)", 0, 0},
        CLI_OPT_THREADS(&threads),
        {"--chunk", CLI_I64, &chunk, 1, 4096, "N", NULL,
         "most prompt tokens one forward runs at once (default: a session's chunk)", 0, 0},
        {"--float", CLI_FLAG, &as_float, 0, 0, NULL, NULL,
         "dequantise the archive to float32 at load (as NEEDLE_FLOAT=1)", 0, 0},
    };
    cli_cmd cmd = {"bench decode", bd_usage, bd_about, NULL, opts, CLI_NOPTS(opts), 0, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    int quant = !as_float && !nd_engine_float_path();
    if (!weights)
        return cli_usage_error("bench", "decode needs --weights X.cact");
    double t0 = nd_wtime();
    cact_file f;
    if (quant ? cact_map_file(weights, &f) : cact_read_file(weights, &f))
        return cli_fail(weights);
    san_model m;
    nd_qweights3 q3 = {0};
    nd_qweights *qw = &q3.q; /* a Needle 2 archive's CQ view is q3.q too */
    int gen3 = f.generation == 3, rc;
    if (gen3) {
        rc = nd_cact3_to_qmodel(&f, &m, &q3);
        if (!rc && !quant) { /* float path: the dequantised model */
            san_model_free(&m);
            nd_qweights3_free(&q3);
            memset(&q3, 0, sizeof q3);
            rc = nd_cact3_to_model(&f, &m);
        }
    } else {
        rc = quant ? nd_cact_to_qmodel(&f, &m, qw) : nd_cact_to_model(&f, &m);
    }
    int kvw = (int)(gen3 ? f.h3.kv_window : f.hdr.kv_window);
    if (!quant || rc)
        cact_free(&f);
    if (rc)
        return cli_fail(weights);
    size_t per_token = quant ? nd_qweights_bytes_per_token(qw, &m) : float_bytes_per_token(&m);
    double t_load = nd_wtime() - t0;
    if (P + G > m.cfg.max_seq_len) {
        int max_len = m.cfg.max_seq_len; /* san_model_free clears it */
        san_model_free(&m);
        nd_qweights3_free(&q3);
        cact_free(&f);
        return cli_usage_error("bench", "--prompt + --gen = %lld exceeds max_seq_len %d", P + G,
                               max_len);
    }
    const nd_backend *be = nd_backend_cpu((int)threads);
    int V = m.dims.V;
    int32_t *tok = malloc(sizeof *tok * (size_t)(P + G));
    float *lg = malloc(sizeof *lg * (size_t)V);
    for (long long i = 0; i < P; i++)
        tok[i] = (int32_t)(4 + (i * 7919) % (V - 4));
    double best_p = 1e30, best_d = 1e30;
    double *tp = calloc((size_t)iters, sizeof *tp), *td = calloc((size_t)iters, sizeof *td);
    long pc[3][2] = {{0}}; /* this thread's forks and handoffs (nd_parallel_counts) */
    /* one state for every round, reset between them as a session's next
     * conversation resets it (needle_session_reset): round 1 writes the
     * cache's pages for the first time, which costs this machine ~10% of a
     * prompt (first writes to fresh pages), so it is printed apart */
    nd_kv_state s;
    int sink = 0;
    if ((rc = nd_kv_init(&s, &m, be, (int)chunk, kvw)))
        goto out;
    if (quant)
        nd_kv_use_quant(&s, qw);
    nd_kv_set_bits(&s, m.cfg.kv_bits); /* as a session does: int8 rows by default */
    sink = s.n_sink;
    for (long long it = 0; it < iters && !rc; it++) {
        nd_kv_rewind(&s, 0);
        nd_kv_slide(&s, sink);
        nd_parallel_counts(&pc[0][0], &pc[0][1]);
        double a = nd_wtime();
        rc = nd_kv_forward(&s, tok, (int)P, lg, 0);
        double b = nd_wtime();
        nd_parallel_counts(&pc[1][0], &pc[1][1]);
        for (long long g = 0; g < G && !rc; g++) {
            int bi = 0; /* greedy: the first index of the largest logit */
            float bv = lg[0];
            for (int k = 1; k < V; k++)
                if (lg[k] > bv) {
                    bi = k;
                    bv = lg[k];
                }
            /* every round decodes the same tokens: a reset that left
             * anything behind would show here */
            if (it == 0)
                tok[P + g] = bi;
            else if (tok[P + g] != bi)
                rc = nd_error(ND_EFORMAT, "round %lld decoded token %lld differently (%d, not %d)",
                              it + 1, g, bi, tok[P + g]);
            int32_t t = bi;
            if (!rc)
                rc = nd_kv_forward(&s, &t, 1, lg, 0);
        }
        double c = nd_wtime();
        nd_parallel_counts(&pc[2][0], &pc[2][1]);
        tp[it] = b - a;
        td[it] = c - b;
        if (it > 0 || iters == 1) {
            best_p = b - a < best_p ? b - a : best_p;
            best_d = c - b < best_d ? c - b : best_d;
        }
    }
    nd_kv_free(&s);
out:
    if (!rc) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double pt = (double)P / best_p, dt = (double)G / best_d, mb = nd_maxrss_mb(ru.ru_maxrss);
        printf("weights %s: Needle %d, d=%d L=%d H=%d G=%d V=%d, %s, load %.2f s, %d threads\n",
               weights, gen3 ? 3 : 2, m.dims.d, m.dims.L, m.dims.H, m.dims.G, V,
               quant ? "quantised in place" : "float32 after dequant", t_load, nd_get_threads());
        if (quant)
            printf("kernel %s\n", nd_qkernel_best()->name);
        double p1 = tp[0], d1 = td[0];
        int skip = iters > 1; /* the medians of the rounds after the first, as the bests */
        double pm = (double)P / median(tp + skip, (int)iters - skip),
               dm = (double)G / median(td + skip, (int)iters - skip);
        if (gen3) { /* upstream publishes Needle 2's figures only */
            printf("prefill %lld tokens: %.1f tokens/s  (median %.1f)\n", P, pt, pm);
            printf("decode  %lld tokens: %.1f tokens/s  (median %.1f)\n", G, dt, dm);
            printf("peak RSS %.1f MB; chunk %lld\n", mb, chunk);
        } else {
            printf("prefill %lld tokens: %.1f tokens/s  (upstream 4300: ratio %.3f; median %.1f)\n",
                   P, pt, pt / 4300.0, pm);
            printf("decode  %lld tokens: %.1f tokens/s  (upstream 850: ratio %.3f; median %.1f)\n",
                   G, dt, dt / 850.0, dm);
            printf("peak RSS %.1f MB  (upstream ~28 MB: ratio %.2f); chunk %lld\n", mb, mb / 28.0,
                   chunk);
        }
        if (iters > 1) /* the best and median above leave it out */
            printf("round 1 (fresh cache pages): prefill %.1f, decode %.1f tokens/s\n",
                   (double)P / p1, (double)G / d1);
        printf("weights read per decoded token %.2f MB\n", (double)per_token / 1e6);
        printf("parallel calls: prompt %ld forks + %ld handoffs; per decoded token %.1f forks + "
               "%.1f handoffs\n",
               pc[1][0] - pc[0][0], pc[1][1] - pc[0][1],
               G ? (double)(pc[2][0] - pc[1][0]) / (double)G : 0.0,
               G ? (double)(pc[2][1] - pc[1][1]) / (double)G : 0.0);
    }
    free(tp);
    free(td);
    free(tok);
    free(lg);
    san_model_free(&m);
    nd_qweights3_free(&q3);
    cact_free(&f);
    return rc ? cli_fail(NULL) : 0;
}
