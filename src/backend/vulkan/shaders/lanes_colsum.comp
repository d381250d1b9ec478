#version 450
#include "common.glsl"
// dst[k] += scale * sum_t part[k*T + t] for k < K: the second stage of the
// group's deterministic reductions (a fixed tree per column, no atomics).
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 part; F32 dst; int T, K; float scale;
};
layout(push_constant) uniform PC { Args a; };
shared float red[256];
void main() {
    uint t = gl_LocalInvocationID.x, T = uint(a.T);
    for (uint k = gl_WorkGroupID.x; k < uint(a.K); k += gl_NumWorkGroups.x) {
        float s = 0.0;
        for (uint i = t; i < T; i += 256u) s += a.part.v[k * T + i];
        red[t] = s;
        barrier();
        for (uint w = 128u; w > 0u; w >>= 1) {
            if (t < w) red[t] += red[t + w];
            barrier();
        }
        if (t == 0u) a.dst.v[k] += a.scale * red[0];
        barrier();
    }
}
