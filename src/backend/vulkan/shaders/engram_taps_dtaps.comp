#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// Per chunk of `chunk` rows (workgroup x): part[ch][j*d + c] =
// sum_r dv[r][c] * vp[back(r, j*dil)][c]; rows_reduce_add sums the chunks in
// order into dtaps, so the result does not depend on scheduling.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 part; F32 dv; F32 vp; I32 lay;
    int N, n_seg, d, dil, chunk, n_chunks;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint d = uint(a.d), width = 4u * d;
    for (uint ch = gl_WorkGroupID.x; ch < uint(a.n_chunks); ch += gl_NumWorkGroups.x) {
        int r0 = int(ch) * a.chunk, r1 = min(r0 + a.chunk, a.N);
        for (uint col = gl_LocalInvocationID.x; col < width; col += gl_WorkGroupSize.x) {
            int j = int(col / d);
            uint c = col % d;
            float acc = 0.0;
            for (int r = r0; r < r1; r++) {
                int b = lay_back(I32(a.lay), a.n_seg, r, j * a.dil);
                if (b >= 0) acc += a.dv.v[uint(r) * d + c] * a.vp.v[uint(b) * d + c];
            }
            a.part.v[ch * width + col] = acc;
        }
    }
}
