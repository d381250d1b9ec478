#version 450
#include "common.glsl"
// xm[r] = (X[r,0] + ... + X[r,n-1]) * (1/n)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 xm; F32 X; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * d;
    precise float inv = 1.0 / float(a.n);
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint r = idx / d, c = idx % d;
        precise float o = a.X.v[r * n * d + c];
        for (uint i = 1; i < n; i++) o += a.X.v[(r * n + i) * d + c];
        a.xm.v[idx] = o * inv;
    }
}
