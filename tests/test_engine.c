/* Engine: a .cact loads back into float32 weights; the incremental decoder
 * (prefill + one token at a time, chunked prefill, rewind) gives the same
 * logits as the training forward on the dequantised weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "testutil.h"

/* max relative error of row r of a vs b */
static double row_err(const float *a, const float *b, int V)
{
    return tu_rel_err(a, b, V, 1e-3);
}

/* nd_call_list: the envelope's list, each call once */
static void test_call_list(void)
{
    static const struct {
        const char *call, *want;
        int is_call;
    } cases[] = {
        {"[]", "[]", 0},
        {"[{\"name\":\"f\",\"arguments\":{\"a\":1}}]",
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]", 1},
        /* a repeat, verbatim: once */
        {"[{\"name\":\"f\",\"arguments\":{\"a\":1}},{\"name\":\"f\",\"arguments\":{\"a\":1}}]",
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]", 1},
        /* other values, another tool, keys in another order: kept */
        {"[{\"name\":\"f\",\"arguments\":{\"a\":1}},{\"name\":\"f\",\"arguments\":{\"a\":2}},"
         "{\"name\":\"g\",\"arguments\":{\"a\":1}},{\"name\":\"f\",\"arguments\":{\"a\":1}},"
         "{\"name\":\"h\",\"arguments\":{\"a\":1,\"b\":2}},{\"name\":\"h\",\"arguments\":{\"b\":2,"
         "\"a\":1}}]",
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"f\", \"arguments\": {\"a\": "
         "2}}, "
         "{\"name\": \"g\", \"arguments\": {\"a\": 1}}, {\"name\": \"h\", \"arguments\": {\"a\": "
         "1, "
         "\"b\": 2}}, {\"name\": \"h\", \"arguments\": {\"b\": 2, \"a\": 1}}]",
         1},
        /* a prefix of a later call is no repeat of it */
        {"[{\"name\":\"f\",\"arguments\":{}},{\"name\":\"f\",\"arguments\":{\"x\":\"\"}},"
         "{\"name\":\"f\",\"arguments\":{}}]",
         "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"f\", \"arguments\": {\"x\": \"\"}}]",
         1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nd_buf out = {0};
        int is_call = -1;
        CHECK(nd_call_list(cases[k].call, strlen(cases[k].call), &out, &is_call) == ND_OK);
        CHECK_MSG(out.n == strlen(cases[k].want) && !strcmp(out.p, cases[k].want),
                  "case %zu: %s\n want %s", k, out.p, cases[k].want);
        CHECK(is_call == cases[k].is_call);
        nd_buf_free(&out);
    }
    nd_buf out = {0};
    int is_call;
    CHECK(nd_call_list("[{", 2, &out, &is_call) != ND_OK); /* not JSON: an error, no list */
    nd_buf_free(&out);
}

int main(void)
{
    test_call_list();
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_engine: %s\n", nd_last_error());
        return 1;
    }
    const nd_backend *be = nd_backend_cpu(2);
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 256;
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 7);
    /* perturb everything so every path (taps, gates, norms) matters */
    nd_rng r;
    nd_rng_seed(&r, 11);
    for (size_t i = 0; i < src.numel; i++)
        src.mem[i] += (float)(0.05 * nd_rng_normal(&r));

    size_t len;
    unsigned char *arch = tu_archive(&src, tok, 4, san_effective_kv_window(&src.cfg), &len);
    cact_file f;
    CHECK(cact_parse(arch, len, &f) == 0);
    san_model m;
    int rc = nd_cact_to_model(&f, &m);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    if (rc)
        return tu_finish("test_engine");
    CHECK(m.cfg.d_model == c.d_model && m.cfg.num_layers == c.num_layers);
    CHECK(m.numel == src.numel);
    /* 4-bit CQ is lossy, FP16 nearly exact: the weights stay close */
    double err = tu_rel_err(m.mem, src.mem, (long)m.numel, 1e-3);
    CHECK_MSG(err < 0.5, "dequantised weights rel err %g", err);
    for (int i = 0; i < m.n_tensors; i++) {
        const san_tensor *t = &m.tensors[i];
        if (strstr(t->name, "mtp_"))
            continue;
        double e = tu_rel_err(m.mem + t->offset, src.mem + t->offset, (long)t->numel, 1e-3);
        CHECK_MSG(e < 0.35, "%s: rel err %g after 4-bit round trip", t->name, e);
    }
    nd_tokenizer *tk2 = NULL;
    CHECK(nd_cact_tokenizer(&f, &tk2) == 0);
    CHECK(tk2 && nd_tokenizer_vocab_size(tk2) == 8192);

    /* tokens of a real prompt */
    nd_idvec ids = {0};
    nd_idvec_push(&ids, 2);
    const char *text = "<|im_start|>user\n<tools>[{\"name\":\"set_timer\",\"parameters\":{}}]"
                       "</tools>\nset a timer for ten minutes please<|im_end|>\n"
                       "<|im_start|>assistant\n";
    CHECK(nd_tokenizer_encode(tk2, text, strlen(text), &ids) == 0);
    int T = (int)ids.n, V = m.dims.V;
    CHECK(T > 20 && T < 128);

    san_acts a;
    CHECK(san_acts_create(&a, be, &m, 1, T, 0, 0) == 0);
    CHECK(san_forward(&m, &m.w, &a, ids.v) == 0);

    float *lg = malloc((size_t)T * V * sizeof *lg);
    /* whole sequence through the cached path */
    for (int chunk = 1; chunk <= 64; chunk *= 8) {
        nd_kv_state s;
        CHECK(nd_kv_init(&s, &m, be, chunk, 0) == 0);
        CHECK(nd_kv_forward(&s, ids.v, T, lg, 1) == 0);
        double e = tu_rel_err(lg, a.logits, (long)T * V, 1e-3);
        CHECK_MSG(e < 1e-4, "chunk %d: cached forward vs training forward rel err %g", chunk, e);
        nd_kv_free(&s);
    }
    /* prefill then one token at a time */
    {
        nd_kv_state s;
        CHECK(nd_kv_init(&s, &m, be, 32, 0) == 0);
        int P = 13;
        CHECK(nd_kv_forward(&s, ids.v, P, lg, 0) == 0);
        double e = row_err(lg, a.logits + (size_t)(P - 1) * V, V);
        CHECK_MSG(e < 1e-4, "prefill last row rel err %g", e);
        double worst = 0;
        for (int t = P; t < T; t++) {
            /* the scratch's pages handed back between steps (a session does
             * so between turns): what the state keeps is kept */
            nd_kv_release_scratch(&s);
            CHECK(nd_kv_forward(&s, ids.v + t, 1, lg, 0) == 0);
            double et = row_err(lg, a.logits + (size_t)t * V, V);
            worst = et > worst ? et : worst;
        }
        CHECK_MSG(worst < 1e-4, "incremental decode rel err %g", worst);
        /* rewind and replay a suffix */
        nd_kv_rewind(&s, 7);
        CHECK(s.len == 7);
        CHECK(nd_kv_forward(&s, ids.v + 7, T - 7, lg, 0) == 0);
        e = row_err(lg, a.logits + (size_t)(T - 1) * V, V);
        CHECK_MSG(e < 1e-4, "rewound replay rel err %g", e);
        /* overflow of max_seq_len is refused */
        int32_t *many = calloc(200, sizeof *many);
        rc = nd_kv_forward(&s, many, 200, NULL, 0);
        CHECK(rc == ND_ELIMIT);
        free(many);
        nd_kv_free(&s);
    }
    /* corrupt archive: a truncated or tampered one fails cleanly */
    {
        cact_file g;
        CHECK(cact_parse(arch, len / 2, &g) != 0);
        unsigned char *bad = malloc(len);
        memcpy(bad, arch, len);
        bad[6 * 4] ^= 0x01; /* d_model */
        san_model mm;
        if (cact_parse(bad, len, &g) == 0) {
            CHECK(nd_cact_to_model(&g, &mm) != 0);
            cact_free(&g);
        }
        free(bad);
    }
    free(lg);
    san_acts_free(&a);
    nd_idvec_free(&ids);
    san_model_free(&m);
    san_model_free(&src);
    nd_tokenizer_free(tk2);
    nd_tokenizer_free(tok);
    cact_free(&f);
    free(arch);
    return tu_finish("test_engine");
}
