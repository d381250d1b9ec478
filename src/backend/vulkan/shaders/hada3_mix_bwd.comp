#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hada3_mix_backward (backend/ops.def), the per-element part: dsrc and
// dcond (each 0 when not wanted); hada3_mix_sum adds dscale / dbias.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dsrc; F32 dcond; F32 ddst; I32 doff; F32 src; I32 soff; F32 scale; F32 p; F32 cu;
    F32 bias; int drs, srs, rank, silu, N, cols;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint cols = uint(a.cols), total = uint(a.N) * cols;
    bool hp = uint64_t(a.p) != 0, hb = uint64_t(a.bias) != 0, hs = uint64_t(a.src) != 0;
    bool wsrc = uint64_t(a.dsrc) != 0, wcond = uint64_t(a.dcond) != 0;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint r = idx / cols, m = idx - r * cols;
        int od = a.doff.v[m], os = a.soff.v[m];
        precise float e = od < 0 ? 0.0 : a.ddst.v[od + int(r) * a.drs];
        float v = (hs && os >= 0) ? a.src.v[os + int(r) * a.srs] : 0.0;
        precise float g = 1.0;
        if (hp)
            for (int q = 0; q < a.rank; q++)
                g += a.p.v[int(r) * a.rank + q] * a.cu.v[q * int(cols) + int(m)];
        float sc = a.scale.v[m];
        if (a.silu != 0) {
            precise float h = sc * g * v;
            if (hb) h += a.bias.v[m];
            float s = san_sigmoid(h);
            e *= s * (1.0 + h * (1.0 - s));
        }
        if (wsrc && os >= 0) a.dsrc.v[os + int(r) * a.srs] = e * sc * g;
        if (wcond) a.dcond.v[idx] = e * sc * v;
    }
}
