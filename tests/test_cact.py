#!/usr/bin/python3
"""needle build / needle inspect and the .cact archive.

  * byte comparison with tests/ref/cact_ref.py, a numpy port of upstream's
    write_export (exact with the rotation rounded once; with upstream's
    float32 BLAS matmul only near-tie indices may differ -- reported);
  * our reader (inspect, --dequant) and an independent parser agree; every
    FP16 tensor reproduces the checkpoint exactly;
  * LoRA merge: B = 0 changes nothing, known A, B give the known delta
    (float32 and float16 checkpoints), mismatched adapters are refused
    naming the tensor;
  * bits: --bits, the config weight_bits map, default 4;
  * golden per-tensor SHA-256 (tests/data/cact_golden.json; regenerate with
    `test_cact.py --update-golden` after an intended format change);
  * hostile archives give clean errors.
"""
import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
import cact_ref as R  # noqa: E402
import make_ckpt  # noqa: E402

NEEDLE = os.environ.get("NEEDLE") or os.path.join(SRC, "build", "needle")
GOLDEN = os.path.join(SRC, "tests", "data", "cact_golden.json")
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def run(*args, cwd=None, ok=True):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], cwd=cwd, capture_output=True)
    if ok and p.returncode != 0:
        raise SystemExit("needle %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode,
                                                        p.stderr.decode()))
    return p


def tok_blob(vocab, seed=0):
    """A synthetic tokenizer blob in export.py's layout."""
    rng = np.random.default_rng(seed)
    out = bytearray(struct.pack("<IIIIIBBH", vocab, 0, 1, 2, 3, 1, 1, 0))
    for i in range(vocab):
        piece = ("<%d>" % i if i < 4 else "\u2581p%d" % i).encode()
        out += struct.pack("<fBH", float(-rng.random() * 10), 2 if i < 3 else 0, len(piece))
        out += piece
    return bytes(out)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def cq_indices(rec):
    rows, cols = rec["shape"]
    cp = (cols + rec["group"] - 1) // rec["group"] * rec["group"]
    sb = 2 if rec["bits"] == 5 else rec["bits"]
    nb = rows * cp * sb // 8
    idx = R.unpack_bits(np.frombuffer(rec["blob"][:nb], np.uint8).reshape(rows, -1), sb, cp)
    return idx, np.frombuffer(rec["blob"][nb:], np.uint16)


def compare(ours, ref, what, exact):
    """Byte comparison; with exact=False report near-tie index flips."""
    if ours == ref:
        print("  %-34s byte-identical (%d bytes)" % (what, len(ours)))
        return
    if exact:
        n = sum(a != b for a, b in zip(ours, ref)) + abs(len(ours) - len(ref))
        check(False, "%s: %d bytes differ from the reference" % (what, n))
        return
    ho, ro = R.parse(ours)
    hr, rr = R.parse(ref)
    check(len(ours) == len(ref), "%s: sizes %d vs %d" % (what, len(ours), len(ref)))
    first = R.HEADER.size + 4 * ho["codebook_len"] + R.RECORD.size * ho["num_tensors"]
    check(ours[:first] == ref[:first], "%s: header/codebooks/directory differ" % what)
    flips = total = nflips = ntotal = 0
    for a, b in zip(ro, rr):
        if a["blob"] == b["blob"]:
            if a["dtype"] == R.CQ:
                ia, _ = cq_indices(a)
                total += ia.size
            continue
        check(a["dtype"] == R.CQ, "%s: a non-CQ blob differs" % what)
        ia, na = cq_indices(a)
        ib, nb = cq_indices(b)
        flips += int((ia != ib).sum())
        total += ia.size
        nflips += int((na != nb).sum())
        ntotal += na.size
    print("  %-34s %d of %d CQ indices and %d norms differ (near ties of the float32 BLAS "
          "matmul)" % (what, flips, total, nflips))
    check(flips <= max(4, total * 1e-4), "%s: %d index flips" % (what, flips))


def main():
    update = "--update-golden" in sys.argv
    tmp = tempfile.mkdtemp(prefix="needle_cact_")
    try:
        os.chdir(tmp)
        tiny = dict(make_ckpt.TINY)
        # A: float32, perturbed, probe heads, tokenizer
        make_ckpt.make_checkpoint("a.pkl", seed=3, perturb=True, probe_heads=True, **tiny)
        blob = tok_blob(tiny["vocab_size"])
        with open("tok.bin", "wb") as f:
            f.write(blob)
        # B: float16 storage, d_model 160 (padded groups, 1 engram head of 80),
        # a mixed weight_bits map with every width
        kwb = dict(tiny, d_model=160, num_heads=4, num_kv_heads=2, engram_layers=(0, 1),
                   weight_bits="attn.q_proj=2,attn=3,mhc_phi=1.58,engram0=2,default=4")
        make_ckpt.make_checkpoint("b.pkl", seed=4, perturb=True, store_dtype="float16", **kwb)

        # ---- build + progress line ----
        p = run("build", "a.pkl", "--out", "a.cact", "--tokenizer-blob", "tok.bin")
        line = p.stdout.decode().rstrip().splitlines()[-1]
        m = re.fullmatch(r"  wrote     (\S+)  (\d+\.\d\d) MB  (\d+) tensors  (\S+)", line)
        check(m is not None, "progress line: %r" % line)
        size = os.path.getsize("a.cact")
        if m:
            check(m.group(1) == "a.cact" and m.group(2) == "%.2f" % (size / 1e6)
                  and m.group(4) == "W4A8", "progress line fields: %r" % line)
        a = open("a.cact", "rb").read()

        # ---- against the numpy port of upstream's write_export ----
        ck = load("a.pkl")
        R.EXACT_ROTATION = True
        ref, names = R.build(ck["params"], ck["config"], bits=4, tokenizer_blob=blob)
        compare(a, ref, "tiny W4 (rotation rounded once)", exact=True)
        R.EXACT_ROTATION = False
        ref_up, _ = R.build(ck["params"], ck["config"], bits=4, tokenizer_blob=blob)
        compare(a, ref_up, "tiny W4 (upstream float32 matmul)", exact=False)

        # ---- reader: inspect table, names, FP16 exactness, CQ dequant ----
        hdr, recs = R.parse(a)
        out = run("inspect", "a.cact").stdout.decode()
        rows = re.findall(r"^\s+(\d+)  (\S+)\s+(FP16|FP32|CQ|RAW)\s+(\([^)]*\))\s+(\S+)\s+(\d+)"
                          r"\s+(\d+)\s+(\d+)$", out, re.M)
        check(len(rows) == len(recs) == len(names), "inspect lists %d tensors, parser %d, "
              "writer %d" % (len(rows), len(recs), len(names)))
        for row, rec, name in zip(rows, recs, names):
            check(row[1] == name, "tensor %s named %s" % (name, row[1]))
            check(int(row[6]) == rec["offset"] and int(row[7]) == rec["nbytes"],
                  "%s offset/bytes" % name)
        check(names[-1] == "tokenizer" and recs[-1]["dtype"] == R.RAW
              and recs[-1]["blob"] == blob, "tokenizer blob last, verbatim")
        check("heads.manifest" in names and "confidence_head.bias" in names, "probe heads")
        man = R.dequant(recs[names.index("heads.manifest")])
        check(list(man) == [1.0, 2.0], "manifest codes %s" % list(man))
        check(re.search(r"^kv_window\s+160$", out, re.M) is not None, "kv_window 160 (floor)")
        cb_line = " ".join(re.findall(r"^codebook cb\d\s+(.*)$", out, re.M)).split()
        check(np.array_equal(np.array(cb_line, np.float32), hdr["codebook"]), "codebooks")
        flat = make_ckpt.flatten(ck["params"])
        fp16_src = {"final_norm": flat["stack/final_norm/scale"],
                    "layer01.d3": flat["stack/layers/block/hadamard_mlp/d3"][1],
                    "layer00.attn_gate": flat["stack/layers/block/attn_gate"][0:1],
                    "mhc_b_res": flat["stack/mhc_b_res"],
                    "engram0.taps": flat["engrams_0/taps"],
                    "confidence_head.proj": flat["confidence_head/proj/kernel"].T}
        for i, (name, rec) in enumerate(zip(names, recs)):
            if rec["dtype"] == R.RAW:
                continue
            got = np.frombuffer(run("inspect", "a.cact", "--dequant", name).stdout, np.float32)
            want = R.dequant(rec).reshape(-1).astype(np.float32)
            if rec["dtype"] == R.FP16:
                check(np.array_equal(got, want), "%s: FP16 dequant not exact" % name)
                if name in fp16_src:
                    exp = np.asarray(fp16_src[name], np.float16).astype(np.float32).reshape(-1)
                    check(np.array_equal(got, exp), "%s: != checkpoint values" % name)
            else:
                check(got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-7),
                      "%s: CQ dequant differs from the reference reader" % name)
        # every FP16 tensor reproduces the checkpoint exactly
        blk = flat
        L = tiny["num_layers"]
        for i in range(L):
            for nm, path in (("norm_in", "ZCRMSNorm_0/scale"), ("q_norm", "self_attn/q_norm/scale"),
                             ("post_norm", "post_attn_norm/scale"), ("d1", "hadamard_mlp/d1")):
                rec = recs[names.index("layer%02d.%s" % (i, nm))]
                exp = np.asarray(blk["stack/layers/block/" + path][i], np.float16)
                check(rec["blob"] == exp.tobytes(), "layer%02d.%s bytes" % (i, nm))
        run("inspect", "a.cact", "--dequant", "embedding", "--out", "emb.f32")
        emb = np.fromfile("emb.f32", np.float32).reshape(tiny["vocab_size"], tiny["d_model"])
        w = flat["embedding/embedding"]
        rel = float(((emb - w) ** 2).mean() / (w ** 2).mean())
        check(rel < 0.012, "embedding W4 relative MSE %.4f" % rel)
        check(run("inspect", "a.cact", "--dequant", "nope", ok=False).returncode == 1,
              "unknown tensor name")
        check(run("inspect", "a.cact", "--dequant", "tokenizer", ok=False).returncode == 1,
              "RAW dequant refused")

        # ---- bits selection ----
        run("build", "--no-tokenizer", "b.pkl", "--out", "b.cact")
        b = open("b.cact", "rb").read()
        ckb = load("b.pkl")
        R.EXACT_ROTATION = True
        refb, namesb = R.build(ckb["params"], ckb["config"], bits_map=kwb["weight_bits"])
        compare(b, refb, "fp16 mixed map (rotation once)", exact=True)
        _, rb = R.parse(b)
        spec = R.parse_bits_map(kwb["weight_bits"])
        for name, rec in zip(namesb, rb):
            if rec["dtype"] == R.CQ:
                want = R.bits_for(name, spec)
                check(rec["bits"] == (5 if want == R.TERNARY else want),
                      "%s bits %d, map says %s" % (name, rec["bits"], want))
        got_bits = {n: r["bits"] for n, r in zip(namesb, rb) if r["dtype"] == R.CQ}
        check(got_bits["layer00.q_proj"] == 2 and got_bits["layer01.k_proj"] == 3
              and got_bits["mhc_phi_res"] == 5 and got_bits["engram0.tables"] == 2
              and got_bits["engram1.tables"] == 4 and got_bits["embedding"] == 4,
              "mixed widths %s" % got_bits)
        p = run("build", "--no-tokenizer", "b.pkl", "--out", "b2.cact", "--bits", "2")
        check("W2A8" in p.stdout.decode(), "--bits 2 scheme")
        _, rb2 = R.parse(open("b2.cact", "rb").read())
        check(all(r["bits"] == 2 for r in rb2 if r["dtype"] == R.CQ), "--bits overrides map")
        p = run("build", "--no-tokenizer", "b.pkl", "--out", "b3.cact")
        check("mixed[%s]A8" % kwb["weight_bits"] in p.stdout.decode(), "mixed scheme line")
        check(run("build", "b.pkl", "--bits", "5", ok=False).returncode == 2, "--bits 5 refused")

        # ---- default output name, atomic write leaves no temp files ----
        os.mkdir("sub")
        shutil.copy("a.pkl", "sub/my.model.pkl")
        run("build", "--no-tokenizer", os.path.join(tmp, "sub", "my.model.pkl"), cwd=os.path.join(tmp, "sub"))
        check(os.path.exists("sub/my.model.cact"), "default output name")
        check(sorted(os.listdir("sub")) == ["my.model.cact", "my.model.pkl"], "no temp files")
        check(run("build", "missing.pkl", ok=False).returncode == 1, "missing checkpoint")

        # ---- LoRA merge ----
        qk = "stack/layers/block/self_attn/q_proj/kernel"
        vk = "stack/layers/block/self_attn/v_proj/kernel"
        d, Lr = tiny["d_model"], 4
        rng = np.random.default_rng(9)

        def adapter(path, A, B, scale=2.0, rank=Lr, extra=None):
            ad = {"lora": {qk: {"A": A, "B": B}}, "scale": scale, "base": "a.pkl", "rank": rank}
            if extra:
                ad["lora"].update(extra)
            with open(path, "wb") as f:
                pickle.dump(ad, f)

        A = rng.normal(0, 0.3, (L, d, Lr)).astype(np.float32)
        adapter("zero.pkl", A, np.zeros((L, Lr, d), np.float32))
        run("build", "a.pkl", "--out", "z.cact", "--lora", "zero.pkl", "--tokenizer-blob",
            "tok.bin")
        check(open("z.cact", "rb").read() == a, "B = 0 adapter changes the archive")
        B = rng.normal(0, 0.3, (L, Lr, d)).astype(np.float32)
        Av = rng.normal(0, 0.3, (L, d, Lr)).astype(np.float32)
        Bv = rng.normal(0, 0.3, (L, Lr, d // 2)).astype(np.float32)
        adapter("known.pkl", A, B, extra={vk: {"A": Av, "B": Bv}})
        p = run("build", "--no-tokenizer", "a.pkl", "--out", "k.cact", "--lora", "known.pkl")
        check("merged    2 weight groups  known.pkl" in p.stdout.decode(), "merged line")
        kbuf = open("k.cact", "rb").read()
        merged = R.merge_lora(ck["params"], load("known.pkl"))
        R.EXACT_ROTATION = True
        refk, _ = R.build(merged, ck["config"], bits=4)
        compare(kbuf, refk, "merged adapter (float32)", exact=True)
        delta = 2.0 * np.einsum("lir,lro->lio", A.astype(np.float64), B.astype(np.float64))
        wq = flat[qk].astype(np.float64)
        _, rk = R.parse(kbuf)
        q0 = R.dequant(rk[names.index("layer00.q_proj")]).T
        e_new = ((q0 - (wq[0] + delta[0])) ** 2).mean() / ((wq[0] + delta[0]) ** 2).mean()
        e_old = ((q0 - wq[0]) ** 2).mean() / ((wq[0] + delta[0]) ** 2).mean()
        check(e_new < 0.012 and e_old > 0.3, "known delta: rel err %.4f to W+dAB, %.4f to W"
              % (e_new, e_old))
        # float16 checkpoint: merged in float16
        dB = kwb["d_model"]
        A16 = rng.normal(0, 0.3, (2, dB, 3)).astype(np.float32)
        B16 = rng.normal(0, 0.3, (2, 3, dB)).astype(np.float32)
        adapter("k16.pkl", A16, B16, scale=0.5, rank=3)
        run("build", "--no-tokenizer", "b.pkl", "--out", "k16.cact", "--lora", "k16.pkl")
        merged16 = R.merge_lora(ckb["params"], load("k16.pkl"))
        check(merged16["stack"]["layers"]["block"]["self_attn"]["q_proj"]["kernel"].dtype
              == np.float16, "reference merge keeps float16")
        refk16, _ = R.build(merged16, ckb["config"], bits_map=kwb["weight_bits"])
        compare(open("k16.cact", "rb").read(), refk16, "merged adapter (float16)", exact=True)
        # refusals name the tensor
        adapter("badA.pkl", np.zeros((L, d + 1, Lr), np.float32), B)
        adapter("badR.pkl", A, B, rank=Lr + 1)
        adapter("badB.pkl", A, np.zeros((L, Lr, d - 1), np.float32))
        adapter("badL.pkl", A, B, extra={"stack/nope/kernel": {"A": A, "B": B}})
        for bad in ("badA.pkl", "badR.pkl", "badB.pkl", "badL.pkl"):
            p = run("build", "a.pkl", "--out", "bad.cact", "--lora", bad, ok=False)
            err = p.stderr.decode()
            check(p.returncode == 1 and ("q_proj/kernel" in err or "stack/nope" in err),
                  "%s refused naming the tensor: %r" % (bad, err))
        check(not os.path.exists("bad.cact"), "refused build wrote nothing")

        # ---- golden per-tensor checksums ----
        golden(tmp, update)

        # ---- hostile archives ----
        hostile(a)
    finally:
        os.chdir("/")
        shutil.rmtree(tmp, ignore_errors=True)
    if FAIL:
        print("%d failures" % len(FAIL))
        return 1
    print("test_cact: all checks passed")
    return 0


def golden(tmp, update):
    """Small fixed checkpoints -> per-tensor SHA-256 of the archive blobs."""
    spec = {"seed": 11, "perturb": True, "probe_heads": True, "store_dtype": "float16",
            "config": dict(make_ckpt.TINY, d_model=96, num_heads=4, num_kv_heads=2,
                           vocab_size=512, weight_bits="attn=3,mhc_phi=1.58,default=4")}
    cfg = dict(spec["config"])
    make_ckpt.make_checkpoint("g.pkl", seed=spec["seed"], perturb=True, probe_heads=True,
                              store_dtype="float16", **cfg)
    with open("gtok.bin", "wb") as f:
        f.write(tok_blob(cfg["vocab_size"], seed=1))
    result = {}
    for tag, extra in (("map", []), ("w2", ["--bits", "2"])):
        run("build", "g.pkl", "--out", "g.cact", "--tokenizer-blob", "gtok.bin", *extra)
        buf = open("g.cact", "rb").read()
        hdr, recs = R.parse(buf)
        result[tag] = {"archive": sha(buf), "bytes": len(buf),
                       "header": sha(buf[:R.HEADER.size + 4 * hdr["codebook_len"]
                                         + R.RECORD.size * hdr["num_tensors"]]),
                       "tensors": [sha(r["blob"]) for r in recs]}
    if update:
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump({"checkpoint": spec, "builds": result}, f, indent=1)
            f.write("\n")
        print("  golden written to", GOLDEN)
        return
    with open(GOLDEN) as f:
        want = json.load(f)
    check(want["checkpoint"] == json.loads(json.dumps(spec)), "golden spec changed")
    for tag, got in result.items():
        w = want["builds"][tag]
        bad = [i for i, (x, y) in enumerate(zip(got["tensors"], w["tensors"])) if x != y]
        check(got["header"] == w["header"], "golden %s: header/directory drifted" % tag)
        check(len(got["tensors"]) == len(w["tensors"]) and not bad,
              "golden %s: tensors %s drifted" % (tag, bad[:10]))
        check(got["archive"] == w["archive"], "golden %s: archive bytes drifted" % tag)
    print("  golden checksums match (%d + %d tensors)" % (len(result["map"]["tensors"]),
                                                          len(result["w2"]["tensors"])))


def hostile(good):
    hdr, recs = R.parse(good)
    dir0 = R.HEADER.size + 4 * hdr["codebook_len"]

    def put(buf, off, fmt, val):
        b = bytearray(buf)
        struct.pack_into(fmt, b, off, val)
        return bytes(b)

    cases = {}
    for n in (0, 1, 60, 119, 120, 200, dir0, dir0 + 43, dir0 + 44 * 5 + 7,
              recs[0]["offset"] + 1, recs[3]["offset"], len(good) - 1):
        cases["trunc%d" % n] = good[:n]
    cases["tag"] = put(good, 0, "<I", 0x05E12A84)
    cases["num_tensors_huge"] = put(good, 4, "<I", 0xFFFFFFFF)
    cases["num_tensors_more"] = put(good, 4, "<I", hdr["num_tensors"] + 1)
    cases["codebook_huge"] = put(good, 8, "<I", 0x7FFFFFFF)
    cases["orders"] = put(good, 76, "<I", 9)
    rec = lambda i: dir0 + i * R.RECORD.size  # noqa: E731
    cases["offset_past_end"] = put(good, rec(2) + 20, "<Q", len(good) + 64)
    cases["offset_wrap"] = put(good, rec(2) + 20, "<Q", 2 ** 64 - 8)
    cases["nbytes_huge"] = put(good, rec(2) + 28, "<Q", 2 ** 63)
    cases["offset_in_header"] = put(good, rec(1) + 20, "<Q", 8)
    cases["shape_huge"] = put(good, rec(0) + 4, "<I", 0xFFFFFFFF)
    cases["shape_fp16"] = put(good, rec(1) + 4, "<I", 0x10000000)
    cases["ndim"] = put(good, rec(1) + 1, "<B", 9)
    cases["dtype"] = put(good, rec(1), "<B", 7)
    cases["bits"] = put(good, rec(0) + 40, "<I", 6)
    cases["group"] = put(good, rec(0) + 36, "<I", 100)
    cases["group0"] = put(good, rec(0) + 36, "<I", 0)
    cases["cq_3d"] = put(good, rec(0) + 1, "<B", 3)
    for name, buf in cases.items():
        with open("hostile.cact", "wb") as f:
            f.write(buf)
        p = run("inspect", "hostile.cact", ok=False)
        err = p.stderr.decode()
        check(p.returncode == 1 and err.startswith("needle: ") and len(err) < 600,
              "hostile %s: rc %d, stderr %r" % (name, p.returncode, err[:200]))
    # structurally valid but corrupt data still dequantises without crashing
    b = bytearray(good)
    for r in recs[:3]:
        for k in range(r["offset"], r["offset"] + min(r["nbytes"], 256)):
            b[k] = 0xFF
    with open("hostile.cact", "wb") as f:
        f.write(bytes(b))
    for i in range(3):
        p = run("inspect", "hostile.cact", "--dequant", "#%d" % i, ok=False)
        check(p.returncode == 0, "corrupt data #%d: rc %d" % (i, p.returncode))
    print("  %d hostile archives refused cleanly" % len(cases))


if __name__ == "__main__":
    sys.exit(main())
