#version 450
#include "common.glsl"
// dst[r*dst_ld + c] = src[r*src_ld + c]
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; F32 src; int dst_ld, src_ld, rows, cols;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint total = uint(a.rows) * uint(a.cols);
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint r = i / uint(a.cols), c = i % uint(a.cols);
        a.dst.v[r * uint(a.dst_ld) + c] = a.src.v[r * uint(a.src_ld) + c];
    }
}
