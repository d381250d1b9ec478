/* needle build: merge an optional LoRA adapter and export a .cact archive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/adapter_base.h"
#include "text/tokenizer.h"
#include "core/fileio.h"
#include "core/status.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/cq.h"
#include "model/lora_merge.h"
#include "io/pickle.h"

static const char *build_usage =
    "usage: needle build [CKPT.pkl|CKPT.safetensors] [--lora ADAPTER] [--out X.cact]\n"
    "                    [--bits 2|3|4]\n"
    "                    [--tokenizer M | --tokenizer-blob FILE | --no-tokenizer]\n";
static const char *build_about =
    "Without CKPT: the base the adapter records it was trained on (--lora, adapters\n"
    "of our finetune), else checkpoints/needle2.pkl when it is there, else the nano\n"
    "base installed with needle (said in the first lines). A CKPT that is missing is\n"
    "downloaded from Hugging Face (Cactus-Compute/needle2) as upstream does.\n"
    "\n"
    "Export a checkpoint to the .cact archive the Needle engine loads (upstream's\n"
    "format, byte for byte): CQ-quantised matrices, FP16 norms and gates, the\n"
    "probe heads when the checkpoint has them, and the tokenizer blob last.\n"
    "A Needle 3 checkpoint (cactus-needle 3.x) gives the Needle 3 archive (tag\n"
    "0x05E12A84, 3.x's export.py layout: W4 unless --bits says otherwise, the\n"
    "kv_window of 3.x's effective_kv_window, the embedding, confidence and router\n"
    "heads when present).\n";

/* A tokenizer file (.model or blob) -> the archive's RAW blob (export.py layout). */
static int tokenizer_blob(const char *model_path, unsigned char **blob, size_t *len)
{
    nd_tokenizer *t;
    int rc = nd_tokenizer_load(model_path, &t);
    if (rc)
        return rc;
    rc = nd_tokenizer_write_blob(t, blob, len);
    nd_tokenizer_free(t);
    return rc;
}

/* os.path.splitext(os.path.basename(path))[0] + ".cact" */
static void default_out(const char *ckpt, char *out, size_t cap)
{
    const char *base = strrchr(ckpt, '/');
    base = base ? base + 1 : ckpt;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot)
        for (const char *p = base; p < dot; p++)
            if (*p != '.') { /* a dot that is not part of the leading dots */
                n = (size_t)(dot - base);
                break;
            }
    snprintf(out, cap, "%.*s.cact", (int)n, base);
}

static double now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The scheme an adapter was trained at with `finetune --qat` ("W2"), or
 * "" (no --qat, or an adapter that does not say). */
static void adapter_qat_scheme(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    pv *ad = NULL;
    if (ckpt_file_load(path, &ad))
        return;
    const pv *st = ad->kind == PV_DICT ? pv_dict_get(ad, "needle_c_state") : NULL;
    const pv *qat = st && st->kind == PV_DICT ? pv_dict_get(st, "qat") : NULL;
    const pv *sch = st && st->kind == PV_DICT ? pv_dict_get(st, "qat_scheme") : NULL;
    if (qat && qat->kind == PV_INT && qat->u.i && sch && sch->kind == PV_STR)
        snprintf(buf, cap, "%s", sch->u.str.s);
    pv_decref(ad);
}

/* The checkpoint to build from when none is given: the base the adapter
 * records (--lora), else the default base. *ckpt stays as given when
 * there is one; *given says whether it was named or found (not a
 * fallback). Returns 1 (exit status, message printed) on failure. */
static int build_resolve_base(const char *lora, const char **ckpt, int *given, char *basebuf,
                              size_t cap)
{
    *given = *ckpt != NULL;
    if (!*ckpt && lora) {
        if (cli_adapter_base(lora, basebuf, cap))
            return 1;
        if (basebuf[0]) {
            FILE *f = fopen(basebuf, "rb");
            if (!f) {
                fprintf(stderr,
                        "needle build: %s was trained on %s, which cannot be read now: give "
                        "the base checkpoint (needle build CKPT.pkl --lora %s)\n",
                        lora, basebuf, lora);
                return 1;
            }
            fclose(f);
            printf("  %-9s %s  (the base %s was trained on)\n", "base", basebuf, lora);
            *ckpt = basebuf;
            *given = 1; /* found, not a fallback */
        }
    }
    if (*ckpt && lora && cli_check_adapter_base(*ckpt, lora)) /* a nano adapter on needle2 */
        return 1;
    if (!*ckpt)
        *ckpt = cli_default_base(stdout, "needle build CKPT.pkl", basebuf, cap);
    return 0;
}

/* The tokenizer blob to embed: --tokenizer-blob as it is, else the
 * --tokenizer model, $NEEDLE_TOKENIZER, or tokenizer.model beside the
 * checkpoint (fetched as upstream's build does when missing) turned into
 * a blob; none with --no-tokenizer. No tokenizer otherwise is an error. */
static int build_tokenizer(const char *ckpt, const char *out, const char *tok_blob,
                           const char *tok_model, int no_tokenizer, const san_model *m,
                           unsigned char **blob, size_t *blob_len)
{
    if (tok_blob)
        return nd_read_file(tok_blob, (size_t)1 << 30, blob, blob_len);
    if (no_tokenizer)
        return ND_OK;
    /* --tokenizer, else $NEEDLE_TOKENIZER, else tokenizer.model beside the checkpoint */
    const char *env = getenv("NEEDLE_TOKENIZER");
    char beside[4096];
    if (!tok_model && env && *env)
        tok_model = env;
    if (!tok_model) {
        const char *slash = strrchr(ckpt, '/');
        int dir = slash ? (int)(slash - ckpt) + 1 : 0;
        snprintf(beside, sizeof beside, "%.*stokenizer.model", dir, ckpt);
        FILE *f = fopen(beside, "rb");
        if (f) {
            fclose(f);
            tok_model = beside;
        } else if (cli_fetch_tokenizer(beside, m->cfg.generation) == 0) {
            tok_model = beside; /* upstream's, fetched as upstream's build does */
        }
    }
    if (tok_model && nd_same_file(out, tok_model))
        return nd_error(ND_EARG,
                        "%s: is the same file as the tokenizer (%s); refusing to "
                        "overwrite an input, choose another output path",
                        out, tok_model);
    if (tok_model)
        return tokenizer_blob(tok_model, blob, blob_len);
    return nd_error(ND_EARG,
                    "no tokenizer found (--tokenizer, $NEEDLE_TOKENIZER or tokenizer.model "
                    "beside %s): the engine cannot run an archive without one. Upstream's "
                    "tokenizer: Hugging Face %s, tokenizer/tokenizer.model; or pass "
                    "--no-tokenizer to build one anyway",
                    ckpt, cli_hf_repo(m->cfg.generation));
}

/* Write the archive (bits: --bits or 0) and say what was written; a note
 * when the adapter was fine-tuned with --qat at another width. */
static int build_write(const char *out, const san_model *m, const pv *params, long long bits,
                       const unsigned char *blob, size_t blob_len, const char *lora)
{
    cact_write_opts o = {0};
    int gen3 = m->cfg.generation == 3;
    /* 3.x's build writes W4 (WEIGHT_BITS) and has no weight_bits map */
    const char *map = (!gen3 && !bits && m->cfg.weight_bits[0]) ? m->cfg.weight_bits : NULL;
    o.bits = bits ? (int)bits : 4;
    o.bits_map = map;
    o.group = CQ_GROUP;
    o.kv_window = gen3 ? cact3_effective_kv_window(&m->cfg) : san_effective_kv_window(&m->cfg);
    if (gen3 && (m->cfg.n_cla || m->cfg.n_bank_ids))
        fprintf(stderr,
                "needle build: note: the Needle 3 archive header has no field for %s%s%s; the "
                "archive is laid out as 3.x's exporter lays out a model without them%s\n",
                m->cfg.n_cla ? "cla_pairs" : "", m->cfg.n_cla && m->cfg.n_bank_ids ? " or " : "",
                m->cfg.n_bank_ids ? "engram_bank_ids" : "",
                m->cfg.n_bank_ids ? " (each engram site gets its bank's tables)" : "");
    o.tokenizer = blob;
    o.tokenizer_len = blob_len;
    cact_write_info info;
    int rc = cact_write_file(out, m, params, &o, &info);
    if (rc)
        return rc;
    char scheme[300];
    if (map)
        snprintf(scheme, sizeof scheme, "mixed[%s]", map);
    else
        snprintf(scheme, sizeof scheme, "W%d", o.bits);
    printf("  %-9s %s  %.2f MB  %d tensors  %sA8\n", "wrote", out, (double)info.bytes / 1e6,
           info.num_tensors, scheme);
    char trained[300];
    if (lora) {
        adapter_qat_scheme(lora, trained, sizeof trained);
        if (trained[0] && strcmp(trained, scheme))
            fprintf(stderr,
                    "needle build: note: %s was fine-tuned with --qat at %s but this archive is "
                    "%s: its weights are not the ones training saw (build with the --bits the "
                    "fine-tune used)\n",
                    lora, trained, scheme);
    }
    return ND_OK;
}

int cli_build(int argc, char **argv)
{
    const char *lora = NULL, *out = NULL, *tok_blob = NULL, *tok_model = NULL;
    long long bits = 0;
    int no_tokenizer = 0, upload = 0;
    cli_opt opts[] = {
        {"--lora", CLI_PATH, &lora, 0, 0, "FILE", NULL,
         "merge this adapter first: W += scale * A @ B (in the checkpoint's stored dtype)", 0, 0},
        {"--out", CLI_PATH, &out, 0, 0, "FILE", NULL,
         "output (default: checkpoint basename + .cact, in the current directory); written "
         "atomically",
         0, 0},
        {"--bits", CLI_I64, &bits, 2, 4, "N", NULL,
         "CQ width for every matrix: 2 or 4 as upstream, or 3 (ours: upstream's build offers 2|4 "
         "only); default: the config's weight_bits map (\"name=bits,...,default=b\"), else 4",
         0, 0},
        {"--tokenizer-blob", CLI_PATH, &tok_blob, 0, 0, "FILE", NULL,
         "RAW tokenizer blob (export.py layout) stored as the last tensor; its piece count must "
         "equal the config vocab (Needle 3: at most the vocab, as 3.x checks)",
         0, 0},
        CLI_OPT_TOKENIZER(
            &tok_model, "SentencePiece .model (or blob) to embed (default $NEEDLE_TOKENIZER, else "
                        "tokenizer.model beside the checkpoint); without one the build fails: "
                        "the engine cannot run an archive without its tokenizer"),
        {"--no-tokenizer", CLI_FLAG, &no_tokenizer, 0, 0, NULL, NULL,
         "write the archive without a tokenizer anyway (for inspection; `needle run` refuses it)",
         0, 0},
        {"--upload", CLI_FLAG, &upload, 0, 0, NULL, NULL,
         "not supported: upload the .cact with huggingface-cli or the Hugging Face web UI", 0, 0},
    };
    cli_cmd cmd = {"build", build_usage, build_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    if (upload) {
        fprintf(stderr,
                "needle build: --upload is not supported: build the archive, then upload "
                "it with huggingface-cli (`huggingface-cli upload <you>/<model> X.cact`) or "
                "the Hugging Face web UI\n");
        return 2;
    }
    const char *ckpt = cmd.n_pos ? cmd.pos[0] : NULL;
    if (tok_blob && tok_model)
        return cli_usage_error("build", "give --tokenizer or --tokenizer-blob, not both");
    if (no_tokenizer && (tok_blob || tok_model))
        return cli_usage_error("build", "--no-tokenizer contradicts --tokenizer/--tokenizer-blob");
    char basebuf[4096];
    int ckpt_given;
    if (build_resolve_base(lora, &ckpt, &ckpt_given, basebuf, sizeof basebuf))
        return 1;
    char outbuf[4096];
    if (!out) {
        default_out(ckpt, outbuf, sizeof outbuf);
        out = outbuf;
    }

    if (cli_check_output(out, "checkpoint", ckpt, "adapter", lora, "tokenizer", tok_model,
                         "tokenizer blob", tok_blob, "tokenizer ($NEEDLE_TOKENIZER)",
                         getenv("NEEDLE_TOKENIZER"), (const char *)NULL))
        return 1;
    if (nd_check_writable(out))
        return cli_fail(NULL);

    char ckbuf[4096];
    if (cli_fetch_checkpoint(ckpt, ckbuf, sizeof ckbuf)) {
        if (!ckpt_given)
            cli_default_base_hint();
        return 1;
    }
    ckpt = ckbuf;
    double t0 = now();
    san_model m;
    pv *root = NULL;
    unsigned char *blob = NULL;
    size_t blob_len = 0;
    int rc = ckpt_load(ckpt, &m, &root);
    if (rc)
        return cli_fail(NULL);
    const pv *params = pv_dict_get(root, "params");
    if (lora) {
        lora_merge_info li;
        rc = lora_merge_file(&m, params, lora, &li);
        if (rc)
            goto fail;
        printf("  %-9s %d weight groups  %s\n", "merged", li.merged + li.skipped, lora);
    }
    /* NaN/Inf would be quantised into garbage codes: refuse, naming the tensor */
    if ((rc = san_model_check_finite(&m, lora ? lora : ckpt))) {
        if (lora)
            nd_error_prefix(rc, "after merging the adapter into %s", ckpt);
        goto fail;
    }
    rc = build_tokenizer(ckpt, out, tok_blob, tok_model, no_tokenizer, &m, &blob, &blob_len);
    if (rc)
        goto fail;
    rc = build_write(out, &m, params, bits, blob, blob_len, lora);
    if (rc)
        goto fail;
    fprintf(stderr, "  %-9s %.2f s\n", "time", now() - t0);
    free(blob);
    pv_decref(root);
    san_model_free(&m);
    return 0;
fail:
    free(blob);
    pv_decref(root);
    san_model_free(&m);
    return cli_fail(NULL);
}
