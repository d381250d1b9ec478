#version 450
#include "common.glsl"
// o = att * sigmoid(g)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 o; F32 att; F32 g; int n;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) a.o.v[i] = a.att.v[i] * sigmoid_f(a.g.v[i]);
}
