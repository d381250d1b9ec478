/* The quantised engine at two threads: each nd_kv_forward call (a prompt
 * chunk, a decode step) forks one team, the crew (nd_crew_run), and hands
 * its parallel calls (the projections, the attention, the logits; in a
 * prompt chunk every per-row operation too) to it instead of forking per
 * call; a call told to back off (crew_off_until: an earlier crew's helper
 * was late) forks nothing; the logits are bit-for-bit those of one thread
 * either way. A needle2-layout model at a test's size (d 256: its
 * q/k/v/gate product and the logits are big enough to be shared), 2 and 4
 * bits, int8 KV cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "model/params.h"
#include "testutil.h"

#define PROMPT 100 /* two chunks of 64 and 36 */
#define STEPS 40   /* decode steps: past 128 positions, where the attention is shared */

typedef struct {
    float *logits; /* (1 + STEPS) rows of V */
    long forks[1 + STEPS], handoffs[1 + STEPS];
} run_out;

static void run(const san_model *mq, const nd_qweights *qw, const int32_t *toks, int threads,
                run_out *o)
{
    nd_set_threads(threads);
    const nd_backend *be = nd_backend_cpu(0);
    int V = mq->dims.V;
    nd_kv_state s;
    CHECK(nd_kv_init(&s, mq, be, 64, 0) == 0);
    nd_kv_use_quant(&s, qw);
    nd_kv_set_bits(&s, 8);
    for (int i = 0; i <= STEPS; i++) {
        long f0, h0, f1, h1;
        /* a busy machine's late helpers make the engine skip crews a while
         * (crew_off_until): each call here asks for one; the last step is
         * told to skip (it then runs on this thread alone) */
        s.crew_off_until = i == STEPS - 1 ? nd_wtime() + 100.0 : 0.0;
        nd_parallel_counts(&f0, &h0);
        const int32_t *t = i == 0 ? toks : toks + PROMPT + i - 1;
        int rc = nd_kv_forward(&s, t, i == 0 ? PROMPT : 1, o->logits + (size_t)i * V, 0);
        CHECK_MSG(rc == 0, "forward %d: %s", i, nd_last_error());
        nd_parallel_counts(&f1, &h1);
        o->forks[i] = f1 - f0;
        o->handoffs[i] = h1 - h0;
    }
    nd_kv_free(&s);
}

static void run_bits(const san_model *src, const nd_tokenizer *tok, int bits)
{
    size_t len = 0;
    unsigned char *arch = tu_archive(src, tok, bits, 0, &len);
    if (!arch)
        return;
    cact_file f;
    CHECK(cact_parse(arch, len, &f) == 0);
    san_model mq;
    nd_qweights qw;
    CHECK_MSG(nd_cact_to_qmodel(&f, &mq, &qw) == 0, "%s", nd_last_error());
    int V = mq.dims.V, L = mq.dims.L;
    int32_t toks[PROMPT + STEPS];
    unsigned x = 12345u + (unsigned)bits;
    for (int i = 0; i < PROMPT + STEPS; i++) {
        x = x * 1103515245u + 12345u;
        toks[i] = (int32_t)((x >> 8) % (unsigned)V);
    }
    run_out one = {0}, two = {0};
    one.logits = malloc(sizeof(float) * (size_t)V * (1 + STEPS));
    two.logits = malloc(sizeof(float) * (size_t)V * (1 + STEPS));
    run(&mq, &qw, toks, 1, &one);
    run(&mq, &qw, toks, 2, &two);
    int same = 1, first = -1;
    for (int i = 0; i <= STEPS && same; i++)
        if (memcmp(one.logits + (size_t)i * V, two.logits + (size_t)i * V, sizeof(float) * V)) {
            same = 0;
            first = i;
        }
    CHECK_MSG(same, "%d-bit: logits at 2 threads differ from 1 thread's from call %d", bits, first);
    int ok1 = 1, ok2 = 1;
    for (int i = 0; i <= STEPS; i++) {
        ok1 &= one.forks[i] == 0 && one.handoffs[i] == 0;
        /* one fork per call; a decode step hands over at least each
         * layer's q/k/v/gate product and the logits, a prompt's two
         * chunks ~20 calls per layer */
        long want = i == 0 ? 2L * 10 * L : L + 1;
        if (i == STEPS - 1) /* backing off: no fork, no handoff */
            ok2 &= two.forks[i] == 0 && two.handoffs[i] == 0;
        else
            ok2 &= two.forks[i] == 1 && two.handoffs[i] >= want;
    }
    printf("  %d-bit, 2 threads: prompt %ld fork(s), %ld handoffs; decode step %ld fork(s), %ld "
           "(first) .. %ld (last) handoffs\n",
           bits, two.forks[0], two.handoffs[0], two.forks[1], two.handoffs[1], two.handoffs[STEPS]);
    CHECK_MSG(ok1, "%d-bit: one thread forked or handed over", bits);
    CHECK_MSG(ok2, "%d-bit: a call at 2 threads did not run on one crew", bits);
    /* past 128 positions a decode step shares its attention too */
    CHECK(two.handoffs[STEPS] >= 2L * L + 1);
    free(one.logits);
    free(two.logits);
    san_model_free(&mq);
    nd_qweights_free(&qw);
    cact_free(&f);
    free(arch);
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_decode_crew: %s\n", nd_last_error());
        return 1;
    }
    san_config c;
    san_config_preset(&c, "needle2");
    c.d_model = c.attn_dim = 256;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.num_layers = 2;
    c.engram_layers[0] = 0;
    c.engram_layers[1] = 1;
    c.engram_slots = 512;
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 7);
    run_bits(&src, tok, 2);
    run_bits(&src, tok, 4);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_decode_crew");
}
