/* Minimal test harness: CHECK records a failure and keeps going; the test
 * main returns tu_finish(). */
#ifndef ND_TESTUTIL_H
#define ND_TESTUTIL_H

#include <stdio.h>

#include <stddef.h>

#include "model/config.h"
#include "model/san.h"
#include "text/tokenizer.h"

extern int tu_failures, tu_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        tu_checks++;                                                                               \
        if (!(cond)) {                                                                             \
            tu_failures++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        tu_checks++;                                                                               \
        if (!(cond)) {                                                                             \
            tu_failures++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* max |a-b| / max(max|b|, floor) over n floats */
double tu_rel_err(const float *a, const float *b, long n, double floor);
int tu_finish(const char *name);

/* A small model that exercises every part: d 24 (not a power of two, so the
 * Hadamard MLP pads), 3 layers, 3 lanes, GQA 4/2, two engram sites. */
void tu_small_config(san_config *cfg);

/* m as an in-memory .cact (W`bits`, the given kv_window, 0 = the writer's
 * default) with tok's blob embedded; a failed write is a CHECK failure and
 * returns NULL. Free with free(). */
/* A needle2-layout model at a test's size (d 256, 4/2 heads, 2 layers,
 * engram sites at both, 512 slots), random weights from `seed`: big
 * enough that a prompt chunk's products and attention are shared by
 * threads. */
void tu_small_needle2(san_model *m, unsigned seed);
unsigned char *tu_archive(const san_model *m, const nd_tokenizer *tok, int bits, int kv_window,
                          size_t *len);

#endif
