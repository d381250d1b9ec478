#!/usr/bin/python3
"""needle_model_embed on a Needle 3 archive against numpy (issue 32).

For random tiny3 and tiny3b checkpoints (tools/make_needle3_fixture.py,
vocab 8192, with the probe heads) built into archives with `needle build`,
`test_embed3 dump` loads each archive on the float path (NEEDLE_FLOAT=1),
embeds a text and writes the dequantised model as a 3.x safetensors
checkpoint, the ids it should have pooled ([BOS=2] + enc(text): 3.x's
run.py prompt ids, no EOS), the embedding head's float tensors and the
engine's embedding. This test then computes the embedding independently:
tools/ref_needle3.py's numpy forward of that checkpoint over the ids gives
the cells (x0, then the lane mean after each layer: its --trace "hidden"),
and tests/test_probe3_numpy.py's probe_head pools them (3.x's probe_pool,
EmbeddingHead, unit length). They agree to 1e-5 (max abs; ~1e-7 seen).

Run: NEEDLE_BUILD=build /usr/bin/python3 tests/test_embed3_numpy.py
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, os.path.join(SRC, "tools"))
from harness import Checker, find_needle, run  # noqa: E402
import make_needle3_fixture as fixture  # noqa: E402
import ref_needle3  # noqa: E402
from test_probe3_numpy import probe_head  # noqa: E402

TOK = os.path.join(SRC, "models", "tokenizer.model")
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
TEXTS = ["What's the weather in Paris?", "set a timer: 5 min \u00e9t\u00e9"]


def main():
    check = Checker()
    needle = find_needle()
    dumper = os.path.join(BUILD, "test_embed3")
    if not check("needle and test_embed3 found", needle is not None and os.path.exists(dumper)):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle_embed3_")
    for preset, extra in (("tiny3", {}), ("tiny3b", {"out_vocab": 8000})):
        cfg = fixture.config_for(preset, vocab_size=8192, max_seq_len=128, **extra)
        params = fixture.random_params(cfg, np.random.default_rng(9), heads=True)
        ck = os.path.join(tmp, preset + ".safetensors")
        fixture.write_safetensors(ck, params, fixture.checkpoint_metadata(cfg, 3, {"seed": 9}))
        arch = os.path.join(tmp, preset + ".cact")
        r = run([needle, "build", ck, "--tokenizer", TOK, "--out", arch])
        if not check(preset + ": build", r.returncode == 0, r.stderr[-300:]):
            continue
        for i, text in enumerate(TEXTS):
            dq = os.path.join(tmp, "%s_%d_dq.safetensors" % (preset, i))
            txt = os.path.join(tmp, "%s_%d.txt" % (preset, i))
            p = subprocess.run([dumper, "dump", arch, text, dq, txt], capture_output=True,
                               text=True, timeout=300)
            if not check("%s text %d: dump" % (preset, i), p.returncode == 0, p.stderr[-300:]):
                continue
            f = {}
            with open(txt) as fh:
                for line in fh:
                    name, *vals = line.split()
                    f[name] = np.array([float(v) for v in vals], dtype=np.float64)
            rows, k, q, d, out = (int(x) for x in f["shape"])
            ids = [int(x) for x in f["ids"]]
            check("%s text %d: ids start with BOS 2, no EOS" % (preset, i),
                  ids[0] == 2 and 1 not in ids and len(ids) > 3, str(ids))
            prm, rcfg, _ = ref_needle3.load_checkpoint(dq)
            model = ref_needle3.Model(prm, rcfg, True, False)
            trace = {}
            model.forward(ids, trace)
            hidden = np.array(trace["hidden"][0], dtype=np.float64)  # [L+1, T, d]
            cells = hidden.transpose(1, 0, 2)
            ref = probe_head(cells, np.ones(len(ids)), f["probes"].reshape(rows, k, d),
                             f["gain"].reshape(rows, k), f["query"].reshape(q, d),
                             f["row_bias"].reshape(q, rows, k), f["proj"].reshape(q * d, out),
                             None, True)
            err = float(np.max(np.abs(f["emb"] - ref)))
            check("%s text %d: engine embedding vs numpy (max abs err %.2e)" % (preset, i, err),
                  err < 1e-5 and cells.shape[1] == rows, "dim %d" % out)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
