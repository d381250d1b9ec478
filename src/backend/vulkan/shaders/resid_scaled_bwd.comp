#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// y = x + sigmoid(gate) * r: dr = s * dy (dr may alias dy: each element is
// read before the same invocation writes it); when part is not 0, workgroup
// w's share of <dy, r> goes to part[w] (a fixed tree; lanes_colsum adds the
// workgroups in order and the factor s(1-s)).
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dr; F32 dy; F32 r; F32 part; float gate; int n;
};
layout(push_constant) uniform PC { Args a; };
shared float red[256];
void main() {
    uint t = gl_LocalInvocationID.x;
    float s = san_sigmoid(a.gate);
    float acc = 0.0;
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) {
        float g = a.dy.v[i];
        acc += g * a.r.v[i];
        a.dr.v[i] = s * g;
    }
    if (uint64_t(a.part) == 0) return;
    red[t] = acc;
    barrier();
    for (uint w = 128u; w > 0u; w >>= 1) {
        if (t < w) red[t] += red[t + w];
        barrier();
    }
    if (t == 0u) a.part.v[gl_WorkGroupID.x] = red[0];
}
