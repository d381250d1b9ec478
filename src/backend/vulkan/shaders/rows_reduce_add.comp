#version 450
#include "common.glsl"
// dst[c] += sum over chunks (in order) of part[ch * width + c]
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; F32 part; int n_chunks, width;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint w = uint(a.width);
    for (uint c = GRID_ID; c < w; c += GRID_STRIDE) {
        float s = 0.0;
        for (uint ch = 0; ch < uint(a.n_chunks); ch++) s += a.part.v[ch * w + c];
        a.dst.v[c] += s;
    }
}
