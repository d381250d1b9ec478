/* Cached attention over the int8 KV cache for x86-64 CPUs without AVX-512:
 * the scores as integer dot products of the query rows quantised to int8
 * (nd_att_quant_q) with the int8 keys, 8 keys a 256-bit vector, by
 * AVX-VNNI's vpdpbusd or AVX2's vpmaddubsw + vpmaddwd; softmax and the
 * weighted V rows in float (attention.h's block task; attention.c keeps
 * the reference and picks a kernel at run time). Each function carries its
 * own target attribute, so one binary runs on any x86-64.
 *
 * A block's keys are transposed into 4-byte groups (one vector: dims
 * 4g..4g+3 of 8 keys), so each query row's 8 scores come out of one chain
 * of dot-product instructions with the row's group broadcast, no
 * horizontal sums. */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "engine/attention.h"
#include "engine/simd_x86.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma")))
#define T_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))
#define KEYS 8
/* query rows quantised at a time (their int8 rows stay on the stack) */
#define I8_ROWS 32

/* the keys any row of the block sees: [0, se_max) and [lo2, pend) */
static void block_ranges(const nd_att_block *b, int ranges[2][2])
{
    int se_max = b->se[b->nr - 1], lo2 = b->j0[0] > se_max ? b->j0[0] : se_max;
    ranges[0][0] = 0;
    ranges[0][1] = se_max;
    ranges[1][0] = lo2;
    ranges[1][1] = b->pos0 + b->nr;
}

/* r[c][t] -> r[t][c] for an 8 x 8 matrix of 32-bit lanes: interleave pairs
 * of rows, then pairs of pairs (128-bit lane L of u[4i + k] is element
 * 4L + k of rows 4i..4i+3), then the 128-bit halves */
T_AVX2 static inline void transpose8_epi32(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* rows [j, j + nb) of the int8 keys as 4-byte groups, transposed:
 * kt[g * 8 + c] holds dims 4g..4g+3 of key j + c (keys past nb are 0).
 * u8: each byte plus 128 (vpdpbusd's unsigned operand, keys past nb 128);
 * else ka gets the bytes' absolute values (vpmaddubsw's unsigned operand). */
T_AVX2 static void keys_t8(uint32_t *kt, uint32_t *ka, const int8_t *rows, size_t stride, int j,
                           int nb, int hd, int prefetch_end, int u8)
{
    for (int c = 0; c < nb; c++)
        if (j + c + KEYS < prefetch_end)
            _mm_prefetch((const char *)(rows + (size_t)(j + c + KEYS) * stride), _MM_HINT_T0);
    const __m256i off = _mm256_set1_epi8((char)0x80);
    for (int e = 0; e < hd; e += 32) {
        int wide = hd - e >= 32, ng = wide ? 8 : (hd - e) / 4;
        __m256i r[KEYS];
        for (int c = 0; c < KEYS; c++) {
            const int8_t *p = rows + (size_t)(j + c) * stride + e;
            if (c >= nb)
                r[c] = _mm256_setzero_si256();
            else if (wide)
                r[c] = _mm256_loadu_si256((const __m256i *)p);
            else /* hd is a multiple of 16: 16 bytes left */
                r[c] = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                               _mm_loadu_si128((const __m128i *)p), 0);
        }
        transpose8_epi32(r);
        for (int t = 0; t < ng; t++) {
            uint32_t *dst = kt + (size_t)(e / 4 + t) * KEYS;
            if (u8) {
                _mm256_store_si256((__m256i *)dst, _mm256_xor_si256(r[t], off));
            } else {
                _mm256_store_si256((__m256i *)dst, r[t]);
                _mm256_store_si256((__m256i *)(ka + (size_t)(e / 4 + t) * KEYS),
                                   _mm256_abs_epi8(r[t]));
            }
        }
    }
}

/* 8 rows' scales (stride G) from row j, times f; zero past nb */
T_AVX2 static inline __m256 row_scales8(const float *sc, int G, int j, int nb, float f)
{
    _Alignas(32) float x[KEYS];
    for (int c = 0; c < KEYS; c++)
        x[c] = c < nb ? sc[(size_t)(j + c) * G] * f : 0.0f;
    return _mm256_load_ps(x);
}

/* lanes c < n all ones */
T_AVX2 static inline __m256i first8(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* v's first n lanes (all 8 from n = 8) to p: plain stores (vmaskmovps
 * stores are microcoded and slow on AMD cores) */
T_AVX2 static inline void store8(float *p, __m256 v, int n)
{
    if (n >= KEYS) {
        _mm256_storeu_ps(p, v);
        return;
    }
    _Alignas(32) float t[KEYS];
    _mm256_store_ps(t, v);
    memcpy(p, t, sizeof(float) * (size_t)n);
}

/* p's first n floats, lanes past n `fill` */
T_AVX2 static inline __m256 load8(const float *p, int n, float fill)
{
    if (n >= KEYS)
        return _mm256_loadu_ps(p);
    _Alignas(32) float t[KEYS];
    for (int c = 0; c < KEYS; c++)
        t[c] = c < n ? p[c] : fill;
    return _mm256_load_ps(t);
}

/* the task's query rows r0.. (up to I8_ROWS) as int8 groups: qg[i * hd/4
 * + g] holds dims 4g..4g+3 of row r0 + i; qs: each row's scale times
 * b->scale, off: 128 * the row's sum (what the unsigned keys add) */
static int quant_rows(const nd_att_block *b, int r0, int32_t *qg, float *qs, int32_t *off)
{
    int rep = b->rep, R = b->nr * rep, hd = b->hd;
    int nq = R - r0 < I8_ROWS ? R - r0 : I8_ROWS;
    for (int i = 0; i < nq; i++) {
        int r = r0 + i;
        int32_t sum;
        qs[i] = b->scale * nd_att_quant_q(b->q + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd,
                                          hd, (int8_t *)(qg + (size_t)i * (hd / 4)), &sum);
        off[i] = 128 * sum;
    }
    return nq;
}

/* one query row's 8 scores (int32) against the transposed keys */
T_AVXVNNI static inline __m256i dots_avxvnni(const uint32_t *kt, const int32_t *q, int ngr)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int g = 0; g < ngr; g += 2) {
        a0 = _mm256_dpbusd_avx_epi32(a0, _mm256_load_si256((const __m256i *)(kt + g * KEYS)),
                                     _mm256_set1_epi32(q[g]));
        a1 = _mm256_dpbusd_avx_epi32(a1, _mm256_load_si256((const __m256i *)(kt + (g + 1) * KEYS)),
                                     _mm256_set1_epi32(q[g + 1]));
    }
    return _mm256_add_epi32(a0, a1);
}

/* the same by AVX2: |k| (unsigned) times q with k's sign (|q| <= 127, so
 * a pair of products stays within int16), pairs summed by vpmaddwd */
T_AVX2 static inline __m256i dots_avx2(const uint32_t *kt, const uint32_t *ka, const int32_t *q,
                                       int ngr)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int g = 0; g < ngr; g += 2) {
        __m256i k0 = _mm256_load_si256((const __m256i *)(kt + g * KEYS));
        __m256i k1 = _mm256_load_si256((const __m256i *)(kt + (g + 1) * KEYS));
        __m256i s0 = _mm256_sign_epi8(_mm256_set1_epi32(q[g]), k0);
        __m256i s1 = _mm256_sign_epi8(_mm256_set1_epi32(q[g + 1]), k1);
        __m256i p0 = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(ka + g * KEYS)), s0);
        __m256i p1 =
            _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(ka + (g + 1) * KEYS)), s1);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p0, ones));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(p1, ones));
    }
    return _mm256_add_epi32(a0, a1);
}

/* scaled scores of every query row of the task (vnni: AVX-VNNI, else AVX2) */
T_AVXVNNI static void scores_avxvnni(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, R = b->nr * b->rep, ngr = hd / 4;
    _Alignas(32) uint32_t kt[ND_ATT_MAX_HD / 4 * KEYS];
    _Alignas(32) int32_t qg[I8_ROWS * ND_ATT_MAX_HD / 4];
    float qs[I8_ROWS];
    int32_t off[I8_ROWS];
    for (int r0 = 0; r0 < R; r0 += I8_ROWS) {
        int nq = quant_rows(b, r0, qg, qs, off);
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += KEYS) {
                int nb = ranges[rr][1] - j < KEYS ? ranges[rr][1] - j : KEYS;
                keys_t8(kt, NULL, b->k8, (size_t)b->stride, j, nb, hd, ranges[rr][1], 1);
                __m256 ksv = row_scales8(b->ks, b->G, j, nb, 1.0f);
                for (int i = 0; i < nq; i++) {
                    __m256i acc = _mm256_sub_epi32(dots_avxvnni(kt, qg + (size_t)i * ngr, ngr),
                                                   _mm256_set1_epi32(off[i]));
                    store8(b->scores + (size_t)(r0 + i) * b->ml + j,
                           _mm256_mul_ps(_mm256_cvtepi32_ps(acc),
                                         _mm256_mul_ps(ksv, _mm256_set1_ps(qs[i]))),
                           nb);
                }
            }
    }
}

T_AVX2 static void scores_avx2(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, R = b->nr * b->rep, ngr = hd / 4;
    _Alignas(32) uint32_t kt[ND_ATT_MAX_HD / 4 * KEYS], ka[ND_ATT_MAX_HD / 4 * KEYS];
    _Alignas(32) int32_t qg[I8_ROWS * ND_ATT_MAX_HD / 4];
    float qs[I8_ROWS];
    int32_t off[I8_ROWS];
    for (int r0 = 0; r0 < R; r0 += I8_ROWS) {
        int nq = quant_rows(b, r0, qg, qs, off);
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += KEYS) {
                int nb = ranges[rr][1] - j < KEYS ? ranges[rr][1] - j : KEYS;
                keys_t8(kt, ka, b->k8, (size_t)b->stride, j, nb, hd, ranges[rr][1], 0);
                __m256 ksv = row_scales8(b->ks, b->G, j, nb, 1.0f);
                for (int i = 0; i < nq; i++) {
                    __m256i acc = dots_avx2(kt, ka, qg + (size_t)i * ngr, ngr);
                    store8(b->scores + (size_t)(r0 + i) * b->ml + j,
                           _mm256_mul_ps(_mm256_cvtepi32_ps(acc),
                                         _mm256_mul_ps(ksv, _mm256_set1_ps(qs[i]))),
                           nb);
                }
            }
    }
}

T_AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

T_AVX2 static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* the scores become weights: softmax over each row's own keys, the
 * normaliser folded in; keys in the block's ranges that a row does not
 * see weigh zero */
T_AVX2 static void softmax8(const nd_att_block *b, int ranges[2][2])
{
    int rep = b->rep, R = b->nr * rep;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int r = 0; r < R; r++) {
        int i = r / rep, p = b->pos0 + i, se = b->se[i], j0 = b->j0[i];
        float *sc = b->scores + (size_t)r * b->ml;
        int own[2][2] = {{0, se}, {j0, p + 1}};
        __m256 mx = _mm256_set1_ps(-FLT_MAX);
        for (int oo = 0; oo < 2; oo++)
            for (int j = own[oo][0]; j < own[oo][1]; j += KEYS)
                mx = _mm256_max_ps(mx, load8(sc + j, own[oo][1] - j, -FLT_MAX));
        __m256 mxv = _mm256_set1_ps(hmax8(mx)), sum = _mm256_setzero_ps();
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += KEYS) {
                int nb = ranges[rr][1] - j;
                __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(j), iota);
                __m256i seen = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(se), idx),
                                               _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(j0 - 1)));
                seen = _mm256_andnot_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(p)), seen);
                seen = _mm256_and_si256(seen, first8(nb));
                /* a lane not seen may hold anything: its weight is masked */
                __m256 x = _mm256_sub_ps(load8(sc + j, nb, 0.0f), mxv);
                __m256 w = _mm256_and_ps(nd_exp8_ps(x), _mm256_castsi256_ps(seen));
                sum = _mm256_add_ps(sum, w);
                store8(sc + j, w, nb);
            }
        __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += KEYS) {
                int nb = ranges[rr][1] - j;
                store8(sc + j, _mm256_mul_ps(load8(sc + j, nb, 0.0f), inv), nb);
            }
    }
}

/* out rows o0, o1 (nv vectors from e0) += the 8 keys' weights w0, w1
 * times the converted V rows (vbuf, hd apart): the sums stay in registers
 * over the keys and each V load serves both rows */
T_AVX2 static inline __attribute__((always_inline)) void
add_values8_n(float *o0, float *o1, const float *w0, const float *w1, const float *vbuf, int nb,
              int hd, int e0, const int nv)
{
    __m256 a0[4], a1[4];
    for (int k = 0; k < nv; k++) {
        a0[k] = _mm256_loadu_ps(o0 + e0 + 8 * k);
        a1[k] = _mm256_loadu_ps(o1 + e0 + 8 * k);
    }
    for (int c = 0; c < nb; c++) {
        __m256 x0 = _mm256_set1_ps(w0[c]), x1 = _mm256_set1_ps(w1[c]);
        for (int k = 0; k < nv; k++) {
            __m256 v = _mm256_load_ps(vbuf + (size_t)c * hd + e0 + 8 * k);
            a0[k] = _mm256_fmadd_ps(x0, v, a0[k]);
            a1[k] = _mm256_fmadd_ps(x1, v, a1[k]);
        }
    }
    for (int k = 0; k < nv; k++) {
        _mm256_storeu_ps(o0 + e0 + 8 * k, a0[k]);
        _mm256_storeu_ps(o1 + e0 + 8 * k, a1[k]);
    }
}

T_AVX2 static void add_values8(float *o0, float *o1, const float *w0, const float *w1,
                               const float *vbuf, int nb, int hd)
{
    for (int e0 = 0; e0 < hd; e0 += 32) /* hd is a multiple of 16 */
        if (hd - e0 >= 32)
            add_values8_n(o0, o1, w0, w1, vbuf, nb, hd, e0, 4);
        else
            add_values8_n(o0, o1, w0, w1, vbuf, nb, hd, e0, 2);
}

/* out = the weighted V rows: each block's int8 rows become floats once and
 * serve every query row, two at a time (an odd one pairs with itself and
 * its second result is dropped); the rows' scales go into the weights */
T_AVX2 static void values8(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, R = b->nr * rep;
    _Alignas(32) float buf[KEYS * ND_ATT_MAX_HD], w[2][KEYS], junk[ND_ATT_MAX_HD];
    for (int r = 0; r < R; r++)
        memset(b->out + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd, 0,
               sizeof(float) * (size_t)hd);
    memset(junk, 0, sizeof(float) * (size_t)hd);
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += KEYS) {
            int nb = ranges[rr][1] - j < KEYS ? ranges[rr][1] - j : KEYS;
            for (int c = 0; c < nb; c++) {
                const int8_t *v = b->v8 + (size_t)(j + c) * b->stride;
                if (j + c + KEYS < ranges[rr][1])
                    _mm_prefetch((const char *)(v + (size_t)KEYS * b->stride), _MM_HINT_T0);
                for (int e = 0; e < hd; e += 8)
                    _mm256_store_ps(buf + (size_t)c * hd + e,
                                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                        _mm_loadl_epi64((const __m128i *)(v + e)))));
            }
            __m256 vsv = row_scales8(b->vs, b->G, j, nb, 1.0f);
            for (int r = 0; r < R; r += 2) {
                float *o[2];
                for (int t = 0; t < 2; t++) {
                    int rt = r + t < R ? r + t : r;
                    _mm256_store_ps(
                        w[t],
                        _mm256_mul_ps(load8(b->scores + (size_t)rt * b->ml + j, nb, 0.0f), vsv));
                    o[t] = r + t < R ? b->out + (size_t)(rt / rep) * b->qd + (size_t)(rt % rep) * hd
                                     : junk;
                }
                add_values8(o[0], o[1], w[0], w[1], buf, nb, hd);
            }
        }
}

void nd_att_block_avxvnni(const nd_att_block *b)
{
    int ranges[2][2];
    block_ranges(b, ranges);
    scores_avxvnni(b, ranges);
    softmax8(b, ranges);
    values8(b, ranges);
}

void nd_att_block_avx2i8(const nd_att_block *b)
{
    int ranges[2][2];
    block_ranges(b, ranges);
    scores_avx2(b, ranges);
    softmax8(b, ranges);
    values8(b, ranges);
}

int nd_att_avx2i8_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* AVX-VNNI (VEX-encoded 256-bit vpdpbusd): CPUID leaf 7 subleaf 1, EAX
 * bit 4, asked directly (not every compiler's __builtin_cpu_supports knows
 * the name); AVX2 checked first (and with it the OS's YMM state) */
int nd_att_avxvnni_supported(void)
{
    if (!nd_att_avx2i8_supported())
        return 0;
    unsigned a, bx, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(bx), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7)
        return 0;
    __asm__("cpuid" : "=a"(a), "=b"(bx), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    return (a >> 4) & 1;
}

#else /* not x86-64: the reference only */

int nd_att_avxvnni_supported(void)
{
    return 0;
}

int nd_att_avx2i8_supported(void)
{
    return 0;
}

void nd_att_block_avxvnni(const nd_att_block *b)
{
    (void)b;
}

void nd_att_block_avx2i8(const nd_att_block *b)
{
    (void)b;
}

#endif
