/* optax.chain(clip_by_global_norm(max_norm), adamw(schedule)) over one flat
 * parameter buffer, with upstream's warmup + cosine schedule (docs/model.md §4.3). */
#ifndef ND_OPTIM_H
#define ND_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float b1, b2, eps, weight_decay, max_norm;
    float peak_lr;
    long total_steps, warmup_steps;
    long count; /* updates applied so far (the schedule's 0-based step) */
    size_t n;
    float *mu, *nu;
} nd_adamw;

/* warmup = min(max(1, S // 20), S - 1), as upstream */
long nd_warmup_steps(long total_steps);
/* optax.warmup_cosine_decay_schedule(0, peak, warmup, total, end 0) at `step` */
double nd_lr_schedule(double peak, long warmup, long total, long step);

int nd_adamw_init(nd_adamw *o, size_t n, float peak_lr, long total_steps);
void nd_adamw_free(nd_adamw *o);
/* L2 norm of g (double accumulation). */
double nd_global_norm(const float *g, size_t n);
/* Clip g (in place) to max_norm, then one AdamW update of p. Returns the
 * pre-clip global norm through *gnorm. Refuses (ND_ENUMERIC) to touch p
 * when the gradient is not finite. */
int nd_adamw_step(nd_adamw *o, float *p, float *g, double *gnorm, double *lr_used);

#endif
