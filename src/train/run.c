/* The training run object (train/run.h): the steps of `needle finetune`
 * one function each, shared with `needle bench finetune`. */
#define _XOPEN_SOURCE 700
#include "train/run.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "io/checkpoint.h"

void nd_run_emitf(const nd_finetune_opts *o, const char *fmt, ...)
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
        nd_run_emitf(
            o,
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
    nd_run_emitf(o, "  %-9s --resume-override: continuing despite: %s", "warning", diff);
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

/* The outputs must be writable before any long work starts. */
static int check_outputs(const nd_finetune_opts *o)
{
    struct stat dir_st;
    if (!o->out)
        return ND_OK; /* bench finetune: nothing is written */
    if (o->out_dir && stat(o->out_dir, &dir_st) != 0) {
        /* not there yet: created at the first save, if it can be */
        return nd_dir_creatable(o->out_dir, "checkpoint directory");
    }
    return nd_check_writable(o->out);
}

/* Base checkpoint (or, --full --resume, the stopped run's), tokenizer,
 * tokenised data. */
static int load_inputs(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    int rc;
    FILE *probe = fopen(o->checkpoint, "rb");
    if (!probe)
        return nd_error(ND_EIO,
                        "base checkpoint %s not found. Upstream publishes needle2 on Hugging "
                        "Face (Cactus-Compute/needle2, checkpoints/needle2.pkl); download it there "
                        "or pass --checkpoint PATH (e.g. one made by `needle init`)",
                        o->checkpoint);
    fclose(probe);
    char bl[512];
    nd_run_emitf(o, "  %-9s %s", "backend", nd_backend_line(r->be, bl, sizeof bl));
    if (r->dist && (rc = nd_dist_device_open(r->dist, r->be))) /* NCCL with CUDA */
        return rc;
    if (r->dist && nd_dist_device_impl(r->dist))
        nd_run_emitf(o,
                     "  distributed  mpi  %d ranks  %s; each computes its share of a batch, the "
                     "gradients summed on the GPUs by %s",
                     r->nranks, nd_dist_impl(r->dist), nd_dist_device_impl(r->dist));
    else if (r->dist)
        nd_run_emitf(o,
                     "  distributed  mpi  %d ranks  %s; each computes its share of a batch, the "
                     "gradients summed in rank order%s%s%s",
                     r->nranks, nd_dist_impl(r->dist), nd_dist_device_why(r->dist) ? " (" : "",
                     nd_dist_device_why(r->dist) ? nd_dist_device_why(r->dist) : "",
                     nd_dist_device_why(r->dist) ? ")" : "");
    /* --full --resume: the weights are the resumed checkpoint's, the base
     * (--checkpoint) only identifies the run in the settings check */
    const char *weights = o->full && o->resume ? o->resume : o->checkpoint;
    if ((rc = ckpt_load(weights, &r->m, o->full ? &r->base_tree : NULL)) ||
        (rc = san_model_to_backend(&r->m, r->be)))
        return rc;
    if (o->full && o->resume) {
        const pv *st = pv_dict_get(r->base_tree, "needle_c_state");
        if (!st || st->kind != PV_DICT)
            return nd_error(ND_EARG,
                            "%s has no needle_c_state (optimiser state and run settings): it is "
                            "a plain checkpoint (a finished run's, or upstream's), not a stopped "
                            "--full run; start a new run from it with --checkpoint %s",
                            o->resume, o->resume);
        r->resume_root = pv_incref(r->base_tree);
        if (!(r->base_tree = without_state(r->base_tree)))
            return nd_error(ND_ENOMEM, "out of memory");
    }
    if ((rc = nd_tokenizer_load(o->tokenizer, &r->tok)))
        return rc;
    /* the template follows the base model's generation */
    int generation = o->generation ? o->generation : r->m.cfg.generation;
    if ((rc = nd_render_check_vocab(r->tok, generation, r->m.dims.V, o->tokenizer)))
        return rc;
    nd_jsonl_opts jo = {.skip_bad = o->skip_bad, .generation = generation};
    if ((rc = nd_jsonl_load(o->data, &jo, &r->ds)))
        return rc;
    /* like upstream, only --max-len caps the length (max_seq_len sizes the
     * engine's buffers, not training) */
    if ((rc = nd_dataset_tokenize(&r->ds, r->tok, (size_t)o->max_len, &r->ts)))
        return rc;
    const nd_token_set *ts = &r->ts;
    if (ts->n == 0)
        return nd_error(ND_EFORMAT, "%s: no usable examples (empty file, or no line has a query)",
                        o->data);
    nd_run_emitf(o, "  %-9s %zu examples  seq_len %zu  cap %d", "data", ts->n, ts->max_len,
                 o->max_len);
    if (r->ds.no_query || r->ds.bad || ts->truncated)
        nd_run_emitf(
            o,
            "  %-9s %zu lines without query skipped, %zu invalid lines skipped, %zu examples "
            "truncated to %zu tokens",
            "note", r->ds.no_query, r->ds.bad, ts->truncated, ts->max_len);
    return ND_OK;
}

/* Held-out split after a seeded shuffle (upstream: n_val = min(int(N*s),
 * N-1)), and the schedule's length. */
static int split_data(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    const nd_token_set *ts = &r->ts;
    size_t N = ts->n, n_val = (size_t)floor((double)N * o->val_split);
    if (n_val > N - 1)
        n_val = N - 1;
    if (!(r->order = malloc(sizeof *r->order * N)))
        return nd_error(ND_ENOMEM, "out of memory");
    for (size_t i = 0; i < N; i++)
        r->order[i] = i;
    nd_rng rng;
    nd_rng_seed(&rng, o->seed ^ 0x5851F42D4C957F2Dull);
    if (n_val)
        nd_shuffle_indices(r->order, N, &rng);
    r->N = N;
    r->n_val = n_val;
    r->val = r->order;
    r->train = r->order + n_val;
    r->count = N - n_val;
    if (n_val)
        nd_run_emitf(o, "  %-9s %zu examples for validation", "holdout", n_val);
    if ((size_t)o->batch_size > r->count)
        return nd_error(ND_EARG,
                        "batch size %d is larger than the %zu training examples; use "
                        "--batch-size %zu or fewer",
                        o->batch_size, r->count, r->count);
    double targets = 0;
    for (size_t i = 0; i < r->count; i++)
        for (size_t t = 0; t < ts->max_len; t++)
            targets += ts->mask[r->train[i] * ts->max_len + t];
    if (targets == 0)
        return nd_error(ND_EARG,
                        "%s: no target tokens to train on: --max-len %d cuts every training "
                        "example before its answer (the longest example has %zu tokens); raise "
                        "--max-len",
                        o->data, o->max_len, ts->longest);
    r->B = o->batch_size;
    r->T = (int)ts->max_len;
    r->spe = (long)((r->count + (size_t)r->B - 1) / (size_t)r->B);
    r->total = (long)o->epochs * r->spe;
    return ND_OK;
}

/* The optimiser's moments and step from a resumed adapter/checkpoint. */
static int restore_moments(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    const pv *st = pv_dict_get(r->resume_root, "needle_c_state");
    const pv *mu = st ? pv_dict_get(st, "mu") : NULL, *nu = st ? pv_dict_get(st, "nu") : NULL;
    const pv *cnt = st ? pv_dict_get(st, "count") : NULL;
    if (mu && nu && cnt && mu->kind == PV_NDARRAY && nu->kind == PV_NDARRAY &&
        mu->u.nd.dtype == ND_F32 && nu->u.nd.dtype == ND_F32 && pv_nd_numel(mu) == (int64_t)r->NP &&
        pv_nd_numel(nu) == (int64_t)r->NP && cnt->kind == PV_INT && cnt->u.i >= 0 &&
        cnt->u.i <= r->total) {
        memcpy(r->opt.mu, mu->u.nd.data, sizeof(float) * r->NP);
        memcpy(r->opt.nu, nu->u.nd.data, sizeof(float) * r->NP);
        r->opt.count = (long)cnt->u.i;
        nd_run_emitf(o, "  %-9s %s at step %ld/%ld (optimiser moments restored)", "resume",
                     o->resume, r->opt.count, r->total);
    } else if (o->full) {
        return nd_error(ND_EFORMAT,
                        "%s: needle_c_state does not match this model (moments of %zu "
                        "parameters and a step within %ld expected)",
                        o->resume, r->NP, r->total);
    } else {
        nd_run_emitf(o, "  %-9s %s (no optimiser state: moments start at zero, step 0)", "resume",
                     o->resume);
    }
    return ND_OK;
}

/* The trained parameters (a new or resumed adapter, or the whole model)
 * and the optimiser. */
static int open_params(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    san_lora *lora = &r->lora;
    int rc;
    if (o->full) {
        /* every base parameter trains; the output is a checkpoint */
        if (r->resume_root && (rc = check_resume(o, &r->m, r->resume_root)))
            return rc;
    } else if (o->resume) {
        if ((rc = san_lora_load(lora, &r->m, o->resume, &r->resume_root)) ||
            (rc = check_resume(o, &r->m, r->resume_root)))
            return rc;
    } else {
        if ((rc = san_lora_create(lora, &r->m, o->rank, (float)o->alpha)))
            return rc;
        san_lora_init(lora, o->seed);
    }
    snprintf(lora->base, sizeof lora->base, "%s", o->checkpoint);
    if (!o->full && (rc = san_lora_to_backend(lora, r->be)))
        return rc;
    int groups = 0;
    for (int t = 0; t < LORA_NTARGETS; t++)
        groups += lora->t[t].present;
    if (o->full)
        nd_run_emitf(o, "  %-9s all %zu base parameters (full fine-tune)", "params", r->m.numel);
    else
        nd_run_emitf(o, "  %-9s rank %d  alpha %g  %d weight groups", "lora", lora->rank,
                     (double)lora->scale * lora->rank, groups);
    r->P = o->full ? r->m.mem : lora->mem;
    r->NP = o->full ? r->m.numel : lora->numel;
    if ((rc = nd_adamw_init(&r->opt, r->NP, (float)o->lr, r->total)))
        return rc;
    if (r->resume_root && (rc = restore_moments(r)))
        return rc;
    /* the moments are copied: drop the tree's (twice the parameters) */
    pv_decref(r->resume_root);
    r->resume_root = NULL;
    nd_run_emitf(o, "  %-9s %ld steps  warmup %ld  cosine decay  clip 1.0", "schedule", r->total,
                 r->opt.warmup_steps);
    return ND_OK;
}

/* ---- several ranks (dist/dist.h) ---- */

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    while (n--)
        h = (h ^ *b++) * 0x100000001b3ull;
    return h;
}

enum { CK_OK, CK_DATA, CK_SETTINGS, CK_BASE, CK_STATE, CK_N };

/* What every rank must agree on, hashed: the tokenised data, the settings,
 * the base weights, the trained parameters and optimiser state (a resume). */
static void run_hashes(const nd_run *r, int ok, uint64_t h[CK_N])
{
    const nd_finetune_opts *o = &r->o;
    const uint64_t seed = 1469598103934665603ull;
    memset(h, 0, sizeof(uint64_t) * CK_N);
    h[CK_OK] = (uint64_t)ok;
    if (!ok)
        return;
    const nd_token_set *ts = &r->ts;
    size_t cells = ts->n * ts->max_len;
    h[CK_DATA] = hash_bytes(seed, &ts->n, sizeof ts->n);
    h[CK_DATA] = hash_bytes(h[CK_DATA], ts->ids, sizeof *ts->ids * cells);
    h[CK_DATA] = hash_bytes(h[CK_DATA], ts->mask, sizeof *ts->mask * cells);
    h[CK_DATA] = hash_bytes(h[CK_DATA], ts->len, sizeof *ts->len * ts->n);
    char set[512];
    snprintf(set, sizeof set,
             "seed %llu batch %d epochs %d max_len %d rank %d alpha %.17g lr %.17g val %.17g "
             "batching %d group %d full %d qat %d bits %d no_qat %d generation %d skip_bad %d",
             (unsigned long long)o->seed, o->batch_size, o->epochs, o->max_len, o->rank, o->alpha,
             o->lr, o->val_split, o->batching, o->group_by_tools, o->full, o->qat, o->bits,
             o->no_qat, o->generation, o->skip_bad);
    h[CK_SETTINGS] = hash_bytes(seed, set, strlen(set));
    h[CK_BASE] = hash_bytes(seed, r->m.mem, sizeof(float) * r->m.numel);
    h[CK_STATE] = hash_bytes(seed, r->P, sizeof(float) * r->NP);
    h[CK_STATE] = hash_bytes(h[CK_STATE], r->opt.mu, sizeof(float) * r->NP);
    h[CK_STATE] = hash_bytes(h[CK_STATE], r->opt.nu, sizeof(float) * r->NP);
    h[CK_STATE] = hash_bytes(h[CK_STATE], &r->opt.count, sizeof r->opt.count);
}

/* At the start every rank checks it has what rank 0 has; a rank that could
 * not open its run says so here too (the others would wait for it). */
static int dist_check(nd_run *r, int rc)
{
    const nd_finetune_opts *o = &r->o;
    int n = r->nranks;
    uint64_t mine[CK_N], *all = calloc((size_t)n * CK_N, sizeof *all);
    if (!all) {
        nd_error(ND_ENOMEM, "out of memory");
        nd_dist_abort(r->dist, 1);
        return ND_ENOMEM;
    }
    run_hashes(r, rc == ND_OK, mine);
    char local[512];
    snprintf(local, sizeof local, "%s", rc ? nd_last_error() : "");
    int e = nd_dist_gather_u64(r->dist, mine, CK_N, all);
    if (e) {
        free(all);
        return e;
    }
    static const char *what[CK_N] = {
        "", "training data (the tokenised examples of %s)",
        ("settings (seed, batch size, epochs, --max-len, LoRA shape, lr, --val-split, batching, "
         "--full/--qat)"),
        "base checkpoint weights (%s)", "resumed parameters or optimiser state (%s)"};
    int bad = -1, field = 0;
    for (int k = 0; k < n && bad < 0; k++)
        for (int f = 0; f < CK_N && bad < 0; f++)
            if (!all[(size_t)k * CK_N] ? f == CK_OK : all[(size_t)k * CK_N + f] != all[f]) {
                bad = k;
                field = f;
            }
    free(all);
    if (rc) {
        /* this rank's own message; the others report it as failed */
        nd_dist_set_shared(r->dist, 2);
        nd_error(rc, "%s", local);
        return rc;
    }
    if (bad < 0)
        return ND_OK;
    nd_dist_set_shared(r->dist, 1);
    if (field == CK_OK)
        return nd_error(ND_EIO, "rank %d of %d could not start its run (its own message says why)",
                        bad, n);
    char w[600];
    snprintf(w, sizeof w, what[field],
             field == CK_DATA   ? o->data
             : field == CK_BASE ? o->checkpoint
                                : (o->resume ? o->resume : "a new adapter"));
    return nd_error(ND_EARG,
                    "rank %d of %d: its %s differ from rank 0's: every rank must run with the "
                    "same files (copied to each machine; compare their sha256sum) and the same "
                    "options",
                    bad, n, w);
}

/* This rank's share of the batch idx[0..rows): a run of the examples in
 * the order finetune's batching plans them (prefix groups together), cut
 * so the ranks compute about the same rows, at a group's edge where one is
 * near (the group's shared prefix then runs once, on one rank), else inside
 * the group (each side runs the prefix once). Padded: a run of rows.
 * Returns the count. */
static int share_batch(nd_run *r, const size_t *idx, int rows)
{
    int n = r->nranks, me = r->rank, cnt = 0;
    const nd_token_set *ts = &r->ts;
    if (r->o.batching == ND_BATCH_PADDED) {
        int a = rows * me / n, b = rows * (me + 1) / n;
        for (int i = a; i < b; i++)
            r->mine[cnt++] = idx[i];
        return cnt;
    }
    for (int b = 0; b < rows; b++)
        r->share_ex[b] = (nd_seq_example){ts->ids + idx[b] * ts->max_len,
                                          ts->mask + idx[b] * ts->max_len, ts->len[idx[b]]};
    nd_pack_plan *p = &r->share_plan;
    nd_pack_plan_make(p, r->share_ex, rows, r->o.batching == ND_BATCH_SHARED);
    /* cum[i]: the rows of the first i examples in plan order, each group's
     * prefix spread over its members */
    double *cum = r->share_cum;
    cum[0] = 0;
    for (int g = 0; g < p->n_groups; g++) {
        int m = p->gstart[g + 1] - p->gstart[g];
        for (int i = p->gstart[g]; i < p->gstart[g + 1]; i++)
            cum[i + 1] = cum[i] + (double)(r->share_ex[p->order[i]].len - p->gplen[g]) +
                         (double)p->gplen[g] / m;
    }
    double total = cum[rows], near = total / (4.0 * n);
    int cut[2];
    for (int e = 0; e < 2; e++) {
        int k = me + e;
        if (k == 0 || k == n) {
            cut[e] = k == 0 ? 0 : rows;
            continue;
        }
        double target = total * k / n;
        int best = 0, best_g = -1;
        for (int i = 0; i <= rows; i++)
            if (fabs(cum[i] - target) < fabs(cum[best] - target))
                best = i;
        for (int g = 0; g <= p->n_groups; g++) {
            int i = p->gstart[g];
            if (fabs(cum[i] - target) <= near &&
                (best_g < 0 || fabs(cum[i] - target) < fabs(cum[best_g] - target)))
                best_g = i;
        }
        cut[e] = best_g >= 0 ? best_g : best;
    }
    for (int i = cut[0]; i < cut[1]; i++)
        r->mine[cnt++] = idx[p->order[i]];
    return cnt;
}

/* The loss weight of the whole batch (what one process divides by). */
static double batch_denom(const nd_run *r, const size_t *idx, int rows)
{
    const nd_token_set *ts = &r->ts;
    double total = 0;
    for (int b = 0; b < rows; b++) {
        const float *mask = ts->mask + idx[b] * ts->max_len;
        for (int t = 0; t + 1 < ts->len[idx[b]]; t++)
            total += mask[t + 1];
    }
    return total > 1.0 ? total : 1.0;
}

/* One step's gradients on several ranks: this rank's share, then one sum
 * over the flat buffer (gradients, loss, stop, failure). ND_EINTERRUPT when
 * any rank was asked to stop (every rank stops at the same step). */
static int dist_grads(nd_run *r, const size_t *idx, int rows, double *loss, double *masked)
{
    const nd_finetune_opts *o = &r->o;
    nd_trainer *tr = &r->bt.tr;
    size_t NP = r->NP;
    int cnt = share_batch(r, idx, rows), rc = ND_OK;
    double part = 0, m = 0, denom = batch_denom(r, idx, rows);
    tr->denom = denom;
    if (cnt > 0)
        rc = nd_batcher_step(&r->bt, r->mine, cnt, 1, &part, &m);
    else
        nd_backend_zero(r->be, r->G, sizeof(float) * NP);
    tr->denom = 0;
    if (rc && rc != ND_ENUMERIC)
        return rc; /* rank-local: the caller ends the job */
    /* with NCCL the gradients are summed where they are (GPU memory), the
     * three scalars by MPI; else all in one host buffer */
    size_t host_n = nd_dist_device_impl(r->dist) ? 0 : NP;
    if (host_n)
        nd_backend_download(r->be, r->red, r->G, sizeof(float) * NP);
    r->red[host_n] = (float)part;
    r->red[host_n + 1] = o->stop && *o->stop ? 1.0f : 0.0f;
    r->red[host_n + 2] = rc == ND_ENUMERIC ? 1.0f : 0.0f;
    /* NCCL reads G on a stream of its own: the ops that wrote (or zeroed) it end first */
    if (!host_n)
        nd_backend_sync(r->be);
    double t0 = nd_wtime();
    if ((!host_n && (rc = nd_dist_sum_device(r->dist, r->G, NP))) ||
        (rc = nd_dist_sum(r->dist, r->red, host_n + 3)))
        return rc;
    r->comm_s += nd_wtime() - t0;
    if (host_n) {
        memcpy(r->Gh, r->red, sizeof(float) * NP);
    } else {
        nd_backend_download(r->be, r->Gh, r->G, sizeof(float) * NP);
        memmove(r->red + NP, r->red, sizeof(float) * 3);
    }
    *loss = r->red[NP];
    *masked = denom;
    if (r->red[NP + 1] > 0) {
        nd_dist_set_shared(r->dist, 1);
        return nd_error(ND_EINTERRUPT, "interrupted at step %ld/%ld", r->step, r->total);
    }
    if (r->red[NP + 2] > 0 || !isfinite(*loss))
        return nd_error(ND_ENUMERIC, "loss is not finite (%g)", *loss);
    return ND_OK;
}

static int dist_plan(nd_run *r)
{
    r->mine = malloc(sizeof *r->mine * (size_t)r->B);
    r->red = malloc(sizeof *r->red * (r->NP + 3));
    r->share_ex = malloc(sizeof *r->share_ex * (size_t)r->B);
    r->share_cum = malloc(sizeof *r->share_cum * ((size_t)r->B + 1));
    if (!r->mine || !r->red || !r->share_ex || !r->share_cum ||
        nd_pack_plan_init(&r->share_plan, r->B))
        return nd_error(ND_ENOMEM, "out of memory");
    return ND_OK;
}

int nd_run_open(nd_run **out, const nd_finetune_opts *o)
{
    *out = NULL;
    if (o->epochs < 1 || o->batch_size < 1 || o->rank < 1 || o->max_len < 2 || !(o->lr > 0) ||
        !(o->alpha > 0) || !(o->val_split >= 0 && o->val_split < 1))
        return nd_error(ND_EARG, "epochs, batch size, rank and lr must be positive, max_len >= "
                                 "2 and 0 <= val_split < 1");
    nd_run *r = calloc(1, sizeof *r);
    if (!r)
        return nd_error(ND_ENOMEM, "out of memory");
    r->o = *o;
    r->be = o->be;
    r->dist = o->dist;
    r->rank = nd_dist_rank(o->dist);
    r->nranks = nd_dist_size(o->dist);
    if (r->rank != 0) {
        /* rank 0 alone prints, logs and writes */
        r->o.out = r->o.out_dir = r->o.loss_log = NULL;
        r->o.emit = NULL;
        r->o.status = NULL;
    }
    int rc = check_outputs(&r->o);
    if (!rc)
        rc = load_inputs(r);
    if (!rc)
        rc = split_data(r);
    if (!rc)
        rc = open_params(r);
    if (r->dist)
        rc = dist_check(r, rc);
    if (rc) {
        nd_run_close(r);
        return rc;
    }
    *out = r;
    return ND_OK;
}

/* Needle 3's deployed numerics (default) or, on Needle 2, --qat. */
static int set_numerics(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    nd_trainer *tr = &r->bt.tr;
    int rc;
    if (r->m.cfg.generation == 3) {
        /* 3.x fine-tunes through its deployed numerics; --no-qat: float */
        if (o->qat && o->no_qat)
            return nd_error(ND_EARG, "--qat and --no-qat together");
        if (o->bits)
            return nd_error(ND_EARG, "--bits: a Needle 3 base trains at 3.x's fixed 4-bit CQ "
                                     "weights (give no --bits)");
        if (o->no_qat) {
            nd_run_emitf(o, "  %-9s float (--no-qat)", "qat");
            return ND_OK;
        }
        double tq = nd_wtime();
        if ((rc = nd_trainer_set_quant3(tr)))
            return rc;
        nd_run_emitf(o,
                     "  %-9s Needle 3 numerics: CQ 4-bit weights, A%d activations, KV %d, straight-"
                     "through gradients (%.0f ms; --no-qat for float)",
                     "qat", tr->fq3.act_bits, tr->fq3.kv_bits, (nd_wtime() - tq) * 1e3);
    } else if (o->qat) {
        double tq = nd_wtime();
        if ((rc = nd_trainer_set_qat(tr, o->bits)))
            return rc;
        snprintf(r->qat_scheme, sizeof r->qat_scheme, "%s", tr->qat->scheme);
        nd_run_emitf(o,
                     "  %-9s training through build's %s quantise-dequantise (%d tensors quantised "
                     "in %.0f ms)",
                     "qat", r->qat_scheme, tr->qat->n, (nd_wtime() - tq) * 1e3);
    }
    return ND_OK;
}

/* Replay every epoch's batches (the orders are seeded) to size the buffers
 * for the largest batch, and say what the batching saves on the first
 * epoch. */
static int size_batches(nd_run *r, long *max_rows, long *max_items, long *max_group)
{
    const nd_finetune_opts *o = &r->o;
    const nd_token_set *ts = &r->ts;
    size_t count = r->count;
    r->epoch_rows = 0;
    r->real_tokens = 0;
    r->padded_rows = (double)r->spe * r->B * r->T;
    memcpy(r->tmp, r->train, sizeof *r->tmp * count);
    for (int e = 0; e < o->epochs; e++) {
        nd_epoch_order(r->tmp, count, r->B, o->seed, e, r->set_of, r->tmp2);
        if (nd_batch_caps(ts, o->batching, r->tmp, count, r->B, max_rows, max_items, max_group,
                          e == 0 ? &r->epoch_rows : NULL))
            return nd_error(ND_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < count; i++)
        r->real_tokens += ts->len[r->train[i]];
    if (r->n_val && nd_batch_caps(ts, o->batching, r->val, r->n_val, r->B, max_rows, max_items,
                                  max_group, NULL))
        return nd_error(ND_ENOMEM, "out of memory");
    nd_run_emitf(o,
                 "  %-9s %s: %.0fk real tokens an epoch (%.0fk padded), %.0fk computed (%.1fx less "
                 "than padded)%s",
                 "batching", nd_batching_name(o->batching), r->real_tokens / 1e3,
                 r->padded_rows / 1e3, r->epoch_rows / 1e3,
                 r->padded_rows / (r->epoch_rows > 0 ? r->epoch_rows : 1),
                 r->set_of ? "; batches grouped by tool set (--group-by-tools)" : "");
    return ND_OK;
}

/* The most examples one nd_batcher_step gets: a batch; with several ranks
 * and padded batches a rank's share (share_batch), so its activations and
 * their plan are sized for the rows it computes. */
static int batcher_rows(const nd_run *r)
{
    if (r->nranks > 1 && r->o.batching == ND_BATCH_PADDED)
        return (r->B + r->nranks - 1) / r->nranks;
    return r->B;
}

int nd_run_plan(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    int rc;
    size_t count = r->count;
    r->last_good = malloc(sizeof *r->last_good * (r->NP ? r->NP : 1));
    r->tmp = malloc(sizeof *r->tmp * (count ? count : 1));
    r->tmp2 = malloc(sizeof *r->tmp2 * (count ? count : 1));
    if (o->group_by_tools)
        r->set_of = nd_tool_set_ids(&r->ds, r->N);
    if (!r->last_good || !r->tmp || !r->tmp2 || (o->group_by_tools && !r->set_of))
        return nd_error(ND_ENOMEM, "out of memory");
    /* a loss that is not finite at the first step restores this */
    memcpy(r->last_good, r->P, sizeof(float) * r->NP);
    long max_rows = 0, max_items = 0, max_group = 0;
    if ((rc = size_batches(r, &max_rows, &max_items, &max_group)) ||
        (rc = nd_batcher_create(&r->bt, &r->m, r->be, o->full ? NULL : &r->lora, &r->ts,
                                batcher_rows(r), o->batching, o->full, max_rows, max_items,
                                max_group, o->act_budget_mb)))
        return rc;
    nd_trainer *tr = &r->bt.tr;
    r->G = o->full ? tr->full_g : tr->lora_g;
    r->Gh = r->be->host_mem ? r->G : malloc(sizeof *r->Gh * (r->NP ? r->NP : 1));
    if (!r->Gh)
        return nd_error(ND_ENOMEM, "out of memory for the gradients");
    if (r->dist && (rc = dist_plan(r)))
        return rc;
    if ((rc = set_numerics(r)))
        return rc;
    nd_run_emitf(
        o,
        "  %-9s %d of %d layers' activations kept, the rest recomputed in the backward (%.0f "
        "MB of activations for up to %ld rows at a time; --act-memory)",
        "memory", tr->kept_layers, r->m.dims.L, (double)tr->acts.bytes / 1048576.0,
        tr->acts.cap_rows);
    r->every = r->total / 50 > 1 ? r->total / 50 : 1;
    r->start_step = r->opt.count;
    if (o->loss_log && (rc = nd_loss_log_open(&r->llog, o->loss_log, r->start_step)))
        return rc;
    r->t_start = nd_wtime();
    return ND_OK;
}

/* Move to the next step to run: a new epoch's order, steps a resumed run
 * already did skipped. 0, or ND_RUN_DONE. */
static int next_step(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    for (;;) {
        if (r->epoch >= o->epochs)
            return ND_RUN_DONE;
        if (!r->epoch_open) {
            /* per-epoch order derived from (seed, epoch) so a resume replays it */
            nd_epoch_order(r->train, r->count, r->B, o->seed, r->epoch, r->set_of, r->tmp);
            r->epoch_open = 1;
            r->s0 = 0;
            r->epoch_first = r->step;
            r->last_loss = 0;
        }
        if (r->s0 >= r->count) {
            r->epoch++;
            r->epoch_open = 0;
            continue;
        }
        if (r->step >= r->start_step)
            return ND_OK;
        /* resumed: these updates are already in the adapter */
        r->s0 += (size_t)r->B;
        r->step++;
        if (r->s0 >= r->count)
            nd_run_emitf(o, "  %-9s %d/%d  done before the resume", "epoch", r->epoch + 1,
                         o->epochs);
    }
}

/* After AdamW changed the host's parameters (r->P): the copy the ops read
 * follows (nothing to do where the host reaches the backend's memory). */
static void params_upload(nd_run *r)
{
    if (r->o.full)
        san_model_upload(&r->m);
    else
        san_lora_upload(&r->lora);
}

/* A loss or update that is not finite: the last good parameters (before
 * this step) are written and the run stops. */
static int numeric_stop(nd_run *r)
{
    char why[256];
    snprintf(why, sizeof why, "%s", nd_last_error());
    int rc = nd_error(ND_ENUMERIC,
                      "step %ld/%ld: %s; training stopped, the last good adapter (before this "
                      "step) is written to %s",
                      r->step + 1, r->total, why, r->o.out ? r->o.out : "(nowhere: no output)");
    memcpy(r->P, r->last_good, sizeof(float) * r->NP);
    params_upload(r);
    nd_dist_set_shared(r->dist, 1); /* the summed loss: every rank stops here */
    if (nd_run_save(r, 0) == ND_OK)
        rc = ND_ENUMERIC;
    return rc;
}

/* After a step: the loss log, the status, the step line, a periodic save. */
static void report_step(nd_run *r, int rows, double loss, double lr_used)
{
    const nd_finetune_opts *o = &r->o;
    long done = r->step + 1;
    if (r->llog.f && nd_loss_log_step(&r->llog, done, r->epoch + 1, lr_used, loss)) {
        /* the curve is a by-product: losing it must not stop a long run */
        nd_run_emitf(o, "  %-9s %s; the loss log stops here", "warning", nd_last_error());
        nd_loss_log_close(&r->llog);
    }
    for (int b = 0; b < rows; b++)
        r->tokens_done += r->ts.len[r->train[r->s0 + (size_t)b]];
    double el = nd_wtime() - r->t_start, done_steps = (double)(done - r->start_step);
    if (o->status)
        o->status(o->ctx, done, r->total, loss, r->tokens_done / (el > 0 ? el : 1e-9),
                  el / done_steps * (double)(r->total - done));
    if (done % r->every == 0)
        nd_run_emitf(o, "  %-9s %ld/%ld  loss %.4f", "step", done, r->total, loss);
    if (o->save_every && done % o->save_every == 0 && done < r->total) {
        /* a failed periodic save costs only its crash safety: go on */
        if (nd_run_save(r, 0))
            nd_run_emitf(o, "  %-9s periodic save at step %ld failed (%s); training continues",
                         "warning", done, nd_last_error());
    }
}

int nd_run_step(nd_run *r, nd_run_step_info *si)
{
    const nd_finetune_opts *o = &r->o;
    memset(si, 0, sizeof *si);
    int rc = next_step(r);
    if (rc)
        return rc;
    if (o->stop && !*o->stop && o->stop_after && r->step >= o->stop_after)
        *o->stop = -1; /* --stop-after: a deterministic Ctrl-C */
    /* several ranks: a signal stops every rank at one step (dist_grads) */
    if (o->stop && *o->stop && (!r->dist || *o->stop == -1)) {
        nd_dist_set_shared(r->dist, 1); /* --stop-after: the same step everywhere */
        return nd_error(ND_EINTERRUPT, "interrupted at step %ld/%ld", r->step, r->total);
    }
    int rows = r->count - r->s0 < (size_t)r->B ? (int)(r->count - r->s0) : r->B;
    double loss = 0, masked = 0, gnorm = 0, lr_used = 0;
    /* kept before the step: a non-finite loss on the very first step must
     * restore these, not uninitialised memory */
    memcpy(r->last_good, r->P, sizeof(float) * r->NP);
    if (r->dist)
        rc = dist_grads(r, r->train + r->s0, rows, &loss, &masked);
    else if (!(rc = nd_batcher_step(&r->bt, r->train + r->s0, rows, 1, &loss, &masked)))
        nd_backend_download(r->be, r->Gh, r->G, sizeof(float) * r->NP);
    if (!rc)
        rc = nd_adamw_step(&r->opt, r->P, r->Gh, &gnorm, &lr_used);
    if (!rc)
        params_upload(r);
    if (rc == ND_ENUMERIC)
        return numeric_stop(r);
    nd_trainer *tr = &r->bt.tr;
    if (!rc && (!o->full || o->qat || tr->quant3))
        rc = nd_trainer_merge(tr);
    if (rc)
        return rc;
    r->last_loss = loss;
    report_step(r, rows, loss, lr_used);
    *si = (nd_run_step_info){.step = r->step + 1,
                             .total = r->total,
                             .epoch = r->epoch,
                             .rows = rows,
                             .loss = loss,
                             .masked = masked,
                             .gnorm = gnorm,
                             .lr = lr_used};
    r->s0 += (size_t)r->B;
    r->step++;
    si->epoch_end = r->s0 >= r->count;
    return ND_OK;
}

int nd_run_validate(nd_run *r, double *val_loss)
{
    double vsum = 0;
    int nb = 0, rc = ND_OK;
    *val_loss = 0;
    for (size_t v0 = 0; v0 < r->n_val && !rc; v0 += (size_t)r->B, nb++) {
        int rows = r->n_val - v0 < (size_t)r->B ? (int)(r->n_val - v0) : r->B;
        /* a batch's loss, in pieces of what the batcher holds (a rank's
         * share: batcher_rows) over the whole batch's weight */
        nd_trainer *tr = &r->bt.tr;
        tr->denom = batch_denom(r, r->val + v0, rows);
        for (int b0 = 0; b0 < rows && !rc; b0 += r->bt.B) {
            int n = rows - b0 < r->bt.B ? rows - b0 : r->bt.B;
            double vl = 0;
            rc = nd_batcher_step(&r->bt, r->val + v0 + b0, n, 0, &vl, NULL);
            vsum += vl;
        }
        tr->denom = 0;
    }
    if (!rc && nb)
        *val_loss = vsum / nb;
    return rc;
}

int nd_run_save(nd_run *r, int final)
{
    if (!r->o.out)
        return ND_OK;
    return save_output(&r->o, &r->m, r->base_tree, &r->lora, &r->opt, r->qat_scheme, final);
}

void nd_run_close(nd_run *r)
{
    if (!r)
        return;
    nd_loss_log_close(&r->llog);
    free(r->order);
    free(r->tmp);
    free(r->tmp2);
    free(r->set_of);
    free(r->last_good);
    if (r->Gh != r->G)
        free(r->Gh);
    free(r->mine);
    free(r->red);
    free(r->share_ex);
    free(r->share_cum);
    nd_pack_plan_free(&r->share_plan);
    pv_decref(r->resume_root);
    pv_decref(r->base_tree);
    nd_adamw_free(&r->opt);
    nd_batcher_free(&r->bt);
    san_lora_free(&r->lora);
    nd_token_set_free(&r->ts);
    nd_dataset_free(&r->ds);
    nd_tokenizer_free(r->tok);
    san_model_free(&r->m);
    free(r);
}
