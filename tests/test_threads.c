/* The engine and the C ABI on several threads (run under ThreadSanitizer by
 * `make tsan-check`; a plain test elsewhere):
 *
 * 1. handle API: two models loaded concurrently, four sessions (two per
 *    model, the model shared) completing on four threads; every envelope
 *    equals the one the same query gives single-threaded.
 * 2. upstream ABI: threads calling needle_complete / needle_last_error /
 *    needle_reset while another thread reloads (needle_load + needle_init)
 *    the global model; every call returns a result or a clean error with
 *    an envelope, never a crash or a torn state. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"

static const char *TOOLS =
    "[{\"name\": \"set_timer\", \"description\": \"Start a timer\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"minutes\": {\"type\": \"integer\", \"minimum\": "
    "1, \"maximum\": 60}}, \"required\": [\"minutes\"]}}, {\"name\": \"lights\", "
    "\"description\": \"Lights on or off\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"on\": {\"type\": \"boolean\"}}, \"required\": [\"on\"]}}]";
static const char *QUERIES[] = {"set a timer for five minutes", "turn the lights off",
                                "what's the weather"};
#define NQ 3
#define MAX_NEW 12
#define ENV_CAP 65536

static unsigned char *arch[2];
static size_t arch_len[2];
/* reference envelopes (timing fields cut off) per model and query */
static char ref[2][NQ][ENV_CAP];

static unsigned char *make_archive(uint64_t seed, size_t *len)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_threads: %s\n", nd_last_error());
        exit(1);
    }
    san_config c;
    san_config_preset(&c, "tiny");
    c.max_seq_len = 512;
    san_model m;
    CHECK(san_model_create(&m, &c) == 0);
    san_model_init_random(&m, seed);
    unsigned char *buf = tu_archive(&m, tok, 4, san_effective_kv_window(&m.cfg), len);
    san_model_free(&m);
    nd_tokenizer_free(tok);
    return buf;
}

/* the envelope without prefill_tps / decode_tps / peak_ram_mb */
static void strip_timing(char *env)
{
    char *p = strstr(env, ", \"prefill_tps\"");
    if (p)
        *p = 0;
}

typedef struct {
    needle_model **model; /* shared; loaded by thread `loader` */
    int which, loader, failures;
    pthread_barrier_t *bar;
} sess_arg;

static void *session_thread(void *p)
{
    sess_arg *a = p;
    if (a->loader) {
        *a->model = needle_model_load_buffer(arch[a->which], arch_len[a->which]);
        if (!*a->model)
            a->failures++;
    }
    pthread_barrier_wait(a->bar);
    if (!*a->model)
        return NULL;
    needle_session *s = needle_session_new(*a->model, NULL, TOOLS);
    if (!s) {
        a->failures++;
        return NULL;
    }
    char *buf = malloc(ENV_CAP);
    for (int round = 0; round < 2 && buf; round++)
        for (int q = 0; q < NQ; q++) {
            int qi = (q + a->loader + round) % NQ;
            needle_session_reset(s);
            int n = needle_session_complete(s, QUERIES[qi], MAX_NEW, buf, ENV_CAP);
            if (n < 0) {
                a->failures++;
                continue;
            }
            strip_timing(buf);
            if (strcmp(buf, ref[a->which][qi])) {
                fprintf(stderr, "thread envelope differs:\n  %s\n  %s\n", buf, ref[a->which][qi]);
                a->failures++;
            }
        }
    free(buf);
    needle_session_free(s);
    return NULL;
}

typedef struct {
    int id, ok, estate, bad;
    int *stop;
} abi_arg;

static void *abi_complete_thread(void *p)
{
    abi_arg *a = p;
    char *buf = malloc(ENV_CAP);
    /* until the reloads are over and this thread has had 3 good turns */
    for (int i = 0; i < 5000 && (a->ok < 3 || !__atomic_load_n(a->stop, __ATOMIC_SEQ_CST)); i++) {
        int rc = needle_complete(QUERIES[(a->id + i) % NQ], MAX_NEW, buf, ENV_CAP);
        const char *err = needle_last_error();
        (void)err;
        if (rc >= 0 && strstr(buf, "\"success\": true"))
            a->ok++;
        else if ((rc == NEEDLE_ESTATE || rc == NEEDLE_ELIMIT) && strstr(buf, "\"success\": false"))
            a->estate++; /* between a reload and its init; context full of others' turns */
        else {
            fprintf(stderr, "abi thread %d: rc %d: %.200s\n", a->id, rc, buf);
            a->bad++;
        }
        needle_reset();
        if (rc < 0)
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    free(buf);
    return NULL;
}

int main(void)
{
    arch[0] = make_archive(1, &arch_len[0]);
    arch[1] = make_archive(2, &arch_len[1]);

    /* single-threaded references */
    char *buf = malloc(ENV_CAP);
    for (int w = 0; w < 2; w++) {
        needle_model *m = needle_model_load_buffer(arch[w], arch_len[w]);
        CHECK_MSG(m != NULL, "%s", needle_thread_error());
        needle_session *s = m ? needle_session_new(m, NULL, TOOLS) : NULL;
        CHECK_MSG(s != NULL, "%s", needle_thread_error());
        for (int q = 0; s && q < NQ; q++) {
            needle_session_reset(s);
            int n = needle_session_complete(s, QUERIES[q], MAX_NEW, ref[w][q], ENV_CAP);
            CHECK_MSG(n > 0, "%s", needle_session_error(s));
            strip_timing(ref[w][q]);
        }
        needle_session_free(s);
        needle_model_free(m);
    }

    /* 1. handle API: 2 models x 2 sessions, 4 threads */
    needle_model *models[2] = {NULL, NULL};
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 4);
    pthread_t th[4];
    sess_arg sa[4];
    for (int i = 0; i < 4; i++) {
        sa[i] = (sess_arg){.model = &models[i % 2], .which = i % 2, .loader = i < 2, .bar = &bar};
        pthread_create(&th[i], NULL, session_thread, &sa[i]);
    }
    int fails = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        fails += sa[i].failures;
    }
    CHECK_MSG(fails == 0, "%d session-thread failures", fails);
    pthread_barrier_destroy(&bar);
    needle_model_free(models[0]);
    needle_model_free(models[1]);

    /* 2. upstream ABI: completes on 3 threads while the main thread reloads */
    CHECK(needle_load(arch[0], arch_len[0]) == 0);
    CHECK(needle_init(NULL, TOOLS, NULL) > 0);
    int stop = 0;
    abi_arg aa[3];
    pthread_t at[3];
    for (int i = 0; i < 3; i++) {
        aa[i] = (abi_arg){.id = i, .stop = &stop};
        pthread_create(&at[i], NULL, abi_complete_thread, &aa[i]);
    }
    for (int r = 0; r < 4; r++) {
        int w = (r + 1) % 2;
        CHECK_MSG(needle_load(arch[w], arch_len[w]) == 0, "%s", needle_last_error());
        CHECK_MSG(needle_init(NULL, TOOLS, NULL) > 0, "%s", needle_last_error());
        /* a failed reload keeps the loaded model */
        CHECK(needle_load((const unsigned char *)"garbage", 7) != 0);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
    int ok = 0, bad = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(at[i], NULL);
        ok += aa[i].ok;
        bad += aa[i].bad;
    }
    CHECK_MSG(bad == 0 && ok > 0, "ABI threads: %d ok, %d bad", ok, bad);
    CHECK(needle_complete("turn the lights off", MAX_NEW, buf, ENV_CAP) > 0);
    int waits = aa[0].estate + aa[1].estate + aa[2].estate;
    printf("test_threads: handle API 4 threads x %d completes; ABI %d completes (%d clean "
           "refusals) around 4 reloads\n",
           2 * NQ, ok, waits);
    free(buf);
    free(arch[0]);
    free(arch[1]);
    return tu_finish("test_threads");
}
