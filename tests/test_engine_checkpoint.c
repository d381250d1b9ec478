/* nd_model_from_checkpoint (eval-calls --checkpoint): the engine runs the
 * checkpoint's own float weights, with an adapter merged exactly as
 * `needle build --lora` merges it, nothing quantised; over the same float
 * weights it answers exactly as the float path of an archive does (the
 * archive's tokenizer, header and grammar are the same); bad input names
 * the file at fault. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/from_checkpoint.h"
#include "io/checkpoint.h"
#include "model/lora.h"
#include "model/lora_merge.h"
#include "text/pyjson.h"
#include "testutil.h"

#define TOK "models/tokenizer.model"

static const char *tools =
    "[{\"name\": \"log_feeding\", \"description\": \"Log a pet feeding\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"pet\": {\"type\": \"string\"}, \"grams\": "
    "{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 2000}}, \"required\": [\"pet\"]}}, "
    "{\"name\": \"book_vet\", \"description\": \"Book a vet visit\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"pet\": {\"type\": \"string\"}, \"reason\": {\"type\": "
    "\"string\", \"enum\": [\"checkup\", \"dental\"]}}, \"required\": [\"pet\"]}}]";
static const char *queries[] = {"I fed Rocky 296 grams", "book the vet for Luna, dental",
                                "what is the capital of France?"};

static void random_model(san_model *m, const char *preset, int d, uint64_t seed)
{
    san_config c;
    san_config_preset(&c, preset);
    c.engram_slots = 256;
    c.max_seq_len = 512; /* room for the tools prompt */
    if (d)
        c.d_model = d;
    CHECK(san_model_create(m, &c) == 0);
    san_model_init_random(m, seed);
    nd_rng r;
    nd_rng_seed(&r, seed + 1);
    for (size_t i = 0; i < m->numel; i++)
        m->mem[i] += (float)(0.05 * nd_rng_normal(&r));
}

/* An adapter with A and B both random (B = 0 would merge to nothing). */
static void random_adapter(const san_model *m, const char *path, uint64_t seed)
{
    san_lora lo;
    CHECK(san_lora_create(&lo, m, 4, 8.0f) == 0);
    nd_rng r;
    nd_rng_seed(&r, seed);
    for (size_t i = 0; i < lo.numel; i++)
        lo.mem[i] = (float)(0.1 * nd_rng_normal(&r));
    CHECK_MSG(san_lora_save(&lo, path, NULL) == 0, "%s", nd_last_error());
    san_lora_free(&lo);
}

/* The calls (type, reasoning) a model answers q with, as JSON text (malloc'd):
 * the envelope's timings differ from run to run. */
static char *answer(needle_model *M, const char *q)
{
    needle_session *s = needle_session_new(M, NULL, tools);
    CHECK_MSG(s != NULL, "%s", needle_thread_error());
    if (!s)
        return NULL;
    needle_session_require_call(s, 1); /* a random model would answer [] every time */
    static char env[1 << 16];
    int n = needle_session_complete(s, q, 48, env, (int)sizeof env);
    CHECK_MSG(n >= 0, "%s", needle_session_error(s));
    needle_session_free(s);
    nd_pj_doc *doc = NULL;
    if (n < 0 || nd_pj_parse(env, (size_t)n, &doc, NULL))
        return NULL;
    nd_buf b = {0};
    const nd_pj *root = nd_pj_root(doc), *calls = nd_pj_get(root, "function_calls"),
                *type = nd_pj_get(root, "type"), *why = nd_pj_get(root, "reasoning");
    CHECK(calls && type);
    if (calls && type) {
        nd_pj_dump(type, 1, &b);
        nd_pj_dump(calls, 1, &b);
        if (why)
            nd_pj_dump(why, 1, &b);
    }
    nd_pj_free(doc);
    return b.p;
}

/* every tensor bit for bit (the buffer may have gaps between tensors) */
static int same_weights(const san_model *a, const san_model *b)
{
    if (a->n_tensors != b->n_tensors)
        return 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const san_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (x->numel != y->numel ||
            memcmp(a->mem + x->offset, b->mem + y->offset, x->numel * sizeof(float)))
            return 0;
    }
    return 1;
}

static int error_names(const char *file)
{
    const char *e = nd_last_error();
    int ok = strstr(e, file) != NULL;
    if (!ok)
        fprintf(stderr, "error does not name %s: %s\n", file, e);
    return ok;
}

int main(void)
{
    char dir[] = "/tmp/needle_engine_ckpt_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char ck[256], ad[256], ck_dq[256], ad_other[256];
    snprintf(ck, sizeof ck, "%s/base.pkl", dir);
    snprintf(ad, sizeof ad, "%s/adapter.pkl", dir);
    snprintf(ck_dq, sizeof ck_dq, "%s/dequantised.pkl", dir);
    snprintf(ad_other, sizeof ad_other, "%s/other_adapter.pkl", dir);
    nd_backend_cpu(2);

    san_model src;
    random_model(&src, "tiny", 0, 7);
    CHECK_MSG(ckpt_save(ck, &src, NULL) == 0, "%s", nd_last_error());
    random_adapter(&src, ad, 21);

    /* 1. the weights it runs: the checkpoint's, the adapter merged as build merges */
    needle_model *M = nd_model_from_checkpoint(ck, NULL, TOK);
    CHECK_MSG(M != NULL, "%s", nd_last_error());
    const san_model *w = M ? nd_model_weights(M) : NULL;
    CHECK(w && same_weights(w, &src));

    needle_model *ML = nd_model_from_checkpoint(ck, ad, TOK);
    CHECK_MSG(ML != NULL, "%s", nd_last_error());
    san_model ref;
    pv *root = NULL;
    CHECK(ckpt_load(ck, &ref, &root) == 0);
    lora_merge_info li;
    CHECK(lora_merge_file(&ref, pv_dict_get(root, "params"), ad, &li) == 0 && li.merged > 0);
    const san_model *wl = ML ? nd_model_weights(ML) : NULL;
    CHECK(wl && same_weights(wl, &ref));
    CHECK(wl && !same_weights(wl, &src)); /* the adapter did something */
    pv_decref(root);
    san_model_free(&ref);

    /* 2. not the archive's weights: a 4-bit archive of the same model differs */
    size_t alen = 0;
    nd_tokenizer *tok = NULL;
    CHECK(nd_tokenizer_load(TOK, &tok) == 0);
    unsigned char *arch = tu_archive(&src, tok, 4, 0, &alen);
    if (!arch)
        return tu_finish("test_engine_checkpoint");
    cact_file f;
    san_model dq;
    CHECK(cact_parse(arch, alen, &f) == 0);
    CHECK(nd_cact_to_model(&f, &dq) == 0);
    CHECK(!same_weights(&dq, &src));

    /* 3. over the same float weights, the same answers as the archive's float
     * path: the dequantised weights saved as a checkpoint */
    CHECK(ckpt_save(ck_dq, &dq, NULL) == 0);
    needle_model *MD = nd_model_from_checkpoint(ck_dq, NULL, TOK);
    CHECK_MSG(MD != NULL, "%s", nd_last_error());
    setenv("NEEDLE_FLOAT", "1", 1);
    needle_model *MA = needle_model_load_buffer(arch, alen);
    unsetenv("NEEDLE_FLOAT");
    CHECK_MSG(MA != NULL, "%s", needle_thread_error());
    int differ = 0;
    for (size_t i = 0; MD && MA && i < sizeof queries / sizeof *queries; i++) {
        char *a = answer(MD, queries[i]), *b = answer(MA, queries[i]), *c = answer(M, queries[i]);
        CHECK(a && b && c);
        if (a && b)
            CHECK_MSG(!strcmp(a, b), "query %zu: checkpoint %s, archive (float) %s", i, a, b);
        differ += a && c && strcmp(a, c);
        free(a);
        free(b);
        free(c);
    }
    printf("answers of the original vs the dequantised weights differ on %d of %zu queries\n",
           differ, sizeof queries / sizeof *queries);
    /* else the equality above would say nothing: the answers follow the weights */
    CHECK(differ > 0);

    /* 4. bad input names the file at fault */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.pkl", dir);
    CHECK(nd_model_from_checkpoint(missing, NULL, TOK) == NULL && error_names("missing.pkl"));
    CHECK(nd_model_from_checkpoint(ck, NULL, "/nonexistent/tok.model") == NULL &&
          error_names("/nonexistent/tok.model"));
    san_model other;
    random_model(&other, "tiny", 128, 3); /* another width */
    random_adapter(&other, ad_other, 5);
    CHECK(nd_model_from_checkpoint(ck, ad_other, TOK) == NULL && error_names("other_adapter.pkl"));
    san_model_free(&other);

    needle_model_free(M);
    needle_model_free(ML);
    needle_model_free(MD);
    needle_model_free(MA);
    cact_free(&f);
    san_model_free(&dq);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    free(arch);
    unlink(ck);
    unlink(ad);
    unlink(ck_dq);
    unlink(ad_other);
    rmdir(dir);
    return tu_finish("test_engine_checkpoint");
}
