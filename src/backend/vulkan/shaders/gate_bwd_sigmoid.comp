#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// o = att * sigmoid(g): datt = dout * s, dg = dout * att * s * (1 - s);
// datt may alias dout (read first, by the invocation that writes it)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 datt; F32 dg; F32 dout; F32 att; F32 g; int n;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint i = GRID_ID; i < uint(a.n); i += GRID_STRIDE) {
        float s = san_sigmoid(a.g.v[i]), go = a.dout.v[i], at = a.att.v[i];
        a.datt.v[i] = go * s;
        precise float v = go * at * s * (1.0 - s);
        a.dg.v[i] = v;
    }
}
