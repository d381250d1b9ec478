/* AVX-512 (and AVX2) pieces the cached-attention kernels (attention_x86.c
 * and attention_i8_x86.c for Needle 2, attention3_x86.c for Needle 3) use. Static inline under the
 * kernels' own target attribute, so the including files keep one binary
 * runnable on any x86-64. */
#ifndef ND_SIMD_X86_H
#define ND_SIMD_X86_H

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define ND_T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* 16 int8 values as floats */
ND_T_AVX512 static inline __m512 nd_i8x16_ps(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* san_expf (core/fastmath.h) on 16 lanes x <= 0: its range reduction,
 * polynomial and operation order, so SIMD softmax weights equal the
 * reference's */
ND_T_AVX512 static inline __m512 nd_exp16_ps(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.3f), magic = _mm512_set1_ps(12582912.0f);
    __m512 xc = _mm512_max_ps(x, lo);
    __m512 kf = _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), magic);
    __m512i kb = _mm512_castps_si512(kf);
    kf = _mm512_sub_ps(kf, magic);
    __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(kf, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(kf, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
                      _mm512_set1_ps(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(kb, _mm512_set1_epi32(0x4B400000)),
                                           _mm512_set1_epi32(127)),
                          23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
}

#define ND_T_AVX2 __attribute__((target("avx2,fma")))

/* nd_exp16_ps on 8 lanes (AVX2) */
ND_T_AVX2 static inline __m256 nd_exp8_ps(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f), magic = _mm256_set1_ps(12582912.0f);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 kf = _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), magic);
    __m256i kb = _mm256_castps_si256(kf);
    kf = _mm256_sub_ps(kf, magic);
    __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(kf, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(kf, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r),
                      _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(kb, _mm256_set1_epi32(0x4B400000)),
                                           _mm256_set1_epi32(127)),
                          23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}

#endif
#endif
