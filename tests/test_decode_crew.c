/* The quantised engine at two threads: each nd_kv_forward call (a prompt
 * chunk, a decode step) forks one team, the crew (nd_crew_run), and hands
 * its parallel calls (the projections, the attention, the logits; in a
 * prompt chunk every per-row operation too) to it instead of forking per
 * call; a call told to back off (crew_off_until: an earlier crew's helper
 * was late) forks nothing; the logits are bit-for-bit those of one thread
 * either way. Two models at a test's size, 2 and 4 bits, int8 KV cache:
 *   - a needle2-layout model (d 256: its q/k/v/gate product and the logits
 *     are big enough to be shared);
 *   - a Needle 3 model (tiny3's layout at d 256: conv taps, local layers
 *     with their rings, a CLA pair, the Hadamard MLP, whose GEMMs and mix
 *     stages a prompt chunk shares; attention3 past 128 positions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "model/cq.h"
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

/* the model at 1 and 2 threads: bit-identical logits, one fork per call
 * at 2 threads (none when told to back off), none at 1 */
static void compare(const char *name, const san_model *mq, const nd_qweights *qw, int bits)
{
    int V = mq->dims.V, L = mq->dims.L;
    int32_t toks[PROMPT + STEPS];
    unsigned x = 12345u + (unsigned)bits;
    for (int i = 0; i < PROMPT + STEPS; i++) {
        x = x * 1103515245u + 12345u;
        toks[i] = (int32_t)((x >> 8) % (unsigned)V);
    }
    run_out one = {0}, two = {0};
    one.logits = malloc(sizeof(float) * (size_t)V * (1 + STEPS));
    two.logits = malloc(sizeof(float) * (size_t)V * (1 + STEPS));
    run(mq, qw, toks, 1, &one);
    run(mq, qw, toks, 2, &two);
    int same = 1, first = -1;
    for (int i = 0; i <= STEPS && same; i++)
        if (memcmp(one.logits + (size_t)i * V, two.logits + (size_t)i * V, sizeof(float) * V)) {
            same = 0;
            first = i;
        }
    CHECK_MSG(same, "%s %d-bit: logits at 2 threads differ from 1 thread's from call %d", name,
              bits, first);
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
    printf("  %s %d-bit, 2 threads: prompt %ld fork(s), %ld handoffs; decode step %ld fork(s), "
           "%ld (first) .. %ld (last) handoffs\n",
           name, bits, two.forks[0], two.handoffs[0], two.forks[1], two.handoffs[1],
           two.handoffs[STEPS]);
    CHECK_MSG(ok1, "%s %d-bit: one thread forked or handed over", name, bits);
    CHECK_MSG(ok2, "%s %d-bit: a call at 2 threads did not run on one crew", name, bits);
    /* past 128 positions a decode step shares its attention too */
    CHECK(two.handoffs[STEPS] >= 2L * L + 1);
    free(one.logits);
    free(two.logits);
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
    compare("needle2", &mq, &qw, bits);
    san_model_free(&mq);
    nd_qweights_free(&qw);
    cact_free(&f);
    free(arch);
}

/* src as a Needle 3 archive of `bits`, run from its CQ matrices */
static void run_bits3(const san_model *src, int bits)
{
    pv *root = ckpt_fresh_tree(src, 3);
    CHECK(root != NULL);
    cact_write_opts o = {0};
    o.bits = bits;
    o.group = CQ_GROUP;
    o.kv_window = cact3_effective_kv_window(&src->cfg);
    unsigned char *arch = NULL;
    size_t len = 0;
    cact_file f;
    int rc = root ? cact_write_mem(src, root, &o, &arch, &len, NULL) : -1;
    CHECK_MSG(rc == 0, "needle3 %d-bit archive: %s", bits, nd_last_error());
    if (!rc && !(rc = cact_parse(arch, len, &f))) {
        san_model mq;
        nd_qweights3 q3;
        rc = nd_cact3_to_qmodel(&f, &mq, &q3);
        CHECK_MSG(rc == 0, "%s", nd_last_error());
        if (!rc) {
            compare("needle3", &mq, &q3.q, bits);
            nd_qweights3_free(&q3);
            san_model_free(&mq);
        }
        cact_free(&f);
    }
    free(arch);
    if (root)
        pv_decref(root);
}

/* tiny3's layout (every 3.x piece) at d 256, where the q/k/v/gate products
 * and the prompt's Hadamard GEMMs are big enough to be shared */
static void needle3_model(san_model *m)
{
    san_config c;
    CHECK(san_config_preset(&c, "tiny3") == 0);
    c.d_model = 256;
    c.qk_head_dim = c.v_head_dim = 64;
    CHECK_MSG(san_model_create(m, &c) == 0, "%s", nd_last_error());
    san_model_init_random(m, 7);
    nd_rng r; /* every weight away from its init (zero taps, unit diagonals) */
    nd_rng_seed(&r, 11);
    for (size_t i = 0; i < m->numel; i++)
        m->mem[i] += (float)(0.05 * nd_rng_normal(&r));
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_decode_crew: %s\n", nd_last_error());
        return 1;
    }
    san_model src;
    tu_small_needle2(&src, 7);
    run_bits(&src, tok, 2);
    run_bits(&src, tok, 4);
    san_model_free(&src);
    san_model src3;
    needle3_model(&src3);
    run_bits3(&src3, 2);
    run_bits3(&src3, 4);
    san_model_free(&src3);
    nd_tokenizer_free(tok);
    return tu_finish("test_decode_crew");
}
