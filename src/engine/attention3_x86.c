/* Needle 3's cached attention in AVX-512 and AVX2 (attention.h's
 * nd_att3_block task; attention.c keeps the reference and picks one at run
 * time). Each function carries its own target attribute, so one binary
 * runs on any x86-64.
 *
 * Keys go a vector's width at a time: the block's rows become floats once
 * (int8 rows converted), transposed so that a vector holds one element of
 * W keys, and serve every query row of the task; the arithmetic is the
 * reference's, in its order (see attention3_x86_impl.h). */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "core/fastmath.h"
#include "engine/attention.h"
#include "engine/simd_x86.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* w * v + o as attention.c's reference sums its value rows (KV_MADD):
 * fused where the program is built for FMA */
#if defined(__FMA__)
#define MADD512(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MADD256(a, b, c) _mm256_fmadd_ps(a, b, c)
#else
#define MADD512(a, b, c) _mm512_add_ps(_mm512_mul_ps(a, b), c)
#define MADD256(a, b, c) _mm256_add_ps(_mm256_mul_ps(a, b), c)
#endif

/* ---------------- AVX-512: 16 lanes ---------------- */
#define T_A3 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* 16 rows of 16 floats (ld apart) transposed into dst: vector e holds
 * element e of rows 0..15. Interleave pairs of rows, then pairs of pairs
 * (each 128-bit lane L of u[4i + k] is element 4L + k of rows 4i..4i+3),
 * then a 4 x 4 transpose of those lanes. */
T_A3 static inline void transpose16(const float *src, int ld, float *dst)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        __m512 a = _mm512_load_ps(src + (size_t)(2 * i) * ld);
        __m512 b = _mm512_load_ps(src + (size_t)(2 * i + 1) * ld);
        t[2 * i] = _mm512_unpacklo_ps(a, b);
        t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int k = 0; k < 4; k++) {
        __m512 a0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44);
        __m512 a1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
        __m512 b0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44);
        __m512 b1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
        _mm512_store_ps(dst + (size_t)k * 16, _mm512_shuffle_f32x4(a0, b0, 0x88));
        _mm512_store_ps(dst + (size_t)(4 + k) * 16, _mm512_shuffle_f32x4(a0, b0, 0xDD));
        _mm512_store_ps(dst + (size_t)(8 + k) * 16, _mm512_shuffle_f32x4(a1, b1, 0x88));
        _mm512_store_ps(dst + (size_t)(12 + k) * 16, _mm512_shuffle_f32x4(a1, b1, 0xDD));
    }
}

#define A3(name) name##_avx512
#define W 16
#define VF __m512
#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VLOADA(p) _mm512_load_ps(p)
#define VSTOREA(p, v) _mm512_store_ps(p, v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VMADD(a, b, c) MADD512(a, b, c)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VTRANSPOSE(s, ld, d) transpose16(s, ld, d)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VEXP(v) nd_exp16_ps(v)
#define VI8(p) nd_i8x16_ps(p)
#include "engine/attention3_x86_impl.h"
#undef A3
#undef W
#undef VF
#undef VZERO
#undef VSET1
#undef VLOAD
#undef VSTORE
#undef VLOADA
#undef VSTOREA
#undef VADD
#undef VSUB
#undef VMUL
#undef VMADD
#undef VMAX
#undef VTRANSPOSE
#undef VHMAX
#undef VEXP
#undef VI8
#undef T_A3

void nd_att3_block_avx512(const nd_att3_block *b)
{
    block_avx512(b);
}

/* ---------------- AVX2: 8 lanes ---------------- */
#define T_A3 __attribute__((target("avx2,fma")))

/* 8 rows of 8 floats (ld apart) transposed into dst (as transpose16) */
T_A3 static inline void transpose8(const float *src, int ld, float *dst)
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        __m256 a = _mm256_load_ps(src + (size_t)(2 * i) * ld);
        __m256 b = _mm256_load_ps(src + (size_t)(2 * i + 1) * ld);
        t[2 * i] = _mm256_unpacklo_ps(a, b);
        t[2 * i + 1] = _mm256_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 2; i++) {
        __m256d a = _mm256_castps_pd(t[4 * i]), b = _mm256_castps_pd(t[4 * i + 2]);
        __m256d c = _mm256_castps_pd(t[4 * i + 1]), d = _mm256_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(c, d));
    }
    /* 128-bit lane L of u[4i + k]: element 4L + k of rows 4i..4i+3 */
    for (int k = 0; k < 4; k++) {
        _mm256_store_ps(dst + (size_t)k * 8, _mm256_permute2f128_ps(u[k], u[4 + k], 0x20));
        _mm256_store_ps(dst + (size_t)(4 + k) * 8, _mm256_permute2f128_ps(u[k], u[4 + k], 0x31));
    }
}

T_A3 static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

T_A3 static inline __m256 i8_8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#define A3(name) name##_avx2
#define W 8
#define VF __m256
#define VZERO() _mm256_setzero_ps()
#define VSET1(x) _mm256_set1_ps(x)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VLOADA(p) _mm256_load_ps(p)
#define VSTOREA(p, v) _mm256_store_ps(p, v)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMADD(a, b, c) MADD256(a, b, c)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VTRANSPOSE(s, ld, d) transpose8(s, ld, d)
#define VHMAX(v) hmax8(v)
#define VEXP(v) nd_exp8_ps(v)
#define VI8(p) i8_8(p)
#include "engine/attention3_x86_impl.h"

void nd_att3_block_avx2(const nd_att3_block *b)
{
    block_avx2(b);
}

int nd_att3_supported(int k)
{
    __builtin_cpu_init();
    if (k == ND_ATT3_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (k == ND_ATT3_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return k == ND_ATT3_REF;
}

#else /* not x86-64: the reference only */

void nd_att3_block_avx512(const nd_att3_block *b)
{
    nd_att3_block_ref(b);
}

void nd_att3_block_avx2(const nd_att3_block *b)
{
    nd_att3_block_ref(b);
}

int nd_att3_supported(int k)
{
    return k == ND_ATT3_REF;
}

#endif

int nd_att3_simd_fits(int hd, int vhd, int rep)
{
    int big = hd > vhd ? hd : vhd;
    big = (big + 15) / 16 * 16;
    return big <= ND_ATT3_MAX_HD && rep * big <= ND_ATT3_BUF - big;
}
