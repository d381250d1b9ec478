#version 450
#include "common.glsl"
// y += alpha * x
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 y; F32 x; float alpha; int n;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) a.y.v[i] += a.alpha * a.x.v[i];
}
