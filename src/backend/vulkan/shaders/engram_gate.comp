#version 450
#include "common.glsl"
// alpha = sigmoid(<rms_unit(u), rms_unit(k)> / sqrt(d)); bx = u + alpha*v
// (bx += alpha*v when accumulate). One workgroup per row; the three dot
// products reduce in a fixed tree.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 bx; F32 alpha; F32 u; F32 k; F32 v;
    int N, d, accumulate;
};
layout(push_constant) uniform PC { Args a; };
shared vec3 part[64];
void main() {
    uint t = gl_LocalInvocationID.x, d = uint(a.d);
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        uint base = r * d;
        vec3 s = vec3(0.0);
        for (uint c = t; c < d; c += 64) {
            float x = a.u.v[base + c], y = a.k.v[base + c];
            s += vec3(x * x, y * y, x * y);
        }
        part[t] = s;
        barrier();
        for (uint w = 32; w > 0; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        vec3 tot = part[0];
        barrier();
        float ru = 1.0 / sqrt(tot.x / float(a.d) + 1e-6), rk = 1.0 / sqrt(tot.y / float(a.d) + 1e-6);
        float al = sigmoid_f(tot.z * ru * rk * (1.0 / sqrt(float(a.d))));
        if (t == 0) a.alpha.v[r] = al;
        for (uint c = t; c < d; c += 64) {
            if (a.accumulate != 0) a.bx.v[base + c] += al * a.v.v[base + c];
            else a.bx.v[base + c] = a.u.v[base + c] + al * a.v.v[base + c];
        }
    }
}
