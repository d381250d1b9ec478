// The CPU backend's exp/log/sigmoid (cpu_kernels.h: san_expf, san_logf,
// san_sigmoid) in GLSL, so the lanes group's shaders round like the
// reference. `precise` keeps the compiler from fusing or reordering them.

float san_expf(float x) {
    const float hi = 88.0, lo = -87.3;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    // k = round-to-even(x / ln2), as the CPU's 1.5 * 2^23 trick rounds
    precise float kf = roundEven(xc * 1.44269504088896341);
    precise float r = xc - kf * 0.693359375;
    r = r - kf * -2.12194440e-4;
    precise float p = 1.9875691500e-4;
    p = p * r + 1.3981999507e-3;
    p = p * r + 8.3334519073e-3;
    p = p * r + 4.1665795894e-2;
    p = p * r + 1.6666665459e-1;
    p = p * r + 5.0000001201e-1;
    p = p * r * r + r + 1.0;
    float scale = uintBitsToFloat(uint(int(kf) + 127) << 23);
    precise float y = p * scale;
    y = x > hi ? uintBitsToFloat(0x7f800000u) : y;
    y = x < lo ? 0.0 : y;
    return isnan(x) ? x : y;
}

// log(x) for positive normal finite x (sums of exponentials here)
float san_logf(float x) {
    uint u = floatBitsToUint(x);
    int e = int((u >> 23) & 0xffu) - 126;
    u = (u & 0x007fffffu) | 0x3f000000u;
    precise float m = uintBitsToFloat(u);
    bool lo = m < 0.707106781186547524;
    float fe = float(e - (lo ? 1 : 0));
    m = lo ? m + m - 1.0 : m - 1.0;
    precise float z = m * m;
    precise float y = 7.0376836292e-2;
    y = y * m - 1.1514610310e-1;
    y = y * m + 1.1676998740e-1;
    y = y * m - 1.2420140846e-1;
    y = y * m + 1.4249322787e-1;
    y = y * m - 1.6668057665e-1;
    y = y * m + 2.0000714765e-1;
    y = y * m - 2.4999993993e-1;
    y = y * m + 3.3333331174e-1;
    y = y * m * z;
    y += -2.12194440e-4 * fe;
    y += -0.5 * z;
    precise float res = (m + y) + 0.693359375 * fe;
    return res;
}

float san_sigmoid(float x) {
    precise float s = 1.0 / (1.0 + san_expf(-x));
    return s;
}

// One half-round of log-space Sinkhorn on one n x n matrix (cpu_sinkhorn.c,
// san_sinkhorn_halfstep): element i of Z at Z[zo + i*zs]; when E is not 0
// it receives this step's softmax at E[eo + i*es].
void sinkhorn_halfstep(F32 Z, uint zo, uint zs, F32 E, uint eo, uint es, int n, bool rowstep) {
    bool want_e = uint64_t(E) != 0;
    for (int a = 0; a < n; a++) {
        uint base = uint(rowstep ? a * n : a), stp = uint(rowstep ? 1 : n);
        float mx = Z.v[zo + base * zs];
        for (int b = 1; b < n; b++) {
            float p = Z.v[zo + (base + uint(b) * stp) * zs];
            mx = p > mx ? p : mx;
        }
        precise float s = 0.0;
        for (int b = 0; b < n; b++) {
            uint i = base + uint(b) * stp;
            float e = san_expf(Z.v[zo + i * zs] - mx);
            if (want_e) E.v[eo + i * es] = e;
            s += e;
        }
        precise float lse = mx + san_logf(s);
        precise float inv = 1.0 / s;
        for (int b = 0; b < n; b++) {
            uint i = base + uint(b) * stp;
            Z.v[zo + i * zs] -= lse;
            if (want_e) E.v[eo + i * es] *= inv;
        }
    }
}

// In-place fast Walsh-Hadamard transform of hada[0..hn) (a power of two) in
// Sylvester order times scale, by the whole workgroup: the same butterflies
// as san_fwht, so the same float operations per element.
#define FWHT(buf, hn, scale, tid, nthreads)                                                        \
    {                                                                                              \
        for (uint h_ = 1u; h_ < (hn); h_ <<= 1) {                                                  \
            for (uint q_ = (tid); q_ < (hn) / 2u; q_ += (nthreads)) {                              \
                uint j_ = (q_ & ~(h_ - 1u)) * 2u + (q_ & (h_ - 1u));                               \
                float p_ = buf[j_], r_ = buf[j_ + h_];                                             \
                buf[j_] = p_ + r_;                                                                 \
                buf[j_ + h_] = p_ - r_;                                                            \
            }                                                                                      \
            barrier();                                                                             \
        }                                                                                          \
        for (uint i_ = (tid); i_ < (hn); i_ += (nthreads)) buf[i_] *= (scale);                     \
        barrier();                                                                                 \
    }
