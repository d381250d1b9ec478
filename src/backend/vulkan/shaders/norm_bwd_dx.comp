#version 450
#include "common.glsl"
// rmsnorm backward, one workgroup per row: g = dy*(1+scale),
// dx (+)= rs*g - x * rs^3 <g,x> / dim. dx may alias dy: the dot is complete
// (barrier) before any write, and each element is written by the invocation
// that read it.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dx; F32 dy; F32 x; F32 rstd; F32 scale; int rows, dim, accumulate;
};
layout(push_constant) uniform PC { Args a; };
shared float part[64];
void main() {
    uint t = gl_LocalInvocationID.x, dim = uint(a.dim);
    bool has_scale = uint64_t(a.scale) != 0;
    precise float inv_dim = 1.0 / float(a.dim);
    for (uint r = gl_WorkGroupID.x; r < uint(a.rows); r += gl_NumWorkGroups.x) {
        uint o = r * dim;
        float s = 0.0;
        for (uint c = t; c < dim; c += 64u) {
            precise float v = has_scale ? a.dy.v[o + c] * (1.0 + a.scale.v[c]) * a.x.v[o + c]
                                        : a.dy.v[o + c] * a.x.v[o + c];
            s += v;
        }
        part[t] = s;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        float rs = a.rstd.v[r];
        precise float cc = rs * rs * rs * part[0] * inv_dim;
        barrier();
        for (uint c = t; c < dim; c += 64u) {
            precise float v = has_scale ? rs * a.dy.v[o + c] * (1.0 + a.scale.v[c]) - cc * a.x.v[o + c]
                                        : rs * a.dy.v[o + c] - cc * a.x.v[o + c];
            if (a.accumulate != 0) a.dx.v[o + c] += v;
            else a.dx.v[o + c] = v;
        }
    }
}
