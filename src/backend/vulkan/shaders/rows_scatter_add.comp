#version 450
#include "common.glsl"
// dst[key] += src[i] * scale over the rows i of each group, in increasing i:
// the host grouped the rows by destination (order = rows sorted stably by
// key, group g = order[gstart[g] .. gstart[g+1]) with key gkey[g]), so each
// destination row has one owner workgroup and sums in the CPU's order
// without atomics.
layout(local_size_x = 128) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; F32 src; I32 order; I32 gstart; I32 gkey; float scale; int n_groups, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint d = uint(a.d);
    for (uint g = gl_WorkGroupID.x; g < uint(a.n_groups); g += gl_NumWorkGroups.x) {
        uint base = uint(a.gkey.v[g]) * d;
        int i0 = a.gstart.v[g], i1 = a.gstart.v[g + 1];
        for (uint c = gl_LocalInvocationID.x; c < d; c += gl_WorkGroupSize.x) {
            float acc = a.dst.v[base + c];
            for (int i = i0; i < i1; i++) acc += a.src.v[uint(a.order.v[i]) * d + c] * a.scale;
            a.dst.v[base + c] = acc;
        }
    }
}
