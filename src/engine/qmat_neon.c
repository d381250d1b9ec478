/* NEON (aarch64) kernels for quantised products (qmat.h). Codes become int8
 * codebook values through a 16-entry table lookup (tbl). Three variants,
 * all exact in their integer group sums:
 *  - neon: baseline armv8-a; products of two int8 pairs fit int16 (|w|,
 *    |a| <= 127), widened into int32 lanes;
 *  - neondot: the dot-product extension (sdot, armv8.2-a+dotprod: Cortex-A76,
 *    Apple M1 and later), four products per int32 lane per instruction;
 *  - neoni8mm: the int8 matrix multiply (smmla, armv8.6-a+i8mm: Cortex-X2,
 *    Neoverse V1, Apple M2 and later): a 2 x 8 by 8 x 2 block per
 *    instruction, two rows against two tokens.
 * The extensions are asked of the kernel at run time (HWCAP_ASIMDDP,
 * HWCAP2_I8MM) and each function carries its own target, so one baseline
 * binary runs everywhere. */
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

/* ------------------------------------------------------------------ */
/* dot product (sdot)                                                   */

#if defined(ND_QNEON_DOT)
#if defined(__clang__)
#define T_DOT /* the build targets the extension (qmat.h) */
#else
#define T_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

T_DOT static inline int32_t dot_sdot(const int8x16_t v[8], const int8_t *a)
{
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = acc0;
    for (int i = 0; i < 8; i += 2) {
        acc0 = vdotq_s32(acc0, v[i], vld1q_s8(a + 16 * i));
        acc1 = vdotq_s32(acc1, v[i + 1], vld1q_s8(a + 16 * i + 16));
    }
    return vaddvq_s32(vaddq_s32(acc0, acc1));
}

T_DOT void nd_qgemm_neondot(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const int8x16_t lut = vld1q_s8(lut16);
    const int ng = w->ng, n = x->n;
    for (int r = r0; r < r1; r++)
        for (int t0 = 0; t0 < n; t0 += 4) {
            int tn = n - t0 < 4 ? n - t0 : 4;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int g = 0; g < ng; g++) {
                int8x16_t v[8];
                unpack_neon(w, r, g, lut, lut16, v);
                float nr = nd_qmat_norm(w, r, g);
                for (int k = 0; k < tn; k++) {
                    size_t tg = (size_t)(t0 + k) * ng + (size_t)g;
                    acc[k] += nr * x->scale[tg] * (float)dot_sdot(v, x->q + tg * ND_QGROUP);
                }
            }
            for (int k = 0; k < tn; k++)
                y[(size_t)(t0 + k) * ldy + (size_t)r] = acc[k] * inv;
        }
}

#endif

/* ------------------------------------------------------------------ */
/* int8 matrix multiply (smmla)                                         */

#if defined(ND_QNEON_I8MM)
#if defined(__clang__)
#define T_MM
#else
#define T_MM __attribute__((target("arch=armv8.6-a+i8mm")))
#endif

/* smmla: acc (2 x 2 int32, row-major) += A (2 x 8) . B (2 x 8)^T, A and B
 * each two rows of 8 int8 in one register. Rows r, r + 1 (the codes) are
 * A, tokens t, t + 1 (the activations) B: the 64-bit halves of a row's and
 * its partner's 16-byte chunks interleave (zip1/zip2 on 64-bit lanes) so one
 * chunk pair is two instructions. A missing partner (odd rows or tokens)
 * repeats the last one and its results are dropped. */
T_MM static inline int32x4_t mm_group(const int8x16_t va[8], const int8x16_t vb[8],
                                      const int8_t *xa, const int8_t *xb)
{
    int32x4_t acc = vdupq_n_s32(0);
    for (int i = 0; i < 8; i++) {
        int64x2_t ra = vreinterpretq_s64_s8(va[i]), rb = vreinterpretq_s64_s8(vb[i]);
        int64x2_t ta = vreinterpretq_s64_s8(vld1q_s8(xa + 16 * i));
        int64x2_t tb = vreinterpretq_s64_s8(vld1q_s8(xb + 16 * i));
        acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip1q_s64(ra, rb)),
                         vreinterpretq_s8_s64(vzip1q_s64(ta, tb)));
        acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip2q_s64(ra, rb)),
                         vreinterpretq_s8_s64(vzip2q_s64(ta, tb)));
    }
    return acc; /* (r t, r t+1, r+1 t, r+1 t+1) */
}

T_MM void nd_qgemm_neoni8mm(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const int8x16_t lut = vld1q_s8(lut16);
    const int ng = w->ng, n = x->n;
    for (int r = r0; r < r1; r += 2) {
        int rb = r + 1 < r1 ? r + 1 : r;
        /* four tokens (two pairs) per pass over the two rows' groups */
        for (int t0 = 0; t0 < n; t0 += 4) {
            int tn = n - t0 < 4 ? n - t0 : 4;
            int tt[4];
            for (int k = 0; k < 4; k++)
                tt[k] = t0 + (k < tn ? k : tn - 1);
            float32x4_t f0 = vdupq_n_f32(0.0f), f1 = f0;
            for (int g = 0; g < ng; g++) {
                int8x16_t va[8], vb[8];
                unpack_neon(w, r, g, lut, lut16, va);
                unpack_neon(w, rb, g, lut, lut16, vb);
                float na = nd_qmat_norm(w, r, g), nb = nd_qmat_norm(w, rb, g);
                size_t tg[4];
                for (int k = 0; k < 4; k++)
                    tg[k] = (size_t)tt[k] * ng + (size_t)g;
                int32x4_t p0 = mm_group(va, vb, x->q + tg[0] * ND_QGROUP, x->q + tg[1] * ND_QGROUP);
                int32x4_t p1 = mm_group(va, vb, x->q + tg[2] * ND_QGROUP, x->q + tg[3] * ND_QGROUP);
                const float s0[4] = {na * x->scale[tg[0]], na * x->scale[tg[1]],
                                     nb * x->scale[tg[0]], nb * x->scale[tg[1]]};
                const float s1[4] = {na * x->scale[tg[2]], na * x->scale[tg[3]],
                                     nb * x->scale[tg[2]], nb * x->scale[tg[3]]};
                f0 = vfmaq_f32(f0, vcvtq_f32_s32(p0), vld1q_f32(s0));
                f1 = vfmaq_f32(f1, vcvtq_f32_s32(p1), vld1q_f32(s1));
            }
            float o[8];
            vst1q_f32(o, vmulq_n_f32(f0, inv));
            vst1q_f32(o + 4, vmulq_n_f32(f1, inv));
            /* o: pair p's (row, token) at o[4p + 2 * row + token] */
            for (int k = 0; k < tn; k++) {
                int p = k / 2, tk = k % 2;
                y[(size_t)(t0 + k) * ldy + (size_t)r] = o[4 * p + tk];
                if (rb != r)
                    y[(size_t)(t0 + k) * ldy + (size_t)rb] = o[4 * p + 2 + tk];
            }
        }
    }
}
#endif

#else
typedef int nd_qmat_neon_unused; /* ISO C: no empty translation unit */
#endif
