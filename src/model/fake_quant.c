#include "model/fake_quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "model/cq.h"

/* Each product, quotient and sum rounds on its own, in the order written
 * (upstream's elementwise float32 ops). */
#pragma STDC FP_CONTRACT OFF

#define FQ3_KV_A8_BITS 8 /* a8_fake_quant_kv: fake_quant(x, x.shape[-1], 8) */
#define FQ3_BLOCK 32768  /* about this many floats per parallel work item */

void nd_fq3_defaults(nd_fq3_numerics *n)
{
    n->act_bits = 8;
    n->kv_bits = 8;
    n->kv_group = 64;
    n->weight_bits = 4;
}

static int group_ok(int g)
{
    return g >= 8 && g <= 4096 && (g & (g - 1)) == 0;
}

int nd_fq3_validate(const nd_fq3_numerics *n)
{
    if (n->act_bits < 2 || n->act_bits > 16)
        return nd_error(ND_EARG,
                        "act_bits %d: quantised training needs an activation width in [2, 16] "
                        "(at 0 or 1 upstream's fake_quant degenerates)",
                        n->act_bits);
    if (n->kv_bits < 0)
        return nd_error(ND_EARG,
                        "kv_bits %d: quantised training supports 0 (off), 1 to 7 (CQ) or >= 8 "
                        "(int8)",
                        n->kv_bits);
    if (!group_ok(n->kv_group))
        return nd_error(ND_EARG, "kv group %d: must be a power of two in [8, 4096]", n->kv_group);
    if (n->weight_bits < 2 || n->weight_bits > 4)
        return nd_error(ND_EARG, "weight bits %d: CQ weights are 2, 3 or 4 bits", n->weight_bits);
    return ND_OK;
}

/* ------------------------------------------------------------------ */
/* fake_quant: symmetric absmax, one group per row                      */

static void fq_row(const float *x, float *y, int64_t n, float qmax)
{
    float amax = 0.0f;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) { /* branch-free, so it vectorises */
        const float a = fabsf(x[i]);
        nan |= isnan(a) ? 1 : 0;
        amax = a > amax ? a : amax;
    }
    if (nan)
        amax = NAN;                                       /* jnp.max propagates NaN */
    const float scale = amax > 0.0f ? amax / qmax : 1.0f; /* NaN > 0 is false */
    const float lo = -qmax - 1.0f, hi = qmax;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        float r = nearbyintf(v / scale); /* round half to even */
        if (r < lo)                      /* jnp.clip; NaN passes through */
            r = lo;
        if (r > hi)
            r = hi;
        const float q = r * scale;
        const float d = q - v;
        y[i] = v + d; /* x + stop_gradient(q - x) */
    }
}

typedef struct {
    const float *x;
    float *y;
    int64_t dim;
    float qmax;
} fq_args;

static void fq_rows(void *p, long lo, long hi, int tid)
{
    (void)tid;
    const fq_args *a = p;
    for (long r = lo; r < hi; r++)
        fq_row(a->x + (size_t)r * (size_t)a->dim, a->y + (size_t)r * (size_t)a->dim, a->dim,
               a->qmax);
}

int nd_fq3_fake_quant(const float *x, float *y, int64_t rows, int64_t dim, int bits)
{
    if (bits < 2 || bits > 16)
        return nd_error(ND_EARG, "fake_quant width must be in [2, 16], not %d", bits);
    if (rows < 0 || dim < 1)
        return nd_error(ND_EARG, "fake_quant of %lld rows of %lld", (long long)rows,
                        (long long)dim);
    fq_args a = {x, y, dim, (float)((1 << (bits - 1)) - 1)};
    long grain = (long)(FQ3_BLOCK / dim);
    nd_parallel_for((long)rows, grain < 1 ? 1 : grain, fq_rows, &a);
    return ND_OK;
}

int nd_fq3_act(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows, int64_t dim)
{
    return nd_fq3_fake_quant(x, y, rows, dim, n->act_bits);
}

static void copy_if(const float *x, float *y, size_t n)
{
    if (x != y)
        memmove(y, x, n * sizeof *y);
}

int nd_fq3_query(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows, int64_t head_dim)
{
    if (!n->act_bits) {
        if (rows < 0 || head_dim < 1)
            return nd_error(ND_EARG, "query of %lld rows of %lld", (long long)rows,
                            (long long)head_dim);
        copy_if(x, y, (size_t)(rows * head_dim));
        return ND_OK;
    }
    return nd_fq3_fake_quant(x, y, rows, head_dim, FQ3_KV_A8_BITS);
}

int nd_fq3_kv(const nd_fq3_numerics *n, const float *x, float *y, int64_t rows, int64_t head_dim)
{
    if (n->kv_bits >= 8)
        return nd_fq3_fake_quant(x, y, rows, head_dim, FQ3_KV_A8_BITS);
    if (n->kv_bits == 0) {
        if (rows < 0 || head_dim < 1)
            return nd_error(ND_EARG, "kv of %lld rows of %lld", (long long)rows,
                            (long long)head_dim);
        copy_if(x, y, (size_t)(rows * head_dim));
        return ND_OK;
    }
    if (n->kv_bits < 0)
        return nd_error(ND_EARG, "kv_bits %d: CQ KV quantisation is 1 to 7 bits", n->kv_bits);
    return nd_fq3_cq_ste_rows(x, y, rows, head_dim, n->kv_bits, n->kv_group);
}

/* ------------------------------------------------------------------ */
/* cq_ste: CQ quantise -> dequantise, straight through                  */

/* The rows to quantise, as a logical [rows, in_dim] matrix over w and y:
 * contiguous rows, or (stride set) a stack of flax kernels (lead, in, per)
 * whose rows are the per output columns of each leading block. */
typedef struct {
    const float *w;
    float *y;
    int64_t rows, in_dim;
    int64_t per;    /* rows per leading block */
    int64_t stride; /* second-last reduction: row o of block l, column i at
                       l*in*per + i*per + o; 0 = contiguous rows */
    int bits, group;
    int kv; /* KV rows: widths 1..7 (3.x maybe_quant_kv), else 2..4 */
    int64_t block_rows;
    atomic_int err; /* first failure's ND_E* code */
} cq_args;

static size_t elem(const cq_args *a, int64_t o, int64_t i)
{
    if (!a->stride)
        return (size_t)(o * a->in_dim + i);
    int64_t l = o / a->per, j = o % a->per;
    return (size_t)((l * a->in_dim + i) * a->per + j);
}

static void cq_blocks(void *p, long lo, long hi, int tid)
{
    (void)tid;
    cq_args *a = p;
    for (long b = lo; b < hi; b++) {
        int64_t r0 = (int64_t)b * a->block_rows;
        int64_t r1 = r0 + a->block_rows < a->rows ? r0 + a->block_rows : a->rows;
        int64_t nr = r1 - r0, in = a->in_dim;
        int stored = a->bits >= 2 && a->bits <= 4; /* else a KV-only width */
        size_t nb = stored ? cq_blob_bytes(nr, in, a->bits, a->group) : 0;
        float *m = malloc((size_t)(nr * in) * sizeof *m + 1);
        unsigned char *blob = malloc(nb + 1);
        int rc = !m || !blob ? ND_ENOMEM : stored && !nb ? ND_ELIMIT : ND_OK;
        if (!rc) {
            for (int64_t o = 0; o < nr; o++)
                for (int64_t i = 0; i < in; i++)
                    m[o * in + i] = a->w[elem(a, r0 + o, i)];
            if (stored)
                rc = cq_quantize(m, nr, in, a->bits, a->group, blob);
            else /* no stored form: straight to the dequantised values */
                rc = cq_kv_roundtrip(m, nr, in, a->bits, a->group, m);
        }
        if (!rc && stored)
            rc = cq_dequantize(blob, nb, nr, in, a->bits, a->group, m);
        if (!rc)
            for (int64_t o = 0; o < nr; o++)
                for (int64_t i = 0; i < in; i++) {
                    size_t e = elem(a, r0 + o, i);
                    const float v = a->w[e];
                    const float d = m[o * in + i] - v;
                    a->y[e] = v + d; /* w + stop_gradient(cq_quantize(w) - w) */
                }
        free(m);
        free(blob);
        if (rc) {
            int none = ND_OK;
            atomic_compare_exchange_strong(&a->err, &none, rc);
        }
    }
}

static int cq_run(cq_args *a)
{
    if (a->bits < 1 || a->bits > (a->kv ? 7 : 4) || (!a->kv && a->bits == 1))
        return nd_error(ND_EARG, "CQ straight-through width must be %s, not %d",
                        a->kv ? "1 to 7" : "2, 3 or 4", a->bits);
    if (!group_ok(a->group))
        return nd_error(ND_EARG, "CQ group must be a power of two in [8, 4096], not %d", a->group);
    if (a->rows < 0 || a->in_dim < 1)
        return nd_error(ND_EARG, "CQ of %lld rows of %lld", (long long)a->rows,
                        (long long)a->in_dim);
    if (!a->rows)
        return ND_OK;
    int64_t br = FQ3_BLOCK / cq_in_pad(a->in_dim, a->group);
    a->block_rows = br < 1 ? 1 : br;
    long nblocks = (long)((a->rows + a->block_rows - 1) / a->block_rows);
    atomic_init(&a->err, ND_OK);
    /* one parallel loop; the cq calls inside its bodies run serially */
    nd_parallel_for_dynamic(nblocks, 1, cq_blocks, a);
    int rc = atomic_load(&a->err);
    if (rc) /* the message was recorded on a worker thread */
        return nd_error(rc, "CQ straight-through quantisation of [%lld, %lld] failed (%s)",
                        (long long)a->rows, (long long)a->in_dim, nd_status_name(rc));
    return ND_OK;
}

int nd_fq3_cq_ste_rows(const float *w, float *y, int64_t rows, int64_t in_dim, int bits, int group)
{
    cq_args a = {
        .w = w, .y = y, .rows = rows, .in_dim = in_dim, .bits = bits, .group = group, .kv = 1};
    return cq_run(&a);
}

int nd_fq3_leaf_rule(const char *path, int ndim)
{
    const char *slash = strrchr(path, '/');
    const char *key = slash ? slash + 1 : path;
    if (ndim < 2)
        return ND_FQ3_LEAF_FLOAT;
    if (!strcmp(key, "kernel") || !strncmp(key, "mhc_phi", 7))
        return ND_FQ3_LEAF_SECOND_LAST;
    if (!strcmp(key, "embedding"))
        return ND_FQ3_LEAF_LAST;
    return ND_FQ3_LEAF_FLOAT;
}

int nd_fq3_cq_ste_leaf(const char *path, const int64_t *shape, int ndim, const float *w, float *y,
                       int bits, int group)
{
    int64_t numel = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0)
            return nd_error(ND_ESHAPE, "%s: negative dimension", path);
        numel *= shape[k];
    }
    int rule = nd_fq3_leaf_rule(path, ndim);
    if (rule == ND_FQ3_LEAF_FLOAT) {
        copy_if(w, y, (size_t)numel);
        return rule;
    }
    int64_t a0 = shape[ndim - 2], a1 = shape[ndim - 1], lead = a1 && a0 ? numel / (a0 * a1) : 0;
    cq_args a = {.w = w, .y = y, .bits = bits, .group = group};
    if (rule == ND_FQ3_LEAF_LAST) {
        a.rows = lead * a0;
        a.in_dim = a1;
    } else { /* (lead, in, out): rows are the out columns of each lead */
        a.rows = lead * a1;
        a.in_dim = a0;
        a.per = a1;
        a.stride = 1;
    }
    if (!numel)
        return rule;
    int rc = cq_run(&a);
    return rc ? nd_error_prefix(rc, "%s", path) : rule;
}

void nd_fq3_ste_backward(const float *dy, float *dx, size_t n, int accumulate)
{
    if (!accumulate) {
        copy_if(dy, dx, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dx[i] += dy[i];
}

int nd_fq3_model_weights(const san_model *m, const nd_fq3_numerics *n, const float *src_mem,
                         float *dst_mem)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const san_tensor *t = &m->tensors[i];
        int rc = nd_fq3_cq_ste_leaf(t->name, t->shape, t->ndim, src_mem + t->offset,
                                    dst_mem + t->offset, n->weight_bits, ND_FQ3_WEIGHT_GROUP);
        if (rc < 0)
            return rc;
    }
    return ND_OK;
}
