#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hada3_mix (backend/ops.def): one invocation per (row r, feature m);
// p / bias are 0 when absent. The arithmetic follows the CPU's order.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; I32 doff; F32 src; I32 soff; F32 scale; F32 p; F32 cu; F32 bias;
    int drs, srs, rank, silu, N, cols;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint cols = uint(a.cols), total = uint(a.N) * cols;
    bool hp = uint64_t(a.p) != 0, hb = uint64_t(a.bias) != 0;
    for (uint idx = GRID_ID; idx < total; idx += GRID_STRIDE) {
        uint r = idx / cols, m = idx - r * cols;
        int od = a.doff.v[m];
        if (od < 0) continue;
        int os = a.soff.v[m];
        float v = os < 0 ? 0.0 : a.src.v[os + int(r) * a.srs];
        precise float g = 1.0;
        if (hp)
            for (int q = 0; q < a.rank; q++)
                g += a.p.v[int(r) * a.rank + q] * a.cu.v[q * int(cols) + int(m)];
        precise float h = v * (a.scale.v[m] * g);
        if (hb) h += a.bias.v[m];
        a.dst.v[od + int(r) * a.drs] = a.silu != 0 ? h * san_sigmoid(h) : h;
    }
}
