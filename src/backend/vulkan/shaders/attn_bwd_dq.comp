#version 450
#include "common.glsl"
#include "attn_common.glsl"
// Attention backward, dq (set): a workgroup owns ROWS query rows of one
// segment and head gl_WorkGroupID.y and walks the keys those rows see (as in
// attn_fwd), recomputing p = exp(scale q.k - lse); ds = p (dout.v - delta);
// dq = scale * sum ds k. q/k head dim hd, v/dout vd; window as attn_fwd.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dq; F32 dout; F32 q; F32 k; F32 v; F32 lse; F32 delta; I32 lay; I32 blocks;
    int N, n_seg, n_blocks, H, G, hd, vd, window; float scale;
};
layout(push_constant) uniform PC { Args a; };

#define BK 8
shared float Ks[BK][HD_MAX];
shared float Vs[BK][HD_MAX];
shared float part_s[ROWS][BK][LANES];  // per-lane pieces of q.k
shared float part_dp[ROWS][BK][LANES]; // and of dout.v

void main() {
    int tid = int(gl_LocalInvocationID.x), r = tid / LANES, lane = tid % LANES;
    int hd = a.hd, h = int(gl_WorkGroupID.y), g = h / (a.H / a.G);
    int vd = a.vd, qs = a.H * hd, ks = a.G * hd, vs = a.G * vd, os = a.H * vd;
    for (uint b = gl_WorkGroupID.x; b < uint(a.n_blocks); b += gl_NumWorkGroups.x) {
        int s = a.blocks.v[2 * b], t0 = a.blocks.v[2 * b + 1];
        int start = SEG_START(s), len = SEG_LEN(s), par = SEG_PARENT(s);
        int plen = par >= 0 ? SEG_LEN(par) : 0, p0 = par >= 0 ? SEG_START(par) : 0;
        int t1 = min(t0 + ROWS, len), t = t0 + r;
        bool live = t < t1;
        int qrow = start + t;
        int nkeys = plen + t1, last = plen + t;
        int lo = first_key(last, a.window), jstart = first_key(plen + t0, a.window) / BK * BK;
        float qr[COLS], dor[COLS], dqr[COLS];
        for (int j = 0; j < COLS; j++) {
            int c = lane + LANES * j;
            qr[j] = live && c < hd ? a.q.v[qrow * qs + h * hd + c] : 0.0;
            dor[j] = live && c < vd ? a.dout.v[qrow * os + h * vd + c] : 0.0;
            dqr[j] = 0.0;
        }
        float lse_r = live ? a.lse.v[qrow * a.H + h] : 0.0;
        float delta_r = live ? a.delta.v[qrow * a.H + h] : 0.0;
        for (int j0 = jstart; j0 < nkeys; j0 += BK) {
            for (int e = tid; e < BK * hd; e += 64) {
                int kk = e / hd, c = e % hd, j = j0 + kk;
                float kv = 0.0;
                if (j < nkeys) {
                    int krow = j < plen ? p0 + j : start + j - plen;
                    kv = a.k.v[krow * ks + g * hd + c];
                }
                Ks[kk][c] = kv;
            }
            for (int e = tid; e < BK * vd; e += 64) {
                int kk = e / vd, c = e % vd, j = j0 + kk;
                float vv = 0.0;
                if (j < nkeys) {
                    int krow = j < plen ? p0 + j : start + j - plen;
                    vv = a.v.v[krow * vs + g * vd + c];
                }
                Vs[kk][c] = vv;
            }
            barrier();
            for (int kk = 0; kk < BK; kk++) {
                float ps = 0.0, pd = 0.0;
                for (int j = 0; j < COLS; j++) {
                    int c = lane + LANES * j;
                    if (c < hd) ps += qr[j] * Ks[kk][c];
                    if (c < vd) pd += dor[j] * Vs[kk][c];
                }
                part_s[r][kk][lane] = ps;
                part_dp[r][kk][lane] = pd;
            }
            barrier();
            if (live) {
                for (int kk = 0; kk < BK; kk++) {
                    if (j0 + kk > last) break;
                    if (j0 + kk < lo) continue;
                    float x = 0.0, dp = 0.0;
                    for (int ln = 0; ln < LANES; ln++) {
                        x += part_s[r][kk][ln];
                        dp += part_dp[r][kk][ln];
                    }
                    float p = exp(a.scale * x - lse_r);
                    float ds = p * (dp - delta_r);
                    for (int j = 0; j < COLS; j++) {
                        int c = lane + LANES * j;
                        if (c < hd) dqr[j] += ds * Ks[kk][c];
                    }
                }
            }
            barrier();
        }
        if (live)
            for (int j = 0; j < COLS; j++) {
                int c = lane + LANES * j;
                if (c < hd) a.dq.v[qrow * qs + h * hd + c] = a.scale * dqr[j];
            }
    }
}
