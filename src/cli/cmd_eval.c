/* needle eval: next-token loss of a checkpoint on token sequences. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "core/fileio.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/eval.h"

static const char *eval_help =
    "usage: needle eval --checkpoint CKPT.pkl --tokens FILE [--json] [--logits OUT.bin]\n"
    "                   [--batch-size B] [--threads N] [--device auto|cpu]\n"
    "\n"
    "Mean next-token cross-entropy of each token-id sequence in FILE (one sequence\n"
    "per line, ids separated by spaces; all positions count) and the overall mean.\n"
    "\n"
    "  --json           print one JSON object: {\"examples\": [{\"loss\", \"tokens\"}...],\n"
    "                   \"mean_loss\"}; tokens = predicted positions (length - 1)\n"
    "  --logits OUT     write every sequence's float32 logits [len, V], little-endian,\n"
    "                   back to back (written atomically)\n"
    "  --batch-size B   sequences per forward pass (default 16)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --device D       auto|cpu (default auto)\n";

static int write_logits(void *ctx, int seq, const float *logits, int len, int V)
{
    (void)seq;
    FILE *f = ctx;
    if (fwrite(logits, sizeof(float), (size_t)len * V, f) != (size_t)len * V)
        return nd_error(ND_EIO, "writing logits failed");
    return ND_OK;
}

int cli_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *tokens = NULL, *logits_path = NULL, *device = "auto";
    int json = 0;
    long long batch = 16, threads = 0;
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
        if (a[0] != '-')
            return cli_usage_error("eval", "unexpected argument '%s'", a);
        if (i + 1 >= argc)
            return cli_usage_error("eval", "%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--checkpoint"))
            ckpt = v;
        else if (!strcmp(a, "--tokens"))
            tokens = v;
        else if (!strcmp(a, "--logits"))
            logits_path = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--batch-size")) {
            if (cli_parse_int(a, v, 1, 1 << 16, &batch))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int(a, v, 1, 1024, &threads))
                return 2;
        } else
            return cli_usage_error("eval", "unknown option '%s'", a);
    }
    if (!ckpt)
        return cli_usage_error("eval", "--checkpoint is required");
    if (!tokens)
        return cli_usage_error("eval", "--tokens FILE is required");

    const nd_backend *be = nd_backend_get(device, (int)threads);
    if (!be)
        return cli_fail(NULL);
    san_model m;
    if (ckpt_load(ckpt, &m, NULL))
        return cli_fail(NULL);
    token_seqs seqs;
    if (token_file_read(tokens, m.dims.V, &seqs)) {
        san_model_free(&m);
        return cli_fail(NULL);
    }
    fprintf(stderr, "  %-9s %s (%d threads)\n", "backend", be->name, be->threads);

    nd_atomic_file af = {0};
    if (logits_path && nd_atomic_open(&af, logits_path)) {
        token_seqs_free(&seqs);
        san_model_free(&m);
        return cli_fail(NULL);
    }
    san_eval_result r;
    int rc = san_eval(&m, be, &seqs, (int)batch, logits_path ? write_logits : NULL, af.fp, &r);
    if (logits_path) {
        if (rc)
            nd_atomic_abort(&af);
        else
            rc = nd_atomic_commit(&af);
    }
    if (rc) {
        token_seqs_free(&seqs);
        san_model_free(&m);
        return cli_fail(tokens);
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
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "  %-9s %.0f tokens/s forward  (%ld tokens in %.3f s)  peak RSS %.1f MB\n",
            "speed", r.seconds > 0 ? (double)r.tokens / r.seconds : 0.0, r.tokens, r.seconds,
            (double)ru.ru_maxrss / 1024.0);
    san_eval_result_free(&r);
    token_seqs_free(&seqs);
    san_model_free(&m);
    return 0;
}
