"""Numpy reading of upstream 3.x quantize.py's training quantisers
(fake_quant, cq_quantize, cq_ste, cq_ste_params' leaf rule) in float32,
shared by tests/test_fake_quant_numpy.py (bit-for-bit against
src/model/fake_quant.c) and tools/ref_needle3.py --quant (the quantised
3.x forward)."""
import numpy as np

F32 = np.float32


def ref_fake_quant(x, group, bits):
    """quantize.fake_quant: symmetric absmax per group of the last axis,
    forward value of x + stop_gradient(q - x)."""
    x = np.asarray(x, F32)
    qmax = 2 ** (bits - 1) - 1
    d = x.shape[-1]
    pad = (-d) % group
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), F32)], -1) if pad else x
    g = xp.reshape(xp.shape[:-1] + (-1, group))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.abs(g).max(axis=-1, keepdims=True)  # NaN wins, as jnp.max
        scale = np.where(amax > 0, amax / F32(qmax), F32(1.0)).astype(F32)
        r = np.round(g / scale)  # half to even
        r = np.minimum(np.maximum(r, F32(-qmax - 1)), F32(qmax))
        q = (r * scale).reshape(xp.shape)[..., :d]
        return (x + (q - x)).astype(F32)


_LEVELS = {}


def lloyd_max(bits):
    """Lloyd-Max levels of N(0,1): 400,000 RandomState(0) samples, sorted,
    200 iterations from the sample quantiles. Cells are runs of the sorted
    samples, so each centroid is the mean of one contiguous slice. One
    bit is upstream's closed form +-sqrt(2/pi)."""
    if bits == 1:
        c = np.sqrt(2.0 / np.pi)
        return np.array([-c, c])
    if bits not in _LEVELS:
        n, levels = 400000, 1 << bits
        x = np.sort(np.random.RandomState(0).randn(n))
        c = x[((np.arange(levels) + 0.5) / levels * n).astype(int)].astype(np.float64)
        for _ in range(200):
            edges = (c[:-1] + c[1:]) / 2.0
            ends = list(np.searchsorted(x, edges, side="right")) + [n]
            start = 0
            for k, end in enumerate(ends):
                if end > start:
                    c[k] = x[start:end].mean()
                    start = end
        _LEVELS[bits] = np.sort(c)
    return _LEVELS[bits]


def codebook(bits, group):
    return (lloyd_max(bits) / np.sqrt(group)).astype(F32)


def walsh(group):
    i = np.arange(group)
    bits = np.bitwise_and(i[:, None], i[None, :])
    parity = np.zeros_like(bits)
    while bits.any():
        parity ^= bits & 1
        bits >>= 1
    return (np.where(parity == 1, -1.0, 1.0).astype(F32) / np.sqrt(group)).astype(F32)


def rotate(v, h):
    return (v.astype(np.float64) @ h.astype(np.float64)).astype(F32)


def ref_cq_quantize(w, bits, group):
    """quantize.cq_quantize along the last axis (quantise -> dequantise)."""
    w = np.asarray(w, F32)
    cb, h = codebook(bits, group), walsh(group)
    d = w.shape[-1]
    pad = (-d) % group
    wp = np.concatenate([w, np.zeros(w.shape[:-1] + (pad,), F32)], -1) if pad else w
    g = np.ascontiguousarray(wp.reshape(wp.shape[:-1] + (-1, group)))
    rot = rotate(g, h)
    norm = np.sqrt((rot * rot).sum(-1, keepdims=True))
    unit = rot / np.maximum(norm, F32(1e-12))
    flat = unit.reshape(-1)
    pos = np.clip(np.searchsorted(cb, flat), 1, len(cb) - 1)
    left, right = cb[pos - 1], cb[pos]
    idx = np.where(np.abs(flat - left) <= np.abs(flat - right), pos - 1, pos)
    norm16 = norm.astype(np.float16).astype(F32)
    deq = rotate(cb[idx].reshape(unit.shape) * norm16, h).reshape(wp.shape)[..., :d]
    return deq


def ref_cq_ste(w, bits, group):
    w = np.asarray(w, F32)
    return w + (ref_cq_quantize(w, bits, group) - w)


def ref_leaf_rule(path, ndim):
    """0 float, 1 reduce last axis, 2 reduce second-last (_is_quant_leaf,
    _reduces_second_last)."""
    key = path.rsplit("/", 1)[-1]
    if ndim < 2 or not (key in ("kernel", "embedding") or key.startswith("mhc_phi")):
        return 0
    return 2 if key == "kernel" or key.startswith("mhc_phi") else 1


def ref_cq_ste_leaf(path, w, bits, group):
    rule = ref_leaf_rule(path, w.ndim)
    if rule == 0:
        return w.copy()
    if rule == 2:
        return np.swapaxes(ref_cq_ste(np.swapaxes(w, -1, -2), bits, group), -1, -2)
    return ref_cq_ste(w, bits, group)
