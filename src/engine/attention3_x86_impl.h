/* The body of attention3_x86.c's Needle 3 attention kernel, included once
 * per instruction set with these macros set:
 *   A3(name)  the function's name for this set (name_avx512, name_avx2)
 *   T_A3      its target attribute
 *   W         floats per vector; VF the vector type
 *   VZERO, VSET1, VLOAD, VSTORE (unaligned), VLOADA, VSTOREA (aligned),
 *   VADD, VSUB, VMUL, VMAX, VMADD (a * b + c as attention.c's reference
 *   does it: fused where the target has FMA), VHMAX (largest lane), VEXP
 *   (san_expf on lanes <= 0), VI8 (W int8 -> floats), VTRANSPOSE(src, ld,
 *   dst) (W rows of W floats, ld apart, into W vectors at dst: vector e =
 *   element e of every row)
 * Not a header of its own: only attention3_x86.c includes it.
 *
 * Every output is the reference's (nd_att3_block_ref) bit for bit: a
 * vector holds W keys (lanes), so each key's dot product runs over the
 * head dim in the reference's order; the softmax sums run in key order;
 * a value lane is an output dim summed over the keys in order. */

/* rows c of buf (ld floats apart, nb of them) from the cache's rows of the
 * positions j.. (float rows, or int8 ones converted); the row's padding up
 * to ld and the rows past nb are zero */
T_A3 static void A3(load_rows)(float *buf, int ld, const float *f, const int8_t *q8, size_t stride,
                               const nd_att3_block *b, int j, int nb, int dim)
{
    int full = dim / W * W;
    for (int c = 0; c < nb; c++) {
        size_t row = (size_t)nd_att3_row(b, j + c) * stride;
        float *dst = buf + (size_t)c * ld;
        int e = 0;
        if (q8) {
            const int8_t *r = q8 + row;
            for (; e < full; e += W)
                VSTOREA(dst + e, VI8(r + e));
            for (; e < dim; e++)
                dst[e] = (float)r[e];
        } else {
            const float *r = f + row;
            for (; e < full; e += W)
                VSTOREA(dst + e, VLOAD(r + e));
            for (; e < dim; e++)
                dst[e] = r[e];
        }
        for (e = dim; e < ld; e++)
            dst[e] = 0.0f;
    }
    if (nb < W)
        memset(buf + (size_t)nb * ld, 0, sizeof(float) * (size_t)(W - nb) * (size_t)ld);
}

/* W rows' scales (stride G, from position j); 1 past nb */
T_A3 static inline VF A3(row_scales)(const float *sc, int G, const nd_att3_block *b, int j, int nb)
{
    _Alignas(64) float x[W];
    for (int c = 0; c < W; c++)
        x[c] = c < nb ? sc[(size_t)nd_att3_row(b, j + c) * G] : 1.0f;
    return VLOADA(x);
}

/* nb (<= W) lanes of v at dst */
T_A3 static inline void A3(store_n)(float *dst, VF v, int nb)
{
    if (nb == W) {
        VSTORE(dst, v);
        return;
    }
    _Alignas(64) float x[W];
    VSTOREA(x, v);
    memcpy(dst, x, sizeof(float) * (size_t)nb);
}

/* The scores of the R query rows (qr[r]: hd floats) against the keys of
 * [lo, hi): rows of the score scratch. kt: W * ld floats (the keys,
 * transposed), kbuf: W * ld. */
T_A3 static void A3(scores)(const nd_att3_block *b, const float *const *qr, int R, int ld,
                            float *kbuf, float *kt, int lo, int hi)
{
    size_t ml = b->ml;
    int hd = b->hd;
    VF sv = VSET1(b->scale);
    for (int j = lo; j < hi; j += W) {
        int nb = hi - j < W ? hi - j : W;
        A3(load_rows)(kbuf, ld, b->kf, b->k8, b->kstride, b, j, nb, hd);
        for (int e = 0; e < ld; e += W)
            VTRANSPOSE(kbuf + e, ld, kt + (size_t)e * W);
        VF ksv = b->k8 ? A3(row_scales)(b->ks, b->G, b, j, nb) : VSET1(1.0f);
        /* four query rows at a time: four independent sums */
        for (int r = 0; r < R; r += 4) {
            const float *q0 = qr[r], *q1 = qr[r + 1 < R ? r + 1 : r];
            const float *q2 = qr[r + 2 < R ? r + 2 : r], *q3 = qr[r + 3 < R ? r + 3 : r];
            VF a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
            for (int e = 0; e < hd; e++) {
                VF k = VLOADA(kt + (size_t)e * W);
                a0 = VADD(a0, VMUL(VSET1(q0[e]), k));
                a1 = VADD(a1, VMUL(VSET1(q1[e]), k));
                a2 = VADD(a2, VMUL(VSET1(q2[e]), k));
                a3 = VADD(a3, VMUL(VSET1(q3[e]), k));
            }
            VF a[4] = {a0, a1, a2, a3};
            for (int c = 0; c < 4 && r + c < R; c++) {
                VF x = b->k8 ? VMUL(a[c], ksv) : a[c];
                A3(store_n)(b->scores + (size_t)(r + c) * ml + j, VMUL(x, sv), nb);
            }
        }
    }
}

/* the largest of sc[lo, hi) (at least m) */
T_A3 static float A3(range_max)(const float *sc, int lo, int hi, float m)
{
    int j = lo;
    if (hi - lo >= W) {
        VF mv = VSET1(m);
        for (; j + W <= hi; j += W)
            mv = VMAX(mv, VLOAD(sc + j));
        m = VHMAX(mv);
    }
    for (; j < hi; j++)
        m = sc[j] > m ? sc[j] : m;
    return m;
}

/* sc[j] = exp(sc[j] - mx) over [lo, hi) */
T_A3 static void A3(range_exp)(float *sc, int lo, int hi, float mx)
{
    int j = lo;
    VF mv = VSET1(mx);
    for (; j + W <= hi; j += W)
        VSTORE(sc + j, VEXP(VSUB(VLOAD(sc + j), mv)));
    for (; j < hi; j++)
        sc[j] = san_expf(sc[j] - mx);
}

/* sc[j] *= f over [lo, hi): the reference's w * inv (the value rows'
 * scale multiplies later, in the value pass, once per key block) */
T_A3 static void A3(range_scale)(float *sc, int lo, int hi, float f)
{
    int j = lo;
    VF fv = VSET1(f);
    for (; j + W <= hi; j += W)
        VSTORE(sc + j, VMUL(VLOAD(sc + j), fv));
    for (; j < hi; j++)
        sc[j] = sc[j] * f;
}

/* zero sc over [a, b) where it meets the ranges rng */
static inline void A3(zero_in)(float *sc, int a, int b, int rng[2][2])
{
    for (int rr = 0; rr < 2; rr++) {
        int lo = a > rng[rr][0] ? a : rng[rr][0], hi = b < rng[rr][1] ? b : rng[rr][1];
        if (lo < hi)
            memset(sc + lo, 0, sizeof(float) * (size_t)(hi - lo));
    }
}

/* out rows o0, o1 (nv vectors from e0) += the W weights w0, w1 times the
 * value rows of vbuf (ldv apart), in key order; the accumulators stay in
 * registers over the block and each value load serves both rows */
T_A3 static inline __attribute__((always_inline)) void A3(values2)(float *o0, float *o1,
                                                                   const float *w0, const float *w1,
                                                                   const float *vbuf, int ldv,
                                                                   int e0, const int nv)
{
    VF a0[4], a1[4];
    for (int k = 0; k < nv; k++) {
        a0[k] = VLOADA(o0 + e0 + W * k);
        a1[k] = VLOADA(o1 + e0 + W * k);
    }
#pragma GCC unroll 16
    for (int c = 0; c < W; c++) {
        VF x0 = VSET1(w0[c]), x1 = VSET1(w1[c]);
        for (int k = 0; k < nv; k++) {
            VF v = VLOADA(vbuf + (size_t)c * ldv + e0 + W * k);
            a0[k] = VMADD(x0, v, a0[k]);
            a1[k] = VMADD(x1, v, a1[k]);
        }
    }
    for (int k = 0; k < nv; k++) {
        VSTOREA(o0 + e0 + W * k, a0[k]);
        VSTOREA(o1 + e0 + W * k, a1[k]);
    }
}

T_A3 static void A3(values_block)(float *o0, float *o1, const float *w0, const float *w1,
                                  const float *vbuf, int ldv)
{
    for (int e0 = 0; e0 < ldv; e0 += 4 * W)
        switch ((ldv - e0) / W) {
        case 1: A3(values2)(o0, o1, w0, w1, vbuf, ldv, e0, 1); break;
        case 2: A3(values2)(o0, o1, w0, w1, vbuf, ldv, e0, 2); break;
        case 3: A3(values2)(o0, o1, w0, w1, vbuf, ldv, e0, 3); break;
        default: A3(values2)(o0, o1, w0, w1, vbuf, ldv, e0, 4); break;
        }
}

/* One task (attention.h's nd_att3_block): nr query rows of the rep heads
 * sharing kv head g, over the keys each row sees. The rows go in groups
 * whose outputs fit the stack buffer; each group converts a key or value
 * row once for all of its query rows. */
T_A3 static void A3(block)(const nd_att3_block *b)
{
    int rep = b->rep, ld = (b->hd + W - 1) / W * W, ldv = (b->vhd + W - 1) / W * W;
    int per = (ND_ATT3_BUF - ldv) / (rep * ldv);
    _Alignas(64) float obuf[ND_ATT3_BUF], kbuf[W * ND_ATT3_MAX_HD], kt[W * ND_ATT3_MAX_HD];
    _Alignas(64) float wz[W] = {0}, wpad[2][W];
    const float *qr[ND_ATT3_BUF / W];
    size_t ml = b->ml;
    for (int i0 = 0; i0 < b->nr; i0 += per) {
        int nr = b->nr - i0 < per ? b->nr - i0 : per, R = nr * rep;
        const int *se = b->se + i0, *j0 = b->j0 + i0;
        int pos0 = b->pos0 + i0, pend = pos0 + nr;
        /* the keys any row of the group sees: [0, se_max) and [lo2, pend) */
        int se_max = se[nr - 1], lo2 = j0[0] > se_max ? j0[0] : se_max;
        int rng[2][2] = {{0, se_max}, {lo2, pend}};
        for (int r = 0; r < R; r++)
            qr[r] = b->q + (size_t)(i0 + r / rep) * b->qd + (size_t)(r % rep) * b->hd;
        for (int rr = 0; rr < 2; rr++)
            A3(scores)(b, qr, R, ld, kbuf, kt, rng[rr][0], rng[rr][1]);
        /* softmax over each row's own keys, summed in key order (the rep
         * heads of a query row see the same keys: their sums interleave);
         * keys of the group's ranges a row does not see weigh nothing */
        for (int i = 0; i < nr; i++) {
            int p = pos0 + i;
            int own[2][2] = {{0, se[i]}, {j0[i], p + 1}};
            float sum[ND_ATT3_BUF / W];
            for (int h = 0; h < rep; h++) {
                float *sc = b->scores + ((size_t)i * rep + h) * ml, mx = -FLT_MAX;
                for (int rr = 0; rr < 2; rr++)
                    mx = A3(range_max)(sc, own[rr][0], own[rr][1], mx);
                for (int rr = 0; rr < 2; rr++)
                    A3(range_exp)(sc, own[rr][0], own[rr][1], mx);
                sum[h] = 0.0f;
            }
            const float *sc0 = b->scores + (size_t)i * rep * ml;
            for (int rr = 0; rr < 2; rr++)
                for (int j = own[rr][0]; j < own[rr][1]; j++)
                    for (int h = 0; h < rep; h++)
                        sum[h] += sc0[(size_t)h * ml + j];
            for (int h = 0; h < rep; h++) {
                float *sc = b->scores + ((size_t)i * rep + h) * ml, inv = 1.0f / sum[h];
                for (int rr = 0; rr < 2; rr++)
                    A3(range_scale)(sc, own[rr][0], own[rr][1], inv);
                A3(zero_in)(sc, se[i], j0[i], rng);
                A3(zero_in)(sc, p + 1, pend, rng);
            }
        }
        /* one spare row for an odd last query row's partner */
        memset(obuf, 0, sizeof(float) * (size_t)(R + 1) * (size_t)ldv);
        for (int rr = 0; rr < 2; rr++)
            for (int j = rng[rr][0]; j < rng[rr][1]; j += W) {
                int nb = rng[rr][1] - j < W ? rng[rr][1] - j : W;
                A3(load_rows)(kbuf, ldv, b->vf, b->v8, b->vstride, b, j, nb, b->vhd);
                /* int8 rows: the weights times the rows' scales */
                VF vsv = b->v8 ? A3(row_scales)(b->vs, b->G, b, j, nb) : VSET1(1.0f);
                for (int r = 0; r < R; r += 2) {
                    const float *w0 = b->scores + (size_t)r * ml + j, *w1 = wz;
                    float *o0 = obuf + (size_t)r * ldv, *o1 = obuf + (size_t)R * ldv;
                    if (r + 1 < R) {
                        w1 = w0 + ml;
                        o1 = o0 + ldv;
                    }
                    if (nb < W || b->v8) { /* the padding rows weigh nothing */
                        for (int c = 0; c < W; c++) {
                            wpad[0][c] = c < nb ? w0[c] : 0.0f;
                            wpad[1][c] = c < nb ? w1[c] : 0.0f;
                        }
                        if (b->v8) {
                            VSTOREA(wpad[0], VMUL(VLOADA(wpad[0]), vsv));
                            VSTOREA(wpad[1], VMUL(VLOADA(wpad[1]), vsv));
                        }
                        w0 = wpad[0];
                        w1 = wpad[1];
                    }
                    A3(values_block)(o0, o1, w0, w1, kbuf, ldv);
                }
            }
        for (int r = 0; r < R; r++)
            memcpy(b->out + (size_t)(i0 + r / rep) * b->od + (size_t)(r % rep) * b->vhd,
                   obuf + (size_t)r * ldv, sizeof(float) * (size_t)b->vhd);
    }
}
