#!/usr/bin/python3
"""Interop between Python's pickle/numpy and the C reader/writer.

Python writes real pickles (protocols 2-5, every supported dtype, C and
Fortran order, 0-d and empty arrays, numpy scalars, checkpoint-like
trees); build/pickle_tool renders what C read, which must match Python's
own rendering of the same object. Each file is also rewritten by C and
loaded back by pickle.load. Hostile pickles must be refused with
ND_EUNSAFE naming the global (or ND_EUNSUPPORTED for unsupported data).
"""
import collections
import os
import pickle
import struct
import subprocess
import sys
import tempfile

import numpy as np

BUILD = os.environ.get("NEEDLE_BUILD", "build")
TOOL = os.path.join(BUILD, "pickle_tool")
failures = 0
checks = 0

DTYPE_NAMES = {
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("b", 1): "bool",
}


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def render(v, out):
    """Python twin of pickle_tool's rendering."""
    if v is None:
        out.append("none")
    elif isinstance(v, (bool, np.bool_)):
        out.append("bool %d" % int(v))
    elif isinstance(v, (int, np.integer)):
        out.append("int %d" % int(v))
    elif isinstance(v, (float, np.floating)):
        out.append("float " + struct.pack(">d", float(v)).hex())
    elif isinstance(v, str):
        out.append("str " + (v.encode("utf-8", "surrogatepass").hex() or "-"))
    elif isinstance(v, (bytes, bytearray)):
        out.append("bytes " + (bytes(v).hex() or "-"))
    elif isinstance(v, (list, tuple)):
        out.append("%s %d" % ("list" if isinstance(v, list) else "tuple", len(v)))
        for x in v:
            render(x, out)
    elif isinstance(v, dict):
        out.append("dict %d" % len(v))
        for k, x in v.items():
            render(k, out)
            render(x, out)
    elif isinstance(v, np.ndarray):
        name = DTYPE_NAMES[(v.dtype.kind, v.dtype.itemsize)]
        le = np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<")))
        out.append("ndarray %s [%s] %s" % (name, ",".join(str(d) for d in v.shape),
                                           le.tobytes().hex() or "-"))
    else:
        raise TypeError(type(v))
    return out


def tool(*args):
    p = subprocess.run([TOOL, *args], capture_output=True, text=True)
    return p.returncode, p.stdout


def same_types(a, b, path="root"):
    """After a C rewrite: containers keep their types and key order, arrays
    keep dtype/shape and come back C-contiguous; numpy scalars become
    Python scalars by design."""
    if isinstance(a, np.ndarray):
        check(isinstance(b, np.ndarray), path + ": not an ndarray")
        if isinstance(b, np.ndarray):
            check(b.dtype == a.dtype.newbyteorder("="), "%s: dtype %s vs %s" % (path, b.dtype, a.dtype))
            check(b.shape == a.shape, path + ": shape")
            check(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path + ": values")
            check(b.flags.c_contiguous, path + ": not C-contiguous")
        return
    if isinstance(a, dict):
        check(type(b) is dict and list(a.keys()) == list(b.keys()), path + ": dict keys")
        if type(b) is dict:
            for k in a:
                same_types(a[k], b.get(k), "%s[%r]" % (path, k))
        return
    if isinstance(a, (list, tuple)):
        check(type(b) is type(a) and len(a) == len(b), path + ": sequence type/len")
        if type(b) is type(a):
            for i, (x, y) in enumerate(zip(a, b)):
                same_types(x, y, "%s[%d]" % (path, i))
        return
    if isinstance(a, (np.bool_, bool)):
        check(type(b) is bool and b == bool(a), path + ": bool")
    elif isinstance(a, (np.integer, int)):
        check(type(b) is int and b == int(a), path + ": int")
    elif isinstance(a, (np.floating, float)):
        check(type(b) is float and struct.pack("d", b) == struct.pack("d", float(a)), path + ": float")
    else:
        check(type(b) is type(a) and a == b, path + ": %r vs %r" % (a, b))


def round_trip(tmp, name, obj, protocol, expect_in_pickle=None):
    path = os.path.join(tmp, "%s.p%d.pkl" % (name, protocol))
    data = pickle.dumps(obj, protocol=protocol)
    if expect_in_pickle:
        check(expect_in_pickle in data, "%s p%d: pickle lacks %r" % (name, protocol, expect_in_pickle))
    with open(path, "wb") as f:
        f.write(data)
    rc, out = tool("dump", path)
    want = "\n".join(render(obj, [])) + "\n"
    check(rc == 0, "%s p%d: dump failed: %s" % (name, protocol, out.strip()[:300]))
    if rc == 0:
        check(out == want, "%s p%d: rendering differs\n C: %s\n Py: %s" % (name, protocol, out[:400], want[:400]))
    out_path = path + ".c.pkl"
    rc, out = tool("rewrite", path, out_path)
    check(rc == 0, "%s p%d: rewrite failed: %s" % (name, protocol, out.strip()[:300]))
    if rc == 0:
        with open(out_path, "rb") as f:
            blob = f.read()
        check(blob[:2] == b"\x80\x04", name + ": C output is not protocol 4")
        back = pickle.loads(blob)
        same_types(obj, back, "%s p%d" % (name, protocol))
        check("\n".join(render(back, [])) + "\n" == want, "%s p%d: reread rendering" % (name, protocol))
        return back
    return None


def sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == np.bool_:
        a = rng.integers(0, 2, n).astype(np.bool_)
    elif np.dtype(dtype).kind == "i":
        a = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    else:
        a = (rng.standard_normal(n) * 100).astype(dtype)
    return a.reshape(shape)


class Evil:
    pass


class Pwn:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def expect_refusal(tmp, name, obj_or_bytes, code, needle, protocol=4):
    path = os.path.join(tmp, "bad_%s.pkl" % name)
    data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else pickle.dumps(obj_or_bytes, protocol=protocol)
    with open(path, "wb") as f:
        f.write(data)
    rc, out = tool("dump", path)
    check(rc == 3 and out.startswith("ERROR " + code) and needle in out,
          "%s: want %s naming %r, got rc=%d %s" % (name, code, needle, rc, out.strip()[:300]))


def main():
    if not os.path.exists(TOOL):
        print("missing", TOOL, file=sys.stderr)
        return 1
    dtypes = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]
    shapes = [(), (0,), (5,), (2, 3), (2, 3, 4), (3, 0, 2), (2, 1, 3, 2, 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for protocol in (2, 3, 4, 5):
            for di, dt in enumerate(dtypes):
                tree = {}
                for si, shape in enumerate(shapes):
                    a = sample(dt, shape, 100 * di + si)
                    tree["c%d" % si] = a
                    tree["f%d" % si] = np.asfortranarray(a)
                    tree["t%d" % si] = a.T  # a transposed view: Fortran-contiguous
                    if a.dtype.itemsize > 1:
                        tree["be%d" % si] = a.astype(a.dtype.newbyteorder(">"))
                tree["scalar"] = dt(1) if dt != np.bool_ else np.bool_(True)
                round_trip(tmp, "arrays_%s" % np.dtype(dt).name, tree, protocol)
            # top-level arrays in each form
            round_trip(tmp, "top_c", sample(np.float32, (3, 4), 1), protocol)
            round_trip(tmp, "top_0d", np.array(2.5, dtype=np.float64), protocol)
            round_trip(tmp, "top_empty", np.zeros((0, 3), np.int32), protocol)
            round_trip(tmp, "top_f", np.asfortranarray(sample(np.int64, (3, 5), 2)), protocol,
                       b"_frombuffer" if protocol == 5 else b"_reconstruct")
            round_trip(tmp, "top_big", sample(np.float32, (300, 257), 3), protocol)

            shared = sample(np.float16, (4, 4), 9)
            shared_list = [1, 2.0, "three"]
            ckpt = {
                "format_version": 2,
                "params": {
                    "embed": {"weight": sample(np.float32, (16, 8), 4)},
                    "layers": {
                        "0": {"attn": {"wq": sample(np.float16, (8, 8), 5),
                                        "bias": np.zeros((8,), np.float32)},
                              "norm": np.ones((8,), np.float32)},
                        "1": {"tied": shared, "tied_again": shared},
                    },
                    "step": np.array(1234, dtype=np.int64),
                    "mask": np.array([[True, False], [False, True]]),
                },
                "config": {
                    "d_model": 8,
                    "n_layers": 2,
                    "dropout": 0.1,
                    "lr": 3e-4,
                    "eps": float("inf"),
                    "nan": float("nan"),
                    "big": 2 ** 62,
                    "small": -(2 ** 63),
                    "mid": -70000,
                    "name": "needle ✓ héllo",
                    "empty": "",
                    "blob": b"\x00\xff\x80 binary",
                    "noblob": b"",
                    "none": None,
                    "flags": (True, False),
                    "shape": (2, 3, 4, 5, 6),
                    "single": (1,),
                    "unit": (),
                    "list": [1, [2, [3, []]], {"x": (None,)}],
                    "shared_list": shared_list,
                    "shared_again": shared_list,
                    "np_scalars": [np.float32(1.5), np.float64(-2.25), np.float16(0.333),
                                   np.int32(-3), np.int64(2 ** 40), np.bool_(False)],
                    "int_keys": {1: "a", -5: "b", 2 ** 40: "c"},
                    "long_list": list(range(2500)),
                    "long_str": "x" * 70000,
                },
            }
            back = round_trip(tmp, "checkpoint", ckpt, protocol)
            if back is not None:  # shared objects stay shared through C
                tied = back["params"]["layers"]["1"]
                check(tied["tied"] is tied["tied_again"], "p%d: tied arrays not shared" % protocol)
                check(back["config"]["shared_list"] is back["config"]["shared_again"],
                      "p%d: shared list not shared" % protocol)

        # hostile and unsupported pickles
        for p in (2, 4):
            expect_refusal(tmp, "os_system_%d" % p, os.system, "ND_EUNSAFE", "posix.system", p)
            expect_refusal(tmp, "pwn_%d" % p, Pwn(), "ND_EUNSAFE", "posix.system", p)
            expect_refusal(tmp, "instance_%d" % p, Evil(), "ND_EUNSAFE", "__main__.Evil", p)
            expect_refusal(tmp, "ordereddict_%d" % p, collections.OrderedDict(a=1), "ND_EUNSAFE",
                           "collections.OrderedDict", p)
            expect_refusal(tmp, "complex_%d" % p, 1 + 2j, "ND_EUNSAFE", ".complex", p)
            expect_refusal(tmp, "nested_%d" % p, {"ok": np.zeros(2), "bad": [Evil()]}, "ND_EUNSAFE",
                           "__main__.Evil", p)
            expect_refusal(tmp, "object_arr_%d" % p, np.array([1, "a"], dtype=object), "ND_EUNSUPPORTED",
                           "O8", p)
            expect_refusal(tmp, "uint8_%d" % p, np.zeros(3, np.uint8), "ND_EUNSUPPORTED", "u1", p)
            expect_refusal(tmp, "struct_%d" % p, np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]),
                           "ND_EUNSUPPORTED", "V8", p)
        expect_refusal(tmp, "set4", {1, 2}, "ND_EUNSUPPORTED", "set", 4)
        expect_refusal(tmp, "set2", {1, 2}, "ND_EUNSAFE", "builtin__.set", 2)
        oob = pickle.dumps(np.arange(4.0), protocol=5, buffer_callback=lambda b: False)
        expect_refusal(tmp, "oob", oob, "ND_EUNSUPPORTED", "out-of-band")
        expect_refusal(tmp, "unpickled_trailer", pickle.dumps([1, 2], protocol=2)[:-1],
                       "ND_EFORMAT", "truncated")
        expect_refusal(tmp, "codecs_utf8",
                       b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00utf-8\x86R.",
                       "ND_EUNSAFE", "latin1")

    print("test_pickle_interop: %d checks, %d failures" % (checks, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
