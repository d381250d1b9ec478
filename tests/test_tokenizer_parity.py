#!/usr/bin/python3
"""Encode/decode parity of `needle tokenize` with SentencePiece itself.

Trains small BPE models with Debian's spm_train (identity and the default
nmt_nfkc normaliser, byte fallback on and off, no dummy prefix), then checks
every line of a hostile corpus against `spm_encode --output_format=id`,
multi-line texts against python3-sentencepiece, decoding against
`spm_decode`, and the .cact tokenizer blob against upstream's layout.
"""
import os
import struct
import subprocess
import sys
import tempfile

import sentencepiece as spm

NEEDLE = os.environ.get("NEEDLE", "build/needle")
SRC = os.environ.get("NEEDLE_SRC", ".")
MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
           "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>"]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg, file=sys.stderr)


def corpus_lines():
    """Lines that exercise every branch of normalisation and BPE."""
    lines = [
        "What is the weather in London tomorrow?",
        "Please book a table for 4 at 19:30 in Paris.",
        "héllo wörld café naïve façade Ångström œuvre ß Ærøskøbing",
        "日本語のテキストと中文文本 한국어 텍스트",
        "emoji 😀🎉👍🏽 👨‍👩‍👧 flags 🇫🇷🇯🇵",
        "ctrl \x01\x02\x03\x07\x08\x0b\x0c\x0e\x1b\x1f\x7f end",
        "tab\there\tand\t\tthere",
        "carriage\rreturn",
        "runs    of     spaces   here",
        "   leading spaces",
        "trailing spaces    ",
        "    ",
        "\t",
        "",
        " ",
        "<think>glued</think>word<|im_start|>user<|im_end|>x<tool_call>[]</tool_call>",
        "<|im_start|><|im_start|><think><think>",
        "<thinking> <tool_calls> </tool_result>> <<tools>>",
        "ꙮꙮꙮ ᚠᚢᚦᚨᚱᚲ 𓀀𓀁 ௐ ∰∱∲ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "fullwidth ＡＢＣ１２３ and ligatures ﬁ ﬂ ① ㍿ ℃ ™ ½",
        "non-breaking\u00a0space and\u3000ideographic and\u2009thin",
        "zero\u200bwidth\u200d joiner \ufeffbom",
        "combining e\u0301 a\u0308 n\u0303",
        "U+FFFD literal \ufffd here",
        '{"name":"get_weather","arguments":{"city":"London","unit":"celsius"}}',
        '[{"a":1.5,"b":-0.0,"c":"\\u00fc\\ud83d\\ude00"}]',
        "numbers 1234567890 3.14159 -42 1e-05 0x1F",
        "x" * 3000,
        "word " * 500,
        "▁already▁escaped ▁ ▁▁",
    ]
    return lines


RAW_BAD = [b"bad \xff\xfe utf8 \xc3 end", b"\xc0\xaf overlong \xed\xa0\x80 surrogate",
           b"\xf4\x90\x80\x80 too big \xf8\x88\x80\x80\x80", b"nul\x00byte", b"\x80\x80\x80"]


def train(tmp, name, extra):
    corpus = os.path.join(SRC, "examples", "tokenizer_corpus.txt")
    small = os.path.join(tmp, "train.txt")
    if not os.path.exists(small):
        with open(corpus, encoding="utf-8") as f:
            text = f.read()[:300_000]
        with open(small, "w", encoding="utf-8") as f:
            f.write(text)
            # A few non-ASCII lines so some accented/CJK pieces exist.
            f.write("café naïve façade crème brûlée über Straße\n" * 20)
            f.write("日本語のテキスト 中文文本 한국어\n" * 10)
            f.write("fullwidth ＡＢＣ and ligatures ﬁ\n" * 5)
    prefix = os.path.join(tmp, name)
    args = ["spm_train", f"--input={small}", f"--model_prefix={prefix}", "--model_type=bpe",
            "--vocab_size=2000", "--pad_id=0", "--eos_id=1", "--bos_id=2", "--unk_id=3",
            "--user_defined_symbols=" + ",".join(MARKERS), "--num_threads=2",
            "--minloglevel=2"] + extra
    subprocess.run(args, check=True, capture_output=True)
    return prefix + ".model"


def needle(args, data):
    r = subprocess.run([NEEDLE] + args, input=data, capture_output=True)
    if r.returncode != 0:
        fail(f"needle {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r.stdout


def check_model(tmp, label, model, corpus_file):
    ref = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"],
                         stdin=open(corpus_file, "rb"), capture_output=True, check=True).stdout
    ours = needle(["tokenize", "--tokenizer", model], open(corpus_file, "rb").read())
    rl, ol = ref.split(b"\n"), ours.split(b"\n")
    if len(rl) != len(ol):
        fail(f"{label}: {len(rl)} reference lines vs {len(ol)} ours")
    bad = [i for i, (a, b) in enumerate(zip(rl, ol)) if a != b]
    for i in bad[:5]:
        fail(f"{label}: line {i + 1} differs\n  spm:    {rl[i][:200]!r}\n  needle: {ol[i][:200]!r}")
    print(f"{label}: {len(rl) - 1} lines, {len(bad)} mismatches")

    # Decode: ids -> text against spm_decode.
    ref_dec = subprocess.run(["spm_decode", f"--model={model}", "--input_format=id"],
                             input=ref, capture_output=True, check=True).stdout
    our_dec = needle(["tokenize", "--tokenizer", model, "--decode"], ref)
    if ref_dec != our_dec:
        a, b = ref_dec.split(b"\n"), our_dec.split(b"\n")
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fail(f"{label}: decode differs at line {i + 1}: {a[i:i+1]!r} vs {b[i:i+1]!r}")

    # Multi-line texts go through the library, as training does.
    sp = spm.SentencePieceProcessor(model_file=model)
    texts = ["line one\nline two\n\nline four", "\n\nleading newlines", "trailing\n\n",
             "<|im_start|>user\n<tools>[]</tools>\nhi<|im_end|>\n<|im_start|>assistant\n",
             "mixed\r\nendings\rhere\n", "tabs\n\t\tindented\n  spaces\n"]
    for t in texts:
        want = sp.encode(t)
        got = needle(["tokenize", "--tokenizer", model, "--whole"], t.encode())
        got_ids = [int(x) for x in got.split()]
        if got_ids != want:
            fail(f"{label}: multi-line {t!r}\n  spm:    {want}\n  needle: {got_ids}")
        dec = needle(["tokenize", "--tokenizer", model, "--decode"],
                     (" ".join(map(str, want)) + "\n").encode())
        if dec.decode("utf-8")[:-1] != sp.decode(want).replace("\n", "\n"):
            # Decoded newlines come back as text; compare exactly.
            if dec[:-1] != sp.decode(want).encode():
                fail(f"{label}: decode of {t!r}: {dec!r} vs {sp.decode(want)!r}")


def upstream_blob(model):
    """The .cact tokenizer blob as upstream's exporter lays it out (docs/formats.md §4.3)."""
    sp = spm.SentencePieceProcessor(model_file=model)
    n = sp.get_piece_size()
    out = bytearray(struct.pack("<IIIIIBBH", n, 0, 1, 2, 3, 1, 1, 0))
    for i in range(n):
        piece = sp.id_to_piece(i)
        if sp.is_control(i):
            t = 2
        elif sp.is_unknown(i):
            t = 1
        elif sp.is_byte(i):
            t = 4
        elif piece in MARKERS:
            t = 3
        else:
            t = 0
        b = piece.encode("utf-8")
        out += struct.pack("<fBH", sp.get_score(i), t, len(b)) + b
    return bytes(out)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        corpus_file = os.path.join(tmp, "corpus.txt")
        with open(corpus_file, "wb") as f:
            for line in corpus_lines():
                f.write(line.encode("utf-8") + b"\n")
            for raw in RAW_BAD:
                f.write(raw + b"\n")
            with open(os.path.join(SRC, "examples", "tokenizer_corpus.txt"), "rb") as c:
                f.write(b"".join(c.readlines()[-300:]))

        models = {
            "identity": train(tmp, "identity", ["--normalization_rule_name=identity",
                                                "--byte_fallback=true"]),
            "nmt_nfkc": train(tmp, "nfkc", ["--byte_fallback=true"]),
            "nfkc_no_fallback": train(tmp, "nofb", ["--byte_fallback=false"]),
            "no_dummy_prefix": train(tmp, "nodummy", ["--byte_fallback=true",
                                                      "--add_dummy_prefix=false",
                                                      "--normalization_rule_name=identity",
                                                      "--remove_extra_whitespaces=false"]),
            "shipped": os.path.join(SRC, "models", "tokenizer.model"),
        }
        for label, model in models.items():
            check_model(tmp, label, model, corpus_file)

        # The blob: byte-identical to upstream's exporter, and it encodes the
        # same as the .model it came from (the shipped model has no
        # normaliser and keeps whitespace, exactly what the blob implies).
        shipped = models["shipped"]
        blob = os.path.join(tmp, "tok.blob")
        needle(["tokenize", "--tokenizer", shipped, "--export-blob", blob], b"")
        if open(blob, "rb").read() != upstream_blob(shipped):
            fail("tokenizer blob differs from upstream's layout")
        valid = b"".join(l.encode() + b"\n" for l in corpus_lines())
        a = needle(["tokenize", "--tokenizer", shipped], valid)
        b = needle(["tokenize", "--tokenizer", blob], valid)
        if a != b:
            fail("blob-loaded tokenizer encodes differently from the .model")

        sp = spm.SentencePieceProcessor(model_file=shipped)
        if sp.get_piece_size() != 8192 or [sp.id_to_piece(i) for i in range(4, 14)] != MARKERS:
            fail("shipped tokenizer does not have vocab 8192 with markers at 4..13")
        if [sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()] != [0, 1, 2, 3]:
            fail("shipped tokenizer ids are not PAD 0, EOS 1, BOS 2, UNK 3")

        # Broken model files: a clear error, never a crash.
        good = open(shipped, "rb").read()
        for name, data in [("empty", b""), ("truncated", good[:len(good) // 2]),
                           ("garbage", b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 20)]:
            p = os.path.join(tmp, name + ".model")
            open(p, "wb").write(data)
            r = subprocess.run([NEEDLE, "tokenize", "--tokenizer", p], input=b"hi\n",
                               capture_output=True)
            if r.returncode != 1 or b"needle:" not in r.stderr:
                fail(f"{name} model: rc {r.returncode}, stderr {r.stderr!r}")
    if failures:
        print(f"{failures} failure(s)", file=sys.stderr)
        sys.exit(1)
    print("tokenizer parity: OK")


if __name__ == "__main__":
    main()
