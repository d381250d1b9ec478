#version 450
#include "common.glsl"
// dx = y * (dy - <y, dy>) per row of k floats, one invocation per row
// (grid-stride); dx may alias dy (each row is read before it is written).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dx; F32 dy; F32 y; int N, k;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint k = uint(a.k);
    for (uint r = GRID_ID; r < uint(a.N); r += GRID_STRIDE) {
        uint base = r * k;
        precise float s = 0.0;
        for (uint i = 0u; i < k; i++) s += a.y.v[base + i] * a.dy.v[base + i];
        for (uint i = 0u; i < k; i++) {
            precise float t = a.y.v[base + i] * (a.dy.v[base + i] - s);
            a.dx.v[base + i] = t;
        }
    }
}
