/* AVX-512 cached attention over the int8 KV cache (attention.h's block
 * task; attention.c keeps the reference). The function carries its own target
 * attribute, so one binary runs on any x86-64 and attention.c picks it at run time.
 *
 * Keys go 16 at a time: the block's int8 rows become floats once (the V
 * rows with their scale folded in) and serve every query row of the task.
 * A query row's 16 dot products are reduced together by a transpose-add
 * tree into one vector of 16 scores, and softmax runs on whole vectors. */
#if defined(__x86_64__)
#include <float.h>
#include <immintrin.h>
#include <string.h>

#include "engine/amx.h"
#include "engine/attention.h"
#include "engine/simd_x86.h"
#include "engine/qmat.h"

#define T_ATT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define ATT_KEYS 16

/* lane c = the sum of a[c]'s lanes: pairs of vectors interleave and add
 * (4 levels), so 16 dot products cost 15 adds instead of 16 reductions */
T_ATT static inline __m512 sum16(const __m512 a[16])
{
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88),
                         _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

static inline __mmask16 first_lanes(int nb)
{
    return (__mmask16)((1u << nb) - 1u);
}

/* scores of one query row against the block's 16 converted keys (rows of
 * kbuf, hd apart) times the keys' scales ksv */
T_ATT static inline __m512 block_scores(const float *q, const float *kbuf, int hd, __m512 ksv)
{
    __m512 acc[ATT_KEYS];
    for (int c = 0; c < ATT_KEYS; c++)
        acc[c] = _mm512_setzero_ps();
    for (int e = 0; e < hd; e += 16) {
        __m512 qv = _mm512_loadu_ps(q + e);
#pragma GCC unroll 16
        for (int c = 0; c < ATT_KEYS; c++)
            acc[c] = _mm512_fmadd_ps(qv, _mm512_load_ps(kbuf + (size_t)c * hd + e), acc[c]);
    }
    return _mm512_mul_ps(sum16(acc), ksv);
}

/* out rows o0, o1 (nv vectors from e0) += the block's 16 weights w0, w1
 * times the converted V rows: the accumulators stay in registers over the
 * keys and each V load serves both rows */
T_ATT static inline __attribute__((always_inline)) void
block_values2(float *o0, float *o1, const float *w0, const float *w1, const float *vbuf, int hd,
              int e0, const int nv)
{
    __m512 a0[4], a1[4];
    for (int k = 0; k < nv; k++) {
        a0[k] = _mm512_loadu_ps(o0 + e0 + 16 * k);
        a1[k] = _mm512_loadu_ps(o1 + e0 + 16 * k);
    }
#pragma GCC unroll 16
    for (int c = 0; c < ATT_KEYS; c++) {
        __m512 x0 = _mm512_set1_ps(w0[c]), x1 = _mm512_set1_ps(w1[c]);
        for (int k = 0; k < nv; k++) {
            __m512 v = _mm512_load_ps(vbuf + (size_t)c * hd + e0 + 16 * k);
            a0[k] = _mm512_fmadd_ps(x0, v, a0[k]);
            a1[k] = _mm512_fmadd_ps(x1, v, a1[k]);
        }
    }
    for (int k = 0; k < nv; k++) {
        _mm512_storeu_ps(o0 + e0 + 16 * k, a0[k]);
        _mm512_storeu_ps(o1 + e0 + 16 * k, a1[k]);
    }
}

T_ATT static void block_values(float *o0, float *o1, const float *w0, const float *w1,
                               const float *vbuf, int hd)
{
    for (int e0 = 0; e0 < hd; e0 += 64)
        switch ((hd - e0) / 16) {
        case 1: block_values2(o0, o1, w0, w1, vbuf, hd, e0, 1); break;
        case 2: block_values2(o0, o1, w0, w1, vbuf, hd, e0, 2); break;
        case 3: block_values2(o0, o1, w0, w1, vbuf, hd, e0, 3); break;
        default: block_values2(o0, o1, w0, w1, vbuf, hd, e0, 4); break;
        }
}

/* rows [j, j + nb) of an int8 cache as floats in buf; rows past nb are
 * zero. The next block's rows are fetched ahead (a kv head's rows are
 * contiguous, so a block is 16 consecutive rows of hd bytes). */
T_ATT static void convert_rows(float *buf, const int8_t *rows, size_t stride, int j, int nb, int hd,
                               int prefetch_end)
{
    for (int c = 0; c < nb; c++) {
        const int8_t *r = rows + (size_t)(j + c) * stride;
        if (j + c + ATT_KEYS < prefetch_end)
            _mm_prefetch((const char *)(r + ATT_KEYS * stride), _MM_HINT_T0);
        for (int e = 0; e < hd; e += 16)
            _mm512_store_ps(buf + (size_t)c * hd + e, nd_i8x16_ps(r + e));
    }
    if (nb < ATT_KEYS)
        memset(buf + (size_t)nb * hd, 0, sizeof(float) * (size_t)(ATT_KEYS - nb) * hd);
}

/* 16 rows' scales (stride G) from row j, times f; zero past nb */
T_ATT static inline __m512 row_scales(const float *sc, int G, int j, int nb, float f)
{
    _Alignas(64) float x[ATT_KEYS];
    for (int c = 0; c < ATT_KEYS; c++)
        x[c] = c < nb ? sc[(size_t)(j + c) * G] * f : 0.0f;
    return _mm512_load_ps(x);
}

/* the keys any row of the block sees: [0, se_max) and [lo2, pend) */
static void block_ranges(const nd_att_block *b, int ranges[2][2])
{
    int se_max = b->se[b->nr - 1], lo2 = b->j0[0] > se_max ? b->j0[0] : se_max;
    ranges[0][0] = 0;
    ranges[0][1] = se_max;
    ranges[1][0] = lo2;
    ranges[1][1] = b->pos0 + b->nr;
}

/* r[c][t] -> r[t][c] for a 16 x 16 matrix of 32-bit lanes */
T_ATT static inline void transpose16_ps(__m512 f[16])
{
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_castps_si512(f[i]);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        f[k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v0, w0, 0x88));
        f[8 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v0, w0, 0xDD));
        f[4 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v1, w1, 0x88));
        f[12 + k] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v1, w1, 0xDD));
    }
}

/* rows [j, j + nb) of the int8 keys as floats, transposed: kt[e * 16 + c]
 * is dim e of key j + c (keys past nb are zero), so a query row's 16
 * scores are one vector of fmas with q[e] broadcast, no horizontal sums */
T_ATT static void convert_keys_t(float *kt, const int8_t *rows, size_t stride, int j, int nb,
                                 int hd, int prefetch_end)
{
    for (int c = 0; c < nb; c++)
        if (j + c + ATT_KEYS < prefetch_end)
            _mm_prefetch((const char *)(rows + (size_t)(j + c + ATT_KEYS) * stride), _MM_HINT_T0);
    for (int e = 0; e < hd; e += 16) {
        __m512 f[ATT_KEYS];
        for (int c = 0; c < ATT_KEYS; c++)
            f[c] = c < nb ? nd_i8x16_ps(rows + (size_t)(j + c) * stride + e) : _mm512_setzero_ps();
        transpose16_ps(f);
        for (int c = 0; c < ATT_KEYS; c++)
            _mm512_store_ps(kt + (size_t)(e + c) * ATT_KEYS, f[c]);
    }
}

/* the 16 scores of NQ query rows (q[i]) against transposed keys kt, two
 * sums per row (even and odd dims) so the fma chains overlap */
T_ATT static inline __attribute__((always_inline)) void
rows_scores_t(const float *const *q, float *const *out, const float *kt, int hd, __m512 ksv,
              __mmask16 m, const int NQ)
{
    __m512 a[4][2];
    for (int i = 0; i < NQ; i++)
        a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int e = 0; e < hd; e += 2) {
        __m512 k0 = _mm512_load_ps(kt + (size_t)e * ATT_KEYS);
        __m512 k1 = _mm512_load_ps(kt + (size_t)(e + 1) * ATT_KEYS);
        for (int i = 0; i < NQ; i++) {
            a[i][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][e]), k0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][e + 1]), k1, a[i][1]);
        }
    }
    for (int i = 0; i < NQ; i++)
        _mm512_mask_storeu_ps(out[i], m, _mm512_mul_ps(_mm512_add_ps(a[i][0], a[i][1]), ksv));
}

/* Scores of a few query rows (a decode step): the keys as rows, each
 * row's 16 dot products reduced by sum16 (a transposed block would cost
 * more than it saves) */
T_ATT static void scores_float_few(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) float buf[ATT_KEYS * ND_ATT_MAX_HD];
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
            int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
            convert_rows(buf, b->k8, stride, j, nb, hd, ranges[rr][1]);
            __m512 ksv = row_scales(b->ks, G, j, nb, b->scale);
            for (int r = 0; r < R; r++) {
                const float *q = b->q + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd;
                _mm512_mask_storeu_ps(b->scores + (size_t)r * ml + j, first_lanes(nb),
                                      block_scores(q, buf, hd, ksv));
            }
        }
}

/* Query rows from which a block's keys are transposed (prefill tasks) */
#define ATT_T_MIN_ROWS 6

/* scaled scores of every query row of the task, in float */
T_ATT static void scores_float(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep;
    size_t stride = (size_t)b->stride, ml = b->ml;
    if (R < ATT_T_MIN_ROWS) {
        scores_float_few(b, ranges);
        return;
    }
    _Alignas(64) float kt[ATT_KEYS * ND_ATT_MAX_HD];
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
            int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
            convert_keys_t(kt, b->k8, stride, j, nb, hd, ranges[rr][1]);
            __m512 ksv = row_scales(b->ks, G, j, nb, b->scale);
            __mmask16 m = first_lanes(nb);
            int r = 0;
            for (; r < R; r += 4) {
                const float *q[4];
                float *o[4];
                int nq = R - r < 4 ? R - r : 4;
                for (int i = 0; i < nq; i++) {
                    q[i] = b->q + (size_t)((r + i) / rep) * b->qd + (size_t)((r + i) % rep) * hd;
                    o[i] = b->scores + (size_t)(r + i) * ml + j;
                }
                switch (nq) {
                case 4: rows_scores_t(q, o, kt, hd, ksv, m, 4); break;
                case 3: rows_scores_t(q, o, kt, hd, ksv, m, 3); break;
                case 2: rows_scores_t(q, o, kt, hd, ksv, m, 2); break;
                default: rows_scores_t(q, o, kt, hd, ksv, m, 1); break;
                }
            }
        }
}

/* the scores become weights: softmax over each row's own keys; the weights
 * of keys in the block's ranges that a row does not see become zero */
T_ATT static void softmax_rows(const nd_att_block *b, int ranges[2][2])
{
    int rep = b->rep, R = b->nr * rep;
    size_t ml = b->ml;
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int r = 0; r < R; r++) {
        int i = r / rep, p = b->pos0 + i, se = b->se[i], j0 = b->j0[i];
        float *sc = b->scores + (size_t)r * ml;
        int own[2][2] = {{0, se}, {j0, p + 1}};
        __m512 mx = _mm512_set1_ps(-FLT_MAX);
        for (int oo = 0; oo < 2; oo++)
            for (int j = own[oo][0]; j < own[oo][1]; j += ATT_KEYS) {
                int nb = own[oo][1] - j < ATT_KEYS ? own[oo][1] - j : ATT_KEYS;
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, first_lanes(nb), sc + j));
            }
        __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
                int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
                __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(j), iota);
                __mmask16 seen = (_mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(se)) |
                                  _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(j0))) &
                                 _mm512_cmple_epi32_mask(idx, _mm512_set1_epi32(p)) &
                                 first_lanes(nb);
                __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(seen, sc + j), mxv);
                __m512 w = _mm512_maskz_mov_ps(seen, nd_exp16_ps(x));
                sum = _mm512_add_ps(sum, w);
                _mm512_mask_storeu_ps(sc + j, first_lanes(nb), w);
            }
        /* the normaliser goes into the weights (a second pass: the sum
         * is known only now) */
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
                int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
                _mm512_mask_storeu_ps(
                    sc + j, first_lanes(nb),
                    _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(nb), sc + j), inv));
            }
    }
}

/* out = the weighted V rows, two query rows at a time (an odd one pairs
 * with itself and its second result is dropped) */
T_ATT static void values_float(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) float buf[ATT_KEYS * ND_ATT_MAX_HD];
    for (int r = 0; r < R; r++)
        memset(b->out + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd, 0,
               sizeof(float) * (size_t)hd);
    _Alignas(64) float wpad[2][ATT_KEYS], junk[ND_ATT_MAX_HD];
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
            int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
            convert_rows(buf, b->v8, stride, j, nb, hd, ranges[rr][1]);
            /* the rows' scales go into the weights: one multiply per
             * query row instead of one per converted value */
            __m512 vsv = row_scales(b->vs, G, j, nb, 1.0f);
            for (int r = 0; r < R; r += 2) {
                float *o[2];
                for (int t = 0; t < 2; t++) {
                    int rt = r + t < R ? r + t : r;
                    const float *sc = b->scores + (size_t)rt * ml + j;
                    _mm512_store_ps(wpad[t],
                                    _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(nb), sc), vsv));
                    o[t] = r + t < R ? b->out + (size_t)(rt / rep) * b->qd + (size_t)(rt % rep) * hd
                                     : junk;
                }
                if (o[1] == junk)
                    memset(junk, 0, sizeof(float) * (size_t)hd);
                block_values(o[0], o[1], wpad[0], wpad[1], buf, hd);
            }
        }
}

T_ATT void nd_att_block_avx512(const nd_att_block *b)
{
    int ranges[2][2];
    block_ranges(b, ranges);
    scores_float(b, ranges);
    softmax_rows(b, ranges);
    values_float(b, ranges);
}

/* ------------------------------------------------------------------ */
/* AVX-512 VNNI scores: q . k as integer dot products                   */

#define T_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
/* query rows quantised at a time (their int8 rows stay on the stack) */
#define ATT_I8_ROWS 32

/* rows [j, j + nb) of the int8 keys as 4-byte groups, transposed and
 * offset to unsigned: kt[g * 16 + c] holds dims 4g..4g+3 of key j + c,
 * each byte plus 128 (vpdpbusd's unsigned operand); keys past nb are 128
 * (value 0) */
T_VNNI static void keys_t_u8(uint32_t *kt, const int8_t *rows, size_t stride, int j, int nb, int hd,
                             int prefetch_end)
{
    for (int c = 0; c < nb; c++)
        if (j + c + ATT_KEYS < prefetch_end)
            _mm_prefetch((const char *)(rows + (size_t)(j + c + ATT_KEYS) * stride), _MM_HINT_T0);
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int e = 0; e < hd; e += 64) {
        int left = hd - e, ng = left >= 64 ? 16 : left / 4;
        __mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        __m512 f[ATT_KEYS];
        for (int c = 0; c < ATT_KEYS; c++)
            f[c] = c < nb ? _mm512_castsi512_ps(
                                _mm512_maskz_loadu_epi8(m, rows + (size_t)(j + c) * stride + e))
                          : _mm512_setzero_ps();
        transpose16_ps(f);
        for (int t = 0; t < ng; t++)
            _mm512_store_si512(kt + (size_t)(e / 4 + t) * ATT_KEYS,
                               _mm512_xor_si512(_mm512_castps_si512(f[t]), off));
    }
}

/* scaled scores of every query row of the task: each row quantised to
 * int8 once (nd_att_quant_q), 16 keys a vector of vpdpbusd sums (two
 * chains), less the 128 * sum(q) the unsigned keys add, times the row's
 * and the keys' scales */
T_VNNI static void scores_vnni512(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep, ngr = hd / 4;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) uint32_t kt[ND_ATT_MAX_HD / 4 * ATT_KEYS];
    _Alignas(64) int32_t qg[ATT_I8_ROWS * ND_ATT_MAX_HD / 4];
    float qs[ATT_I8_ROWS];
    int32_t off[ATT_I8_ROWS];
    for (int r0 = 0; r0 < R; r0 += ATT_I8_ROWS) {
        int nq = R - r0 < ATT_I8_ROWS ? R - r0 : ATT_I8_ROWS;
        for (int i = 0; i < nq; i++) {
            int r = r0 + i;
            int32_t sum;
            qs[i] = nd_att_quant_q(b->q + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd, hd,
                                   (int8_t *)(qg + (size_t)i * ngr), &sum);
            off[i] = 128 * sum;
        }
        for (int rr = 0; rr < 2; rr++)
            for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
                int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
                keys_t_u8(kt, b->k8, stride, j, nb, hd, ranges[rr][1]);
                __m512 ksv = row_scales(b->ks, G, j, nb, b->scale);
                for (int i = 0; i < nq; i++) {
                    const int32_t *q = qg + (size_t)i * ngr;
                    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
                    for (int g = 0; g < ngr; g += 2) {
                        a0 = _mm512_dpbusd_epi32(a0, _mm512_load_si512(kt + (size_t)g * ATT_KEYS),
                                                 _mm512_set1_epi32(q[g]));
                        a1 = _mm512_dpbusd_epi32(a1,
                                                 _mm512_load_si512(kt + (size_t)(g + 1) * ATT_KEYS),
                                                 _mm512_set1_epi32(q[g + 1]));
                    }
                    __m512i acc =
                        _mm512_sub_epi32(_mm512_add_epi32(a0, a1), _mm512_set1_epi32(off[i]));
                    _mm512_mask_storeu_ps(b->scores + (size_t)(r0 + i) * ml + j, first_lanes(nb),
                                          _mm512_mul_ps(_mm512_cvtepi32_ps(acc),
                                                        _mm512_mul_ps(ksv, _mm512_set1_ps(qs[i]))));
                }
            }
    }
}

/* Weighted V rows on vpdpwssd, ATT_VKEYS keys a block: the block's int8
 * rows sign-extended to int16 and interleaved in key pairs (an int32 lane
 * holds one dim of two keys); each query row's weights (times the rows'
 * scales) as int16 at max / 32767 of the block, two keys to an int32
 * broadcast; the block's int32 sums (|sum| < 32 * 32767 * 128 < 2^31)
 * times that scale go into the float output. The pairs' unpack puts dims
 * in the order 8L..8L+3 (lo) / 8L+4..8L+7 (hi) per 128-bit lane L,
 * undone once per block. */
#define ATT_VKEYS 32
T_VNNI static void values_i16(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep, nv = (hd + 31) / 32 * 2;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) int16_t vb[ATT_VKEYS / 2 * ND_ATT_MAX_HD * 2];
    _Alignas(64) int16_t w16[ATT_VKEYS];
    for (int r = 0; r < R; r++)
        memset(b->out + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd, 0,
               sizeof(float) * (size_t)hd);
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_VKEYS) {
            int nb = ranges[rr][1] - j < ATT_VKEYS ? ranges[rr][1] - j : ATT_VKEYS;
            int np = (nb + 1) / 2;
            /* pair p, dims 32t..: vb + (p * nv + 2t) * 32 (lo), + 32 (hi); nv
             * slots a pair (a 16-dim tail takes two) */
            for (int pp = 0; pp < np; pp++) {
                const int8_t *v0 = b->v8 + (size_t)(j + 2 * pp) * stride;
                const int8_t *v1 = v0 + stride;
                int odd = 2 * pp + 1 >= nb;
                if (j + 2 * pp + ATT_VKEYS < ranges[rr][1]) {
                    _mm_prefetch((const char *)(v0 + ATT_VKEYS * stride), _MM_HINT_T0);
                    _mm_prefetch((const char *)(v1 + ATT_VKEYS * stride), _MM_HINT_T0);
                }
                for (int e = 0; e < hd; e += 32) {
                    __mmask32 m = hd - e >= 32 ? ~(__mmask32)0 : (__mmask32)0xFFFF;
                    __m512i x0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, v0 + e));
                    __m512i x1 = odd ? _mm512_setzero_si512()
                                     : _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, v1 + e));
                    int16_t *d = vb + ((size_t)pp * nv + (size_t)(e / 16)) * 32;
                    _mm512_store_si512(d, _mm512_unpacklo_epi16(x0, x1));
                    _mm512_store_si512(d + 32, _mm512_unpackhi_epi16(x0, x1));
                }
            }
            __m512 vs0 = row_scales(b->vs, G, j, nb < ATT_KEYS ? nb : ATT_KEYS, 1.0f);
            __m512 vs1 = row_scales(b->vs, G, j + ATT_KEYS, nb - ATT_KEYS, 1.0f);
            for (int r = 0; r < R; r++) {
                const float *sc = b->scores + (size_t)r * ml + j;
                int n0 = nb < ATT_KEYS ? nb : ATT_KEYS, n1 = nb - n0;
                __m512 x0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(n0), sc), vs0);
                __m512 x1 =
                    _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(n1), sc + ATT_KEYS), vs1);
                float mx = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
                if (!(mx > 0.0f))
                    continue; /* no key of the block weighs anything */
                __m512 inv = _mm512_set1_ps(32767.0f / mx);
                _mm256_store_si256((__m256i *)w16, _mm512_cvtepi32_epi16(
                                                       _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv))));
                _mm256_store_si256((__m256i *)(w16 + 16), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(
                                                              _mm512_mul_ps(x1, inv))));
                float *o = b->out + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd;
                __m512 wsc = _mm512_set1_ps(mx / 32767.0f);
                for (int e = 0; e < hd; e += 32) {
                    int two = hd - e >= 32; /* else 16 dims: the lo/hi of one chunk */
                    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
                    for (int pp = 0; pp < np; pp++) {
                        int32_t wp;
                        memcpy(&wp, w16 + 2 * pp, sizeof wp);
                        __m512i wv = _mm512_set1_epi32(wp);
                        const int16_t *d = vb + ((size_t)pp * nv + (size_t)(e / 16)) * 32;
                        a0 = _mm512_dpwssd_epi32(a0, _mm512_load_si512(d), wv);
                        a1 = _mm512_dpwssd_epi32(a1, _mm512_load_si512(d + 32), wv);
                    }
                    /* lanes [lo0 hi0 lo1 hi1] and [lo2 hi2 lo3 hi3]: dims in order */
                    __m512i c0 = _mm512_shuffle_i32x4(a0, a1, 0x44);
                    c0 = _mm512_shuffle_i32x4(c0, c0, 0xD8);
                    _mm512_storeu_ps(o + e, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), wsc,
                                                            _mm512_loadu_ps(o + e)));
                    if (two) {
                        __m512i c1 = _mm512_shuffle_i32x4(a0, a1, 0xEE);
                        c1 = _mm512_shuffle_i32x4(c1, c1, 0xD8);
                        _mm512_storeu_ps(o + e + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), wsc,
                                                                     _mm512_loadu_ps(o + e + 16)));
                    }
                }
            }
        }
}

T_VNNI void nd_att_block_vnni512(const nd_att_block *b)
{
    int ranges[2][2];
    block_ranges(b, ranges);
    scores_vnni512(b, ranges);
    softmax_rows(b, ranges);
    values_i16(b, ranges);
}

/* ------------------------------------------------------------------ */
/* AMX scores: q . k as int8 tiles                                      */

#define T_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* r[c][t] -> r[t][c] for a 16 x 16 matrix of 32-bit lanes */
T_AMX static inline void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + k]'s 128-bit lane L: column 4L + k of rows 4i..4i+3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[4 + k] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

/* A query row as two int8 rows: hi = q at 127 / max|q| (nearest, ties to
 * even) and lo = what hi misses, at 254 times that scale (|miss| <= half a
 * step). q = (hi + lo / 254) * max|q| / 127 to ~1/64000 of max|q|, so the
 * scores are as exact as float ones; returns max|q| / 127. */
T_AMX static float quant_query(const float *q, int hd, int8_t *hi, int8_t *lo)
{
    __m512 mx = _mm512_setzero_ps();
    for (int e = 0; e < hd; e += 16)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(q + e)));
    float m = _mm512_reduce_max_ps(mx);
    __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    for (int e = 0; e < hd; e += 16) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(q + e), inv);
        __m512i h = _mm512_cvtps_epi32(x);
        __m512 miss = _mm512_sub_ps(x, _mm512_cvtepi32_ps(h));
        _mm_storeu_si128((__m128i *)(hi + e), _mm512_cvtsepi32_epi8(h));
        _mm_storeu_si128((__m128i *)(lo + e), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(
                                                  _mm512_mul_ps(miss, _mm512_set1_ps(254.0f)))));
    }
    return m / 127.0f;
}

/* Scores of the task's query rows: the rows become two int8 rows once
 * (quant_query), each block of 16 keys is transposed into the B operand
 * (four dims x 16 keys per tile row), and two tdpbssd per 64 dims give
 * 16 x 16 dot products. Needs 16-row groups x hd <= ATT_AMX_QBYTES. */
#define ATT_AMX_QBYTES 8192
T_AMX static void scores_amx(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep, chunks = hd / 64;
    int groups = (R + 15) / 16;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) int8_t qh[ATT_AMX_QBYTES], ql[ATT_AMX_QBYTES]; /* rows hd apart */
    _Alignas(64) int8_t kt[ND_ATT_MAX_HD / 64][16][64];
    _Alignas(64) int32_t c[16][16], cl[16][16];
    float qs[ATT_AMX_QBYTES / 64];
    for (int r = 0; r < groups * 16; r++) {
        if (r < R)
            qs[r] = quant_query(b->q + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd, hd,
                                qh + (size_t)r * hd, ql + (size_t)r * hd);
        else {
            memset(qh + (size_t)r * hd, 0, (size_t)hd);
            memset(ql + (size_t)r * hd, 0, (size_t)hd);
        }
    }
    /* tmm0/tmm3: C of the hi/lo rows, tmm1/tmm4: A, tmm2: B */
    nd_amx_tiles(5);
    for (int rr = 0; rr < 2; rr++)
        for (int j = ranges[rr][0]; j < ranges[rr][1]; j += ATT_KEYS) {
            int nb = ranges[rr][1] - j < ATT_KEYS ? ranges[rr][1] - j : ATT_KEYS;
            const int8_t *rows = b->k8 + (size_t)j * stride;
            if (j + 2 * ATT_KEYS <= ranges[rr][1])
                for (int k = 0; k < ATT_KEYS; k++)
                    _mm_prefetch((const char *)(rows + (size_t)(ATT_KEYS + k) * stride),
                                 _MM_HINT_T0);
            for (int ch = 0; ch < chunks; ch++) {
                __m512i kr[16];
                for (int k = 0; k < ATT_KEYS; k++) /* keys past the block are zero */
                    kr[k] = k < nb ? _mm512_loadu_si512(rows + (size_t)k * stride + 64 * ch)
                                   : _mm512_setzero_si512();
                transpose16(kr);
                for (int t = 0; t < 16; t++)
                    _mm512_store_si512(kt[ch][t], kr[t]);
            }
            __m512 ksv = row_scales(b->ks, G, j, nb, b->scale);
            for (int gr = 0; gr < groups; gr++) {
                _tile_zero(0);
                _tile_zero(3);
                for (int ch = 0; ch < chunks; ch++) {
                    _tile_loadd(1, qh + (size_t)16 * gr * hd + 64 * ch, hd);
                    _tile_loadd(4, ql + (size_t)16 * gr * hd + 64 * ch, hd);
                    _tile_loadd(2, kt[ch][0], 64);
                    _tile_dpbssd(0, 1, 2);
                    _tile_dpbssd(3, 4, 2);
                }
                _tile_stored(0, c, 64);
                _tile_stored(3, cl, 64);
                int rn = R - 16 * gr < 16 ? R - 16 * gr : 16;
                for (int i = 0; i < rn; i++) {
                    int r = 16 * gr + i;
                    __m512 x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cl[i])),
                                               _mm512_set1_ps(1.0f / 254.0f),
                                               _mm512_cvtepi32_ps(_mm512_load_si512(c[i])));
                    _mm512_mask_storeu_ps(
                        b->scores + (size_t)r * ml + j, first_lanes(nb),
                        _mm512_mul_ps(x, _mm512_mul_ps(ksv, _mm512_set1_ps(qs[r]))));
                }
            }
        }
    _tile_release();
}

#define T_AMXBF __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* bf16 of 16 floats, nearest with ties to even (finite inputs), in the low
 * halves of 32-bit lanes */
T_AMXBF static inline __m512i bf16_lo(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                             16);
}

/* Weighted V rows from AMX-BF16 tiles, 32 keys a step: the A operands are
 * the weights (scale of each V row folded in) as two bf16 parts, hi =
 * bf16(w) and lo = bf16(w - hi), so their sum is w to ~2^-17; the B
 * operand is a V row pair per tile row, interleaved per dim (int8 values
 * are exact in bf16); four C tiles hold 16 query rows x 64 dims of float
 * sums. */
T_AMXBF static void values_amx(const nd_att_block *b, int ranges[2][2])
{
    int hd = b->hd, rep = b->rep, G = b->G, R = b->nr * rep;
    size_t stride = (size_t)b->stride, ml = b->ml;
    _Alignas(64) uint32_t pa[16][16], pl[16][16]; /* 16 rows x 32 bf16 weights: hi, lo */
    _Alignas(64) uint32_t vb[4][16][16];          /* per 16 dims: 16 key pairs x 16 dims */
    _Alignas(64) float c[16][16];
    /* tmm0-3: C (16 rows x 16 dims each), tmm4/tmm6: A (hi/lo weights),
     * tmm5: B */
    nd_amx_tiles(7);
    const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int g0 = 0; g0 < R; g0 += 16) {
        int rn = R - g0 < 16 ? R - g0 : 16;
        for (int e0 = 0; e0 < hd; e0 += 64) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int rr = 0; rr < 2; rr++)
                for (int j = ranges[rr][0]; j < ranges[rr][1]; j += 2 * ATT_KEYS) {
                    int nb = ranges[rr][1] - j < 2 * ATT_KEYS ? ranges[rr][1] - j : 2 * ATT_KEYS;
                    int nb0 = nb < ATT_KEYS ? nb : ATT_KEYS, nb1 = nb - nb0;
                    __m512 vs0 = row_scales(b->vs, G, j, nb0, 1.0f);
                    __m512 vs1 = row_scales(b->vs, G, j + ATT_KEYS, nb1, 1.0f);
                    for (int i = 0; i < 16; i++) {
                        if (i >= rn) {
                            _mm512_store_si512(pa[i], _mm512_setzero_si512());
                            _mm512_store_si512(pl[i], _mm512_setzero_si512());
                            continue;
                        }
                        const float *sc = b->scores + (size_t)(g0 + i) * ml + j;
                        __m512 x[2] = {
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(nb0), sc), vs0),
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(nb1), sc + ATT_KEYS),
                                          vs1)};
                        for (int h = 0; h < 2; h++) {
                            __m512i hi = bf16_lo(x[h]);
                            __m512 rest =
                                _mm512_sub_ps(x[h], _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
                            _mm256_store_si256((__m256i *)&pa[i][8 * h], _mm512_cvtepi32_epi16(hi));
                            _mm256_store_si256((__m256i *)&pl[i][8 * h],
                                               _mm512_cvtepi32_epi16(bf16_lo(rest)));
                        }
                    }
                    /* tile row kp: keys 2kp and 2kp + 1 side by side per dim
                     * (the bf16 of an int8 value is its float's high half) */
                    for (int kp = 0; kp < ATT_KEYS; kp++) {
                        int k0 = 2 * kp, k1 = k0 + 1;
                        const int8_t *v0 = b->v8 + (size_t)(j + k0) * stride + e0;
                        const int8_t *v1 = v0 + stride;
                        for (int t = 0; t < 4 && e0 + 16 * t < hd; t++) {
                            __m512i x0 = k0 < nb ? _mm512_castps_si512(nd_i8x16_ps(v0 + 16 * t))
                                                 : _mm512_setzero_si512();
                            __m512i x1 = k1 < nb ? _mm512_castps_si512(nd_i8x16_ps(v1 + 16 * t))
                                                 : _mm512_setzero_si512();
                            _mm512_store_si512(vb[t][kp],
                                               _mm512_or_si512(_mm512_srli_epi32(x0, 16),
                                                               _mm512_and_si512(x1, hi16)));
                        }
                    }
                    _tile_loadd(4, pa, 64);
                    _tile_loadd(6, pl, 64);
/* C tile t += (hi + lo weights) x the V pairs of dims e0 + 16t.. (tile
 * numbers are immediates, hence a macro) */
#define ATT_DIMS16(t)                                                                              \
    do {                                                                                           \
        _tile_loadd(5, vb[t], 64);                                                                 \
        _tile_dpbf16ps(t, 4, 5);                                                                   \
        _tile_dpbf16ps(t, 6, 5);                                                                   \
    } while (0)
                    ATT_DIMS16(0);
                    if (e0 + 16 < hd)
                        ATT_DIMS16(1);
                    if (e0 + 32 < hd)
                        ATT_DIMS16(2);
                    if (e0 + 48 < hd)
                        ATT_DIMS16(3);
#undef ATT_DIMS16
                }
            for (int t = 0; t < 4 && e0 + 16 * t < hd; t++) {
                switch (t) {
                case 0: _tile_stored(0, c, 64); break;
                case 1: _tile_stored(1, c, 64); break;
                case 2: _tile_stored(2, c, 64); break;
                default: _tile_stored(3, c, 64); break;
                }
                for (int i = 0; i < rn; i++) {
                    int r = g0 + i;
                    _mm512_storeu_ps(b->out + (size_t)(r / rep) * b->qd + (size_t)(r % rep) * hd +
                                         e0 + 16 * t,
                                     _mm512_load_ps(c[i]));
                }
            }
        }
    }
    _tile_release();
}

T_AMX void nd_att_block_amx(const nd_att_block *b)
{
    int ranges[2][2];
    block_ranges(b, ranges);
    if (b->hd % 64 == 0 && (b->nr * b->rep + 15) / 16 * 16 * b->hd <= ATT_AMX_QBYTES)
        scores_amx(b, ranges);
    else
        scores_float(b, ranges);
    softmax_rows(b, ranges);
    if (b->hd % 64 == 0 && nd_amx_bf16_usable())
        values_amx(b, ranges);
    else
        values_float(b, ranges);
}

int nd_att_avx512_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

int nd_att_vnni512_supported(void)
{
    __builtin_cpu_init();
    return nd_att_avx512_supported() && __builtin_cpu_supports("avx512vnni");
}

#else
#include "engine/attention.h"

int nd_att_avx512_supported(void)
{
    return 0;
}

void nd_att_block_avx512(const nd_att_block *b)
{
    (void)b;
}

void nd_att_block_amx(const nd_att_block *b)
{
    (void)b;
}

int nd_att_vnni512_supported(void)
{
    return 0;
}

void nd_att_block_vnni512(const nd_att_block *b)
{
    (void)b;
}
#endif
