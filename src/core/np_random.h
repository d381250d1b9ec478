/* numpy's legacy RandomState stream, bit for bit: MT19937 seeded with
 * init_genrand, doubles from two 32-bit draws (53 bits), and the polar
 * Box-Muller gauss that caches its second value. Upstream derives its CQ
 * codebooks from np.random.RandomState(0).randn(400000), so reproducing it
 * exactly makes our codebooks (and archives) identical. */
#ifndef ND_NP_RANDOM_H
#define ND_NP_RANDOM_H

#include <stdint.h>

typedef struct {
    uint32_t key[624];
    int pos;
    int has_gauss;
    double gauss;
} nd_np_random;

/* RandomState(seed) for an integer seed in [0, 2^32). */
void nd_np_random_seed(nd_np_random *r, uint32_t seed);
uint32_t nd_np_random_u32(nd_np_random *r);
/* random_sample(): [0, 1) with 53 bits. */
double nd_np_random_double(nd_np_random *r);
/* randn() / standard_normal() of the legacy generator. */
double nd_np_random_gauss(nd_np_random *r);
/* random_interval(max): a uniform integer in [0, max] by masked rejection
 * (the smallest all-ones mask >= max; 32-bit draws while max < 2^32). */
uint64_t nd_np_random_interval(nd_np_random *r, uint64_t max);
/* permutation(n) of the legacy generator: arange(n) shuffled in place by
 * Fisher-Yates from the end (i = n-1 .. 1 swaps with interval(i)). */
void nd_np_random_permutation(nd_np_random *r, int32_t *out, int32_t n);

#endif
