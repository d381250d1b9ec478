#version 450
#include "common.glsl"
// X[r,i] = x0[r] for every lane i
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 X; F32 x0; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * n * d;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint c = idx % d, r = idx / d / n;
        a.X.v[idx] = a.x0.v[r * d + c];
    }
}
