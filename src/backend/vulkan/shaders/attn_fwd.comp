#version 450
#include "common.glsl"
#include "attn_common.glsl"
// Causal GQA attention forward, flash style: a workgroup owns ROWS query
// rows of one segment (blocks[b] = (segment, first row)) and head
// gl_WorkGroupID.y; keys (the parent segment's rows, then the segment's
// own rows) stream through shared memory BK at a time with an online
// softmax. q/k have head dim hd, v vd; out [N, H*vd]; lse [N, H] (0
// address: not wanted). window > 0: a query sees only its last `window` keys.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 o; F32 lse; F32 q; F32 k; F32 v; I32 lay; I32 blocks;
    int N, n_seg, n_blocks, H, G, hd, vd, window; float scale;
};
layout(push_constant) uniform PC { Args a; };

#define BK 8
shared float Ks[BK][HD_MAX];
shared float Vs[BK][HD_MAX];
shared float part[ROWS][BK][LANES]; // per-lane pieces of q.k

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
        int nkeys = plen + t1, last = plen + t; // this row sees keys lo..last
        int lo = first_key(last, a.window), jstart = first_key(plen + t0, a.window) / BK * BK;
        float qr[COLS], acc[COLS];
        for (int j = 0; j < COLS; j++) {
            int c = lane + LANES * j;
            qr[j] = live && c < hd ? a.q.v[qrow * qs + h * hd + c] : 0.0;
            acc[j] = 0.0;
        }
        float m = NEG_BIG, l = 0.0;
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
                float p = 0.0;
                for (int j = 0; j < COLS; j++) {
                    int c = lane + LANES * j;
                    if (c < hd) p += qr[j] * Ks[kk][c];
                }
                part[r][kk][lane] = p;
            }
            barrier();
            if (live) {
                float sc[BK];
                float mnew = m;
                for (int kk = 0; kk < BK; kk++) {
                    float x = 0.0;
                    for (int ln = 0; ln < LANES; ln++) x += part[r][kk][ln];
                    sc[kk] = a.scale * x;
                    if (j0 + kk >= lo && j0 + kk <= last) mnew = max(mnew, sc[kk]);
                }
                float alpha = exp(m - mnew);
                l *= alpha;
                for (int j = 0; j < COLS; j++) acc[j] *= alpha;
                for (int kk = 0; kk < BK; kk++) {
                    if (j0 + kk > last) break;
                    if (j0 + kk < lo) continue;
                    float p = exp(sc[kk] - mnew);
                    l += p;
                    for (int j = 0; j < COLS; j++) {
                        int c = lane + LANES * j;
                        if (c < vd) acc[j] += p * Vs[kk][c];
                    }
                }
                m = mnew;
            }
            barrier();
        }
        if (live) {
            float inv = 1.0 / l;
            for (int j = 0; j < COLS; j++) {
                int c = lane + LANES * j;
                if (c < vd) a.o.v[qrow * os + h * vd + c] = acc[j] * inv;
            }
            if (lane == 0 && uint64_t(a.lse) != 0) a.lse.v[qrow * a.H + h] = m + log(l);
        }
    }
}
