#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// causal per-channel conv of q, k or v: y[r, i] = sum_{j < nt} taps[j, i] *
// x[back(r, j), i], taps in j order, stopping at the first missing row (as
// cpu_v3.c); nt = ntaps, or window when that is smaller. One invocation
// per element of y [N, width].
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 y; F32 x; F32 taps; I32 lay;
    int N, n_seg, width, nt;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint n = uint(a.N) * uint(a.width);
    for (uint e = GRID_ID; e < n; e += GRID_STRIDE) {
        int r = int(e / uint(a.width)), i = int(e % uint(a.width));
        precise float acc = 0.0;
        for (int j = 0; j < a.nt; j++) {
            int b = lay_back(I32(a.lay), a.n_seg, r, j);
            if (b < 0) break;
            precise float t = a.taps.v[j * a.width + i] * a.x.v[b * a.width + i];
            acc = acc + t;
        }
        a.y.v[e] = acc;
    }
}
