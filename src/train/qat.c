#include "train/qat.h"

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
    const char *map = (!bits && m->cfg.weight_bits[0]) ? m->cfg.weight_bits : NULL;
    cact_write_opts o = {0};
    o.bits = bits ? bits : 4;
    o.bits_map = map;
    o.group = CQ_GROUP;
    q->bits = bits;
    nd_qat_scheme(m, bits, q->scheme, sizeof q->scheme);
    int rc = cact_model_tensors(m, &o, &q->t, &q->n);
    if (rc)
        return rc;
    size_t blob = 1, mat = 1;
    for (int i = 0; i < q->n; i++) {
        const cact_model_tensor *t = &q->t[i];
        if (t->src == CACT_SRC_FP16)
            continue;
        size_t nb = cq_blob_bytes(t->out, t->in, t->bits, t->group);
        size_t nm = (size_t)t->out * (size_t)t->in;
        blob = nb > blob ? nb : blob;
        mat = nm > mat ? nm : mat;
    }
    q->blob = malloc(blob);
    q->tmp = malloc(mat * sizeof *q->tmp);
    if (!q->blob || !q->tmp) {
        nd_qat_free(q);
        return nd_error(ND_ENOMEM, "out of memory for --qat buffers");
    }
    return ND_OK;
}

void nd_qat_free(nd_qat *q)
{
    free(q->t);
    free(q->blob);
    free(q->tmp);
    memset(q, 0, sizeof *q);
}

typedef struct {
    const cact_model_tensor *t;
    const float *src;
    float *dst, *mat;
    int to_mat; /* gather src -> mat, else scatter mat -> dst */
} layout_args;

/* rows [r0, r1) of the [out, in] matrix between the model layout and mat,
 * as the exporter transposes (cact.c emit_entry) */
static void move_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const layout_args *a = p;
    const cact_model_tensor *t = a->t;
    int64_t in = t->in;
    for (int64_t o = r0; o < r1; o++) {
        float *row = a->mat + o * in;
        for (int64_t i = 0; i < in; i++) {
            size_t k;
            if (t->src == CACT_SRC_KERNEL) { /* kernel [in, out] */
                k = (size_t)(i * t->out + o);
            } else { /* phi (L, nC, lanes): row l*lanes + j, column c */
                int64_t lanes = t->c, l = o / lanes, j = o % lanes;
                k = (size_t)((l * t->b + i) * lanes + j);
            }
            if (a->to_mat)
                row[i] = a->src[k];
            else
                a->dst[k] = row[i];
        }
    }
}

int nd_qat_apply_one(nd_qat *q, int i, const float *src, float *dst)
{
    const cact_model_tensor *t = &q->t[i];
    if (t->src == CACT_SRC_FP16) {
        for (size_t k = 0; k < t->numel; k++)
            dst[k] = nd_half_to_float(nd_float_to_half(src[k]));
        return ND_OK;
    }
    size_t nb = cq_blob_bytes(t->out, t->in, t->bits, t->group);
    int direct = t->src == CACT_SRC_DIRECT;
    layout_args a = {t, src, dst, q->tmp, 1};
    const float *w = src;
    if (!direct) {
        nd_parallel_for((long)t->out, 16, move_rows, &a);
        w = q->tmp;
    }
    int rc = cq_quantize(w, t->out, t->in, t->bits, t->group, q->blob);
    if (!rc)
        rc = cq_dequantize(q->blob, nb, t->out, t->in, t->bits, t->group, direct ? dst : q->tmp);
    if (rc)
        return nd_error_prefix(rc, "--qat: %s", t->name);
    if (!direct) {
        a.to_mat = 0;
        nd_parallel_for((long)t->out, 16, move_rows, &a);
    }
    return ND_OK;
}

int nd_qat_apply(nd_qat *q, const float *src_mem, float *dst_mem, size_t lo, size_t hi)
{
    for (int i = 0; i < q->n; i++) {
        const cact_model_tensor *t = &q->t[i];
        if (t->offset < lo || t->offset + t->numel > hi)
            continue;
        int rc = nd_qat_apply_one(q, i, src_mem + t->offset, dst_mem + t->offset);
        if (rc)
            return rc;
    }
    return ND_OK;
}
