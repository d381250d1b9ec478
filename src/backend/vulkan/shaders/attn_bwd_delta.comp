#version 450
#include "common.glsl"
// delta[i] = sum_c dout[i*hd + c] * out[i*hd + c] per (row, head) i: the
// softmax backward's row term, read by attn_bwd_dq and attn_bwd_dkdv.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 delta; F32 dout; F32 o;
    int rows, hd;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    for (uint i = GRID_ID; i < uint(a.rows); i += GRID_STRIDE) {
        uint base = i * uint(a.hd);
        float acc = 0.0;
        for (uint c = 0; c < uint(a.hd); c++) acc += a.dout.v[base + c] * a.o.v[base + c];
        a.delta.v[i] = acc;
    }
}
