#version 450
#include "common.glsl"
// dX[r,i] = dxm[r] * (1/n)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dX; F32 dxm; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * n * d;
    precise float inv = 1.0 / float(a.n);
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint c = idx % d, r = idx / d / n;
        a.dX.v[idx] = a.dxm.v[r * d + c] * inv;
    }
}
