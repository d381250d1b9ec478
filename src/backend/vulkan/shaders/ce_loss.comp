#version 450
#include "common.glsl"
#include "ce_math.glsl"
// loss[r] = logsumexp(logits[r]) - logits[r][target[r]]; one workgroup per
// row, max and sums reduced in a fixed tree. The sum of exp(l - max) is kept
// as (sum over l < max) + (count of l == max) - 1 next to 1, so log1p keeps
// the small losses of confident rows (the CPU sums in double).
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 loss; F32 logits; I32 target; int N, V;
};
layout(push_constant) uniform PC { Args a; };
shared vec2 part[256];
void main() {
    uint t = gl_LocalInvocationID.x, V = uint(a.V);
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        uint base = r * V;
        float m = -3.402823466e38;
        for (uint i = t; i < V; i += 256) m = max(m, a.logits.v[base + i]);
        part[t].x = m;
        barrier();
        for (uint w = 128; w > 0; w >>= 1) { if (t < w) part[t].x = max(part[t].x, part[t + w].x); barrier(); }
        float mx = part[0].x;
        barrier();
        vec2 s = vec2(0.0); // (sum of exp below the max, count at the max)
        for (uint i = t; i < V; i += 256) {
            float x = a.logits.v[base + i];
            if (x < mx) s.x += ce_exp(x - mx);
            else s.y += 1.0;
        }
        part[t] = s;
        barrier();
        for (uint w = 128; w > 0; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        // (max - target logit) first: exact when they are close
        if (t == 0)
            a.loss.v[r] = (mx - a.logits.v[base + uint(a.target.v[r])]) +
                          ce_log1p(part[0].x + (part[0].y - 1.0));
        barrier();
    }
}
