/* san_fwht for one row with AVX-512: the same butterflies in the same stage
 * order (h = 1, 2, 4, ...), so the same bits. The first four stages pair
 * lanes inside one vector (a permutation and a blend of a + b / a - b),
 * the rest pair whole vectors. A decode step's Hadamard MLP runs two of
 * these per layer on the calling thread. */
#include "backend/cpu/cpu_kernels.h"
#include "core/tuning.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>

#define T_FW __attribute__((target("avx512f")))

/* one in-vector stage: lanes with `hi` set hold a - b (their partner is
 * a), the others a + b */
#define FW_LANES(v, sw, hi)                                                                        \
    _mm512_mask_blend_ps((hi), _mm512_add_ps((v), (sw)), _mm512_sub_ps((sw), (v)))

T_FW static void fwht_avx512(float *x, int n, float scale)
{
    int nv = n / 16;
    for (int k = 0; k < nv; k++) {
        __m512 v = _mm512_loadu_ps(x + 16 * k);
        v = FW_LANES(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);
        v = FW_LANES(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);
        v = FW_LANES(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);
        v = FW_LANES(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);
        _mm512_storeu_ps(x + 16 * k, v);
    }
    for (int h = 1; h < nv; h <<= 1)
        for (int i = 0; i < nv; i += h << 1)
            for (int k = i; k < i + h; k++) {
                __m512 a = _mm512_loadu_ps(x + 16 * k), b = _mm512_loadu_ps(x + 16 * (k + h));
                _mm512_storeu_ps(x + 16 * k, _mm512_add_ps(a, b));
                _mm512_storeu_ps(x + 16 * (k + h), _mm512_sub_ps(a, b));
            }
    __m512 s = _mm512_set1_ps(scale);
    for (int k = 0; k < nv; k++)
        _mm512_storeu_ps(x + 16 * k, _mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), s));
}
#undef FW_LANES

static int fwht_simd(void)
{
    static int have = -1; /* a benign race: every thread computes the same */
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") && !nd_tuning_get()->fwht_ref;
    return have;
}

void cpu_fwht_row(float *x, int n, float scale)
{
    if (n >= 16 && fwht_simd()) {
        fwht_avx512(x, n, scale);
        return;
    }
    san_fwht(x, n, scale);
}
#else
void cpu_fwht_row(float *x, int n, float scale)
{
    san_fwht(x, n, scale);
}
#endif
