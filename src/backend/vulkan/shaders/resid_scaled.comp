#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// y = x + sigmoid(gate) * r
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 y; F32 x; F32 r; float gate; int n;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    float s = san_sigmoid(a.gate);
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) {
        precise float v = a.x.v[i] + s * a.r.v[i];
        a.y.v[i] = v;
    }
}
