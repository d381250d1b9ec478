#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hada3_mix_backward's parameter gradients: invocation m sums feature m's
// dscale / dbias terms over the rows in order (each 0 when not wanted).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dscale; F32 dbias; F32 ddst; I32 doff; F32 src; I32 soff; F32 scale; F32 p; F32 cu;
    F32 bias; int drs, srs, rank, silu, N, cols;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint m = GRID_ID;
    if (m >= uint(a.cols)) return;
    bool hp = uint64_t(a.p) != 0, hb = uint64_t(a.bias) != 0, hs = uint64_t(a.src) != 0;
    int od = a.doff.v[m], os = a.soff.v[m], cols = a.cols;
    float sc = a.scale.v[m], bm = hb ? a.bias.v[m] : 0.0;
    precise float ss = 0.0, sb = 0.0;
    for (int r = 0; r < a.N; r++) {
        precise float e = od < 0 ? 0.0 : a.ddst.v[od + r * a.drs];
        float v = (hs && os >= 0) ? a.src.v[os + r * a.srs] : 0.0;
        precise float g = 1.0;
        if (hp)
            for (int q = 0; q < a.rank; q++) g += a.p.v[r * a.rank + q] * a.cu.v[q * cols + int(m)];
        if (a.silu != 0) {
            precise float h = sc * g * v + bm;
            float s = san_sigmoid(h);
            e *= s * (1.0 + h * (1.0 - s));
        }
        ss += e * g * v;
        sb += e;
    }
    if (uint64_t(a.dscale) != 0) a.dscale.v[m] += ss;
    if (uint64_t(a.dbias) != 0) a.dbias.v[m] += sb;
}
