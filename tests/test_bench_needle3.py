#!/usr/bin/python3
"""`needle bench train` on Needle 3 presets (a tiny one; the timing itself is
not checked, benchmarks stay out of the timed suite).

  * the run works on a Needle 3 preset and reports the model FLOPs of a step;
  * the attention FLOPs follow the layers' spans: local layers see at most
    sliding_window keys. tiny3 (model/config.c): 4 heads, qk head dim 8,
    value head dim 12, 4 layers of which layer 3 is global, window 4. A LoRA
    step counts twice the forward (cmd_bench.c: the forward and the
    input-gradient backward), so its attention FLOPs are 2 x 2 x B x H x
    (qk + v) x the query-key pairs summed over the layers;
  * everything else grows linearly with the tokens: step(T=16) - 2 x
    step(T=8) equals the same difference of the attention parts;
  * --quant runs 3.x's training numerics (it reports the re-quantisation),
    and is refused on a Needle 2 preset; --qat-bits is refused on Needle 3.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, find_needle, run  # noqa: E402

H, QK, VD, LAYERS, GLOBAL, WINDOW, B = 4, 8, 12, 4, {3}, 4, 2


def pairs(T, window):
    if window <= 0 or window >= T:
        return T * (T + 1) / 2
    return window * (window + 1) / 2 + (T - window) * window


def attention_step_flops(T):
    per = sum(pairs(T, 0 if l in GLOBAL else WINDOW) for l in range(LAYERS))
    return 2 * 2 * B * H * (QK + VD) * per


def bench(needle, check, T, *extra):
    r = run([needle, "bench", "train", "--preset", "tiny3", "--batch", str(B), "--seq", str(T),
             "--iters", "1", "--threads", "1", "--device", "cpu", *extra])
    if not check("bench train tiny3 T=%d %s exits 0" % (T, " ".join(extra)), r.returncode == 0,
                 r.stderr[-300:]):
        return None
    check("T=%d: the result line names the preset and shape" % T,
          ("train tiny3 B=%d T=%d" % (B, T)) in r.stdout, r.stdout[:200])
    m = re.search(r"model FLOPs a step: ([0-9.e+]+) \(attention ([0-9.e+]+)\)", r.stdout)
    if not check("T=%d: model FLOPs of a step reported" % T, m is not None, r.stdout[-300:]):
        return None
    return float(m.group(1)), float(m.group(2)), r.stdout


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    r8, r16 = bench(needle, check, 8), bench(needle, check, 16)
    if r8 and r16:
        for T, (_, att, _) in ((8, r8), (16, r16)):
            want = attention_step_flops(T)
            check("T=%d: attention FLOPs follow the local layers' window" % T,
                  abs(att - want) <= 1e-9 * want, "%r vs %r" % (att, want))
        lin = r16[0] - 2 * r8[0]
        want = attention_step_flops(16) - 2 * attention_step_flops(8)
        check("step FLOPs: only attention grows faster than the tokens",
              abs(lin - want) <= 1e-6 * r16[0], "%r vs %r" % (lin, want))
    rq = bench(needle, check, 8, "--quant")
    if rq:
        check("--quant reports 3.x's training numerics", "3.x training numerics" in rq[2],
              rq[2][-300:])
        check("--quant counts the same model FLOPs", r8 is not None and rq[0] == r8[0])
    r = run([needle, "bench", "train", "--preset", "needle2", "--quant"])
    check("--quant on a Needle 2 preset: usage error (2)", r.returncode == 2, r.stderr[-200:])
    r = run([needle, "bench", "train", "--preset", "tiny3", "--qat-bits", "4"])
    check("--qat-bits on a Needle 3 preset: usage error (2)", r.returncode == 2, r.stderr[-200:])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
