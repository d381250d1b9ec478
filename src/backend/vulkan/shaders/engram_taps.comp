#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// v[r] = sum_j taps[j] * vp[back(r, j*dil)], j < 4, stopping at the sequence start
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 v; F32 vp; F32 taps; I32 lay;
    int N, n_seg, d, dil;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint d = uint(a.d), total = uint(a.N) * d;
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint r = i / d, c = i % d;
        float acc = 0.0;
        for (int j = 0; j < 4; j++) {
            int b = lay_back(I32(a.lay), a.n_seg, int(r), j * a.dil);
            if (b < 0) break;
            acc += a.taps.v[uint(j) * d + c] * a.vp.v[uint(b) * d + c];
        }
        a.v.v[i] = acc;
    }
}
