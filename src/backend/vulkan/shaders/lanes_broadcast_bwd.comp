#version 450
#include "common.glsl"
// dx0[r] = sum_i dX[r,i] (lanes in order)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dx0; F32 dX; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * d;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint r = idx / d, c = idx % d;
        precise float o = a.dX.v[r * n * d + c];
        for (uint i = 1; i < n; i++) o += a.dX.v[(r * n + i) * d + c];
        a.dx0.v[idx] = o;
    }
}
