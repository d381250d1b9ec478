/* Probe heads: loading from the archive and the pooled forward. */
#include "engine/heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/layout.h"
#include "core/status.h"
#include "model/san.h"
#include "engine/model_internal.h"
#include "model/probe3.h"

enum { HEAD_CONTRASTIVE = 1, HEAD_CONFIDENCE = 2 };

static int load_fp16(const cact_file *f, int idx, size_t want, float **out, const char *what)
{
    size_t n;
    if (f->t[idx].dtype != CACT_FP16 && f->t[idx].dtype != CACT_FP32)
        return nd_error(ND_EFORMAT, "cact: %s (tensor %d) is %s, expected FP16", what, idx,
                        cact_dtype_name(f->t[idx].dtype));
    int rc = cact_dequant(f, idx, out, &n);
    if (rc)
        return nd_error_prefix(rc, "%s", what);
    if (want && n != want) {
        free(*out);
        *out = NULL;
        return nd_error(ND_ESHAPE, "cact: %s (tensor %d) has %zu elements, expected %zu", what, idx,
                        n, want);
    }
    return ND_OK;
}

int nd_heads_load(const cact_file *f, const san_model *m, nd_heads *h)
{
    memset(h, 0, sizeof *h);
    const san_dims *D = &m->dims;
    /* embedding, 14 per layer, 9 mHC, 4 per engram site, final_norm */
    int first = 1 + 14 * D->L + 9 + 4 * m->cfg.n_sites + 1;
    int extra = (int)f->hdr.num_tensors - first - 1; /* the tokenizer is last */
    if (extra <= 0)
        return ND_OK;
    if ((extra - 1) % 3)
        return nd_error(ND_EFORMAT,
                        "cact: %d tensors between final_norm and the tokenizer; probe heads "
                        "come as a manifest and triples",
                        extra);
    int n_heads = (extra - 1) / 3;
    float *codes = NULL;
    int rc = load_fp16(f, first, (size_t)n_heads, &codes, "heads.manifest");
    if (rc)
        return rc;
    size_t d = (size_t)D->d;
    for (int i = 0; i < n_heads && !rc; i++) {
        int code = (int)codes[i];
        nd_probe_head *ph = code == HEAD_CONTRASTIVE  ? &h->contrastive
                            : code == HEAD_CONFIDENCE ? &h->confidence
                                                      : NULL;
        if (!ph || (float)code != codes[i] || ph->present) {
            rc = nd_error(ND_EFORMAT, "cact: heads.manifest code %g is unknown or repeated",
                          (double)codes[i]);
            break;
        }
        int base = first + 1 + 3 * i;
        const cact_tensor *tp = &f->t[base], *tb = &f->t[base + 2];
        size_t P = tp->ndim == 2 ? tp->shape[0] : 0, out = cact_numel(tb);
        if (!P || tp->shape[1] != d || !out || out > 4096 || P > 64) {
            rc = nd_error(ND_ESHAPE, "cact: probe head %d has probes [%u, %u] and %zu outputs",
                          code, tp->shape[0], tp->shape[1], out);
            break;
        }
        ph->n_probes = (int)P;
        ph->out_dim = (int)out;
        if ((rc = load_fp16(f, base, P * d, &ph->probes, "head probes")) ||
            (rc = load_fp16(f, base + 1, out * P * d, &ph->proj, "head proj")) ||
            (rc = load_fp16(f, base + 2, out, &ph->bias, "head bias")))
            break;
        ph->present = 1;
    }
    if (!rc && h->confidence.present && h->confidence.out_dim != 1)
        rc = nd_error(ND_ESHAPE, "cact: the confidence head has %d outputs, expected 1",
                      h->confidence.out_dim);
    free(codes);
    if (rc)
        nd_heads_free(h);
    return rc;
}

void nd_heads_free(nd_heads *h)
{
    nd_probe_head *all[2] = {&h->contrastive, &h->confidence};
    for (int i = 0; i < 2; i++) {
        free(all[i]->probes);
        free(all[i]->proj);
        free(all[i]->bias);
        memset(all[i], 0, sizeof *all[i]);
    }
}

/* Online softmax pooling: per probe the running max score, the sum of
 * exp(score - max) and the weighted sum of the cells, so the T*(L+1)
 * cells never need to be held at once. */
typedef struct {
    int P, d;
    const float *probes;
    double *mx, *sum, *acc; /* [P], [P], [P*d] */
} pool_state;

static void pool_cells(pool_state *ps, const float *cells, long N, const uint8_t *keep)
{
    double inv_sqrt_d = 1.0 / sqrt((double)ps->d);
    for (long r = 0; r < N; r++) {
        if (!keep[r])
            continue;
        const float *c = cells + (size_t)r * (size_t)ps->d;
        for (int k = 0; k < ps->P; k++) {
            const float *pr = ps->probes + (size_t)k * (size_t)ps->d;
            double s = 0;
            for (int j = 0; j < ps->d; j++)
                s += (double)c[j] * (double)pr[j];
            s *= inv_sqrt_d;
            double *acc = ps->acc + (size_t)k * (size_t)ps->d;
            if (s > ps->mx[k]) { /* rescale what was summed under the old max */
                double f = ps->sum[k] > 0 ? exp(ps->mx[k] - s) : 0;
                ps->sum[k] *= f;
                for (int j = 0; j < ps->d; j++)
                    acc[j] *= f;
                ps->mx[k] = s;
            }
            double w = exp(s - ps->mx[k]);
            ps->sum[k] += w;
            for (int j = 0; j < ps->d; j++)
                acc[j] += w * (double)c[j];
        }
    }
}

typedef struct {
    pool_state *ps;
    const uint8_t *keep;
} pool_hook_ctx;

static void pool_hook(void *ctx, int layer, int p0, const float *cells, int n)
{
    (void)layer;
    pool_hook_ctx *h = ctx;
    pool_cells(h->ps, cells, n, h->keep + p0);
}

/* The head's raw outputs (pooled @ proj^T + bias) for t[0..T): the
 * engine's own forward (quantised or float, as the model was loaded), T
 * rows with full causal attention, pooling the cells as each layer of each
 * chunk finishes. */
static int head_run(const san_model *m, const nd_backend *be, const nd_heads *hs,
                    const nd_probe_head *h, const int32_t *t, int T, double *out)
{
    if (!h->present)
        return nd_error(ND_EARG, "the archive has no such probe head");
    if (T < 1 || T > m->cfg.max_seq_len)
        return nd_error(ND_ELIMIT, "probe head over %d tokens (max_seq_len %d)", T,
                        m->cfg.max_seq_len);
    const san_dims *D = &m->dims;
    int d = D->d, P = h->n_probes;
    nd_kv_state kv;
    /* chunks of at most 256 rows: the scratch grows with the chunk (~80 KB
     * a row for needle2), and pooling is an online softmax over the cells
     * in any order */
    int rc = nd_kv_init(&kv, m, be, T < 256 ? T : 256, 0);
    if (rc)
        return rc;
    if (hs->qw)
        nd_kv_use_quant(&kv, hs->qw);
    pool_state ps = {P, d, h->probes, NULL, NULL, NULL};
    ps.mx = malloc((size_t)P * sizeof *ps.mx);
    ps.sum = calloc((size_t)P, sizeof *ps.sum);
    ps.acc = calloc((size_t)P * (size_t)d, sizeof *ps.acc);
    uint8_t *keep = malloc((size_t)T);
    if (!ps.mx || !ps.sum || !ps.acc || !keep) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    int any = 0;
    for (int i = 0; i < T; i++) {
        if (t[i] < 0 || t[i] >= D->V) {
            rc = nd_error(ND_EARG, "token id %d outside the vocabulary", t[i]);
            goto done;
        }
        keep[i] = t[i] != m->cfg.pad_token_id;
        any |= keep[i];
    }
    for (int k = 0; k < P; k++)
        ps.mx[k] = -INFINITY;
    pool_hook_ctx hc = {&ps, keep};
    kv.cells_hook = pool_hook;
    kv.cells_ctx = &hc;
    if ((rc = nd_kv_forward(&kv, t, T, NULL, 0)))
        goto done;
    /* pooled (P*d) @ proj^T + bias */
    size_t Pd = (size_t)P * (size_t)d;
    for (int o = 0; o < h->out_dim; o++) {
        const float *row = h->proj + (size_t)o * Pd;
        double s = 0;
        for (int k = 0; any && k < P; k++)
            for (int j = 0; j < d; j++)
                s += ps.acc[(size_t)k * d + j] / ps.sum[k] * (double)row[(size_t)k * d + j];
        out[o] = s + (double)h->bias[o];
    }
done:
    free(ps.mx);
    free(ps.sum);
    free(ps.acc);
    free(keep);
    nd_kv_free(&kv);
    return rc;
}

int nd_head_embed(const san_model *m, const nd_backend *be, const nd_heads *h, const int32_t *t,
                  int T, float *emb)
{
    const nd_probe_head *ph = &h->contrastive;
    double *raw = malloc((size_t)(ph->present ? ph->out_dim : 1) * sizeof *raw);
    if (!raw)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = head_run(m, be, h, ph, t, T, raw);
    if (!rc) {
        double ss = 0;
        for (int o = 0; o < ph->out_dim; o++)
            ss += raw[o] * raw[o];
        double inv = 1.0 / sqrt(ss + 1e-12);
        for (int o = 0; o < ph->out_dim; o++)
            emb[o] = (float)(raw[o] * inv);
    }
    free(raw);
    return rc;
}

int nd_head_confidence(const san_model *m, const nd_backend *be, const nd_heads *h,
                       const int32_t *t, int T, double *p)
{
    double logit;
    int rc = head_run(m, be, h, &h->confidence, t, T, &logit);
    if (!rc)
        *p = 1.0 / (1.0 + exp(-logit));
    return rc;
}

/* ---- Needle 3 probe heads (model/probe3.h) ---- */

const nd_qhead3 *nd_model_head3(const needle_model *M, int code)
{
    if (!M || M->gen != 3)
        return NULL;
    for (int i = 0; i < M->qw3.n_heads; i++)
        if (M->qw3.head[i].code == code && M->qw3.head[i].probes_f)
            return &M->qw3.head[i];
    return NULL;
}

typedef struct {
    san_probe3_pool *pool;
    const uint8_t *keep; /* [T] */
} pool3_ctx;

static void pool3_hook(void *ctx, int layer, int p0, const float *cells, int n)
{
    pool3_ctx *c = ctx;
    san_probe3_add(c->pool, layer + 1, cells, n, c->keep + p0);
}

int nd_head3_run(const needle_model *M, const nd_qhead3 *h, const int32_t *t, int T, float *out)
{
    const san_model *m = &M->m;
    const san_dims *D = &m->dims;
    if (!h)
        return nd_error(ND_EUNSUPPORTED, "the archive has no such probe head");
    if (T < 1 || T > m->cfg.max_seq_len)
        return nd_error(ND_ELIMIT, "probe head over %d tokens (max_seq_len %d)", T,
                        m->cfg.max_seq_len);
    san_probe3_head ph = {D->L + 1,
                          h->k,
                          h->q,
                          D->d,
                          h->out,
                          h->probes_f,
                          h->gain,
                          h->query_f,
                          h->row_bias,
                          h->proj_f,
                          h->code == 1 ? NULL : h->bias,
                          h->code == 1};
    uint8_t *keep = malloc((size_t)T);
    if (!keep)
        return nd_error(ND_ENOMEM, "out of memory");
    for (int i = 0; i < T; i++) {
        if (t[i] < 0 || t[i] >= D->V) {
            free(keep);
            return nd_error(ND_EARG, "token id %d outside the vocabulary", t[i]);
        }
        keep[i] = t[i] != 0; /* 3.x's PAD_ID */
    }
    san_probe3_pool pool;
    int rc = san_probe3_begin(&pool, &ph);
    if (rc) {
        free(keep);
        return rc;
    }
    nd_kv_state kv;
    /* chunks of at most a session's 64 rows (a 256-row chunk's scratch is
     * ~30 MB at needle3 shape, the largest part of a long conversation's
     * peak); the pooling's softmax over tokens is online, so the chunks
     * hand their cells over as they finish */
    int chunk = T < ND_SESSION_CHUNK ? T : ND_SESSION_CHUNK;
    if ((rc = nd_kv_init(&kv, m, M->be, chunk, 0))) {
        san_probe3_free(&pool);
        free(keep);
        return rc;
    }
    if (M->quant)
        nd_kv_use_quant(&kv, &M->qw3.q);
    /* no sinks and no window (T <= max_seq_len: nothing is dropped), but the
     * local layers keep a ring of their window's rows, not all T */
    nd_kv_slide(&kv, 0);
    pool3_ctx c = {&pool, keep};
    kv.cells_hook = pool3_hook;
    kv.cells_ctx = &c;
    rc = nd_kv_forward(&kv, t, T, NULL, 0);
    nd_kv_free(&kv);
    free(keep);
    if (rc) {
        san_probe3_free(&pool);
        return rc;
    }
    return san_probe3_finish(&pool, out);
}
