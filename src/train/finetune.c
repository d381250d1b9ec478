#define _XOPEN_SOURCE 700
#include "train/finetune.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <math.h>
#include "core/threadpool.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/jsonl.h"
#include "model/lora.h"
#include "text/render.h"
#include "text/tokenizer.h"
#include "train/optim.h"
#include "train/batch.h"
#include "train/loss_log.h"
#include "train/trainer.h"

void nd_finetune_defaults(nd_finetune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->checkpoint = "checkpoints/needle2.pkl";
    o->out = "checkpoints/needle_lora.pkl";
    o->epochs = 3;
    o->batch_size = 16;
    o->rank = 16;
    o->max_len = 1024;
    o->lr = 1e-4;
    o->alpha = 32;
    o->val_split = 0.1;
    o->act_budget_mb = ND_ACT_BUDGET_MB;
}

static void emitf(const nd_finetune_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void emitf(const nd_finetune_opts *o, const char *fmt, ...)
{
    if (!o->emit)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->emit(o->ctx, line);
}

/* The base checkpoint as recorded for --resume: its absolute path when it
 * resolves, else as given. */
static void base_id(const char *path, char *buf, size_t cap)
{
    char *rp = realpath(path, NULL);
    snprintf(buf, cap, "%s", rp ? rp : path);
    free(rp);
}

/* The optimiser state plus the run's settings (needle_c_state, docs/formats.md §1.5). A
 * resume compares the settings with the new run's (see check_resume). */
static pv *optimizer_state(const nd_finetune_opts *o, const nd_adamw *opt, const char *qat)
{
    pv *st = pv_dict();
    int64_t n = (int64_t)opt->n;
    if (!st)
        return NULL;
    char base[PATH_MAX + 1];
    base_id(o->checkpoint, base, sizeof base);
    pv_dict_set(st, "format", pv_str("needle-c adamw 1"));
    pv_dict_set(st, "count", pv_int(opt->count));
    pv_dict_set(st, "seed", pv_int((int64_t)o->seed));
    pv_dict_set(st, "total_steps", pv_int(opt->total_steps));
    pv_dict_set(st, "mu", pv_ndarray(ND_F32, 1, &n, opt->mu));
    pv_dict_set(st, "nu", pv_ndarray(ND_F32, 1, &n, opt->nu));
    pv_dict_set(st, "base_checkpoint", pv_str(base));
    pv_dict_set(st, "batch_size", pv_int(o->batch_size));
    pv_dict_set(st, "epochs", pv_int(o->epochs));
    pv_dict_set(st, "val_split", pv_float(o->val_split));
    pv_dict_set(st, "max_len", pv_int(o->max_len));
    pv_dict_set(st, "lora_rank", pv_int(o->rank));
    pv_dict_set(st, "lora_alpha", pv_float(o->alpha));
    pv_dict_set(st, "group_by_tools", pv_int(o->group_by_tools));
    pv_dict_set(st, "full", pv_int(o->full));
    pv_dict_set(st, "lr", pv_float(o->lr));
    /* --qat: the scheme build must use to get what training saw ("W2") */
    pv_dict_set(st, "qat", pv_int(o->qat));
    /* a Needle 3 base: 1 = trained in float, 0 = through 3.x's numerics */
    pv_dict_set(st, "no_qat", pv_int(o->no_qat));
    if (o->qat && qat)
        pv_dict_set(st, "qat_scheme", pv_str(qat));
    return st;
}

static void appendf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* Compare the settings recorded in a resumed adapter with this run's:
 * differences refuse the resume unless o->resume_override. */
static int check_resume(const nd_finetune_opts *o, const san_model *m, const pv *root)
{
    const pv *st = pv_dict_get(root, "needle_c_state");
    const pv *bs = st && st->kind == PV_DICT ? pv_dict_get(st, "batch_size") : NULL;
    if (!bs) {
        emitf(o,
              "  %-9s %s records no run settings (an upstream or older adapter): cannot check "
              "that the base, seed, batch size, epochs, split, max_len and LoRA shape match "
              "this run; continuing",
              "warning", o->resume);
        return ND_OK;
    }
    char diff[2048] = "";
    int nd = 0;
    const char *rec = o->full ? "checkpoint" : "adapter";
    char base[PATH_MAX + 1];
    base_id(o->checkpoint, base, sizeof base);
    const pv *v = pv_dict_get(st, "base_checkpoint");
    if (!v || v->kind != PV_STR || strcmp(v->u.str.s, base)) {
        appendf(diff, sizeof diff, "%sbase checkpoint %s (%s) vs %s (this run)", nd++ ? "; " : "",
                v && v->kind == PV_STR ? v->u.str.s : "?", rec, base);
    }
    static const struct {
        const char *key, *what;
    } ints[] = {{"seed", "--seed"},           {"batch_size", "--batch-size"},
                {"epochs", "--epochs"},       {"max_len", "--max-len"},
                {"lora_rank", "--lora-rank"}, {"group_by_tools", "--group-by-tools (1 = on)"},
                {"qat", "--qat (1 = on)"},    {"no_qat", "--no-qat (1 = on)"}};
    long long now[] = {(long long)o->seed, o->batch_size, o->epochs, o->max_len, o->rank,
                       o->group_by_tools,  o->qat,        o->no_qat};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (o->full && !strncmp(ints[i].key, "lora_", 5))
            continue; /* no adapter in a --full run */
        v = pv_dict_get(st, ints[i].key);
        if (!v && !strcmp(ints[i].key, "qat") && !o->qat)
            continue; /* adapters from before --qat: trained without it */
        if (!v && !strcmp(ints[i].key, "no_qat") && !o->no_qat)
            continue; /* adapters from before --no-qat */
        if (!v || v->kind != PV_INT || v->u.i != now[i]) {
            char was[32];
            if (v && v->kind == PV_INT)
                snprintf(was, sizeof was, "%lld", (long long)v->u.i);
            else
                snprintf(was, sizeof was, "?");
            appendf(diff, sizeof diff, "%s%s %s (%s) vs %lld (this run)", nd++ ? "; " : "",
                    ints[i].what, was, rec, now[i]);
        }
    }
    static const struct {
        const char *key, *what;
    } dbls[] = {{"val_split", "--val-split"}, {"lora_alpha", "--lora-alpha"}, {"lr", "--lr"}};
    double nowd[] = {o->val_split, o->alpha, o->lr};
    for (size_t i = 0; i < sizeof dbls / sizeof dbls[0]; i++) {
        v = pv_dict_get(st, dbls[i].key);
        if (!v && !strcmp(dbls[i].key, "lr"))
            continue; /* adapters written before the lr was recorded */
        if (o->full && !strncmp(dbls[i].key, "lora_", 5))
            continue;
        double was = v && v->kind == PV_FLOAT ? v->u.f
                     : v && v->kind == PV_INT ? (double)v->u.i
                                              : NAN;
        if (!(was == nowd[i]))
            appendf(diff, sizeof diff, "%s%s %g (%s) vs %g (this run)", nd++ ? "; " : "",
                    dbls[i].what, was, rec, nowd[i]);
    }
    if (o->qat) {
        char scheme[300];
        nd_qat_scheme(m, o->bits, scheme, sizeof scheme);
        v = pv_dict_get(st, "qat_scheme");
        if (!v || v->kind != PV_STR || strcmp(v->u.str.s, scheme))
            appendf(diff, sizeof diff, "%s--qat scheme %s (adapter) vs %s (this run)",
                    nd++ ? "; " : "", v && v->kind == PV_STR ? v->u.str.s : "none", scheme);
    }
    if (!nd)
        return ND_OK;
    if (!o->resume_override)
        return nd_error(ND_EARG,
                        "%s was trained with other settings than this run: %s. Resume with "
                        "the same settings (the schedule and the train/validation split "
                        "depend on them), or pass --resume-override to continue anyway",
                        o->resume, diff);
    emitf(o, "  %-9s --resume-override: continuing despite: %s", "warning", diff);
    return ND_OK;
}

/* The run's output: the adapter (with optimiser state, for --resume) or,
 * with --full, the whole checkpoint (extra tensors of the base kept).
 * A --full checkpoint saved before the end (periodic, Ctrl-C, a numeric
 * stop) carries the optimiser state and settings as an extra top-level key
 * "needle_c_state", which upstream's load_checkpoint ignores (it reads only
 * format_version, params and config); the final one is float32 or, with
 * save_f16, float16 as upstream's own, and has no such key. */
/* The run settings without the optimiser moments (st is consumed). */
static pv *without_moments(pv *st)
{
    pv *copy = pv_dict();
    for (size_t i = 0; copy && i < st->u.dict.n; i++) {
        const pv *k = st->u.dict.keys[i];
        if (k->kind == PV_STR && (!strcmp(k->u.str.s, "mu") || !strcmp(k->u.str.s, "nu")))
            continue;
        if (pv_dict_set_key(copy, k, pv_incref(st->u.dict.vals[i]))) {
            pv_decref(copy);
            copy = NULL;
        }
    }
    pv_decref(st);
    return copy;
}

static int save_output(const nd_finetune_opts *o, const san_model *m, const pv *base_tree,
                       const san_lora *lora, const nd_adamw *opt, const char *qat, int final)
{
    /* the directory appears only when something is written into it */
    int rc = ND_OK;
    if (o->out_dir && (rc = nd_mkdirs(o->out_dir, "checkpoint directory")))
        return rc;
    if (!o->full) {
        pv *st = optimizer_state(o, opt, qat);
        /* a finished safetensors adapter keeps upstream 3.x's layout: its
         * read_adapter would take the moments' tensors for weight groups
         * (the settings ride in the metadata, which it ignores) */
        if (st && final && ckpt_path_is_safetensors(o->out))
            st = without_moments(st);
        return san_lora_save(lora, o->out, st);
    }
    pv *root = ckpt_to_tree(m, base_tree);
    if (!root)
        return ND_ENOMEM;
    if (!final) {
        pv *st = optimizer_state(o, opt, qat);
        rc = st ? pv_dict_set(root, "needle_c_state", st) : nd_error(ND_ENOMEM, "out of memory");
    } else if (o->save_f16) {
        rc = ckpt_tree_params_to_dtype(root, ND_F16);
    }
    if (!rc)
        rc = ckpt_file_save(root, o->out);
    pv_decref(root);
    return rc;
}

/* The tree without its "needle_c_state" (a resumed checkpoint's): the
 * outputs carry the base's other top-level keys, never a stale state. */
static pv *without_state(pv *tree)
{
    if (!tree || tree->kind != PV_DICT || !pv_dict_get(tree, "needle_c_state"))
        return tree;
    pv *copy = pv_dict();
    for (size_t i = 0; copy && i < tree->u.dict.n; i++) {
        const pv *k = tree->u.dict.keys[i];
        if (k->kind == PV_STR && !strcmp(k->u.str.s, "needle_c_state"))
            continue;
        if (pv_dict_set_key(copy, k, pv_incref(tree->u.dict.vals[i]))) {
            pv_decref(copy);
            copy = NULL;
        }
    }
    pv_decref(tree);
    return copy;
}

int nd_finetune(const nd_finetune_opts *o)
{
    int rc;
    const nd_backend *be = o->be;
    if (o->epochs < 1 || o->batch_size < 1 || o->rank < 1 || o->max_len < 2 || !(o->lr > 0) ||
        !(o->alpha > 0) || !(o->val_split >= 0 && o->val_split < 1))
        return nd_error(ND_EARG, "epochs, batch size, rank and lr must be positive, max_len >= "
                                 "2 and 0 <= val_split < 1");
    san_model m = {0};
    nd_tokenizer *tok = NULL;
    nd_dataset ds = {0};
    nd_token_set ts = {0};
    san_lora lora = {0};
    nd_batcher bt = {0};
    nd_adamw opt = {0};
    size_t *order = NULL, *tmp = NULL, *tmp2 = NULL;
    int32_t *set_of = NULL;
    float *last_good = NULL;
    pv *resume_root = NULL, *base_tree = NULL;
    nd_loss_log llog = {0};
    char qat_scheme[300] = "";

    /* the output must be writable before any long work starts */
    struct stat dir_st;
    if (o->out_dir && stat(o->out_dir, &dir_st) != 0) {
        /* not there yet: created at the first save, if it can be */
        if ((rc = nd_dir_creatable(o->out_dir, "checkpoint directory")))
            return rc;
    } else if ((rc = nd_check_writable(o->out)))
        return rc;
    FILE *probe = fopen(o->checkpoint, "rb");
    if (!probe)
        return nd_error(ND_EIO,
                        "base checkpoint %s not found. Upstream publishes needle2 on Hugging "
                        "Face (Cactus-Compute/needle2, checkpoints/needle2.pkl); download it there "
                        "or pass --checkpoint PATH (e.g. one made by `needle init`)",
                        o->checkpoint);
    fclose(probe);
    char bl[512];
    emitf(o, "  %-9s %s", "backend", nd_backend_line(be, bl, sizeof bl));
    /* --full --resume: the weights are the resumed checkpoint's, the base
     * (--checkpoint) only identifies the run in the settings check */
    const char *weights = o->full && o->resume ? o->resume : o->checkpoint;
    if ((rc = ckpt_load(weights, &m, o->full ? &base_tree : NULL)) ||
        (rc = san_model_to_backend(&m, be)))
        goto done;
    if (o->full && o->resume) {
        const pv *st = pv_dict_get(base_tree, "needle_c_state");
        if (!st || st->kind != PV_DICT) {
            rc = nd_error(ND_EARG,
                          "%s has no needle_c_state (optimiser state and run settings): it is a "
                          "plain checkpoint (a finished run's, or upstream's), not a stopped "
                          "--full run; start a new run from it with --checkpoint %s",
                          o->resume, o->resume);
            goto done;
        }
        resume_root = pv_incref(base_tree);
        if (!(base_tree = without_state(base_tree))) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            goto done;
        }
    }
    if ((rc = nd_tokenizer_load(o->tokenizer, &tok)))
        goto done;
    /* the template follows the base model's generation */
    int generation = o->generation ? o->generation : m.cfg.generation;
    if ((rc = nd_render_check_vocab(tok, generation, m.dims.V, o->tokenizer)))
        goto done;
    nd_jsonl_opts jo = {.skip_bad = o->skip_bad, .generation = generation};
    if ((rc = nd_jsonl_load(o->data, &jo, &ds)))
        goto done;
    /* like upstream, only --max-len caps the length (max_seq_len sizes the
     * engine's buffers, not training) */
    if ((rc = nd_dataset_tokenize(&ds, tok, (size_t)o->max_len, &ts)))
        goto done;
    if (ts.n == 0) {
        rc = nd_error(ND_EFORMAT, "%s: no usable examples (empty file, or no line has a query)",
                      o->data);
        goto done;
    }
    emitf(o, "  %-9s %zu examples  seq_len %zu  cap %d%s", "data", ts.n, ts.max_len, o->max_len,
          "");
    if (ds.no_query || ds.bad || ts.truncated)
        emitf(o,
              "  %-9s %zu lines without query skipped, %zu invalid lines skipped, %zu examples "
              "truncated to %zu tokens",
              "note", ds.no_query, ds.bad, ts.truncated, ts.max_len);

    /* held-out split after a seeded shuffle (upstream: n_val = min(int(N*s), N-1)) */
    size_t N = ts.n;
    size_t n_val = (size_t)floor((double)N * o->val_split);
    if (n_val > N - 1)
        n_val = N - 1;
    order = malloc(sizeof *order * N);
    if (!order) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < N; i++)
        order[i] = i;
    nd_rng rng;
    nd_rng_seed(&rng, o->seed ^ 0x5851F42D4C957F2Dull);
    if (n_val)
        nd_shuffle_indices(order, N, &rng);
    size_t *val = order, *train = order + n_val, count = N - n_val;
    if (n_val)
        emitf(o, "  %-9s %zu examples for validation", "holdout", n_val);
    if ((size_t)o->batch_size > count) {
        rc = nd_error(ND_EARG,
                      "batch size %d is larger than the %zu training examples; use "
                      "--batch-size %zu or fewer",
                      o->batch_size, count, count);
        goto done;
    }
    double targets = 0;
    for (size_t i = 0; i < count; i++)
        for (size_t t = 0; t < ts.max_len; t++)
            targets += ts.mask[train[i] * ts.max_len + t];
    if (targets == 0) {
        rc = nd_error(ND_EARG,
                      "%s: no target tokens to train on: --max-len %d cuts every training "
                      "example before its answer (the longest example has %zu tokens); raise "
                      "--max-len",
                      o->data, o->max_len, ts.longest);
        goto done;
    }
    int B = o->batch_size, T = (int)ts.max_len;
    long spe = (long)((count + (size_t)B - 1) / (size_t)B), total = (long)o->epochs * spe;

    if (o->full) {
        /* every base parameter trains; the output is a checkpoint */
        if (resume_root && (rc = check_resume(o, &m, resume_root)))
            goto done;
    } else if (o->resume) {
        if ((rc = san_lora_load(&lora, &m, o->resume, &resume_root)))
            goto done;
        if ((rc = check_resume(o, &m, resume_root)))
            goto done;
    } else {
        if ((rc = san_lora_create(&lora, &m, o->rank, (float)o->alpha)))
            goto done;
        san_lora_init(&lora, o->seed);
    }
    snprintf(lora.base, sizeof lora.base, "%s", o->checkpoint);
    if (!o->full && (rc = san_lora_to_backend(&lora, be)))
        goto done;
    int groups = 0;
    for (int t = 0; t < LORA_NTARGETS; t++)
        groups += lora.t[t].present;
    if (o->full)
        emitf(o, "  %-9s all %zu base parameters (full fine-tune)", "params", m.numel);
    else
        emitf(o, "  %-9s rank %d  alpha %g  %d weight groups", "lora", lora.rank,
              (double)lora.scale * lora.rank, groups);
    float *P = o->full ? m.mem : lora.mem;
    size_t NP = o->full ? m.numel : lora.numel;
    if ((rc = nd_adamw_init(&opt, NP, (float)o->lr, total)))
        goto done;
    if (resume_root) {
        const pv *st = pv_dict_get(resume_root, "needle_c_state");
        const pv *mu = st ? pv_dict_get(st, "mu") : NULL, *nu = st ? pv_dict_get(st, "nu") : NULL;
        const pv *cnt = st ? pv_dict_get(st, "count") : NULL;
        if (mu && nu && cnt && mu->kind == PV_NDARRAY && nu->kind == PV_NDARRAY &&
            mu->u.nd.dtype == ND_F32 && nu->u.nd.dtype == ND_F32 &&
            pv_nd_numel(mu) == (int64_t)NP && pv_nd_numel(nu) == (int64_t)NP &&
            cnt->kind == PV_INT && cnt->u.i >= 0 && cnt->u.i <= total) {
            memcpy(opt.mu, mu->u.nd.data, sizeof(float) * NP);
            memcpy(opt.nu, nu->u.nd.data, sizeof(float) * NP);
            opt.count = (long)cnt->u.i;
            emitf(o, "  %-9s %s at step %ld/%ld (optimiser moments restored)", "resume", o->resume,
                  opt.count, total);
        } else if (o->full) {
            rc = nd_error(ND_EFORMAT,
                          "%s: needle_c_state does not match this model (moments of %zu "
                          "parameters and a step within %ld expected)",
                          o->resume, NP, total);
            goto done;
        } else {
            emitf(o, "  %-9s %s (no optimiser state: moments start at zero, step 0)", "resume",
                  o->resume);
        }
    }
    /* the moments are copied: drop the tree's (twice the parameters) */
    pv_decref(resume_root);
    resume_root = NULL;
    emitf(o, "  %-9s %ld steps  warmup %ld  cosine decay  clip 1.0", "schedule", total,
          opt.warmup_steps);

    last_good = malloc(sizeof *last_good * (NP ? NP : 1));
    tmp = malloc(sizeof *tmp * (count ? count : 1));
    tmp2 = malloc(sizeof *tmp2 * (count ? count : 1));
    if (o->group_by_tools)
        set_of = nd_tool_set_ids(&ds, N);
    if (!last_good || !tmp || !tmp2 || (o->group_by_tools && !set_of)) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    /* a loss that is not finite at the first step restores this */
    memcpy(last_good, P, sizeof(float) * NP);
    /* Replay every epoch's batches (the orders are seeded) to size the
     * buffers for the largest batch, and say what the batching saves on
     * the first epoch. */
    long max_rows = 0, max_items = 0, max_group = 0;
    double real = 0, rows_done = 0, padded = (double)spe * B * T;
    memcpy(tmp, train, sizeof *tmp * count);
    for (int e = 0; e < o->epochs && !rc; e++) {
        nd_epoch_order(tmp, count, B, o->seed, e, set_of, tmp2);
        if (nd_batch_caps(&ts, o->batching, tmp, count, B, &max_rows, &max_items, &max_group,
                          e == 0 ? &rows_done : NULL))
            rc = nd_error(ND_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < count; i++)
        real += ts.len[train[i]];
    if (!rc && n_val &&
        nd_batch_caps(&ts, o->batching, val, n_val, B, &max_rows, &max_items, &max_group, NULL))
        rc = nd_error(ND_ENOMEM, "out of memory");
    if (rc)
        goto done;
    emitf(o,
          "  %-9s %s: %.0fk real tokens an epoch (%.0fk padded), %.0fk computed (%.1fx less "
          "than padded)%s",
          "batching", nd_batching_name(o->batching), real / 1e3, padded / 1e3, rows_done / 1e3,
          padded / (rows_done > 0 ? rows_done : 1),
          set_of ? "; batches grouped by tool set (--group-by-tools)" : "");
    if ((rc = nd_batcher_create(&bt, &m, be, o->full ? NULL : &lora, &ts, B, o->batching, o->full,
                                max_rows, max_items, max_group, o->act_budget_mb)))
        goto done;
    nd_trainer *tr = &bt.tr;
    float *G = o->full ? tr->full_g : tr->lora_g;
    if (m.cfg.generation == 3) {
        /* 3.x fine-tunes through its deployed numerics; --no-qat: float */
        if (o->qat && o->no_qat)
            rc = nd_error(ND_EARG, "--qat and --no-qat together");
        else if (o->bits)
            rc = nd_error(ND_EARG, "--bits: a Needle 3 base trains at 3.x's fixed 4-bit CQ "
                                   "weights (give no --bits)");
        if (rc)
            goto done;
        if (!o->no_qat) {
            double tq = nd_wtime();
            if ((rc = nd_trainer_set_quant3(tr)))
                goto done;
            emitf(o,
                  "  %-9s Needle 3 numerics: CQ 4-bit weights, A%d activations, KV %d, straight-"
                  "through gradients (%.0f ms; --no-qat for float)",
                  "qat", tr->fq3.act_bits, tr->fq3.kv_bits, (nd_wtime() - tq) * 1e3);
        } else
            emitf(o, "  %-9s float (--no-qat)", "qat");
    } else if (o->qat) {
        double tq = nd_wtime();
        if ((rc = nd_trainer_set_qat(tr, o->bits)))
            goto done;
        snprintf(qat_scheme, sizeof qat_scheme, "%s", tr->qat->scheme);
        emitf(o,
              "  %-9s training through build's %s quantise-dequantise (%d tensors quantised "
              "in %.0f ms)",
              "qat", qat_scheme, tr->qat->n, (nd_wtime() - tq) * 1e3);
    }
    emitf(o,
          "  %-9s %d of %d layers' activations kept, the rest recomputed in the backward (%.0f "
          "MB of activations for up to %ld rows at a time; --act-memory)",
          "memory", tr->kept_layers, m.dims.L, (double)tr->acts.bytes / 1048576.0,
          tr->acts.cap_rows);

    long every = total / 50 > 1 ? total / 50 : 1, step = 0;
    double t_start = nd_wtime(), tokens_done = 0;
    long start_step = opt.count;
    if (o->loss_log && (rc = nd_loss_log_open(&llog, o->loss_log, start_step)))
        goto done;
    for (int epoch = 0; epoch < o->epochs && !rc; epoch++) {
        /* per-epoch order derived from (seed, epoch) so a resume replays it */
        nd_epoch_order(train, count, B, o->seed, epoch, set_of, tmp);
        double last = 0;
        long epoch_first = step;
        for (size_t s0 = 0; s0 < count && !rc; s0 += (size_t)B, step++) {
            if (step < start_step)
                continue; /* resumed: these updates are already in the adapter */
            if (o->stop && !*o->stop && o->stop_after && step >= o->stop_after)
                *o->stop = -1; /* --stop-after: a deterministic Ctrl-C */
            if (o->stop && *o->stop) {
                rc = nd_error(ND_EIO, "interrupted at step %ld/%ld", step, total);
                break;
            }
            int rows = count - s0 < (size_t)B ? (int)(count - s0) : B;
            double loss, masked, gnorm, lr_used = 0;
            /* kept before the step: a non-finite loss on the very first
             * step must restore these, not uninitialised memory */
            memcpy(last_good, P, sizeof(float) * NP);
            rc = nd_batcher_step(&bt, train + s0, rows, 1, &loss, &masked);
            if (!rc)
                rc = nd_adamw_step(&opt, P, G, &gnorm, &lr_used);
            if (rc == ND_ENUMERIC) {
                char why[256];
                snprintf(why, sizeof why, "%s", nd_last_error());
                rc = nd_error(ND_ENUMERIC,
                              "step %ld/%ld: %s; training stopped, the last good adapter "
                              "(before this step) is written to %s",
                              step + 1, total, why, o->out);
                memcpy(P, last_good, sizeof(float) * NP);
                if (save_output(o, &m, base_tree, &lora, &opt, qat_scheme, 0) == ND_OK)
                    rc = ND_ENUMERIC;
                break;
            }
            if (rc)
                break;
            if ((!o->full || o->qat || tr->quant3) && (rc = nd_trainer_merge(tr)))
                break;
            last = loss;
            if (llog.f && nd_loss_log_step(&llog, step + 1, epoch + 1, lr_used, loss)) {
                /* the curve is a by-product: losing it must not stop a long run */
                emitf(o, "  %-9s %s; the loss log stops here", "warning", nd_last_error());
                nd_loss_log_close(&llog);
            }
            for (int b = 0; b < rows; b++)
                tokens_done += ts.len[train[s0 + (size_t)b]];
            double el = nd_wtime() - t_start, done_steps = (double)(step + 1 - start_step);
            if (o->status)
                o->status(o->ctx, step + 1, total, loss, tokens_done / (el > 0 ? el : 1e-9),
                          el / done_steps * (double)(total - step - 1));
            if ((step + 1) % every == 0)
                emitf(o, "  %-9s %ld/%ld  loss %.4f", "step", step + 1, total, loss);
            if (o->save_every && (step + 1) % o->save_every == 0 && step + 1 < total) {
                /* a failed periodic save costs only its crash safety: go on */
                if (save_output(o, &m, base_tree, &lora, &opt, qat_scheme, 0))
                    emitf(o, "  %-9s periodic save at step %ld failed (%s); training continues",
                          "warning", step + 1, nd_last_error());
            }
        }
        if (rc)
            break;
        if (step <= start_step && step > epoch_first) {
            /* every step of this epoch was done before the resume */
            emitf(o, "  %-9s %d/%d  done before the resume", "epoch", epoch + 1, o->epochs);
            continue;
        }
        if (n_val) {
            double vsum = 0;
            int nb = 0;
            for (size_t v0 = 0; v0 < n_val && !rc; v0 += (size_t)B, nb++) {
                int rows = n_val - v0 < (size_t)B ? (int)(n_val - v0) : B;
                double vl;
                rc = nd_batcher_step(&bt, val + v0, rows, 0, &vl, NULL);
                vsum += vl;
            }
            if (!rc)
                emitf(o, "  %-9s %d/%d  loss %.4f  val %.4f", "epoch", epoch + 1, o->epochs, last,
                      vsum / nb);
            if (!rc && llog.f && nd_loss_log_val(&llog, step, epoch + 1, vsum / nb)) {
                emitf(o, "  %-9s %s; the loss log stops here", "warning", nd_last_error());
                nd_loss_log_close(&llog);
            }
        } else {
            emitf(o, "  %-9s %d/%d  loss %.4f", "epoch", epoch + 1, o->epochs, last);
        }
    }
    if (rc == ND_EIO && o->stop && *o->stop) {
        /* Ctrl-C: keep what we have */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nd_last_error());
        if (save_output(o, &m, base_tree, &lora, &opt, qat_scheme, 0) == ND_OK)
            rc = nd_error(ND_EIO, "%s; %s so far written to %s (continue with --resume %s)", msg,
                          o->full ? "checkpoint" : "adapter", o->out, o->out);
    }
    if (!rc && tr && tr->qat && tr->qat->calls > 1) {
        double per = tr->qat->seconds / (double)tr->qat->calls, el = nd_wtime() - t_start;
        long steps = step - start_step;
        emitf(o, "  %-9s %.1f ms a step requantising (%.1f%% of the %.0f ms steps)", "qat",
              per * 1e3, el > 0 && steps > 0 ? 100.0 * per * (double)steps / el : 0.0,
              steps > 0 ? el / (double)steps * 1e3 : 0.0);
    }
    if (!rc) {
        rc = save_output(o, &m, base_tree, &lora, &opt, qat_scheme, 1);
        if (!rc && o->full) {
            emitf(o, "  %-9s %s", "checkpoint", o->out);
            emitf(o, "  %-9s needle finetune DATA.jsonl --checkpoint %s", "next", o->out);
        } else if (!rc) {
            emitf(o, "  %-9s %s", "adapter", o->out);
            char bits[32] = "";
            if (o->qat && o->bits) /* build at the width training saw */
                snprintf(bits, sizeof bits, " --bits %d", o->bits);
            emitf(o, "  %-9s needle build %s --lora %s%s", "next", o->checkpoint, o->out, bits);
        }
    }
done:
    nd_loss_log_close(&llog);
    free(order);
    free(tmp);
    free(tmp2);
    free(set_of);
    free(last_good);
    pv_decref(resume_root);
    pv_decref(base_tree);
    nd_adamw_free(&opt);
    nd_batcher_free(&bt);
    san_lora_free(&lora);
    nd_token_set_free(&ts);
    nd_dataset_free(&ds);
    nd_tokenizer_free(tok);
    san_model_free(&m);
    return rc;
}
