#version 450
#include "common.glsl"
#include "ce_math.glsl"
// softmax_rows (in place) and, when bwd != 0, softmax_rows_backward
// (x = dx, dy, y): one invocation per row.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 x; F32 dy; F32 y; int N, k, bwd;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    int k = a.k;
    for (uint r = GRID_ID; r < uint(a.N); r += GRID_STRIDE) {
        int b = int(r) * k;
        if (a.bwd != 0) {
            precise float s = 0.0;
            for (int i = 0; i < k; i++) s += a.y.v[b + i] * a.dy.v[b + i];
            for (int i = 0; i < k; i++) a.x.v[b + i] = a.y.v[b + i] * (a.dy.v[b + i] - s);
            continue;
        }
        float mx = a.x.v[b];
        for (int i = 1; i < k; i++) mx = max(mx, a.x.v[b + i]);
        precise float s = 0.0;
        for (int i = 0; i < k; i++) {
            float e = ce_exp(a.x.v[b + i] - mx);
            a.x.v[b + i] = e;
            s += e;
        }
        float inv = 1.0 / s;
        for (int i = 0; i < k; i++) a.x.v[b + i] *= inv;
    }
}
