/* Sliding KV window (issue 14 part C): a conversation far longer than
 * max_seq_len keeps answering with valid envelopes, the system + tools
 * prefix (the sinks) is never evicted, the session's memory stays flat once
 * the window is full; the int8 KV cache stays close to the float one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"
#include "text/pyjson.h"

static const char *TOOLS = "[{\"name\": \"set_timer\", \"description\": \"start a timer\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"minutes\": "
                           "{\"type\": \"integer\"}}, \"required\": [\"minutes\"]}}, "
                           "{\"name\": \"lights\", \"description\": \"switch lights\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"on\": "
                           "{\"type\": \"boolean\"}}, \"required\": [\"on\"]}}]";

/* 1 when env is a well-formed envelope: success with calls naming declared
 * tools (or a text answer), or the budget ran out */
static int valid_envelope(const char *env)
{
    nd_pj_doc *doc = NULL;
    if (nd_pj_parse(env, strlen(env), &doc, NULL))
        return 0;
    const nd_pj *root = nd_pj_root(doc), *ok = nd_pj_get(root, "success");
    const nd_pj *calls = nd_pj_get(root, "function_calls"), *code = nd_pj_get(root, "error_code");
    int good = 0;
    if (ok && nd_pj_truthy(ok) && calls && calls->type == ND_PJ_ARRAY) {
        good = 1;
        for (size_t i = 0; i < calls->len; i++) {
            const nd_pj *name = nd_pj_get(calls->items[i], "name");
            if (!name || !name->str ||
                (strcmp(name->str, "set_timer") && strcmp(name->str, "lights")))
                good = 0;
        }
    } else if (code && code->str && !strcmp(code->str, "max_new_tokens")) {
        good = 1;
    }
    nd_pj_free(doc);
    return good;
}

/* the conversation test on one loaded archive */
static void long_conversation(const unsigned char *arch, size_t len, const char *what)
{
    needle_model *M = needle_model_load_buffer(arch, len);
    CHECK_MSG(M, "%s: %s", what, needle_thread_error());
    if (!M)
        return;
    needle_session *S = needle_session_new(M, "You are a home assistant.", TOOLS);
    CHECK_MSG(S, "%s: %s", what, needle_thread_error());
    if (!S) {
        needle_model_free(M);
        return;
    }
    const nd_kv_state *kv = nd_session_kv(S);
    int P = needle_session_context_tokens(S), max_len = needle_model_max_seq_len(M);
    CHECK(P > 0 && P == kv->n_sink && P + 16 < max_len);
    int32_t *sinks = malloc((size_t)P * sizeof *sinks);
    memcpy(sinks, kv->tokens, (size_t)P * sizeof *sinks);
    /* The cache's resident rows (the engine's accounting: rows ever used)
     * grow until the window has slid a few times, then never move: the
     * last 100 of 150 turns must all account the same bytes, and no turn
     * may exceed the stated bound or shrink. */
    long long bound = needle_session_memory_bound(S), flat = -1, last = -1;
    int turns = 150, bad = 0, sink_bad = 0, mem_moved = 0, over = 0, shrank = 0;
    char buf[8192];
    const char *texts[] = {"set a timer for ten minutes", "turn the lights on",
                           "what time is it in the kitchen and the hall right now", "thanks"};
    for (int t = 0; t < turns; t++) {
        int rc = needle_session_complete(S, texts[t % 4], 40, buf, (int)sizeof buf);
        if (rc <= 0 || !valid_envelope(buf)) {
            if (bad++ < 3)
                fprintf(stderr, "%s turn %d: rc %d %s (%s)\n", what, t, rc, buf,
                        needle_session_error(S));
        }
        if (memcmp(kv->tokens, sinks, (size_t)P * sizeof *sinks) || kv->n_sink != P)
            sink_bad++;
        long long mem = needle_session_memory_bytes(S);
        if (mem > bound)
            over++;
        shrank += mem < last;
        last = mem;
        if (t >= turns - 100) {
            if (flat < 0)
                flat = mem;
            else if (mem != flat)
                mem_moved++;
        }
        CHECK(kv->len <= max_len);
    }
    long seen = kv->evicted + kv->len;
    printf("%s: %d turns, %ld positions seen (max_seq_len %d, kv_window %d, %d sinks), %ld "
           "evicted, memory %lld bytes flat (bound %lld; cache %d rows = %zu bytes, int8 %d)\n",
           what, turns, seen, max_len, kv->kv_window, P, kv->evicted, flat, bound, kv->rows_hw,
           nd_kv_bytes(kv) - kv->scratch_bytes, kv->kv_int8);
    CHECK_MSG(bad == 0, "%s: %d turns without a valid envelope", what, bad);
    CHECK_MSG(sink_bad == 0, "%s: sinks changed on %d turns", what, sink_bad);
    CHECK_MSG(seen > 5L * max_len, "%s: only %ld positions seen", what, seen);
    CHECK_MSG(kv->evicted > 0 && flat > 0 && mem_moved == 0,
              "%s: memory moved on %d of the last 100 turns", what, mem_moved);
    CHECK_MSG(shrank == 0, "%s: memory accounting shrank on %d turns", what, shrank);
    CHECK_MSG(over == 0, "%s: memory over its stated bound on %d turns", what, over);
    /* with a kv_window the cache holds the sinks, the window and one batch
     * of new rows (ND_KV_SLIDE_ROWS, whatever the session's chunk): no
     * second batch of slack */
    if (kv->kv_window)
        CHECK_MSG(kv->rows_hw <= P + kv->kv_window + ND_KV_SLIDE_ROWS,
                  "%s: %d rows held for %d sinks + %d", what, kv->rows_hw, P, kv->kv_window);
    /* reset goes back to the sinks; the session answers again */
    CHECK(needle_session_reset(S) == 0 && kv->len == P && kv->evicted == 0);
    CHECK(needle_session_complete(S, "turn the lights off", 40, buf, (int)sizeof buf) > 0 &&
          valid_envelope(buf));
    free(sinks);
    needle_session_free(S);
    needle_model_free(M);
}

/* Eviction changes nothing a query sees: a state that slides (one token
 * per step, so its high mark is low and rows are dropped often) gives the
 * same logits as one that keeps every row (chunk and slide batch =
 * max_seq_len: it never needs to drop) under the same sink + window mask. */
static void eviction_exact(const san_model *m, const nd_backend *be)
{
    int V = m->dims.V, T = m->cfg.max_seq_len - 8, P = 20, W = 300;
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    nd_rng r;
    nd_rng_seed(&r, 5);
    for (int t = 0; t < T; t++)
        tok[t] = 3 + (int)(nd_rng_next(&r) % (uint64_t)(V - 3));
    nd_kv_state keep, slide;
    CHECK(nd_kv_init(&keep, m, be, m->cfg.max_seq_len, W) == 0);
    keep.slide_rows = m->cfg.max_seq_len; /* a batch as large as the chunk */
    CHECK(nd_kv_init(&slide, m, be, 1, W) == 0);
    nd_kv_slide(&keep, P);
    nd_kv_slide(&slide, P);
    float *lk = malloc((size_t)T * V * sizeof *lk), *ls = malloc((size_t)V * sizeof *ls);
    CHECK(nd_kv_forward(&keep, tok, T, lk, 1) == 0);
    CHECK(keep.evicted == 0);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        CHECK(nd_kv_forward(&slide, tok + t, 1, ls, 0) == 0);
        double e = tu_rel_err(ls, lk + (size_t)t * V, V, 1e-3);
        worst = e > worst ? e : worst;
    }
    printf("eviction: %ld rows dropped, %d kept; logits vs the full cache rel err %.3g\n",
           slide.evicted, slide.len, worst);
    CHECK(slide.evicted > 100);
    CHECK(!memcmp(slide.tokens, tok, (size_t)P * sizeof *tok));
    CHECK_MSG(worst < 1e-4, "sliding cache vs full cache rel err %g", worst);
    nd_kv_free(&keep);
    nd_kv_free(&slide);
    free(lk);
    free(ls);
    free(tok);
}

/* int8 vs float KV cache on the same weights: logits and greedy tokens */
static void int8_accuracy(const san_model *m, const nd_tokenizer *tok, const nd_backend *be)
{
    const char *prompts[] = {
        "<|im_start|>user\nset a timer for ten minutes please<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nlights on<|im_end|>\n",
        "what is the weather like in Paris tomorrow morning, and should I take an umbrella?"};
    int V = m->dims.V;
    double worst = 0;
    int agree = 0, total = 0;
    for (int p = 0; p < 3; p++) {
        nd_idvec ids = {0};
        nd_idvec_push(&ids, 2);
        CHECK(nd_tokenizer_encode(tok, prompts[p], strlen(prompts[p]), &ids) == 0);
        int T = (int)ids.n;
        float *lf = malloc((size_t)T * V * sizeof *lf), *lq = malloc((size_t)T * V * sizeof *lq);
        nd_kv_state sf, sq;
        CHECK(nd_kv_init(&sf, m, be, 16, 0) == 0 && nd_kv_init(&sq, m, be, 16, 0) == 0);
        nd_kv_set_bits(&sq, 8);
        CHECK(sq.kv_int8 == 1 && sf.kv_int8 == 0);
        CHECK(nd_kv_forward(&sf, ids.v, T, lf, 1) == 0);
        CHECK(nd_kv_forward(&sq, ids.v, T, lq, 1) == 0);
        for (int t = 0; t < T; t++) {
            double e = tu_rel_err(lq + (size_t)t * V, lf + (size_t)t * V, V, 1e-3);
            worst = e > worst ? e : worst;
            int af = 0, aq = 0;
            for (int i = 1; i < V; i++) {
                af = lf[(size_t)t * V + i] > lf[(size_t)t * V + af] ? i : af;
                aq = lq[(size_t)t * V + i] > lq[(size_t)t * V + aq] ? i : aq;
            }
            agree += af == aq;
            total++;
        }
        CHECK(nd_kv_bytes(&sq) < nd_kv_bytes(&sf));
        nd_kv_free(&sf);
        nd_kv_free(&sq);
        free(lf);
        free(lq);
        nd_idvec_free(&ids);
    }
    printf("int8 KV vs float KV: logits rel err %.3g (worst row), greedy agreement %d/%d\n", worst,
           agree, total);
    CHECK_MSG(worst < 0.05, "int8 KV logits rel err %g", worst);
    CHECK_MSG(agree >= total * 95 / 100, "int8 KV greedy agreement %d/%d", agree, total);
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_window: %s\n", nd_last_error());
        return 1;
    }
    const nd_backend *be = nd_backend_cpu(2);
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 256;
    c.max_seq_len = 512; /* room for a window smaller than the context */
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 7);
    nd_rng r;
    nd_rng_seed(&r, 11);
    for (size_t i = 0; i < src.numel; i++)
        src.mem[i] += (float)(0.05 * nd_rng_normal(&r));

    /* kv_bits 8 (the default header) with a 64-key window, and the same
     * with no window (slides at max_seq_len) */
    size_t len;
    unsigned char *arch = tu_archive(&src, tok, 4, 64, &len);
    long_conversation(arch, len, "kv_window 64");
    free(arch);
    arch = tu_archive(&src, tok, 4, 0, &len);
    long_conversation(arch, len, "kv_window 0");

    cact_file f;
    CHECK(cact_parse(arch, len, &f) == 0);
    san_model m;
    CHECK(nd_cact_to_model(&f, &m) == 0);
    int8_accuracy(&m, tok, be);
    eviction_exact(&m, be);
    san_model_free(&m);
    cact_free(&f);
    free(arch);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_window");
}
