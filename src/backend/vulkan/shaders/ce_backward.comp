#version 450
#include "common.glsl"
#include "ce_math.glsl"
// in place: logits[r] <- w[r] * (softmax(logits[r]) - onehot(target[r]));
// rows with weight 0 become zeros. One workgroup per row.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 logits; I32 target; F32 weight; int N, V; // weight: 0 = all 1
};
layout(push_constant) uniform PC { Args a; };
shared float part[256];
void main() {
    uint t = gl_LocalInvocationID.x, V = uint(a.V);
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        uint base = r * V;
        float w = uint64_t(a.weight) != 0 ? a.weight.v[r] : 1.0;
        if (w == 0.0) {
            for (uint i = t; i < V; i += 256) a.logits.v[base + i] = 0.0;
            continue;
        }
        float m = -3.402823466e38;
        for (uint i = t; i < V; i += 256) m = max(m, a.logits.v[base + i]);
        part[t] = m;
        barrier();
        for (uint ww = 128; ww > 0; ww >>= 1) { if (t < ww) part[t] = max(part[t], part[t + ww]); barrier(); }
        float mx = part[0];
        barrier();
        float s = 0.0;
        for (uint i = t; i < V; i += 256) s += ce_exp(a.logits.v[base + i] - mx);
        part[t] = s;
        barrier();
        for (uint ww = 128; ww > 0; ww >>= 1) { if (t < ww) part[t] += part[t + ww]; barrier(); }
        float c = w / part[0];
        barrier();
        uint tg = uint(a.target.v[r]);
        for (uint i = t; i < V; i += 256) {
            float p = ce_exp(a.logits.v[base + i] - mx) * c;
            a.logits.v[base + i] = i == tg ? p - w : p;
        }
    }
}
