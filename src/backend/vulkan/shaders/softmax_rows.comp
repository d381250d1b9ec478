#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// In place: x[r] = softmax(x[r]) over k floats, one invocation per row
// (grid-stride), the operations of cpu_hada3.c in its order.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 x; int N, k;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint k = uint(a.k);
    for (uint r = GRID_ID; r < uint(a.N); r += GRID_STRIDE) {
        uint base = r * k;
        float mx = a.x.v[base];
        for (uint i = 1u; i < k; i++) { float t = a.x.v[base + i]; mx = t > mx ? t : mx; }
        precise float s = 0.0;
        for (uint i = 0u; i < k; i++) {
            float e = san_expf(a.x.v[base + i] - mx);
            a.x.v[base + i] = e;
            s += e;
        }
        precise float inv = 1.0 / s;
        for (uint i = 0u; i < k; i++) { precise float t = a.x.v[base + i] * inv; a.x.v[base + i] = t; }
    }
}
