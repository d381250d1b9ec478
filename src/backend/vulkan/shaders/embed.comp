#version 450
#include "common.glsl"
// x0[t] = emb[tok[t]] * scale
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 x0; F32 emb; I32 tok; float scale; int N, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.N) * uint(a.d);
    for (uint i = GRID_ID; i < n; i += GRID_STRIDE) {
        uint t = i / uint(a.d), c = i % uint(a.d);
        a.x0.v[i] = a.emb.v[uint(a.tok.v[t]) * uint(a.d) + c] * a.scale;
    }
}
