#version 450
#include "common.glsl"
#include "attn_common.glsl"
// Attention backward, dk and dv (set): a workgroup owns ROWS key rows of
// one segment (blocks[b] = (segment, first row)) and kv head
// gl_WorkGroupID.y, and walks every query that sees them, BQ rows at a
// time, in a fixed order: for each head of the group, the segment's own
// rows from the block's first row on (causal), then every row of each
// child segment (children in index order). No other workgroup writes these
// rows, so no atomics: dv = sum p dout, dk = scale * sum ds q. q/k head
// dim hd, v/dout vd; window > 0: a query sees only its last `window` keys.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dk; F32 dv; F32 dout; F32 q; F32 k; F32 v; F32 lse; F32 delta; I32 lay; I32 blocks;
    I32 child_off; I32 child_list;
    int N, n_seg, n_blocks, H, G, hd, vd, window; float scale;
};
layout(push_constant) uniform PC { Args a; };

#define BQ 8
shared float Qs[BQ][HD_MAX];
shared float dOs[BQ][HD_MAX];
shared float lse_s[BQ], delta_s[BQ];
shared float part_s[ROWS][BQ][LANES];  // per-lane pieces of k.q
shared float part_dp[ROWS][BQ][LANES]; // and of v.dout

void main() {
    int tid = int(gl_LocalInvocationID.x), r = tid / LANES, lane = tid % LANES;
    int hd = a.hd, g = int(gl_WorkGroupID.y), rep = a.H / a.G;
    int vd = a.vd, qs = a.H * hd, ks = a.G * hd, vs = a.G * vd, os = a.H * vd;
    for (uint b = gl_WorkGroupID.x; b < uint(a.n_blocks); b += gl_NumWorkGroups.x) {
        int s = a.blocks.v[2 * b], t0 = a.blocks.v[2 * b + 1];
        int start = SEG_START(s), len = SEG_LEN(s);
        int t1 = min(t0 + ROWS, len), t = t0 + r;
        bool live = t < t1;
        int krow = start + t;
        float kr[COLS], vr[COLS], dkr[COLS], dvr[COLS];
        for (int j = 0; j < COLS; j++) {
            int c = lane + LANES * j;
            kr[j] = live && c < hd ? a.k.v[krow * ks + g * hd + c] : 0.0;
            vr[j] = live && c < vd ? a.v.v[krow * vs + g * vd + c] : 0.0;
            dkr[j] = 0.0;
            dvr[j] = 0.0;
        }
        int c0 = a.child_off.v[s], c1 = a.child_off.v[s + 1];
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            // span -1: the own segment's rows t0..len-1; then child spans
            for (int sp = c0 - 1; sp < c1; sp++) {
                bool own = sp < c0;
                int cs = own ? s : a.child_list.v[sp];
                int qstart = SEG_START(cs), qlen = SEG_LEN(cs);
                // a query's key index: its row (own) or len + its row (child);
                // the block's keys t0..t1-1 are within the window of queries
                // whose index is below t1 - 1 + window (an upper bound here)
                int qend = qlen;
                if (a.window > 0) qend = min(qlen, max(0, t1 - 1 + a.window - (own ? 0 : len)));
                for (int i0 = own ? t0 : 0; i0 < qend; i0 += BQ) {
                    for (int e = tid; e < BQ * hd; e += 64) {
                        int ii = e / hd, c = e % hd, i = i0 + ii;
                        Qs[ii][c] = i < qlen ? a.q.v[(qstart + i) * qs + h * hd + c] : 0.0;
                    }
                    for (int e = tid; e < BQ * vd; e += 64) {
                        int ii = e / vd, c = e % vd, i = i0 + ii;
                        dOs[ii][c] = i < qlen ? a.dout.v[(qstart + i) * os + h * vd + c] : 0.0;
                    }
                    if (tid < BQ) {
                        int i = i0 + tid;
                        lse_s[tid] = i < qlen ? a.lse.v[(qstart + i) * a.H + h] : 0.0;
                        delta_s[tid] = i < qlen ? a.delta.v[(qstart + i) * a.H + h] : 0.0;
                    }
                    barrier();
                    for (int ii = 0; ii < BQ; ii++) {
                        float ps = 0.0, pd = 0.0;
                        for (int j = 0; j < COLS; j++) {
                            int c = lane + LANES * j;
                            if (c < hd) ps += Qs[ii][c] * kr[j];
                            if (c < vd) pd += dOs[ii][c] * vr[j];
                        }
                        part_s[r][ii][lane] = ps;
                        part_dp[r][ii][lane] = pd;
                    }
                    barrier();
                    if (live) {
                        for (int ii = 0; ii < BQ; ii++) {
                            int i = i0 + ii;
                            if (i >= qlen) break;
                            if (own && i < t) continue; // causal: this query is before the key
                            // window: the query's key index minus the key's
                            if (a.window > 0 && (own ? i - t : len + i - t) >= a.window) continue;
                            float x = 0.0, dp = 0.0;
                            for (int ln = 0; ln < LANES; ln++) {
                                x += part_s[r][ii][ln];
                                dp += part_dp[r][ii][ln];
                            }
                            float p = exp(a.scale * x - lse_s[ii]);
                            float ds = p * (dp - delta_s[ii]);
                            for (int j = 0; j < COLS; j++) {
                                int c = lane + LANES * j;
                                if (c < vd) dvr[j] += p * dOs[ii][c];
                                if (c < hd) dkr[j] += ds * Qs[ii][c];
                            }
                        }
                    }
                    barrier();
                }
            }
        }
        if (live)
            for (int j = 0; j < COLS; j++) {
                int c = lane + LANES * j;
                if (c < hd) a.dk.v[krow * ks + g * hd + c] = a.scale * dkr[j];
                if (c < vd) a.dv.v[krow * vs + g * vd + c] = dvr[j];
            }
    }
}
