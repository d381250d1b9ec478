#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// dvp[r] = sum_j taps[j] * dv[r + j*dil] within r's segment, then (for the
// last 3*dil rows of a segment other segments continue) what the first rows
// of each continuing segment send back, in the CPU's order: segments in
// index order, and within one the rows (and so j) ascending.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dvp; F32 dv; F32 taps; I32 lay;
    int N, n_seg, d, dil;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint d = uint(a.d), total = uint(a.N) * d;
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        int r = int(i / d);
        uint c = i % d;
        int s = lay_row_seg(I32(a.lay), a.n_seg, r);
        int end = a.lay.v[3 * s] + a.lay.v[3 * s + 1];
        float acc = 0.0;
        for (int j = 0; j < 4 && r + j * a.dil < end; j++)
            acc += a.taps.v[uint(j) * d + c] * a.dv.v[uint(r + j * a.dil) * d + c];
        if (a.lay.v[3 * s + 2] < 0 && end - r <= 3 * a.dil)
            for (int s2 = s + 1; s2 < a.n_seg; s2++) {
                if (a.lay.v[3 * s2 + 2] != s) continue;
                int start2 = a.lay.v[3 * s2], len2 = a.lay.v[3 * s2 + 1];
                for (int j = 1; j < 4; j++) {
                    // the continuation's row at `off` reaches back j*dil to r
                    int off = j * a.dil - (end - r);
                    if (off >= 0 && off < len2 && off < 3 * a.dil)
                        acc += a.taps.v[uint(j) * d + c] * a.dv.v[uint(start2 + off) * d + c];
                }
            }
        a.dvp.v[i] = acc;
    }
}
