#version 450
#include "common.glsl"
// y = x * rstd * (1 + scale) per row; one workgroup per row (grid-stride over
// rows). The sum of squares is reduced in a fixed tree: deterministic.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 y; F32 rstd; F32 x; F32 scale; // rstd, scale: 0 when absent
    int rows, dim; float eps;
};
layout(push_constant) uniform PC { Args a; };
shared float part[64];
void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < uint(a.rows); r += gl_NumWorkGroups.x) {
        uint base = r * uint(a.dim);
        float s = 0.0;
        for (uint c = t; c < uint(a.dim); c += 64) { float v = a.x.v[base + c]; s = fma(v, v, s); }
        part[t] = s;
        barrier();
        for (uint w = 32; w > 0; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        float rs = 1.0 / sqrt(part[0] / float(a.dim) + a.eps);
        barrier();
        if (t == 0 && uint64_t(a.rstd) != 0) a.rstd.v[r] = rs;
        for (uint c = t; c < uint(a.dim); c += 64) {
            float sc = uint64_t(a.scale) != 0 ? 1.0 + a.scale.v[c] : 1.0;
            a.y.v[base + c] = a.x.v[base + c] * rs * sc;
        }
    }
}
