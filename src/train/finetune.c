/* needle finetune as a library call: a training run (train/run.h) from
 * open to the final save. */
#include "train/finetune.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "train/run.h"

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

/* The end of an epoch: the held-out loss, the epoch line. */
static int end_epoch(nd_run *r, const nd_run_step_info *si)
{
    const nd_finetune_opts *o = &r->o;
    if (!r->n_val || r->rank != 0) { /* several ranks: rank 0 alone validates */
        nd_run_emitf(o, "  %-9s %d/%d  loss %.4f", "epoch", si->epoch + 1, o->epochs, si->loss);
        return ND_OK;
    }
    double val;
    int rc = nd_run_validate(r, &val);
    if (rc)
        return rc;
    nd_run_emitf(o, "  %-9s %d/%d  loss %.4f  val %.4f", "epoch", si->epoch + 1, o->epochs,
                 si->loss, val);
    if (r->llog.f && nd_loss_log_val(&r->llog, si->step, si->epoch + 1, val)) {
        nd_run_emitf(o, "  %-9s %s; the loss log stops here", "warning", nd_last_error());
        nd_loss_log_close(&r->llog);
    }
    return ND_OK;
}

/* Ctrl-C (or --stop-after): keep what we have. */
static int save_interrupted(nd_run *r)
{
    if (!r->o.out)
        return ND_EINTERRUPT; /* a rank other than 0: rank 0 saves */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nd_last_error());
    if (nd_run_save(r, 0) == ND_OK)
        nd_error(ND_EINTERRUPT, "%s; %s so far written to %s (continue with --resume %s)", msg,
                 r->o.full ? "checkpoint" : "adapter", r->o.out, r->o.out);
    return ND_EINTERRUPT;
}

/* All steps done: the requantising cost, the output, the next command. */
static int finish(nd_run *r)
{
    const nd_finetune_opts *o = &r->o;
    const nd_trainer *tr = &r->bt.tr;
    if (tr->qat && tr->qat->calls > 1) {
        double per = tr->qat->seconds / (double)tr->qat->calls, el = nd_wtime() - r->t_start;
        long steps = r->step - r->start_step;
        nd_run_emitf(o, "  %-9s %.1f ms a step requantising (%.1f%% of the %.0f ms steps)", "qat",
                     per * 1e3, el > 0 && steps > 0 ? 100.0 * per * (double)steps / el : 0.0,
                     steps > 0 ? el / (double)steps * 1e3 : 0.0);
    }
    if (r->dist && r->step > r->start_step) {
        double el = nd_wtime() - r->t_start, steps = (double)(r->step - r->start_step);
        nd_run_emitf(o,
                     "  distributed  %.1f ms a step summing gradients over %d ranks (%.1f%% of the "
                     "%.1f ms steps)",
                     r->comm_s / steps * 1e3, r->nranks, el > 0 ? 100.0 * r->comm_s / el : 0.0,
                     el / steps * 1e3);
    }
    int rc = nd_run_save(r, 1);
    if (rc || !o->out)
        return rc;
    if (o->full) {
        nd_run_emitf(o, "  %-9s %s", "checkpoint", o->out);
        nd_run_emitf(o, "  %-9s needle finetune DATA.jsonl --checkpoint %s", "next", o->out);
    } else {
        nd_run_emitf(o, "  %-9s %s", "adapter", o->out);
        char bits[32] = "";
        if (o->qat && o->bits) /* build at the width training saw */
            snprintf(bits, sizeof bits, " --bits %d", o->bits);
        nd_run_emitf(o, "  %-9s needle build %s --lora %s%s", "next", o->checkpoint, o->out, bits);
    }
    return ND_OK;
}

int nd_finetune(const nd_finetune_opts *o)
{
    nd_run *r;
    int rc = nd_run_open(&r, o);
    if (rc)
        return rc;
    rc = nd_run_plan(r);
    nd_run_step_info si;
    while (!rc && (rc = nd_run_step(r, &si)) == ND_OK)
        if (si.epoch_end)
            rc = end_epoch(r, &si);
    if (rc == ND_RUN_DONE)
        rc = finish(r);
    else if (rc == ND_EINTERRUPT)
        rc = save_interrupted(r);
    nd_run_close(r);
    return rc;
}
