/* NEON (aarch64) kernel for quantised products (qmat.h). Codes become int8
 * codebook values through a 16-entry table lookup (tbl); products of two
 * int8 pairs fit int16 (|w|, |a| <= 127), widened into int32 lanes, so the
 * group sum is exact. Baseline armv8-a: no dotprod extension needed. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <stdint.h>

#include "engine/qmat.h"
#include "model/cq.h"

static inline int stored_bits(int bits)
{
    return bits == CQ_TERNARY ? 2 : bits;
}

/* the group's 128 values as eight 16-byte vectors in layout order */
static inline void unpack_neon(const nd_qmat *m, int r, int g, int8x16_t lut,
                               const int8_t lut16[16], int8x16_t v[8])
{
    int sb = stored_bits(m->bits);
    const uint8_t *p = m->codes + (size_t)r * m->row_bytes + (size_t)g * ND_QGROUP * sb / 8;
    if (sb == 4) {
        const uint8x16_t low4 = vdupq_n_u8(0x0f);
        for (int h = 0; h < 4; h++) {
            uint8x16_t b = vld1q_u8(p + 16 * h);
            v[h] = vqtbl1q_s8(lut, vandq_u8(b, low4));
            v[4 + h] = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));
        }
    } else if (sb == 2) {
        const uint8x16_t low2 = vdupq_n_u8(0x03);
        for (int h = 0; h < 2; h++) {
            uint8x16_t b = vld1q_u8(p + 16 * h);
            v[h] = vqtbl1q_s8(lut, vandq_u8(b, low2));
            v[2 + h] = vqtbl1q_s8(lut, vandq_u8(vshrq_n_u8(b, 2), low2));
            v[4 + h] = vqtbl1q_s8(lut, vandq_u8(vshrq_n_u8(b, 4), low2));
            v[6 + h] = vqtbl1q_s8(lut, vshrq_n_u8(b, 6));
        }
    } else {
        int8_t vals[ND_QGROUP];
        nd_qmat_unpack_values(m, r, g, lut16, vals);
        for (int i = 0; i < 8; i++)
            v[i] = vld1q_s8(vals + 16 * i);
    }
}

static inline int32_t dot_neon(const int8x16_t v[8], const int8_t *a)
{
    int32x4_t acc = vdupq_n_s32(0);
    for (int i = 0; i < 8; i++) {
        int8x16_t x = vld1q_s8(a + 16 * i);
        int16x8_t p = vmull_s8(vget_low_s8(v[i]), vget_low_s8(x));
        p = vmlal_high_s8(p, v[i], x);
        acc = vpadalq_s16(acc, p);
    }
    return vaddvq_s32(acc);
}

void nd_qgemm_neon(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const int8x16_t lut = vld1q_s8(lut16);
    const int ng = w->ng, n = x->n;
    for (int r = r0; r < r1; r++) {
        /* one unpack per group serves every token of the batch */
        for (int t0 = 0; t0 < n; t0 += 4) {
            int tn = n - t0 < 4 ? n - t0 : 4;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int g = 0; g < ng; g++) {
                int8x16_t v[8];
                unpack_neon(w, r, g, lut, lut16, v);
                float nr = nd_qmat_norm(w, r, g);
                for (int k = 0; k < tn; k++) {
                    size_t tg = (size_t)(t0 + k) * ng + (size_t)g;
                    acc[k] += nr * x->scale[tg] * (float)dot_neon(v, x->q + tg * ND_QGROUP);
                }
            }
            for (int k = 0; k < tn; k++)
                y[(size_t)(t0 + k) * ldy + (size_t)r] = acc[k] * inv;
        }
    }
}

#else
typedef int nd_qmat_neon_unused; /* ISO C: no empty translation unit */
#endif
