/* One random case of the engine's cached attention, shared by the
 * attention kernel tests: a model of H query heads over G key/value heads
 * of head dim hd, an int8 K/V cache of `ml` rows with per-row scales, and
 * n random query rows. The values are drawn in a fixed order (queries,
 * then K and V bytes in turn, then their scales) from the test's own
 * generator, so a test's cases stay the same from run to run. */
#ifndef ND_TEST_ATT_CASE_H
#define ND_TEST_ATT_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "engine/attention.h"
#include "engine/engine.h"

typedef struct {
    san_model m;
    nd_kv_state s; /* s.m points at m: an att_case must not move once made */
    float *q;      /* n rows of q_dim */
    size_t qn;     /* n * q_dim */
} att_case;

/* keys_to_128: key bytes cover -128..127 (floor of 128 x), else
 * -127..127 (rounded 127 x), as the engine's quantiser writes them.
 * Exits with status 2 when out of memory. */
static inline void att_case_make(att_case *c, int H, int G, int hd, int n, int ml, int kv_window,
                                 int n_sink, int keys_to_128, float (*frand)(void))
{
    memset(c, 0, sizeof *c);
    c->m.dims.H = H;
    c->m.dims.G = G;
    c->m.dims.hd = hd;
    c->m.dims.q_dim = H * hd;
    c->m.dims.kv_dim = G * hd;
    nd_kv_state *s = &c->s;
    s->m = &c->m;
    s->cap = s->max_len = ml;
    s->kv_int8 = 1;
    s->kv_window = kv_window;
    s->n_sink = n_sink;
    s->att_threads = nd_get_threads();
    size_t kvn = (size_t)ml * c->m.dims.kv_dim;
    c->qn = (size_t)n * c->m.dims.q_dim;
    c->q = malloc(sizeof(float) * c->qn);
    s->k8 = malloc(kvn);
    s->v8 = malloc(kvn);
    s->ks = malloc(sizeof(float) * (size_t)ml * G);
    s->vs = malloc(sizeof(float) * (size_t)ml * G);
    s->att_s = malloc(sizeof(float) * (size_t)s->att_threads * ND_ATT_ROWS * (H / G) * ml);
    if (!c->q || !s->k8 || !s->v8 || !s->ks || !s->vs || !s->att_s)
        exit(2);
    for (size_t e = 0; e < c->qn; e++)
        c->q[e] = 2.0f * frand();
    for (size_t e = 0; e < kvn; e++) {
        s->k8[e] =
            keys_to_128 ? (int8_t)(int)floorf(128.0f * frand()) : (int8_t)lrintf(127.0f * frand());
        s->v8[e] = (int8_t)lrintf(127.0f * frand());
    }
    for (int e = 0; e < ml * G; e++) {
        s->ks[e] = (1.5f + frand()) * 0.2f / 127.0f * sqrtf((float)hd);
        s->vs[e] = (1.5f + frand()) / 127.0f;
    }
}

static inline void att_case_free(att_case *c)
{
    free(c->q);
    free(c->s.k8);
    free(c->s.v8);
    free(c->s.ks);
    free(c->s.vs);
    free(c->s.att_s);
}

#endif
