#version 450
#include "common.glsl"
// engram_gate's backward, one workgroup per row: du += ds*(k - cu*u),
// dk += ds*(u - ck*k), dv += alpha*dbx (any of du, dk, dv may be absent).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 du; F32 dk; F32 dv; F32 dbx; F32 u; F32 k; F32 v; F32 alpha;
    int N, d;
};
layout(push_constant) uniform PC { Args a; };
shared vec4 part[64];
void main() {
    uint t = gl_LocalInvocationID.x, d = uint(a.d);
    float inv_d = 1.0 / float(a.d), cs = 1.0 / sqrt(float(a.d));
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        uint base = r * d;
        vec4 s = vec4(0.0);
        for (uint c = t; c < d; c += 64) {
            float x = a.u.v[base + c], y = a.k.v[base + c];
            s += vec4(x * x, y * y, x * y, a.dbx.v[base + c] * a.v.v[base + c]);
        }
        part[t] = s;
        barrier();
        for (uint w = 32; w > 0; w >>= 1) { if (t < w) part[t] += part[t + w]; barrier(); }
        vec4 tot = part[0];
        barrier();
        float ru = 1.0 / sqrt(tot.x * inv_d + 1e-6), rk = 1.0 / sqrt(tot.y * inv_d + 1e-6);
        float al = a.alpha.v[r];
        float ds = tot.w * al * (1.0 - al) * cs * ru * rk;
        float cu = tot.z * ru * ru * inv_d, ck = tot.z * rk * rk * inv_d;
        for (uint c = t; c < d; c += 64) {
            float x = a.u.v[base + c], y = a.k.v[base + c];
            if (uint64_t(a.du) != 0) a.du.v[base + c] += ds * (y - cu * x);
            if (uint64_t(a.dk) != 0) a.dk.v[base + c] += ds * (x - ck * y);
            if (uint64_t(a.dv) != 0) a.dv.v[base + c] += al * a.dbx.v[base + c];
        }
    }
}
