#version 450
#include "common.glsl"
// Xo[r,i] = hpost[r,i] y[r] + sum_j M[r,i,j] X[r,j]
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 Xo; F32 M; F32 X; F32 hpost; F32 y; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.n), d = uint(a.d), total = uint(a.N) * n * d;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint c = idx % d, ri = idx / d, r = ri / n;
        precise float o = a.hpost.v[ri] * a.y.v[r * d + c];
        for (uint j = 0; j < n; j++) o += a.M.v[ri * n + j] * a.X.v[(r * n + j) * d + c];
        a.Xo.v[idx] = o;
    }
}
