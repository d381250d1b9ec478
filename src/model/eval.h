/* Next-token loss of a model over variable-length token sequences. */
#ifndef ND_EVAL_H
#define ND_EVAL_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/token_file.h"
#include "model/fake_quant.h"
#include "model/params.h"

typedef struct {
    double *loss_sum; /* per sequence: summed CE over predicted positions */
    int *positions;   /* per sequence: predicted positions (len - 1) */
    double total_loss;
    long total_positions;
    double seconds; /* wall time of the forward passes */
    long tokens;    /* tokens pushed through the model (padding included) */
} san_eval_result;

/* Called with each sequence's logits [len, V] in order (may be NULL). */
typedef int (*san_logits_sink)(void *ctx, int seq, const float *logits, int len, int V);

/* Sequences are grouped `batch` at a time and right-padded with the pad id
 * (exact: attention is causal and engrams only look back). */
int san_eval(const san_model *m, const nd_backend *be, const token_seqs *seqs, int batch,
             san_logits_sink sink, void *sink_ctx, san_eval_result *res);
/* The same with weights w (m's layout) and, for a Needle 3 model, 3.x's
 * quant=True activation numerics when quant is non-NULL (the caller puts
 * the weights through nd_fq3_model_weights for the full 3.x forward). */
int san_eval_quant(const san_model *m, const san_weights *w, const nd_fq3_numerics *quant,
                   const nd_backend *be, const token_seqs *seqs, int batch, san_logits_sink sink,
                   void *sink_ctx, san_eval_result *res);
void san_eval_result_free(san_eval_result *r);

#endif
