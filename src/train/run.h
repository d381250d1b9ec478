/* One training run: the object `needle finetune`, `needle bench finetune`
 * and (through a `needle finetune` child) the playground's fine-tune share.
 *
 *   nd_run_open      settings checked, outputs checked writable, base
 *                    checkpoint, tokenizer, data (tokenised, split), the
 *                    adapter (new or resumed) and the optimiser
 *   nd_run_plan      buffers sized for the largest batch, the training
 *                    numerics (Needle 3's, --qat), the loss log
 *   nd_run_step      the next optimiser step (1 when the run is done,
 *                    ND_EINTERRUPT when *o->stop asked to stop first)
 *   nd_run_validate  the held-out loss with the current weights
 *   nd_run_save      the adapter (or --full checkpoint), atomically
 *   nd_run_close     everything freed
 *
 * Progress lines go through o->emit, as in nd_finetune. With several
 * processes (src/dist, `mpirun -np N`), each rank computes its share of a
 * step's batch and the gradients are summed before the optimiser step;
 * only rank 0 emits, validates into the log and saves. The fields are
 * readable by callers (bench finetune reports them); only run.c writes. */
#ifndef ND_RUN_H
#define ND_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "io/pickle.h"
#include "io/jsonl.h"
#include "model/lora.h"
#include "text/render.h"
#include "text/tokenizer.h"
#include "train/batch.h"
#include "train/finetune.h"
#include "train/loss_log.h"
#include "train/optim.h"
#include "train/pack.h"

/* nd_run_step: no step left */
#define ND_RUN_DONE 1

typedef struct {
    long step, total; /* the step just done (1-based) and the run's steps */
    int epoch;        /* 0-based */
    int epoch_end;    /* the step ended its epoch */
    int rows;         /* examples in the step's batch (all ranks) */
    double loss, masked, gnorm, lr;
    double comm_s; /* seconds spent summing gradients across ranks */
} nd_run_step_info;

typedef struct {
    nd_finetune_opts o;
    const nd_backend *be;
    nd_dist *dist; /* one of several ranks, or NULL */
    int rank, nranks;
    san_model m;
    nd_tokenizer *tok;
    nd_dataset ds;
    nd_token_set ts;
    san_lora lora;
    nd_batcher bt;
    nd_adamw opt;
    pv *resume_root, *base_tree;
    nd_loss_log llog;
    char qat_scheme[300];
    size_t *order, *tmp, *tmp2;
    int32_t *set_of;
    float *last_good;
    size_t N, n_val, count; /* examples, held out, trained on */
    size_t *val, *train;    /* into order */
    int B, T;
    long spe, total;
    float *P, *G; /* trained parameters (host) and their gradients (backend memory) */
    /* the gradients where the host reads them (AdamW): G itself when the
     * host can reach the backend's memory (be->host_mem), else a copy */
    float *Gh;
    size_t NP;
    /* plan: what an epoch computes */
    double real_tokens, padded_rows, epoch_rows;
    /* progress */
    int epoch, epoch_open;
    size_t s0;
    long step, start_step, epoch_first, every;
    double last_loss, t_start, tokens_done, comm_s;
    /* several ranks: this rank's share of a batch, the sum buffer (the
     * gradients, then the loss, a stop and a numeric-failure flag) */
    size_t *mine;
    float *red;
    nd_pack_plan share_plan;
    nd_seq_example *share_ex;
    double *share_cum;
} nd_run;

int nd_run_open(nd_run **out, const nd_finetune_opts *o);
int nd_run_plan(nd_run *r);
int nd_run_step(nd_run *r, nd_run_step_info *si);
/* The held-out loss (mean of the batches' losses, as upstream); 0 batches
 * (no hold-out) leaves *val_loss 0 and returns ND_OK. */
int nd_run_validate(nd_run *r, double *val_loss);
/* final: the finished output (a safetensors adapter without moments, a
 * --full checkpoint without needle_c_state); else the resumable one.
 * Ranks other than 0 write nothing. */
int nd_run_save(nd_run *r, int final);
void nd_run_close(nd_run *r);

/* One progress line through o->emit (nothing without one). */
void nd_run_emitf(const nd_finetune_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
