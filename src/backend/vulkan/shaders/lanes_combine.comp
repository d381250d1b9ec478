#version 450
#include "common.glsl"
// u[r] = sum_i hpre[r,i] X[r,i] (lanes added in order, as the CPU)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 u; F32 hpre; F32 X; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * d;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint r = idx / d, c = idx % d;
        precise float s = 0.0;
        for (uint i = 0; i < n; i++) s += a.hpre.v[r * n + i] * a.X.v[(r * n + i) * d + c];
        a.u.v[idx] = s;
    }
}
