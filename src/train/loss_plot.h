/* The loss curve of a --loss-log file as an SVG picture, drawn by our own
 * code (needle plot-loss): the train loss of every step (thin), its
 * exponential moving average (thick), validation losses (dots), axes with
 * ticks and labels, a title. */
#ifndef ND_LOSS_PLOT_H
#define ND_LOSS_PLOT_H

typedef struct {
    long *step;
    double *lr, *loss; /* one per logged step */
    int *epoch;
    long n;
    long *val_step;
    double *val_loss;
    long n_val;
} nd_loss_curve;

/* Read a --loss-log JSONL file; errors name the file and line. */
int nd_loss_curve_load(const char *path, nd_loss_curve *c);
void nd_loss_curve_free(nd_loss_curve *c);

/* Write the SVG atomically. smooth in [0, 1): the EMA weight of the past
 * (0 = no smoothing), debiased at the start as TensorBoard does. */
int nd_loss_plot_svg(const nd_loss_curve *c, const char *title, double smooth, const char *out);

#endif
