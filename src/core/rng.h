/* Seeded, portable random numbers (xoshiro256** seeded by splitmix64).
 * The same seed gives the same stream on every machine. */
#ifndef ND_RNG_H
#define ND_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
    int has_spare;
    double spare;
} nd_rng;

void nd_rng_seed(nd_rng *r, uint64_t seed);
uint64_t nd_rng_next(nd_rng *r);
double nd_rng_uniform(nd_rng *r); /* [0, 1) with 53 random bits */
double nd_rng_normal(nd_rng *r);  /* N(0, 1), polar Box-Muller */
/* Uniform integer in [0, n). */
uint64_t nd_rng_below(nd_rng *r, uint64_t n);

#endif
