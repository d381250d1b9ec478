/* lora_grad_dump: a test helper (not installed, not public): one LoRA
 * training step's adapter gradients, every entry, as JSON in the layout of
 * tools/ref_needle3.py --grads, so tests/test_needle3_lora_grads.py can
 * compare them entry by entry with the float64 reference.
 *
 *   lora_grad_dump CKPT ADAPTER TOKENS_FILE OUT.json [--mask-file F]
 *                  [--quant] [--threads N] [--perturb TENSOR:INDEX:DELTA]
 *
 * TOKENS_FILE / --mask-file: one sequence per line, ids (mask weights)
 * separated by commas or blanks; the sequences form one batch of
 * max-length rows, padded with pad_token_id at mask 0 (the loss is the
 * token-weighted mean, as nd_trainer_step computes it). --quant: Needle 3's
 * training numerics (nd_trainer_set_quant3; default float). --perturb adds
 * DELTA to one written gradient entry (the test's proof that a wrong
 * gradient is caught). Output: {"loss": L, "count": C, "quant": 0|1,
 * "tensors": {"lora/<kernel path>/A": {"shape": [L, in, r], "grad": [...]},
 * ...}} (all entries, row-major), written atomically. Exit 0, 1 on errors
 * (message names the file and line), 2 on usage errors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/lora.h"
#include "model/san.h"
#include "train/trainer.h"

typedef struct {
    int n, cap;
    int *len;
    double **v;
} seq_list;

static void seqs_free(seq_list *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    free(s->len);
}

/* One sequence per non-empty line; numbers split by commas or blanks. */
static int read_seqs(const char *path, seq_list *s)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "lora_grad_dump: %s: %s\n", path, strerror(errno));
        return 1;
    }
    char line[65536];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            fprintf(stderr, "lora_grad_dump: %s:%d: line too long\n", path, lineno);
            rc = 1;
            break;
        }
        double *v = NULL;
        int n = 0, cap = 0;
        char *p = line;
        for (;;) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\r' || *p == '\n')
                p++;
            if (!*p)
                break;
            char *end;
            double x = strtod(p, &end);
            if (end == p) {
                fprintf(stderr, "lora_grad_dump: %s:%d: not a number at '%.20s'\n", path, lineno,
                        p);
                free(v);
                rc = 1;
                goto out;
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                double *nv = realloc(v, sizeof *v * (size_t)cap);
                if (!nv) {
                    free(v);
                    rc = 1;
                    goto out;
                }
                v = nv;
            }
            v[n++] = x;
            p = end;
        }
        if (!n)
            continue;
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 8;
            int *nl = realloc(s->len, sizeof *nl * (size_t)s->cap);
            double **nv = nl ? realloc(s->v, sizeof *nv * (size_t)s->cap) : NULL;
            if (nl)
                s->len = nl;
            if (!nv) {
                free(v);
                rc = 1;
                goto out;
            }
            s->v = nv;
        }
        s->len[s->n] = n;
        s->v[s->n++] = v;
    }
out:
    fclose(f);
    return rc;
}

static int usage(void)
{
    fprintf(stderr, "usage: lora_grad_dump CKPT ADAPTER TOKENS_FILE OUT.json [--mask-file F] "
                    "[--quant] [--threads N] [--perturb TENSOR:INDEX:DELTA]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *pos[4], *mask_path = NULL, *perturb = NULL;
    int npos = 0, quant = 0, threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quant"))
            quant = 1;
        else if (!strcmp(argv[i], "--mask-file") && i + 1 < argc)
            mask_path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--perturb") && i + 1 < argc)
            perturb = argv[++i];
        else if (argv[i][0] != '-' && npos < 4)
            pos[npos++] = argv[i];
        else
            return usage();
    }
    if (npos != 4 || threads < 1)
        return usage();
    seq_list toks = {0}, masks = {0};
    if (read_seqs(pos[2], &toks) || (mask_path && read_seqs(mask_path, &masks)))
        return 1;
    if (!toks.n) {
        fprintf(stderr, "lora_grad_dump: %s: no token sequence\n", pos[2]);
        return 1;
    }
    if (mask_path && masks.n != toks.n) {
        fprintf(stderr, "lora_grad_dump: %s: %d masks for %d token sequences\n", mask_path, masks.n,
                toks.n);
        return 1;
    }
    int B = toks.n, T = 0;
    for (int i = 0; i < B; i++) {
        if (mask_path && masks.len[i] != toks.len[i]) {
            fprintf(stderr, "lora_grad_dump: %s:%d: %d mask values for %d tokens\n", mask_path,
                    i + 1, masks.len[i], toks.len[i]);
            return 1;
        }
        T = toks.len[i] > T ? toks.len[i] : T;
    }
    const nd_backend *be = nd_backend_cpu(threads);
    san_model m;
    san_lora lora = {0};
    nd_trainer tr = {0};
    int rc = 1;
    int32_t *ids = malloc(sizeof *ids * (size_t)B * T);
    float *mask = malloc(sizeof *mask * (size_t)B * T);
    if (!ids || !mask || ckpt_load(pos[0], &m, NULL)) {
        fprintf(stderr, "lora_grad_dump: %s\n", nd_last_error());
        seqs_free(&toks);
        seqs_free(&masks);
        free(ids);
        free(mask);
        return 1;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)b * T + t;
            int in = t < toks.len[b];
            double id = in ? toks.v[b][t] : m.cfg.pad_token_id;
            if (id < 0 || id >= m.dims.V || id != (double)(int32_t)id) {
                fprintf(stderr, "lora_grad_dump: %s:%d: token %g outside [0, %d)\n", pos[2], b + 1,
                        id, m.dims.V);
                goto done;
            }
            ids[r] = (int32_t)id;
            mask[r] = !in ? 0.0f : mask_path ? (float)masks.v[b][t] : 1.0f;
        }
    double loss = 0, count = 0;
    if (san_model_to_backend(&m, be) || san_lora_load(&lora, &m, pos[1], NULL) ||
        san_lora_to_backend(&lora, be) || nd_trainer_create(&tr, &m, be, &lora, B, T, 0, -1) ||
        (quant && nd_trainer_set_quant3(&tr)) || nd_trainer_merge(&tr) ||
        nd_trainer_step(&tr, ids, mask, B, 1, &loss, &count)) {
        fprintf(stderr, "lora_grad_dump: %s\n", nd_last_error());
        goto done;
    }
    nd_backend_sync(be);
    if (perturb) { /* TENSOR:INDEX:DELTA, TENSOR "q_proj/A" style */
        char name[64];
        long idx;
        double delta;
        const char *c1 = strchr(perturb, ':');
        if (!c1 || c1 - perturb >= (long)sizeof name ||
            sscanf(c1 + 1, "%ld:%lf", &idx, &delta) != 2) {
            rc = usage();
            goto done;
        }
        memcpy(name, perturb, (size_t)(c1 - perturb));
        name[c1 - perturb] = 0;
        int hit = 0;
        for (int t = 0; t < LORA_NTARGETS && !hit; t++) {
            const char *tn = san_lora_target_name(t), *slash = strstr(tn, "self_attn/");
            if (!lora.t[t].present || !slash)
                continue;
            slash += strlen("self_attn/");
            size_t kl = strcspn(slash, "/");
            for (int w = 0; w < 2 && !hit; w++) {
                char want[64];
                snprintf(want, sizeof want, "%.*s/%c", (int)kl, slash, "AB"[w]);
                size_t n = (size_t)lora.L * lora.rank * (w ? lora.t[t].out : lora.t[t].in);
                if (!strcmp(want, name) && idx >= 0 && (size_t)idx < n) {
                    tr.lora_g[(w ? lora.t[t].b_off : lora.t[t].a_off) + (size_t)idx] +=
                        (float)delta;
                    hit = 1;
                }
            }
        }
        if (!hit) {
            fprintf(stderr, "lora_grad_dump: --perturb %s names no gradient entry\n", perturb);
            goto done;
        }
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", pos[3]);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "lora_grad_dump: %s: %s\n", tmp, strerror(errno));
        goto done;
    }
    fprintf(f, "{\"loss\": %.17g, \"count\": %.17g, \"quant\": %d, \"tensors\": {", loss, count,
            quant);
    int first = 1;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lora.t[t].present)
            continue;
        for (int w = 0; w < 2; w++) {
            int d0 = w ? lora.rank : lora.t[t].in, d1 = w ? lora.t[t].out : lora.rank;
            const float *g = tr.lora_g + (w ? lora.t[t].b_off : lora.t[t].a_off);
            fprintf(f, "%s\"lora/%s/%c\": {\"shape\": [%d, %d, %d], \"grad\": [", first ? "" : ", ",
                    san_lora_target_name(t), "AB"[w], lora.L, d0, d1);
            first = 0;
            size_t n = (size_t)lora.L * d0 * d1;
            for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%.9g", i ? ", " : "", (double)g[i]);
            fprintf(f, "]}");
        }
    }
    fprintf(f, "}}\n");
    if (fclose(f) || rename(tmp, pos[3])) {
        fprintf(stderr, "lora_grad_dump: %s: %s\n", pos[3], strerror(errno));
        remove(tmp);
        goto done;
    }
    rc = 0;
done:
    nd_trainer_free(&tr);
    san_lora_free(&lora);
    san_model_free(&m);
    seqs_free(&toks);
    seqs_free(&masks);
    free(ids);
    free(mask);
    return rc;
}
