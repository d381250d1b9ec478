// Shared by the hada3_mix shaders (included after the push constant `a`,
// whose block has p, cu, rank): the cond gain of feature m of row r,
// g = 1 + sum_q p[r*rank + q] * cu[q*cols + m], summed in q order as the
// CPU does (cpu_hada3.c); 1 when p is absent.
float hada3_gain(uint cols, uint r, uint m) {
    precise float g = 1.0;
    if (uint64_t(a.p) == 0) return g;
    uint rank = uint(a.rank);
    for (uint q = 0u; q < rank; q++) g += a.p.v[r * rank + q] * a.cu.v[q * cols + m];
    return g;
}
