/* needle_model_embed on Needle 3 archives (issue 32): the embedding head
 * (model/probe3.h) over the cells of a forward of [BOS=2] + enc(text).
 *
 * Without arguments: a random tiny3 model (vocab 8192, fresh probe heads)
 * exported in memory as a 4-bit v3 archive with the tokenizer;
 *   - needle_model_embed_dim is the config's embedding_dim and
 *     needle_model_embed returns it, a unit vector;
 *   - the quantised path (CQ matrices in place) and the float path
 *     (NEEDLE_FLOAT=1: the archive dequantised) agree (cosine > 0.995),
 *     also for a text longer than one 256-row chunk of the pooling
 *     forward;
 *   - different texts embed differently; the same text the same;
 *   - needle_model_head_confidence: the confidence head's probability,
 *     the same on both paths within 0.01;
 *   - an archive exported without probe heads: NEEDLE_EUNSUPPORTED from
 *     all three calls, the message naming the head.
 *
 * `test_embed3 dump ARCHIVE TEXT OUT.safetensors OUT.txt` (for
 * tests/test_embed3_numpy.py): loads ARCHIVE on the float path, embeds
 * TEXT, writes the dequantised model as a 3.x safetensors checkpoint and,
 * to OUT.txt, the ids it should have pooled ([BOS] + enc(TEXT)), the head's
 * float tensors and the embedding. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "model/cq.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"

static void put_row(FILE *f, const char *name, const float *v, size_t n)
{
    fprintf(f, "%s", name);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %.9g", (double)v[i]);
    fputc('\n', f);
}

static int mode_dump(char **a)
{
    setenv("NEEDLE_FLOAT", "1", 1);
    needle_model *M = needle_model_load(a[0]);
    if (!M) {
        fprintf(stderr, "%s\n", nd_last_error());
        return 1;
    }
    const nd_qhead3 *h = nd_model_head3(M, 1);
    int dim = needle_model_embed_dim(M);
    if (!h || dim <= 0) {
        fprintf(stderr, "no embedding head: %s\n", nd_last_error());
        needle_model_free(M);
        return 1;
    }
    float *v = malloc((size_t)dim * sizeof *v);
    int rc = needle_model_embed(M, a[1], v, dim);
    nd_idvec ids = {0};
    nd_idvec_push(&ids, 2);
    nd_tokenizer_encode(M->tok, a[1], strlen(a[1]), &ids);
    FILE *f = fopen(a[3], "w");
    if (rc != dim || !f || ckpt_save(a[2], nd_model_weights(M), NULL)) {
        fprintf(stderr, "dump: rc %d: %s\n", rc, nd_last_error());
        rc = -1;
    } else {
        const san_dims *D = &M->m.dims;
        size_t rows = (size_t)D->L + 1, d = (size_t)D->d, k = (size_t)h->k, q = (size_t)h->q;
        fprintf(f, "shape %zu %zu %zu %zu %d\nids", rows, k, q, d, h->out);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(f, " %d", ids.v[i]);
        fputc('\n', f);
        put_row(f, "probes", h->probes_f, rows * k * d);
        put_row(f, "gain", h->gain, rows * k);
        put_row(f, "query", h->query_f, q * d);
        put_row(f, "row_bias", h->row_bias, q * rows * k);
        put_row(f, "proj", h->proj_f, q * d * (size_t)h->out);
        put_row(f, "emb", v, (size_t)dim);
        rc = 0;
    }
    if (f)
        fclose(f);
    nd_idvec_free(&ids);
    free(v);
    needle_model_free(M);
    return rc ? 1 : 0;
}

static int g_embedding_dim; /* the exported model's config */

/* a 4-bit tiny3 archive (vocab 8192, the tokenizer), probe heads or not */
static int make_archive(int heads, unsigned char **buf, size_t *len)
{
    san_config c;
    san_model m;
    CHECK(san_config_preset(&c, "tiny3") == 0);
    c.vocab_size = 8192;
    c.max_seq_len = 512;
    if (san_model_create(&m, &c)) {
        CHECK_MSG(0, "%s", nd_last_error());
        return -1;
    }
    g_embedding_dim = m.cfg.embedding_dim;
    san_model_init_random(&m, 4);
    nd_rng r;
    nd_rng_seed(&r, 12);
    for (size_t i = 0; i < m.numel; i++)
        m.mem[i] += (float)(0.05 * nd_rng_normal(&r));
    pv *root = heads ? ckpt_fresh_tree(&m, 3) : NULL;
    nd_tokenizer *t = NULL;
    unsigned char *blob = NULL;
    size_t blob_len = 0;
    int rc = nd_tokenizer_load("models/tokenizer.model", &t);
    if (!rc)
        rc = nd_tokenizer_write_blob_gen(t, 3, &blob, &blob_len);
    cact_write_opts o = {0};
    o.bits = 4;
    o.group = CQ_GROUP;
    o.kv_window = cact3_effective_kv_window(&m.cfg);
    o.tokenizer = blob;
    o.tokenizer_len = blob_len;
    if (!rc)
        rc = cact_write_mem(&m, root ? pv_dict_get(root, "params") : NULL, &o, buf, len, NULL);
    CHECK_MSG(rc == 0, "archive: %s", nd_last_error());
    free(blob);
    nd_tokenizer_free(t);
    pv_decref(root);
    san_model_free(&m);
    return rc;
}

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb + 1e-30);
}

static void test_embed(void)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    if (make_archive(1, &buf, &len))
        return;
    unsetenv("NEEDLE_FLOAT");
    needle_model *Mq = needle_model_load_buffer(buf, len);
    setenv("NEEDLE_FLOAT", "1", 1);
    needle_model *Mf = needle_model_load_buffer(buf, len);
    unsetenv("NEEDLE_FLOAT");
    CHECK_MSG(Mq && Mf, "load: %s", nd_last_error());
    if (Mq && Mf) {
        int dim = needle_model_embed_dim(Mq);
        CHECK_MSG(dim == g_embedding_dim && dim > 0 && dim <= 64, "dim %d", dim);
        CHECK(needle_model_embed_dim(Mf) == dim);
        /* a long text: the pooling forward runs in 256-row chunks */
        char *longtext = malloc(4096);
        longtext[0] = 0;
        for (int i = 0; i < 60; i++)
            strcat(longtext, "remind me tomorrow ");
        const char *texts[3] = {"What's the weather in Paris?", "Set a timer for 5 minutes",
                                longtext};
        float v[3][64], w[64];
        for (int i = 0; i < 3; i++) {
            int rq = needle_model_embed(Mq, texts[i], v[i], 64);
            int rf = needle_model_embed(Mf, texts[i], w, 64);
            CHECK_MSG(rq == dim && rf == dim, "embed: %d %d: %s", rq, rf, nd_last_error());
            double nn = 0;
            for (int j = 0; j < dim; j++)
                nn += (double)v[i][j] * v[i][j];
            CHECK_MSG(fabs(nn - 1) < 1e-4, "text %d: |e|^2 = %g", i, nn);
            double c = cosine(v[i], w, dim);
            printf("  text %d: quantised vs float path cosine %.6f\n", i, c);
            CHECK_MSG(c > 0.995, "text %d: quantised vs float path cosine %g", i, c);
        }
        CHECK(cosine(v[0], v[1], dim) < 0.9999);
        float again[64];
        CHECK(needle_model_embed(Mq, texts[0], again, 64) == dim);
        CHECK(!memcmp(again, v[0], (size_t)dim * sizeof(float)));
        /* out_len smaller than dim: a prefix, the dim returned */
        float part[2];
        CHECK(needle_model_embed(Mq, texts[0], part, 2) == dim && part[1] == v[0][1]);
        free(longtext);
        /* the confidence head over a token sequence, both paths */
        int ids[12] = {2, 4, 485, 24, 8, 8140, 8141, 9, 24, 1388, 5, 24};
        double pq = -1, pf = -1;
        CHECK_MSG(needle_model_head_confidence(Mq, ids, 12, &pq) == 0, "%s", nd_last_error());
        CHECK(needle_model_head_confidence(Mf, ids, 12, &pf) == 0);
        printf("  confidence head: quantised %.6f float %.6f\n", pq, pf);
        CHECK(pq > 0 && pq < 1 && fabs(pq - pf) < 0.01);
    }
    needle_model_free(Mq);
    needle_model_free(Mf);
    free(buf);

    /* no probe heads */
    if (make_archive(0, &buf, &len))
        return;
    needle_model *M = needle_model_load_buffer(buf, len);
    CHECK_MSG(M != NULL, "%s", nd_last_error());
    if (M) {
        float out[8];
        int rc = needle_model_embed_dim(M);
        CHECK_MSG(rc == NEEDLE_EUNSUPPORTED && strstr(nd_last_error(), "embedding head"),
                  "dim without a head: %d %s", rc, nd_last_error());
        rc = needle_model_embed(M, "hello", out, 8);
        CHECK_MSG(rc == NEEDLE_EUNSUPPORTED && strstr(nd_last_error(), "embedding head"),
                  "embed without a head: %d %s", rc, nd_last_error());
        int ids[3] = {2, 400, 401};
        double p;
        rc = needle_model_head_confidence(M, ids, 3, &p);
        CHECK_MSG(rc == NEEDLE_EUNSUPPORTED && strstr(nd_last_error(), "confidence head"),
                  "confidence without a head: %d %s", rc, nd_last_error());
        needle_model_free(M);
    }
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "dump"))
        return mode_dump(argv + 2);
    if (argc != 1) {
        fprintf(stderr, "usage: test_embed3 [dump ARCHIVE TEXT OUT.safetensors OUT.txt]\n");
        return 2;
    }
    test_embed();
    return tu_finish("test_embed3");
}
