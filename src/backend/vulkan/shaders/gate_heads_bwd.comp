#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// headwise gate backward, one invocation per (row, head) of NH = N*H:
// datt = dout * s, dg = (sum_i dout*att) * s * (1 - s) (sum in index order,
// as the CPU); datt may alias dout (each element read before it is written)
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 datt; F32 dg; F32 dout; F32 att; F32 g; int NH; int hd;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint rh = GRID_ID; rh < uint(a.NH); rh += GRID_STRIDE) {
        float s = san_sigmoid(a.g.v[rh]);
        uint base = rh * uint(a.hd);
        precise float acc = 0.0;
        for (uint i = 0; i < uint(a.hd); i++) {
            float dy = a.dout.v[base + i];
            acc += dy * a.att.v[base + i];
            precise float dx = dy * s;
            a.datt.v[base + i] = dx;
        }
        precise float v = acc * s * (1.0 - s);
        a.dg.v[rh] = v;
    }
}
