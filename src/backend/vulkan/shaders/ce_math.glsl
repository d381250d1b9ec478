// exp and log for the cross-entropy shaders, accurate to a few ulp on every
// device (GLSL's built-ins may be off by 3 + 2|x| ulp or 2^-21 absolute).

// e^x for x <= 0 as the CPU's san_expf: Cody-Waite reduction x = k ln2 + r,
// a degree-6 polynomial for e^r, 0 below -87.3.
float ce_exp(float x) {
    float xc = max(x, -87.3);
    float kf = roundEven(xc * 1.44269504088896341);
    float r = xc - kf * 0.693359375;
    r = r - kf * -2.12194440e-4;
    float p = 1.9875691500e-4;
    p = p * r + 1.3981999507e-3;
    p = p * r + 8.3334519073e-3;
    p = p * r + 4.1665795894e-2;
    p = p * r + 1.6666665459e-1;
    p = p * r + 5.0000001201e-1;
    p = p * r * r + r + 1.0;
    float y = ldexp(p, int(kf));
    return x < -87.3 ? 0.0 : y;
}

// log(s) for s > 0: s = m 2^e with m in [sqrt(1/2), sqrt(2)), then
// log m = 2 atanh(z), z = (m - 1)/(m + 1), |z| < 0.172, by its series.
float ce_log(float s) {
    int e;
    float m = frexp(s, e);
    if (m < 0.70710678) { m *= 2.0; e -= 1; }
    float z = (m - 1.0) / (m + 1.0), z2 = z * z;
    float p = z2 * (1.0 / 3.0 + z2 * (1.0 / 5.0 + z2 * (1.0 / 7.0 + z2 * (1.0 / 9.0 +
              z2 * (1.0 / 11.0 + z2 * (1.0 / 13.0))))));
    float lm = 2.0 * z + 2.0 * z * p;
    return float(e) * 0.693359375 + (lm + float(e) * -2.12194440e-4);
}

// log(1 + t) for t >= 0, accurate also for tiny t (a confident row's loss):
// 2 atanh(z) with z = t / (2 + t) while z is small, else ce_log.
float ce_log1p(float t) {
    if (t > 0.4) return ce_log(1.0 + t);
    float z = t / (2.0 + t), z2 = z * z; // z < 0.167
    float p = z2 * (1.0 / 3.0 + z2 * (1.0 / 5.0 + z2 * (1.0 / 7.0 + z2 * (1.0 / 9.0 +
              z2 * (1.0 / 11.0 + z2 * (1.0 / 13.0))))));
    return 2.0 * z + 2.0 * z * p;
}
