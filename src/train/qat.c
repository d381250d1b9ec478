#include "train/qat.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "model/cq.h"

void nd_qat_scheme(const san_model *m, int bits, char *buf, size_t cap)
{
    if (!bits && m->cfg.weight_bits[0])
        snprintf(buf, cap, "mixed[%s]", m->cfg.weight_bits);
    else
        snprintf(buf, cap, "W%d", bits ? bits : 4);
}

int nd_qat_init(nd_qat *q, const san_model *m, int bits)
{
    memset(q, 0, sizeof *q);
    if (bits && !cq_bits_valid(bits))
        return nd_error(ND_EARG, "CQ width must be 2, 3, 4 or ternary (%d), not %d", CQ_TERNARY,
                        bits);
    /* build's rule (cmd_build.c): --bits, else the config's map, else 4 */
    cact_write_opts o = {0};
    o.bits = bits ? bits : 4;
    o.bits_map = (!bits && m->cfg.weight_bits[0]) ? m->cfg.weight_bits : NULL;
    o.group = CQ_GROUP;
    q->bits = bits;
    nd_qat_scheme(m, bits, q->scheme, sizeof q->scheme);
    return cact_model_tensors(m, &o, &q->t, &q->n);
}

void nd_qat_free(nd_qat *q)
{
    free(q->t);
    memset(q, 0, sizeof *q);
}

/* about this many floats per work block */
#define QAT_BLOCK 32768

typedef struct {
    int k;          /* index into sel / src / dst */
    int64_t r0, r1; /* rows of the [out, in] matrix (FP16: element range) */
} qat_block;

typedef struct {
    const nd_qat *q;
    const int *sel;
    const float *const *src;
    float *const *dst;
    qat_block *b;
    atomic_int fail;
} run_args;

/* element (row o, column i) of the [out, in] matrix in the model layout,
 * as the exporter transposes (cact.c emit_entry) */
static size_t model_index(const cact_model_tensor *t, int64_t o, int64_t i)
{
    if (t->src == CACT_SRC_DIRECT)
        return (size_t)(o * t->in + i);
    if (t->src == CACT_SRC_KERNEL) /* kernel [in, out] */
        return (size_t)(i * t->out + o);
    int64_t lanes = t->c, l = o / lanes, j = o % lanes; /* phi (L, nC, lanes) */
    return (size_t)((l * t->b + i) * lanes + j);
}

static int run_block(const run_args *a, const qat_block *b)
{
    const cact_model_tensor *t = &a->q->t[a->sel[b->k]];
    const float *src = a->src[b->k];
    float *dst = a->dst[b->k];
    if (t->src == CACT_SRC_FP16) {
        for (int64_t e = b->r0; e < b->r1; e++)
            dst[e] = nd_half_to_float(nd_float_to_half(src[e]));
        return ND_OK;
    }
    /* rows are quantised independently (own groups, own norms): a block of
     * rows is a matrix of its own with the same codes and values */
    int64_t rows = b->r1 - b->r0, in = t->in;
    size_t nb = cq_blob_bytes(rows, in, t->bits, t->group);
    float *w = malloc((size_t)(rows * in) * sizeof *w + 1);
    unsigned char *blob = malloc(nb + 1);
    int rc = !w || !blob ? ND_ENOMEM : ND_OK;
    if (!rc) {
        for (int64_t o = 0; o < rows; o++)
            for (int64_t i = 0; i < in; i++)
                w[o * in + i] = src[model_index(t, b->r0 + o, i)];
        rc = cq_quantize(w, rows, in, t->bits, t->group, blob);
    }
    if (!rc)
        rc = cq_dequantize(blob, nb, rows, in, t->bits, t->group, w);
    if (!rc)
        for (int64_t o = 0; o < rows; o++)
            for (int64_t i = 0; i < in; i++)
                dst[model_index(t, b->r0 + o, i)] = w[o * in + i];
    free(w);
    free(blob);
    return rc;
}

static void run_blocks(void *p, long lo, long hi, int tid)
{
    (void)tid;
    run_args *a = p;
    for (long i = lo; i < hi; i++)
        if (run_block(a, &a->b[i]))
            atomic_store(&a->fail, 1);
}

int nd_qat_run(const nd_qat *q, const int *sel, int count, const float *const *src,
               float *const *dst)
{
    long nb = 0;
    for (int pass = 0; pass < 2; pass++) {
        run_args a = {.q = q, .sel = sel, .src = src, .dst = dst};
        if (pass) {
            a.b = malloc(sizeof *a.b * (size_t)(nb ? nb : 1));
            if (!a.b)
                return nd_error(ND_ENOMEM, "out of memory for --qat");
        }
        long n = 0;
        for (int k = 0; k < count; k++) {
            const cact_model_tensor *t = &q->t[sel[k]];
            int fp16 = t->src == CACT_SRC_FP16;
            int64_t rows = fp16 ? (int64_t)t->numel : t->out;
            int64_t per = fp16 ? QAT_BLOCK : (t->in > 0 ? QAT_BLOCK / t->in : 1);
            per = per < 1 ? 1 : per;
            for (int64_t r = 0; r < rows; r += per, n++)
                if (pass)
                    a.b[n] = (qat_block){k, r, r + per < rows ? r + per : rows};
        }
        if (!pass) {
            nb = n;
            continue;
        }
        atomic_init(&a.fail, 0);
        /* one parallel loop; the CQ calls inside its bodies run serially */
        nd_parallel_for_dynamic(nb, 1, run_blocks, &a);
        free(a.b);
        if (atomic_load(&a.fail))
            return nd_error(ND_ENOMEM, "out of memory requantising for --qat");
    }
    return ND_OK;
}

int nd_qat_apply_one(const nd_qat *q, int i, const float *src, float *dst)
{
    return nd_qat_run(q, &i, 1, &src, &dst);
}

int nd_qat_apply(const nd_qat *q, const float *src_mem, float *dst_mem, size_t lo, size_t hi)
{
    int *sel = malloc(sizeof *sel * (size_t)(q->n ? q->n : 1));
    const float **src = malloc(sizeof *src * (size_t)(q->n ? q->n : 1));
    float **dst = malloc(sizeof *dst * (size_t)(q->n ? q->n : 1));
    int count = 0, rc = ND_OK;
    if (!sel || !src || !dst)
        rc = nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < q->n; i++) {
        const cact_model_tensor *t = &q->t[i];
        if (t->offset < lo || t->offset + t->numel > hi)
            continue;
        sel[count] = i;
        src[count] = src_mem + t->offset;
        dst[count++] = dst_mem + t->offset;
    }
    if (!rc)
        rc = nd_qat_run(q, sel, count, (const float *const *)src, (float *const *)dst);
    free(sel);
    free(src);
    free(dst);
    return rc;
}
