/* Prefix KV cache (issue 14): a session whose system + tools prefix was
 * seen before on the same model restores the prefix's KV rows instead of
 * running it; everything it computes afterwards is bit-identical to a run
 * without the cache; a different tool set misses; the LRU evicts; sessions
 * on several threads share the cache safely. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"

static const char *TOOLS[3] = {
    "[{\"name\": \"set_timer\", \"description\": \"start a timer\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"minutes\": {\"type\": \"integer\"}}, \"required\": "
    "[\"minutes\"]}}]",
    "[{\"name\": \"lights\", \"description\": \"switch lights\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"on\": {\"type\": \"boolean\"}}, \"required\": [\"on\"]}}]",
    "[{\"name\": \"weather\", \"description\": \"forecast for a city\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
    "[\"city\"]}}]"};
static const char *SYSTEM = "You are a home assistant.";
static const char *QUERY = "set a timer for ten minutes";

/* a session's whole KV state (every row it holds) and its envelope */
typedef struct {
    nd_kv_snap rows;
    char env[4096];
    int prefix;
} outcome;

static void run_session(needle_model *M, const char *tools, outcome *o)
{
    memset(o, 0, sizeof *o);
    needle_session *S = needle_session_new(M, SYSTEM, tools);
    CHECK_MSG(S, "%s", needle_thread_error());
    if (!S)
        return;
    o->prefix = needle_session_context_tokens(S);
    int rc = needle_session_complete(S, QUERY, 24, o->env, (int)sizeof o->env);
    CHECK_MSG(rc > 0, "complete: %s", needle_session_error(S));
    char *timing = strstr(o->env, ", \"prefill_tps\""); /* speeds differ run to run */
    if (timing)
        *timing = 0;
    const nd_kv_state *kv = nd_session_kv(S);
    CHECK(nd_kv_snapshot(kv, kv->len, &o->rows) == 0);
    needle_session_free(S);
}

static int same(const outcome *a, const outcome *b)
{
    return a->prefix == b->prefix && !strcmp(a->env, b->env) && a->rows.len == b->rows.len &&
           a->rows.bytes == b->rows.bytes && !memcmp(a->rows.data, b->rows.data, a->rows.bytes);
}

typedef struct {
    needle_model *M;
    outcome out;
} thread_job;

static void *thread_main(void *p)
{
    thread_job *j = p;
    run_session(j->M, TOOLS[0], &j->out);
    return NULL;
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_prefix_cache: %s\n", nd_last_error());
        return 1;
    }
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 256;
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 3);
    nd_rng r;
    nd_rng_seed(&r, 5);
    for (size_t i = 0; i < src.numel; i++)
        src.mem[i] += (float)(0.05 * nd_rng_normal(&r));
    size_t len = 0;
    unsigned char *arch = tu_archive(&src, tok, 4, 0, &len);
    needle_model *M = needle_model_load_buffer(arch, len);
    CHECK_MSG(M, "%s", needle_thread_error());
    if (!M)
        return tu_finish("test_prefix_cache");

    /* without the cache: the reference */
    nd_prefix_cache_limit(M, 0);
    outcome ref, got;
    run_session(M, TOOLS[0], &ref);
    nd_prefix_cache_stats st = nd_prefix_cache_get_stats(M);
    CHECK(st.entries == 0 && st.hits == 0 && st.misses == 0);

    /* first session fills the cache, the second restores from it */
    nd_prefix_cache_limit(M, 2);
    run_session(M, TOOLS[0], &got);
    CHECK_MSG(same(&ref, &got), "miss path differs from the uncached run");
    nd_kv_snap_free(&got.rows);
    st = nd_prefix_cache_get_stats(M);
    CHECK(st.entries == 1 && st.misses == 1 && st.hits == 0 && st.bytes > 0);
    run_session(M, TOOLS[0], &got);
    st = nd_prefix_cache_get_stats(M);
    CHECK_MSG(st.hits == 1, "a repeated tool set must hit (hits %ld)", st.hits);
    CHECK_MSG(same(&ref, &got), "restored prefix changes the answer or the KV rows");
    nd_kv_snap_free(&got.rows);

    /* another tool set misses; a third evicts the least recently used */
    run_session(M, TOOLS[1], &got);
    nd_kv_snap_free(&got.rows);
    st = nd_prefix_cache_get_stats(M);
    CHECK(st.misses == 2 && st.entries == 2);
    run_session(M, TOOLS[2], &got); /* evicts TOOLS[0] (used before TOOLS[1]) */
    nd_kv_snap_free(&got.rows);
    st = nd_prefix_cache_get_stats(M);
    CHECK(st.misses == 3 && st.entries == 2);
    run_session(M, TOOLS[1], &got);
    nd_kv_snap_free(&got.rows);
    CHECK(nd_prefix_cache_get_stats(M).hits == st.hits + 1);
    run_session(M, TOOLS[0], &got);
    CHECK_MSG(nd_prefix_cache_get_stats(M).misses == st.misses + 1, "evicted entry still hit");
    CHECK(same(&ref, &got));
    nd_kv_snap_free(&got.rows);

    /* a session lends its prefix rows: no copy while it is the only user,
     * the copy when a second session asks (that session's answer and rows
     * as without the cache), the cache keeps it after both are freed */
    nd_prefix_cache_limit(M, 0);
    nd_prefix_cache_limit(M, 2);
    needle_session *A = needle_session_new(M, SYSTEM, TOOLS[0]);
    CHECK_MSG(A, "%s", needle_thread_error());
    st = nd_prefix_cache_get_stats(M);
    CHECK_MSG(st.entries == 1 && st.bytes == 0, "one session: %d entries, %zu bytes copied",
              st.entries, st.bytes);
    long hits0 = st.hits;
    run_session(M, TOOLS[0], &got);
    st = nd_prefix_cache_get_stats(M);
    CHECK_MSG(st.hits == hits0 + 1 && st.bytes > 0, "second session: %ld hits, %zu bytes",
              st.hits - hits0, st.bytes);
    CHECK_MSG(same(&ref, &got), "a prefix copied from a live session changes the answer");
    nd_kv_snap_free(&got.rows);
    if (A) { /* the lender's own turn is unchanged by the copy */
        outcome a = {0};
        a.prefix = needle_session_context_tokens(A);
        CHECK(needle_session_complete(A, QUERY, 24, a.env, (int)sizeof a.env) > 0);
        char *timing = strstr(a.env, ", \"prefill_tps\"");
        if (timing)
            *timing = 0;
        CHECK(nd_kv_snapshot(nd_session_kv(A), nd_session_kv(A)->len, &a.rows) == 0);
        CHECK_MSG(same(&ref, &a), "the lending session's turn differs");
        nd_kv_snap_free(&a.rows);
    }
    needle_session_free(A);
    /* a lender freed before anyone asked leaves its copy behind */
    nd_prefix_cache_limit(M, 0);
    nd_prefix_cache_limit(M, 2);
    A = needle_session_new(M, SYSTEM, TOOLS[0]);
    CHECK(nd_prefix_cache_get_stats(M).bytes == 0);
    needle_session_free(A);
    st = nd_prefix_cache_get_stats(M);
    CHECK_MSG(st.entries == 1 && st.bytes > 0, "freed lender: %d entries, %zu bytes", st.entries,
              st.bytes);
    run_session(M, TOOLS[0], &got);
    CHECK(nd_prefix_cache_get_stats(M).hits == st.hits + 1);
    CHECK(same(&ref, &got));
    nd_kv_snap_free(&got.rows);

    /* sessions on four threads at once (TSan in CI): same results */
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].M = M;
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(same(&ref, &jobs[i].out), "thread %d differs", i);
        nd_kv_snap_free(&jobs[i].out.rows);
    }
    st = nd_prefix_cache_get_stats(M);
    printf("prefix cache: %d entries, %zu bytes, %ld hits, %ld misses\n", st.entries, st.bytes,
           st.hits, st.misses);

    nd_kv_snap_free(&ref.rows);
    needle_model_free(M);
    free(arch);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_prefix_cache");
}
