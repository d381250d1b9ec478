#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// qkv_taps backward, one invocation per channel i (every row's scatter into
// dx and every tap's sum over rows in the CPU's order: taps j, then rows r):
// dx[back(r, j), i] += taps[j, i] * dy[r, i] (dx set), dtaps[j, i] +=
// dy[r, i] * x[back(r, j), i] (dtaps 0 address: not wanted).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dx; F32 dtaps; F32 dy; F32 x; F32 taps; I32 lay;
    int N, n_seg, width, nt;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    int w = a.width;
    bool want = uint64_t(a.dtaps) != 0;
    for (uint ui = GRID_ID; ui < uint(w); ui += GRID_STRIDE) {
        int i = int(ui);
        for (int r = 0; r < a.N; r++) a.dx.v[r * w + i] = 0.0;
        for (int j = 0; j < a.nt; j++) {
            float tj = a.taps.v[j * w + i];
            precise float dt = want ? a.dtaps.v[j * w + i] : 0.0;
            for (int r = 0; r < a.N; r++) {
                int b = lay_back(I32(a.lay), a.n_seg, r, j);
                if (b < 0) continue;
                float d = a.dy.v[r * w + i];
                precise float t = tj * d;
                a.dx.v[b * w + i] = a.dx.v[b * w + i] + t;
                if (want) {
                    precise float u = d * a.x.v[b * w + i];
                    dt = dt + u;
                }
            }
            if (want) a.dtaps.v[j * w + i] = dt;
        }
    }
}
