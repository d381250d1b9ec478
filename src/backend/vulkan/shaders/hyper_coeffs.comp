#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// Hyper-connection coefficients, one invocation per token row: the two
// sigmoid gates, then 20 Sinkhorn rounds on the row's n x n matrix, worked
// in place in M.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 hpre; F32 hpost; F32 M; F32 pre; F32 post; F32 res; F32 b_pre; F32 b_post; F32 b_res;
    float a_pre, a_post, a_res; int lane, N, n, rounds;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    int n = a.n;
    uint nn = uint(n * n);
    F32 none = F32(uint64_t(0)), Mref = a.M;
    for (uint r = GRID_ID; r < uint(a.N); r += GRID_STRIDE) {
        for (int i = 0; i < n; i++) {
            uint e = r * uint(n) + uint(i);
            float on = i == a.lane ? 1.0 : 0.0;
            precise float zp = a.a_pre * a.pre.v[e] + a.b_pre.v[i] + 8.0 * on - 4.0;
            a.hpre.v[e] = san_sigmoid(zp);
            precise float zq = a.a_post * a.post.v[e] + a.b_post.v[i] - 4.0 * (1.0 - on);
            precise float hq = 2.0 * san_sigmoid(zq);
            a.hpost.v[e] = hq;
        }
        uint o = r * nn;
        for (uint i = 0; i < nn; i++) {
            precise float z = a.a_res * a.res.v[o + i] + a.b_res.v[i];
            a.M.v[o + i] = z;
        }
        for (int it = 0; it < a.rounds; it++) {
            sinkhorn_halfstep(Mref, o, 1u, none, 0u, 0u, n, true);
            sinkhorn_halfstep(Mref, o, 1u, none, 0u, 0u, n, false);
        }
        for (uint i = 0; i < nn; i++) a.M.v[o + i] = san_expf(a.M.v[o + i]);
    }
}
