/* exp and log in plain float32 arithmetic, one definition for the CPU
 * kernels and the CUDA device code (which includes this header with
 * ND_FASTMATH_FN set to __host__ __device__), so the backends agree to an
 * ulp or two instead of to each libm's error. The Vulkan shaders carry a
 * GLSL port of the same polynomials (shaders/ce_math.glsl), and the CPU's
 * one-matrix Sinkhorn a 16-lane copy (cpu_sinkhorn.c's exp16 / log16:
 * test_san_parts fails when the two drift apart by a bit). */
#ifndef ND_FASTMATH_H
#define ND_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef ND_FASTMATH_FN
#define ND_FASTMATH_FN static inline
#endif

/* exp(x) for float32 in plain arithmetic (no libm call), so loops over it
 * vectorise: Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, a degree-6
 * polynomial for e^r (relative error < 3e-7), and 2^k built in the exponent
 * bits. Returns 0 below -87.3 and +inf above 88 (exp(88.72) is the float
 * limit; callers use it on non-positive arguments); NaN propagates (the
 * input is never converted to an integer). */
ND_FASTMATH_FN float san_expf(float x)
{
    const float hi = 88.0f, lo = -87.3f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* k = round(x / ln2) via the 1.5 * 2^23 trick */
    float kf = xc * 1.44269504088896341f + 12582912.0f;
    uint32_t kb;
    memcpy(&kb, &kf, 4);
    kf -= 12582912.0f;
    float r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^k: k sits in the low mantissa bits of kf's pattern */
    uint32_t e = ((kb - 0x4B400000u) + 127u) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    float y = p * scale;
    y = x > hi ? INFINITY : y;
    y = x < lo ? 0.0f : y;
    return x != x ? x : y;
}

/* log(x) for positive, normal, finite float32 x in plain arithmetic (no
 * libm call) so it vectorises: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
 * log(m) from Cephes' degree-9 polynomial (within ~1 ulp of logf), e ln2
 * added in two parts. Only used on sums of exponentials (>= 1). */
ND_FASTMATH_FN float san_logf(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    int e = (int)((u >> 23) & 0xffu) - 126;
    u = (u & 0x007fffffu) | 0x3f000000u; /* mantissa in [0.5, 1) */
    float m;
    memcpy(&m, &u, 4);
    int lo = m < 0.707106781186547524f;
    float fe = (float)(e - lo);
    m = lo ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float y = 7.0376836292e-2f;
    y = y * m - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return (m + y) + 0.693359375f * fe;
}

#endif
