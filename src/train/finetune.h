/* needle finetune as a library call: LoRA training of a base checkpoint on
 * a JSONL dataset, upstream's defaults (docs/model.md §4.4) and progress
 * lines (docs/training.md). */
#ifndef ND_FINETUNE_H
#define ND_FINETUNE_H

#include <stdint.h>

#include "backend/backend.h"
#include "dist/dist.h"

typedef struct {
    const char *data;       /* JSONL */
    const char *checkpoint; /* base checkpoint */
    const char *tokenizer;  /* .model path (required) */
    const char *out;        /* adapter path */
    const char *out_dir;    /* created (one level) before the first save, or NULL */
    const char *resume;     /* adapter (or, with full, checkpoint) to continue from */
    int epochs, batch_size, rank, max_len;
    double lr, alpha, val_split;
    uint64_t seed;
    long save_every; /* steps; 0 = only at the end */
    int skip_bad;
    int full;             /* train every base parameter; out is a checkpoint */
    int batching;         /* nd_batching (train/batch.h); 0 = shared prefixes */
    int group_by_tools;   /* reorder so batches hold one tool set (changes batches) */
    double act_budget_mb; /* memory for kept activations (ND_ACT_BUDGET_MB) */
    int resume_override;  /* resume even when the adapter's recorded settings differ */
    int save_f16;         /* --full: write the final checkpoint's params as float16 */
    const char *loss_log; /* JSONL per step (and per validation), or NULL */
    int qat;              /* train through build's quantise-dequantise (train/qat.h) */
    int bits;             /* --qat width as build's --bits; 0 = config map, else 4 */
    int no_qat;           /* Needle 3 base: train in float instead of 3.x's deployed
                           * numerics (nd_trainer_set_quant3), which are the default */
    int generation;       /* chat template and tokenizer rules (text/render.h): 2 or 3; 0 = the
                           * base model's generation (its config, model/config.h) */
    const nd_backend *be;
    nd_dist *dist; /* one of several ranks (`mpirun -np N`, dist/dist.h), or NULL */
    /* progress: complete lines ("  step      3/30  loss 2.1234") and a live
     * status (called often; may be NULL) */
    void (*emit)(void *ctx, const char *line);
    void (*status)(void *ctx, long step, long total, double loss, double tokens_per_s,
                   double eta_s);
    void *ctx;
    volatile int *stop; /* set non-zero (e.g. on SIGINT) to stop and save */
    long stop_after;    /* stop (as *stop would) once this many steps are done, 0 = never;
                         * sets *stop to -1 when it does (stop must then be non-NULL) */
} nd_finetune_opts;

void nd_finetune_defaults(nd_finetune_opts *o);
int nd_finetune(const nd_finetune_opts *o);

#endif
