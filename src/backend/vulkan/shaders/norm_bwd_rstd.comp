#version 450
#include "common.glsl"
// rstd[r] = 1 / sqrt(sum(x^2) * (1/dim) + eps) for rmsnorm_backward without
// a saved rstd; one workgroup per row, a fixed tree.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 rstd; F32 x; int rows, dim; float eps;
};
layout(push_constant) uniform PC { Args a; };
shared float part[64];
void main() {
    uint t = gl_LocalInvocationID.x, dim = uint(a.dim);
    for (uint r = gl_WorkGroupID.x; r < uint(a.rows); r += gl_NumWorkGroups.x) {
        float s = 0.0;
        for (uint c = t; c < dim; c += 64u) { float v = a.x.v[r * dim + c]; s = fma(v, v, s); }
        part[t] = s;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        if (t == 0u) {
            precise float rs = 1.0 / sqrt(part[0] * (1.0 / float(a.dim)) + a.eps);
            a.rstd.v[r] = rs;
        }
        barrier();
    }
}
