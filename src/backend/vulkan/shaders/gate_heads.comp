#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// headwise gate: o[r, h, :] = att[r, h, :] * sigmoid(g[r, h]); n = N*H*hd
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 o; F32 att; F32 g; int n; int hd;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) {
        precise float y = a.att.v[i] * san_sigmoid(a.g.v[i / uint(a.hd)]);
        a.o.v[i] = y;
    }
}
