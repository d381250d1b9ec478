#version 450
#include "common.glsl"
// lanes_combine backward, one workgroup per (row, lane) q = r*n + i:
// dhpre[q] = <du[r], X[q]> (fixed tree), dX[q] += hpre[q] du[r].
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dhpre; F32 dX; F32 du; F32 hpre; F32 X; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
shared float red[64];
void main() {
    uint t = gl_LocalInvocationID.x, n = uint(a.n), d = uint(a.d);
    for (uint q = gl_WorkGroupID.x; q < uint(a.N) * n; q += gl_NumWorkGroups.x) {
        uint r = q / n;
        float h = a.hpre.v[q];
        float s = 0.0;
        for (uint c = t; c < d; c += 64u) {
            float g = a.du.v[r * d + c];
            s += g * a.X.v[q * d + c];
            a.dX.v[q * d + c] += h * g;
        }
        red[t] = s;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (t < w) red[t] += red[t + w];
            barrier();
        }
        if (t == 0u) a.dhpre.v[q] = red[0];
        barrier();
    }
}
