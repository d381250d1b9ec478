/* The loss curve of a training run as JSON lines (needle finetune
 * --loss-log): one {"step", "epoch", "lr", "loss"} line per optimiser step
 * and one {"step", "epoch", "val_loss"} line per validation, flushed as
 * they are written so that a killed run keeps its curve. */
#ifndef ND_LOSS_LOG_H
#define ND_LOSS_LOG_H

#include <stdio.h>

typedef struct {
    FILE *f;
    const char *path;
} nd_loss_log;

/* Open `path` for a run whose first new step is `resume_step` + 1: a fresh
 * run (resume_step 0) starts an empty file; a resumed one keeps the lines
 * of steps <= resume_step (a run killed after its last save logged steps
 * the resume repeats) and appends after them. The kept part is rewritten
 * through a temporary file and rename. */
int nd_loss_log_open(nd_loss_log *l, const char *path, long resume_step);
int nd_loss_log_step(nd_loss_log *l, long step, int epoch, double lr, double loss);
int nd_loss_log_val(nd_loss_log *l, long step, int epoch, double val_loss);
int nd_loss_log_close(nd_loss_log *l);

#endif
