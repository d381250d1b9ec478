#include "core/np_random.h"

#include <math.h>

/* Arithmetic must follow numpy's C code statement by statement; keep the
 * compiler from fusing multiply-adds. */
#pragma STDC FP_CONTRACT OFF

#define MT_N 624
#define MT_M 397

void nd_np_random_seed(nd_np_random *r, uint32_t seed)
{
    r->key[0] = seed;
    for (int i = 1; i < MT_N; i++) {
        uint32_t prev = r->key[i - 1];
        r->key[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    r->pos = MT_N;
    r->has_gauss = 0;
    r->gauss = 0.0;
}

static void mt_regenerate(nd_np_random *r)
{
    uint32_t *k = r->key;
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = (k[i] & 0x80000000u) | (k[(i + 1) % MT_N] & 0x7fffffffu);
        uint32_t v = k[(i + MT_M) % MT_N] ^ (y >> 1);
        if (y & 1)
            v ^= 0x9908b0dfu;
        k[i] = v;
    }
    r->pos = 0;
}

uint32_t nd_np_random_u32(nd_np_random *r)
{
    if (r->pos >= MT_N)
        mt_regenerate(r);
    uint32_t y = r->key[r->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double nd_np_random_double(nd_np_random *r)
{
    uint32_t a = nd_np_random_u32(r) >> 5, b = nd_np_random_u32(r) >> 6;
    return ((double)a * 67108864.0 + (double)b) / 9007199254740992.0;
}

double nd_np_random_gauss(nd_np_random *r)
{
    if (r->has_gauss) {
        double g = r->gauss;
        r->has_gauss = 0;
        r->gauss = 0.0;
        return g;
    }
    double x1, x2, r2;
    do {
        x1 = 2.0 * nd_np_random_double(r) - 1.0;
        x2 = 2.0 * nd_np_random_double(r) - 1.0;
        r2 = x1 * x1 + x2 * x2;
    } while (r2 >= 1.0 || r2 == 0.0);
    double f = sqrt(-2.0 * log(r2) / r2);
    r->gauss = f * x1;
    r->has_gauss = 1;
    return f * x2;
}

uint64_t nd_np_random_interval(nd_np_random *r, uint64_t max)
{
    if (max == 0)
        return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffu) {
        do
            value = nd_np_random_u32(r) & mask;
        while (value > max);
    } else {
        do {
            uint64_t hi = nd_np_random_u32(r);
            value = ((hi << 32) | nd_np_random_u32(r)) & mask;
        } while (value > max);
    }
    return value;
}

void nd_np_random_permutation(nd_np_random *r, int32_t *out, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        out[i] = i;
    for (int32_t i = n - 1; i >= 1; i--) {
        int32_t j = (int32_t)nd_np_random_interval(r, (uint64_t)i);
        int32_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}
