#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// Hadamard MLP, one workgroup per row, the transform in shared memory:
// h1 = fwht(d1 * pad(z)); y = (x + (d3 * fwht(silu(d2 * h1)))[:d]) - u.
// hn (a power of two) <= 4096.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 y; F32 h1; F32 x; F32 z; F32 u; F32 d1; F32 d2; F32 d3; int N, d, hn; float scale;
};
layout(push_constant) uniform PC { Args a; };
shared float hada[4096];
void main() {
    uint t = gl_LocalInvocationID.x, d = uint(a.d), hn = uint(a.hn);
    bool has_u = uint64_t(a.u) != 0;
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        for (uint i = t; i < hn; i += 256u) hada[i] = i < d ? a.d1.v[i] * a.z.v[r * d + i] : 0.0;
        barrier();
        FWHT(hada, hn, a.scale, t, 256u)
        // the same invocation owns element i from here to the next transform
        for (uint i = t; i < hn; i += 256u) {
            float h = hada[i];
            a.h1.v[r * hn + i] = h;
            precise float sv = a.d2.v[i] * h;
            precise float si = sv * san_sigmoid(sv);
            hada[i] = si;
        }
        barrier();
        FWHT(hada, hn, a.scale, t, 256u)
        for (uint i = t; i < d; i += 256u) {
            precise float v = a.x.v[r * d + i] + a.d3.v[i] * hada[i];
            if (has_u) v = v - a.u.v[r * d + i];
            a.y.v[r * d + i] = v;
        }
        barrier();
    }
}
