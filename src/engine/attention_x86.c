/* AVX-512 cached attention over the int8 KV cache (attention.h's block
 * task; kv.c keeps the reference). The function carries its own target
 * attribute, so one binary runs on any x86-64 and kv.c picks it at run time.
 *
 * Keys go 16 at a time: the block's int8 rows become floats once (the V
 * rows with their scale folded in) and serve every query row of the task.
 * A query row's 16 dot products are reduced together by a transpose-add
 * tree into one vector of 16 scores, and softmax runs on whole vectors. */
#if defined(__x86_64__)
#include <float.h>
#include <immintrin.h>
#include <string.h>

#include "engine/attention.h"

#define T_ATT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define ATT_KEYS 16

/* 16 int8 values as floats */
T_ATT static inline __m512 load_i8_ps(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

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

/* san_expf (core/fastmath.h) on 16 lanes, for x <= 0: the same reduction,
 * polynomial and operation order */
T_ATT static inline __m512 exp_ps(__m512 x)
{
    const float lo = -87.3f;
    __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(lo));
    __m512 kf = _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                              _mm512_set1_ps(12582912.0f));
    __m512i kb = _mm512_castps_si512(kf);
    kf = _mm512_sub_ps(kf, _mm512_set1_ps(12582912.0f));
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
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
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
            _mm512_store_ps(buf + (size_t)c * hd + e, load_i8_ps(r + e));
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

T_ATT void nd_att_block_avx512(const nd_att_block *b)
{
    int hd = b->hd, nr = b->nr, rep = b->rep, G = b->G, R = nr * rep;
    size_t stride = (size_t)b->stride, ml = b->ml;
    int pend = b->pos0 + nr;
    /* the keys any row of the block sees: [0, se_max) and [lo2, pend) */
    int se_max = b->se[nr - 1], lo2 = b->j0[0] > se_max ? b->j0[0] : se_max;
    int ranges[2][2] = {{0, se_max}, {lo2, pend}};
    _Alignas(64) float buf[ATT_KEYS * ND_ATT_MAX_HD];
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);

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

    /* softmax over each row's own keys; the weights of keys in the block's
     * ranges that a row does not see become zero */
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
                __m512 w = _mm512_maskz_mov_ps(seen, exp_ps(x));
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
        float *out = b->out + (size_t)i * b->qd + (size_t)(r % rep) * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
    }

    /* weighted V rows, two query rows at a time (an odd one pairs with
     * itself and its second result is dropped) */
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

int nd_att_avx512_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
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
#endif
