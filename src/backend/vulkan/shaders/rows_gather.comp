#version 450
#include "common.glsl"
// dst[i] = src[rows[i]] (rows of d floats)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; F32 src; I32 rows; int n, d;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint total = uint(a.n) * uint(a.d);
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint r = i / uint(a.d), c = i % uint(a.d);
        a.dst.v[i] = a.src.v[uint(a.rows.v[r]) * uint(a.d) + c];
    }
}
