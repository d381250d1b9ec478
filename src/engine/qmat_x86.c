/* x86 kernels for quantised products (qmat.h): AVX2, AVX-512 (BW) and
 * AVX-512 VNNI. Each function carries its own target attribute, so one
 * binary runs on any x86-64 and qmat.c picks a variant the CPU supports.
 *
 * Per group of 128 the packed codes become int8 codebook values through a
 * 16-entry byte shuffle, and the integer dot with the int8 activations is
 * exact: AVX2 / AVX-512 multiply |w| by sign(w)*x (pairs stay below 2^15),
 * VNNI multiplies w + 128 (unsigned) by x and subtracts 128 * sum(x). The
 * per-group int32 lanes are scaled by norm * activation scale into float
 * lanes, reduced once per output. Tokens are taken four at a time so the
 * unpacked codes serve several rows of the batch. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "engine/amx.h"
#include "engine/qmat.h"
#include "model/cq.h"

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define T_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

static inline int stored_bits(int bits)
{
    return bits == CQ_TERNARY ? 2 : bits;
}

T_AVX2 static inline float norm_f16c(const nd_qmat *m, int r, int g)
{
    const uint8_t *p = m->norms + ((size_t)r * (size_t)m->ng + (size_t)g) * 2;
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

static inline const uint8_t *group_codes(const nd_qmat *m, int r, int g)
{
    return m->codes + (size_t)r * m->row_bytes + (size_t)g * ND_QGROUP * stored_bits(m->bits) / 8;
}

/* ------------------------------------------------------------------ */
/* AVX2                                                                 */

/* the group's 128 int8 values as four 32-byte vectors in layout order */
T_AVX2 static inline void unpack_avx2(const nd_qmat *m, int r, int g, __m256i lut,
                                      const int8_t lut16[16], __m256i v[4])
{
    const uint8_t *p = group_codes(m, r, g);
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    switch (stored_bits(m->bits)) {
    case 4: {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)p);
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        v[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b0, low4));
        v[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b1, low4));
        v[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b0, 4), low4));
        v[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b1, 4), low4));
        break;
    }
    case 2: {
        __m256i b = _mm256_loadu_si256((const __m256i *)p);
        v[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b, low2));
        v[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 2), low2));
        v[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 4), low2));
        v[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 6), low2));
        break;
    }
    default: {
        int8_t vals[ND_QGROUP];
        nd_qmat_unpack_values(m, r, g, lut16, vals);
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_si256((const __m256i *)(vals + 32 * i));
    }
    }
}

/* exact int32 lanes of sum w * a over 128 values */
T_AVX2 static inline __m256i dot_avx2(const __m256i w[4], const __m256i aw[4], const int8_t *a)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(a + 32 * i));
        __m256i p = _mm256_maddubs_epi16(aw[i], _mm256_sign_epi8(x, w[i]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    return acc;
}

T_AVX2 static inline float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T_AVX2 void nd_qgemm_avx2(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut16));
    const int ng = w->ng, n = x->n;
    const size_t stride = (size_t)ng * ND_QGROUP;
    for (int r = r0; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (int g = 0; g < ng; g++) {
                __m256i v[4], av[4];
                unpack_avx2(w, r, g, lut, lut16, v);
                for (int i = 0; i < 4; i++)
                    av[i] = _mm256_sign_epi8(v[i], v[i]);
                float nr = norm_f16c(w, r, g);
                const int8_t *a = x->q + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                const float *sc = x->scale + (size_t)t * ng + g;
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_avx2(v, av, a)),
                                       _mm256_set1_ps(nr * sc[0]), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_avx2(v, av, a + stride)),
                                       _mm256_set1_ps(nr * sc[ng]), acc1);
                acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_avx2(v, av, a + 2 * stride)),
                                       _mm256_set1_ps(nr * sc[2 * ng]), acc2);
                acc3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_avx2(v, av, a + 3 * stride)),
                                       _mm256_set1_ps(nr * sc[3 * ng]), acc3);
            }
            y[(size_t)t * ldy + (size_t)r] = hsum_avx2(acc0) * inv;
            y[(size_t)(t + 1) * ldy + (size_t)r] = hsum_avx2(acc1) * inv;
            y[(size_t)(t + 2) * ldy + (size_t)r] = hsum_avx2(acc2) * inv;
            y[(size_t)(t + 3) * ldy + (size_t)r] = hsum_avx2(acc3) * inv;
        }
        for (; t < n; t++) {
            __m256 acc = _mm256_setzero_ps();
            for (int g = 0; g < ng; g++) {
                __m256i v[4], av[4];
                unpack_avx2(w, r, g, lut, lut16, v);
                for (int i = 0; i < 4; i++)
                    av[i] = _mm256_sign_epi8(v[i], v[i]);
                const int8_t *a = x->q + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                float s = norm_f16c(w, r, g) * x->scale[(size_t)t * ng + g];
                acc =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_avx2(v, av, a)), _mm256_set1_ps(s), acc);
            }
            y[(size_t)t * ldy + (size_t)r] = hsum_avx2(acc) * inv;
        }
    }
}

/* ------------------------------------------------------------------ */
/* AVX-VNNI (256-bit dpbusd, VEX: Alder Lake and later laptops, Zen 5)   */

#define T_AVXVNNI __attribute__((target("avxvnni,avx2,fma,f16c")))

/* (w + 128) . a over 128 values onto start (lane 0: -128 * sum(a)): the
 * exact w . a as int32 lanes; w holds the codes + 128 as unsigned bytes */
T_AVXVNNI static inline __m256i dot_avxvnni(const __m256i wu[4], const int8_t *a, __m256i start)
{
    for (int i = 0; i < 4; i++)
        start = _mm256_dpbusd_avx_epi32(start, wu[i],
                                        _mm256_loadu_si256((const __m256i *)(a + 32 * i)));
    return start;
}

/* Batches too small for token tiles: four tokens share one unpack of a
 * row group, one dpbusd per 32 products (AVX2 needs four instructions) */
T_AVXVNNI static void small_avxvnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                                    int ldy, __m256i lut_u8, const int8_t lut16[16], float inv)
{
    const int ng = w->ng, n = x->n;
    int8_t lut_u8_16[16];
    for (int i = 0; i < 16; i++)
        lut_u8_16[i] = (int8_t)(lut16[i] ^ 0x80);
    for (int r = r0; r < r1; r++)
        for (int t = 0; t < n; t += 4) {
            int tn = n - t < 4 ? n - t : 4;
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int g = 0; g < ng; g++) {
                __m256i v[4];
                unpack_avx2(w, r, g, lut_u8, lut_u8_16, v);
                float nr = norm_f16c(w, r, g);
                for (int k = 0; k < tn; k++) {
                    size_t tg = (size_t)(t + k) * ng + (size_t)g;
                    __m256i start = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-128 * x->sum[tg]));
                    __m256i i = dot_avxvnni(v, x->q + tg * ND_QGROUP, start);
                    acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i),
                                             _mm256_set1_ps(nr * x->scale[tg]), acc[k]);
                }
            }
            for (int k = 0; k < tn; k++)
                y[(size_t)(t + k) * ldy + (size_t)r] = hsum_avx2(acc[k]) * inv;
        }
}

/* One token, at most 16 groups, 2- or 4-bit codes (decode): as the
 * AVX-512 matvec, each group's offset correction (-128 x the activations'
 * sum) and the row's norms x activation scales are computed once per row,
 * leaving the unpack, four dpbusd and one fma per group; rows are fetched
 * ahead of the hardware prefetcher. */
T_AVXVNNI static inline __attribute__((always_inline)) void
matvec_avxvnni_rows(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, __m256i lut,
                    float inv, int sb)
{
    const int ng = w->ng;
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    __m256i start[16];
    for (int g = 0; g < ng; g++)
        start[g] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-128 * x->sum[g]));
    const size_t rb = w->row_bytes;
    const size_t ahead = 1024 > 4 * rb ? 1024 : 4 * rb;
    const int8_t *a = x->q;
    for (int r = r0; r < r1; r++) {
        const uint8_t *p = w->codes + (size_t)r * rb;
        for (size_t off = 0; off < rb; off += 64)
            _mm_prefetch((const char *)p + ahead + off, _MM_HINT_T0);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        for (int g = 0; g < ng; g++) {
            __m256i v[4];
            if (sb == 2) {
                __m256i b = _mm256_loadu_si256((const __m256i *)(p + 32 * g));
                v[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b, low2));
                v[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 2), low2));
                v[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 4), low2));
                v[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b, 6), low2));
            } else {
                __m256i b0 = _mm256_loadu_si256((const __m256i *)(p + 64 * g));
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(p + 64 * g + 32));
                v[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b0, low4));
                v[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(b1, low4));
                v[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b0, 4), low4));
                v[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(b1, 4), low4));
            }
            __m256i i = dot_avxvnni(v, a + 128 * g, start[g]);
            __m256 sc = _mm256_set1_ps(norm_f16c(w, r, g) * x->scale[g]);
            if (g & 1)
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, acc0);
        }
        y[r] = hsum_avx2(_mm256_add_ps(acc0, acc1)) * inv;
    }
}

T_AVXVNNI static void matvec_avxvnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                                     __m256i lut_u8, float inv)
{
    if (stored_bits(w->bits) == 2)
        matvec_avxvnni_rows(w, x, r0, r1, y, lut_u8, inv, 2);
    else
        matvec_avxvnni_rows(w, x, r0, r1, y, lut_u8, inv, 4);
}

/* Token tiles (x->tiles) on 256-bit registers: a tile's 16 tokens are two
 * vectors of 8 int32 lanes; TV_R rows unpacked to int8 once serve every
 * tile, each (row, half) an accumulator: 2 x TV_R + two activation vectors
 * + one broadcast fit the 16 registers (with six rows gcc spills). Each group's int32 sums start at
 * -128 x the row group's code sum (the unsigned activations' correction)
 * and are scaled by norm x activation scale into float sums kept in L1. */
#define TV_R 4

/* A token tile's float sums of TV_R (4) rows (f[i][lane]) into y: a 4 x 8
 * transpose per half makes one 4-float vector per token (stored whole,
 * or with a mask of the block's nr rows), not a scalar store per (row,
 * token). */
T_AVXVNNI static inline void store_tile4_avx(float *y, int ldy, int n, int tile, int rb, int nr,
                                             const float (*f)[ND_QTILE])
{
    int t0 = tile * ND_QTILE, nt = n - t0 < ND_QTILE ? n - t0 : ND_QTILE;
    const __m128i m = _mm_cmpgt_epi32(_mm_set1_epi32(nr), _mm_setr_epi32(0, 1, 2, 3));
    for (int h = 0; h < ND_QTILE; h += 8) {
        __m256 a = _mm256_load_ps(f[0] + h), b = _mm256_load_ps(f[1] + h);
        __m256 c = _mm256_load_ps(f[2] + h), d = _mm256_load_ps(f[3] + h);
        __m256 ab0 = _mm256_unpacklo_ps(a, b), ab1 = _mm256_unpackhi_ps(a, b);
        __m256 cd0 = _mm256_unpacklo_ps(c, d), cd1 = _mm256_unpackhi_ps(c, d);
        /* u[k]: tokens k (low half) and 4 + k (high half) of these 8 */
        __m256 u[4] = {_mm256_shuffle_ps(ab0, cd0, 0x44), _mm256_shuffle_ps(ab0, cd0, 0xEE),
                       _mm256_shuffle_ps(ab1, cd1, 0x44), _mm256_shuffle_ps(ab1, cd1, 0xEE)};
        for (int k = 0; k < 8; k++) {
            int tok = h + k;
            if (tok >= nt)
                break;
            __m128 v = k < 4 ? _mm256_castps256_ps128(u[k]) : _mm256_extractf128_ps(u[k - 4], 1);
            float *dst = y + (size_t)(t0 + tok) * ldy + (size_t)rb;
            if (nr == TV_R)
                _mm_storeu_ps(dst, v);
            else
                _mm_maskstore_ps(dst, m, v);
        }
    }
}

T_AVXVNNI static void tiles_avxvnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                                    int ldy, __m256i lut_s8, const int8_t lut16[16], float inv)
{
    const int ng = w->ng, n = x->n, tiles = x->tiles;
    _Alignas(32) int8_t ws[TV_R][16][ND_QGROUP];
    int32_t wsum[TV_R][16];
    float wn[TV_R][16];
    const __m256i ones = _mm256_set1_epi8(1);
    for (int rb = r0; rb < r1; rb += TV_R) {
        int nr = r1 - rb < TV_R ? r1 - rb : TV_R;
        for (int i = 0; i < TV_R; i++)
            for (int g = 0; g < ng; g++) {
                __m256i v[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                _mm256_setzero_si256(), _mm256_setzero_si256()};
                if (i < nr)
                    unpack_avx2(w, rb + i, g, lut_s8, lut16, v);
                __m256i c = _mm256_setzero_si256();
                for (int k = 0; k < 4; k++) {
                    _mm256_store_si256((__m256i *)(ws[i][g] + 32 * k), v[k]);
                    c = _mm256_dpbusd_avx_epi32(c, ones, v[k]);
                }
                _Alignas(32) int32_t cs[8];
                _mm256_store_si256((__m256i *)cs, c);
                wsum[i][g] = cs[0] + cs[1] + cs[2] + cs[3] + cs[4] + cs[5] + cs[6] + cs[7];
                wn[i][g] = i < nr ? norm_f16c(w, rb + i, g) * inv : 0.0f;
            }
        for (int tile = 0; tile < tiles; tile++) {
            _Alignas(32) float f[TV_R][ND_QTILE];
            memset(f, 0, sizeof f);
            for (int g = 0; g < ng; g++) {
                const uint8_t *a = x->qt + ((size_t)tile * ng + g) * ND_QTILE * ND_QGROUP;
                __m256i c00 = _mm256_set1_epi32(-128 * wsum[0][g]), c01 = c00;
                __m256i c10 = _mm256_set1_epi32(-128 * wsum[1][g]), c11 = c10;
                __m256i c20 = _mm256_set1_epi32(-128 * wsum[2][g]), c21 = c20;
                __m256i c30 = _mm256_set1_epi32(-128 * wsum[3][g]), c31 = c30;
                const int8_t *w0 = ws[0][g], *w1 = ws[1][g], *w2 = ws[2][g], *w3 = ws[3][g];
                /* one asm block per step: gcc, given the 32 registers of
                 * an AVX-512 build but told "x" (VEX reaches registers 0-15
                 * only), would spill the activations; here they and the
                 * broadcast use the three registers left to the block */
                for (int k4 = 0; k4 < ND_QGROUP / 4; k4++)
                    __asm__("vmovdqu (%[a]), %%ymm13\n\t"
                            "vmovdqu 32(%[a]), %%ymm14\n\t"
                            "vpbroadcastd (%[w0]), %%ymm15\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm13, %[c00]\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm14, %[c01]\n\t"
                            "vpbroadcastd (%[w1]), %%ymm15\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm13, %[c10]\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm14, %[c11]\n\t"
                            "vpbroadcastd (%[w2]), %%ymm15\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm13, %[c20]\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm14, %[c21]\n\t"
                            "vpbroadcastd (%[w3]), %%ymm15\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm13, %[c30]\n\t"
                            "%{vex%} vpdpbusd %%ymm15, %%ymm14, %[c31]"
                            : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11),
                              [c20] "+x"(c20), [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31)
                            : [a] "r"(a + k4 * 64), [w0] "r"(w0 + 4 * k4), [w1] "r"(w1 + 4 * k4),
                              [w2] "r"(w2 + 4 * k4), [w3] "r"(w3 + 4 * k4),
                              "m"(*(const char(*)[2048])a), "m"(*(const char(*)[ND_QGROUP])w0),
                              "m"(*(const char(*)[ND_QGROUP])w1),
                              "m"(*(const char(*)[ND_QGROUP])w2), "m"(*(const char(*)[ND_QGROUP])w3)
                            : "xmm13", "xmm14", "xmm15");
                const float *st = x->st + ((size_t)tile * ng + g) * ND_QTILE;
                __m256 s0 = _mm256_loadu_ps(st), s1 = _mm256_loadu_ps(st + 8);
                __m256i acc[TV_R][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
                for (int i = 0; i < TV_R; i++) {
                    __m256 nv = _mm256_set1_ps(wn[i][g]);
                    _mm256_store_ps(f[i],
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]),
                                                    _mm256_mul_ps(s0, nv), _mm256_load_ps(f[i])));
                    _mm256_store_ps(f[i] + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][1]),
                                                              _mm256_mul_ps(s1, nv),
                                                              _mm256_load_ps(f[i] + 8)));
                }
            }
            store_tile4_avx(y, ldy, n, tile, rb, nr, f);
        }
    }
}

T_AVXVNNI void nd_qgemm_avxvnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                                int ldy)
{
    int8_t lut16[16], lut_u8[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    for (int i = 0; i < 16; i++)
        lut_u8[i] = (int8_t)(lut16[i] ^ 0x80); /* + 128 as an unsigned byte */
    if (x->tiles > 0 && w->ng <= 16) {
        const __m256i lut_s8 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut16));
        tiles_avxvnni(w, x, r0, r1, y, ldy, lut_s8, lut16, inv);
        return;
    }
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut_u8));
    if (x->n == 1 && w->ng <= 16 && (stored_bits(w->bits) == 2 || stored_bits(w->bits) == 4)) {
        matvec_avxvnni(w, x, r0, r1, y, lut, inv);
        return;
    }
    small_avxvnni(w, x, r0, r1, y, ldy, lut, lut16, inv);
}

/* ------------------------------------------------------------------ */
/* AVX-512                                                              */

/* the group's 128 values as two 64-byte vectors in layout order, each
 * byte lut[code] (the caller's lut decides signed or +128 offset) */
T_AVX512 static inline void unpack_avx512(const nd_qmat *m, int r, int g, __m512i lut,
                                          const int8_t lut16[16], int offset, __m512i v[2])
{
    const uint8_t *p = group_codes(m, r, g);
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    switch (stored_bits(m->bits)) {
    case 4: {
        __m512i b = _mm512_loadu_si512(p);
        v[0] = _mm512_shuffle_epi8(lut, _mm512_and_si512(b, low4));
        v[1] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4));
        break;
    }
    case 2: {
        /* both halves hold the group's 32 bytes; shift the upper half two
         * bits further so one vector covers two crumb planes */
        __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
        const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
        v[0] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi16(b, sh01), low2));
        v[1] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi16(b, sh23), low2));
        break;
    }
    default: {
        int8_t vals[ND_QGROUP];
        nd_qmat_unpack_values(m, r, g, lut16, vals);
        const __m512i off = _mm512_set1_epi8((char)(offset ? 0x80 : 0));
        v[0] = _mm512_xor_si512(_mm512_loadu_si512(vals), off);
        v[1] = _mm512_xor_si512(_mm512_loadu_si512(vals + 64), off);
    }
    }
}

T_AVX512 static inline __m512i dot_avx512(const __m512i w[2], const __m512i aw[2], const int8_t *a)
{
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i acc = _mm512_setzero_si512();
    for (int i = 0; i < 2; i++) {
        __m512i x = _mm512_loadu_si512(a + 64 * i);
        /* sign(x, w): negate x where w < 0 (AVX-512 has no psignb) */
        __mmask64 neg = _mm512_movepi8_mask(w[i]);
        __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        __m512i p = _mm512_maddubs_epi16(aw[i], xs);
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, ones));
    }
    return acc;
}

T_AVX512 static inline __m512 step_avx512(__m512 acc, const __m512i w[2], const __m512i aw[2],
                                          const int8_t *a, float s)
{
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_avx512(w, aw, a)), _mm512_set1_ps(s), acc);
}

T_AVX512 void nd_qgemm_avx512(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut16));
    const int ng = w->ng, n = x->n;
    const size_t stride = (size_t)ng * ND_QGROUP;
    for (int r = r0; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (int g = 0; g < ng; g++) {
                __m512i v[2], av[2];
                unpack_avx512(w, r, g, lut, lut16, 0, v);
                av[0] = _mm512_abs_epi8(v[0]);
                av[1] = _mm512_abs_epi8(v[1]);
                float nr = norm_f16c(w, r, g);
                const int8_t *a = x->q + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                const float *sc = x->scale + (size_t)t * ng + g;
                acc0 = step_avx512(acc0, v, av, a, nr * sc[0]);
                acc1 = step_avx512(acc1, v, av, a + stride, nr * sc[ng]);
                acc2 = step_avx512(acc2, v, av, a + 2 * stride, nr * sc[2 * ng]);
                acc3 = step_avx512(acc3, v, av, a + 3 * stride, nr * sc[3 * ng]);
            }
            y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc0) * inv;
            y[(size_t)(t + 1) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc1) * inv;
            y[(size_t)(t + 2) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc2) * inv;
            y[(size_t)(t + 3) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc3) * inv;
        }
        for (; t < n; t++) {
            __m512 acc = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                __m512i v[2], av[2];
                unpack_avx512(w, r, g, lut, lut16, 0, v);
                av[0] = _mm512_abs_epi8(v[0]);
                av[1] = _mm512_abs_epi8(v[1]);
                const int8_t *a = x->q + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                acc = step_avx512(acc, v, av, a, norm_f16c(w, r, g) * x->scale[(size_t)t * ng + g]);
            }
            y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc) * inv;
        }
    }
}

/* ------------------------------------------------------------------ */
/* AVX-512 VNNI                                                         */

/* w . a as int32 lanes: dpbusd takes unsigned x signed bytes, so it sums
 * (w + 128) * a onto a start of -128 * sum(a) (lane 0), exactly */
T_VNNI static inline __m512 step_vnni(__m512 acc, const __m512i w[2], const int8_t *a, int32_t asum,
                                      float s)
{
    __m512i start = _mm512_zextsi128_si512(_mm_cvtsi32_si128(-128 * asum));
    __m512i i = _mm512_dpbusd_epi32(start, w[0], _mm512_loadu_si512(a));
    i = _mm512_dpbusd_epi32(i, w[1], _mm512_loadu_si512(a + 64));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(s), acc);
}

/* (a + 128) . w onto start (-128 * sum(w) lanes): the exact w . a */
T_VNNI static inline __m512 step_vnni_u(__m512 acc, __m512i start, const __m512i w[2],
                                        const uint8_t *a, float s)
{
    __m512i i = _mm512_dpbusd_epi32(start, _mm512_loadu_si512(a), w[0]);
    i = _mm512_dpbusd_epi32(i, _mm512_loadu_si512(a + 64), w[1]);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(s), acc);
}

/* sums of four vectors' lanes as one 4-lane vector: a transposing add
 * tree costs 11 operations where four horizontal sums cost ~32 */
T_VNNI static inline __m128 hsum4_avx512(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* per 128-bit lane: ab = a0+a2 b0+b2 a1+a3 b1+b3, cd alike; then
     * (ab0, ab1, cd0, cd1) + (ab2, ab3, cd2, cd3) = a, b, c, d partials */
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xee));
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return q; /* (a, b, c, d) */
}

/* one row's accumulator over its ng groups, codes of a constant width
 * (2 or 4 bits: inlined per width so the unpack is branch-free and its
 * constants stay in registers) */
T_VNNI static inline __attribute__((always_inline)) __m512
matvec_row(const uint8_t *p, const uint8_t *np, int ng, int sb, __mmask16 gm, __m512 xs,
           const __m512i *start, const int8_t *a, __m512i lut)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    float sv[16];
    _mm512_storeu_ps(sv, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, np)), xs));
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int g = 0; g < ng; g++) {
        __m512i v0, v1;
        if (sb == 2) {
            /* a nibble holds two crumbs: lut2 maps it to the first one's
             * value in the lower 256 bits and the second's in the upper,
             * so one shift serves four planes */
            __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 32 * g)));
            v0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(b, low4));
            v1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4));
        } else {
            __m512i b = _mm512_loadu_si512(p + 64 * g);
            v0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(b, low4));
            v1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4));
        }
        __m512i i = _mm512_dpbusd_epi32(start[g], v0, _mm512_loadu_si512(a + 128 * g));
        i = _mm512_dpbusd_epi32(i, v1, _mm512_loadu_si512(a + 128 * g + 64));
        /* two sums: consecutive groups do not wait on each other's fma */
        if (g & 1)
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(sv[g]), acc1);
        else
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(sv[g]), acc0);
    }
    return _mm512_add_ps(acc0, acc1);
}

T_VNNI static inline __attribute__((always_inline)) void matvec_rows(const nd_qmat *w,
                                                                     const nd_qact *x, int r0,
                                                                     int r1, float *y, __m512i lut,
                                                                     float inv, int sb)
{
    const int ng = w->ng;
    const __mmask16 gm = (__mmask16)((1u << ng) - 1);
    __m512i start[16];
    for (int g = 0; g < ng; g++)
        start[g] = _mm512_zextsi128_si512(_mm_cvtsi32_si128(-128 * x->sum[g]));
    const __m512 xs = _mm512_maskz_loadu_ps(gm, x->scale);
    const size_t rb = w->row_bytes, nb = (size_t)ng * 2;
    /* one token reads each code byte once: fetch rows ahead, the hardware
     * prefetcher restarts on every (small) matrix and page */
    const size_t ahead = 1024 > 4 * rb ? 1024 : 4 * rb;
    const __m128 vinv = _mm_set1_ps(inv);
    const int8_t *a = x->q;
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *p = w->codes + (size_t)r * rb, *np = w->norms + (size_t)r * nb;
        for (size_t off = 0; off < 4 * rb; off += 64)
            _mm_prefetch((const char *)p + ahead + off, _MM_HINT_T0);
        __m512 a0 = matvec_row(p, np, ng, sb, gm, xs, start, a, lut);
        __m512 a1 = matvec_row(p + rb, np + nb, ng, sb, gm, xs, start, a, lut);
        __m512 a2 = matvec_row(p + 2 * rb, np + 2 * nb, ng, sb, gm, xs, start, a, lut);
        __m512 a3 = matvec_row(p + 3 * rb, np + 3 * nb, ng, sb, gm, xs, start, a, lut);
        _mm_storeu_ps(y + r, _mm_mul_ps(hsum4_avx512(a0, a1, a2, a3), vinv));
    }
    for (; r < r1; r++) {
        __m512 acc = matvec_row(w->codes + (size_t)r * rb, w->norms + (size_t)r * nb, ng, sb, gm,
                                xs, start, a, lut);
        y[r] = _mm512_reduce_add_ps(acc) * inv;
    }
}

/* One token, at most 16 groups (inputs up to 2048), 2- or 4-bit codes:
 * the row's norms are converted and scaled in one vector and each group's
 * offset correction is precomputed, leaving shuffles, two dpbusd and one
 * fma per group; four rows share one reduction. */
T_VNNI static void matvec_vnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                               __m512i lut, float inv)
{
    if (stored_bits(w->bits) == 2) {
        int8_t lut_u8[16], l2[64];
        _mm_storeu_si128((__m128i *)lut_u8, _mm512_castsi512_si128(lut));
        for (int nib = 0; nib < 16; nib++) {
            l2[nib] = l2[16 + nib] = lut_u8[nib & 3];
            l2[32 + nib] = l2[48 + nib] = lut_u8[nib >> 2];
        }
        matvec_rows(w, x, r0, r1, y, _mm512_loadu_si512(l2), inv, 2);
    } else {
        matvec_rows(w, x, r0, r1, y, lut, inv, 4);
    }
}

/* A block of rows unpacked for the token-tile kernels (VNNI and AMX): row
 * i's group g as int8 codes at ws + i * TB_ROW + g * ND_QGROUP (at most 16
 * groups; rows nr .. height - 1 are zero). Per (row, group) the code sum,
 * which the unsigned (+128) activations need as a correction, goes to
 * sums[i * si + g * sg] and the group norm x codebook scale to
 * norms[i * si + g * sg]. */
#define TB_ROW (16 * ND_QGROUP)

T_VNNI static inline void unpack_row_block(const nd_qmat *w, int rb, int nr, int height,
                                           __m512i lut_s8, const int8_t lut16[16], float inv,
                                           int8_t *ws, int32_t *sums, float *norms, int si, int sg)
{
    const __m512i ones = _mm512_set1_epi8(1);
    for (int i = 0; i < height; i++)
        for (int g = 0; g < w->ng; g++) {
            __m512i v[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            if (i < nr)
                unpack_avx512(w, rb + i, g, lut_s8, lut16, 0, v);
            int8_t *dst = ws + (size_t)i * TB_ROW + (size_t)g * ND_QGROUP;
            _mm512_store_si512(dst, v[0]);
            _mm512_store_si512(dst + 64, v[1]);
            __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v[0]);
            c = _mm512_dpbusd_epi32(c, ones, v[1]);
            sums[i * si + g * sg] = _mm512_reduce_add_epi32(c);
            norms[i * si + g * sg] = i < nr ? norm_f16c(w, rb + i, g) * inv : 0.0f;
        }
}

/* Token tile `tile`'s float sums of rows rb .. rb + nr - 1 into y. */
T_VNNI static inline void store_tile(float *y, int ldy, int n, int tile, int rb, int nr,
                                     const __m512 *f, int fstride)
{
    int t0 = tile * ND_QTILE, nt = n - t0 < ND_QTILE ? n - t0 : ND_QTILE;
    for (int i = 0; i < nr; i++) {
        float out[ND_QTILE];
        _mm512_storeu_ps(out, f[i * fstride]);
        for (int lane = 0; lane < nt; lane++)
            y[(size_t)(t0 + lane) * ldy + (size_t)(rb + i)] = out[lane];
    }
}

/* The same for at most 8 rows (f[i * fstride], i < nr; the others are
 * not read): an 8 x 16 transpose turns the rows' token lanes into one
 * 8-float vector per token, stored with a mask of nr lanes, where a
 * scalar store per (row, token) cost as much as a third of the products
 * of a 64-token chunk. */
T_VNNI static inline void store_tile8(float *y, int ldy, int n, int tile, int rb, int nr,
                                      const __m512 *f, int fstride)
{
    int t0 = tile * ND_QTILE, nt = n - t0 < ND_QTILE ? n - t0 : ND_QTILE;
    __m512 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = i < nr ? f[i * fstride] : _mm512_setzero_ps();
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: r2i[k], r2i+1[k] pairs */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) /* u[4h + k] lane L: rows 4h..4h+3 of token 4L + k */
        for (int k = 0; k < 2; k++) {
            __m512d a = _mm512_castps_pd(t[4 * h + k]), b = _mm512_castps_pd(t[4 * h + 2 + k]);
            u[4 * h + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[4 * h + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    const __mmask8 m = (__mmask8)((1u << nr) - 1u);
    for (int k = 0; k < 4; k++) {
        /* (rows 0-3, rows 4-7) of tokens k, 4 + k, then 8 + k, 12 + k */
        __m512 lo = _mm512_shuffle_f32x4(u[k], u[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 hi = _mm512_shuffle_f32x4(u[k], u[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
        lo = _mm512_shuffle_f32x4(lo, lo, _MM_SHUFFLE(3, 1, 2, 0));
        hi = _mm512_shuffle_f32x4(hi, hi, _MM_SHUFFLE(3, 1, 2, 0));
        const __m256 v[4] = {_mm512_castps512_ps256(lo),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1)),
                             _mm512_castps512_ps256(hi),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1))};
        for (int q = 0; q < 4; q++) {
            int tok = 4 * q + k;
            if (tok < nt)
                _mm256_mask_storeu_ps(y + (size_t)(t0 + tok) * ldy + (size_t)rb, m, v[q]);
        }
    }
}

/* Token tiles (x->tiles, qmat.h): tokens in the 16 lanes, so a group's
 * product is 32 dpbusd per (row, tile) with the row's four code bytes
 * broadcast, no horizontal sums. TL_R rows are unpacked to int8 once and
 * serve every tile; TL_R x 2 int32 accumulators (two tiles) plus as many
 * float ones fit the 32 registers. Each group's int32 sums start at -128 x
 * (the row group's code sum), the correction for the unsigned activations,
 * and are scaled by norm x activation scale into the float sums. */
#define TL_R 6

T_VNNI static void tiles_vnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy,
                              __m512i lut_s8, const int8_t lut16[16], float inv)
{
    const int ng = w->ng, n = x->n, tiles = x->tiles;
    const size_t tstride = (size_t)ng * ND_QTILE * ND_QGROUP;
    _Alignas(64) int8_t ws[TL_R][16][ND_QGROUP];
    int32_t wsum[TL_R][16];
    float wn[TL_R][16];
    for (int rb = r0; rb < r1; rb += TL_R) {
        int nr = r1 - rb < TL_R ? r1 - rb : TL_R;
        unpack_row_block(w, rb, nr, TL_R, lut_s8, lut16, inv, ws[0][0], wsum[0], wn[0], 16, 1);
        for (int tp = 0; tp < tiles; tp += 2) {
            /* an odd last tile runs twice rather than in a second kernel */
            int t1 = tp + 1 < tiles ? tp + 1 : tp;
            __m512 f[TL_R][2];
            for (int i = 0; i < TL_R; i++)
                f[i][0] = f[i][1] = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                const uint8_t *a0 = x->qt + (size_t)tp * tstride + (size_t)g * ND_QTILE * ND_QGROUP;
                const uint8_t *a1 = x->qt + (size_t)t1 * tstride + (size_t)g * ND_QTILE * ND_QGROUP;
                const int8_t *w0 = ws[0][g], *w1 = ws[1][g], *w2 = ws[2][g];
                const int8_t *w3 = ws[3][g], *w4 = ws[4][g], *w5 = ws[5][g];
                /* named accumulators: arrays of vectors make gcc shuffle
                 * registers on every iteration */
                __m512i c00 = _mm512_set1_epi32(-128 * wsum[0][g]), c01 = c00;
                __m512i c10 = _mm512_set1_epi32(-128 * wsum[1][g]), c11 = c10;
                __m512i c20 = _mm512_set1_epi32(-128 * wsum[2][g]), c21 = c20;
                __m512i c30 = _mm512_set1_epi32(-128 * wsum[3][g]), c31 = c30;
                __m512i c40 = _mm512_set1_epi32(-128 * wsum[4][g]), c41 = c40;
                __m512i c50 = _mm512_set1_epi32(-128 * wsum[5][g]), c51 = c50;
                for (int k4 = 0; k4 < ND_QGROUP / 4; k4++) {
                    __m512i A0 = _mm512_loadu_si512(a0 + k4 * 64);
                    __m512i A1 = _mm512_loadu_si512(a1 + k4 * 64);
/* gcc copies the accumulator of every _mm512_dpbusd_epi32 to a fresh
 * register (24 extra moves per step here); the instruction itself updates
 * it in place and reads the four weight bytes as a broadcast operand */
#define TL_STEP(wr, ca, cb)                                                                        \
    do {                                                                                           \
        const int32_t *bw_ = (const int32_t *)(const void *)((wr) + 4 * k4);                       \
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(ca) : "v"(A0), "m"(*bw_));                   \
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(cb) : "v"(A1), "m"(*bw_));                   \
    } while (0)
                    TL_STEP(w0, c00, c01);
                    TL_STEP(w1, c10, c11);
                    TL_STEP(w2, c20, c21);
                    TL_STEP(w3, c30, c31);
                    TL_STEP(w4, c40, c41);
                    TL_STEP(w5, c50, c51);
#undef TL_STEP
                }
                __m512i acc[TL_R][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                        {c30, c31}, {c40, c41}, {c50, c51}};
                __m512 s0 = _mm512_loadu_ps(x->st + ((size_t)tp * ng + g) * ND_QTILE);
                __m512 s1 = _mm512_loadu_ps(x->st + ((size_t)t1 * ng + g) * ND_QTILE);
                for (int i = 0; i < TL_R; i++) {
                    __m512 nv = _mm512_set1_ps(wn[i][g]);
                    f[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][0]), _mm512_mul_ps(s0, nv),
                                              f[i][0]);
                    f[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][1]), _mm512_mul_ps(s1, nv),
                                              f[i][1]);
                }
            }
            for (int k = 0; k < (t1 > tp ? 2 : 1); k++)
                store_tile8(y, ldy, n, tp + k, rb, nr, &f[0][k], 2);
        }
    }
}

T_VNNI void nd_qgemm_avx512vnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y,
                                int ldy)
{
    int8_t lut16[16], lut_u8[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    for (int i = 0; i < 16; i++)
        lut_u8[i] = (int8_t)(lut16[i] ^ 0x80); /* + 128 as an unsigned byte */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u8));
    const int ng = w->ng, n = x->n;
    const size_t stride = (size_t)ng * ND_QGROUP;
    if (n == 1 && ng <= 16 && (stored_bits(w->bits) == 2 || stored_bits(w->bits) == 4)) {
        matvec_vnni(w, x, r0, r1, y, lut, inv);
        return;
    }
    const __m512i lut_s8 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut16));
    if (x->tiles > 0 && ng <= 16) {
        tiles_vnni(w, x, r0, r1, y, ldy, lut_s8, lut16, inv);
        return;
    }
    const __m512i u128 = _mm512_set1_epi8((char)0x80);
    for (int r = r0; r < r1; r++) {
        int t = 0;
        /* four tokens: signed codes times unsigned activations (a + 128),
         * started at -128 * (codes' lane sums), computed once per group */
        for (; t + 4 <= n; t += 4) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (int g = 0; g < ng; g++) {
                __m512i v[2];
                unpack_avx512(w, r, g, lut_s8, lut16, 0, v);
                __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, v[0]);
                c = _mm512_dpbusd_epi32(c, u128, v[1]);
                const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), c);
                float nr = norm_f16c(w, r, g);
                const uint8_t *a = x->qu + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                const float *sc = x->scale + (size_t)t * ng + g;
                acc0 = step_vnni_u(acc0, start, v, a, nr * sc[0]);
                acc1 = step_vnni_u(acc1, start, v, a + stride, nr * sc[ng]);
                acc2 = step_vnni_u(acc2, start, v, a + 2 * stride, nr * sc[2 * ng]);
                acc3 = step_vnni_u(acc3, start, v, a + 3 * stride, nr * sc[3 * ng]);
            }
            y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc0) * inv;
            y[(size_t)(t + 1) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc1) * inv;
            y[(size_t)(t + 2) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc2) * inv;
            y[(size_t)(t + 3) * ldy + (size_t)r] = _mm512_reduce_add_ps(acc3) * inv;
        }
        for (; t < n; t++) {
            __m512 acc = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                __m512i v[2];
                unpack_avx512(w, r, g, lut, lut16, 1, v);
                const int8_t *a = x->q + ((size_t)t * ng + (size_t)g) * ND_QGROUP;
                float s = norm_f16c(w, r, g) * x->scale[(size_t)t * ng + g];
                acc = step_vnni(acc, v, a, x->sum[(size_t)t * ng + g], s);
            }
            y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc) * inv;
        }
    }
}

/* ------------------------------------------------------------------ */
/* AMX (Sapphire Rapids and later)                                      */

#define T_AMX                                                                                      \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,"       \
                          "f16c")))

/* Token tiles on AMX: a row block of 16 is unpacked to int8 once (the A
 * operand: rows x codes, exactly as unpacked), x->qt is the B operand as
 * it is (four-byte steps x tokens), and one tdpbsud pair computes a
 * group's 16 x 16 int32 sums: signed codes x unsigned activations, started
 * at zero, corrected by -128 x the row group's code sum when scaled. The
 * 16 float sums of a token tile stay in registers across the groups. */
T_AMX static void tiles_amx(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy,
                            __m512i lut_s8, const int8_t lut16[16], float inv)
{
    const int ng = w->ng, n = x->n, tiles = x->tiles;
    _Alignas(64) int8_t ws[16][TB_ROW]; /* rows of the A operand */
    const long astride = (long)sizeof ws[0];
    _Alignas(64) int32_t c[16][16];
    int32_t wsum[16][16];
    float wn[16][16];
    /* tmm0 = C (16 rows x 16 tokens of int32), tmm1 = A (16 rows x 64 code
     * bytes), tmm2 = B (16 four-byte steps x 16 tokens) */
    nd_amx_tiles(3);
    for (int rb = r0; rb < r1; rb += 16) {
        int nr = r1 - rb < 16 ? r1 - rb : 16;
        unpack_row_block(w, rb, nr, 16, lut_s8, lut16, inv, ws[0], wsum[0], wn[0], 1, 16);
        /* the next block's codes and norms arrive while this one computes
         * (the unpack above otherwise waits on the mapped archive) */
        if (rb + 16 < r1) {
            int nn = r1 - rb - 16 < 16 ? r1 - rb - 16 : 16;
            const char *pc = (const char *)w->codes + (size_t)(rb + 16) * w->row_bytes;
            const char *pn = (const char *)w->norms + (size_t)(rb + 16) * (size_t)ng * 2;
            for (size_t off = 0; off < (size_t)nn * w->row_bytes; off += 64)
                _mm_prefetch(pc + off, _MM_HINT_T0);
            for (size_t off = 0; off < (size_t)nn * (size_t)ng * 2; off += 64)
                _mm_prefetch(pn + off, _MM_HINT_T0);
        }
        for (int tile = 0; tile < tiles; tile++) {
            __m512 f[16];
            for (int i = 0; i < 16; i++)
                f[i] = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                const uint8_t *b = x->qt + ((size_t)tile * ng + g) * ND_QTILE * ND_QGROUP;
                _tile_zero(0);
                _tile_loadd(1, ws[0] + g * ND_QGROUP, astride);
                _tile_loadd(2, b, 64);
                _tile_dpbsud(0, 1, 2);
                _tile_loadd(1, ws[0] + g * ND_QGROUP + 64, astride);
                _tile_loadd(2, b + 1024, 64);
                _tile_dpbsud(0, 1, 2);
                _tile_stored(0, c, 64);
                __m512 st = _mm512_loadu_ps(x->st + ((size_t)tile * ng + g) * ND_QTILE);
                for (int i = 0; i < 16; i++) {
                    __m512i ci = _mm512_sub_epi32(_mm512_load_si512(c[i]),
                                                  _mm512_set1_epi32(128 * wsum[g][i]));
                    f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ci),
                                           _mm512_mul_ps(st, _mm512_set1_ps(wn[g][i])), f[i]);
                }
            }
            store_tile(y, ldy, n, tile, rb, nr, f, 1);
        }
    }
    _tile_release();
}

T_AMX void nd_qgemm_amx(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    if (!(x->tiles > 0 && w->ng <= 16)) { /* a few tokens: the VNNI kernel */
        nd_qgemm_avx512vnni(w, x, r0, r1, y, ldy);
        return;
    }
    int8_t lut16[16];
    float inv;
    nd_qcodebook(w->bits, lut16, &inv);
    const __m512i lut_s8 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut16));
    tiles_amx(w, x, r0, r1, y, ldy, lut_s8, lut16, inv);
}

/* q[pos[j]] = natural[j] as one two-register byte permutation (inv is
 * pos's inverse), qu = q + 128 */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void
nd_qact_place_vbmi(const int8_t *natural, const uint8_t inv[ND_QGROUP], int8_t *q, uint8_t *qu)
{
    __m512i a = _mm512_loadu_si512(natural), b = _mm512_loadu_si512(natural + 64);
    __m512i o0 = _mm512_permutex2var_epi8(a, _mm512_loadu_si512(inv), b);
    __m512i o1 = _mm512_permutex2var_epi8(a, _mm512_loadu_si512(inv + 64), b);
    const __m512i off = _mm512_set1_epi8((char)0x80);
    _mm512_storeu_si512(q, o0);
    _mm512_storeu_si512(q + 64, o1);
    _mm512_storeu_si512(qu, _mm512_xor_si512(o0, off));
    _mm512_storeu_si512(qu + 64, _mm512_xor_si512(o1, off));
}

/* ------------------------------------------------------------------ */
/* activation groups                                                    */

/* x[j] + x[j ^ h] or x[j ^ h] - x[j] (lanes with bit h): one butterfly
 * stage of the Walsh-Hadamard transform inside a 16-lane register */
T_AVX512 static inline __m512 butterfly_in_lane(__m512 x, int h)
{
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = _mm512_xor_si512(lane, _mm512_set1_epi32(h));
    __mmask16 high = _mm512_test_epi32_mask(lane, _mm512_set1_epi32(h));
    __m512 p = _mm512_permutexvar_ps(idx, x);
    return _mm512_mask_sub_ps(_mm512_add_ps(x, p), high, p, x);
}

T_AVX512 void nd_qact_group_avx512(const float *v, int8_t *q, float *amax, int32_t *sum)
{
    __m512 x[8];
    for (int k = 0; k < 8; k++)
        x[k] = _mm512_loadu_ps(v + 16 * k);
    for (int h = 1; h < 16; h <<= 1)
        for (int k = 0; k < 8; k++)
            x[k] = butterfly_in_lane(x[k], h);
    for (int s = 1; s < 8; s <<= 1) /* stages 16, 32, 64 across registers */
        for (int k = 0; k < 8; k++)
            if (!(k & s)) {
                __m512 a = x[k], b = x[k + s];
                x[k] = _mm512_add_ps(a, b);
                x[k + s] = _mm512_sub_ps(a, b);
            }
    __m512 mx = _mm512_setzero_ps();
    for (int k = 0; k < 8; k++)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(x[k]));
    float m = _mm512_reduce_max_ps(mx);
    __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i total = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++) { /* nearest, ties away from zero, as the scalar path */
        __m512 r = _mm512_mul_ps(x[k], inv);
        __m512 bias = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(half), _mm512_and_si512(_mm512_castps_si512(r), sign)));
        __m512i qi = _mm512_cvttps_epi32(_mm512_add_ps(r, bias));
        total = _mm512_add_epi32(total, qi);
        _mm_storeu_si128((__m128i *)(q + 16 * k), _mm512_cvtsepi32_epi8(qi));
    }
    *amax = m;
    *sum = _mm512_reduce_add_epi32(total);
}

/* ------------------------------------------------------------------ */
/* row dequantisation                                                   */

/* Group g of row r as floats (nd_qmat_row's, 2- or 4-bit stored codes):
 * the 128 codes in natural order (16 per vector: a variable shift of the
 * word holding them), their float levels by one lane permutation of the
 * 16 levels, times the norm, then the Walsh-Hadamard butterflies in the
 * scalar transform's order (h = 1, 2, ..., 64; a + b, a - b), so every
 * value is the scalar path's bit for bit. */
T_AVX512 void nd_qmat_group_avx512(const uint8_t *codes, int sb, const float levels[16], float norm,
                                   float *out)
{
    const __m512 lv = _mm512_loadu_ps(levels), nv = _mm512_set1_ps(norm);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 x[8];
    for (int k = 0; k < 8; k++) {
        __m512i c;
        if (sb == 2) { /* 16 crumbs: one 32-bit word, value j at bits 2j */
            uint32_t wd;
            memcpy(&wd, codes + 4 * k, 4);
            c = _mm512_srlv_epi32(_mm512_set1_epi32((int)wd), _mm512_slli_epi32(iota, 1));
            c = _mm512_and_si512(c, _mm512_set1_epi32(3));
        } else { /* 16 nibbles: two words, value j at bits 4 (j % 8) of word j / 8 */
            uint32_t w0, w1;
            memcpy(&w0, codes + 8 * k, 4);
            memcpy(&w1, codes + 8 * k + 4, 4);
            __m512i wv = _mm512_mask_set1_epi32(_mm512_set1_epi32((int)w0), 0xFF00, (int)w1);
            c = _mm512_srlv_epi32(
                wv, _mm512_slli_epi32(_mm512_and_si512(iota, _mm512_set1_epi32(7)), 2));
            c = _mm512_and_si512(c, _mm512_set1_epi32(15));
        }
        x[k] = _mm512_mul_ps(_mm512_permutexvar_ps(c, lv), nv);
    }
    for (int h = 1; h < 16; h <<= 1)
        for (int k = 0; k < 8; k++)
            x[k] = butterfly_in_lane(x[k], h);
    for (int s = 1; s < 8; s <<= 1)
        for (int k = 0; k < 8; k++)
            if (!(k & s)) {
                __m512 a = x[k], b = x[k + s];
                x[k] = _mm512_add_ps(a, b);
                x[k + s] = _mm512_sub_ps(a, b);
            }
    for (int k = 0; k < 8; k++)
        _mm512_storeu_ps(out + 16 * k, x[k]);
}

#else
typedef int nd_qmat_x86_unused; /* ISO C: no empty translation unit */
#endif
