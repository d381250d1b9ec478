#!/usr/bin/python3
"""Score a base the way issue 34 asks, and print the score table.

  tools/eval_base.py                                   # the built-in base, 100 examples a part
  tools/eval_base.py --weights new.cact --num 300 --sets big/sets.jsonl --out /tmp/scores
  tools/eval_base.py --checkpoint models/needle-nano.pkl     # float weights, no quantisation
  tools/eval_base.py --finetune examples/heldout/pets_train.jsonl examples/heldout/pets_test.jsonl

Parts (each data file is made afresh with a fixed seed, so two bases are
scored on the same examples; `needle eval-calls --json --predictions`
scores them):
  synthetic  zero-shot on the held-out synthetic domains
             (gen_toolcall_corpus.py --split heldout --seed 2: the first N
             of the recipe's held-out set): tool names, exact arguments,
             false refusals;
  real       zero-shot on held-out real API tool sets (gen_reading_corpus.py
             --split heldout --seed 2: providers never in its train split,
             with its default mix of styles, renamings, distractors,
             multi-call and no-call): tool names, exact arguments;
  first-tool first-tool choice on held-out real API sets: one plain request
             per example (gen_reading_corpus.py --split heldout --seed 3,
             single call, no renaming, distractors or styles): the share
             whose first predicted call names the expected tool, over
             examples and over held-out providers (one counts when most
             of its examples are right), and what guessing scores (a
             random listed tool; the first listed): sets of 1-5 tools,
             so a guess scores ~70%;
  first-tool-mixed  the same requests' kind (seed 3) with every set given 1-4
             tools of other held-out APIs (--distractor-rate 1, as many as
             fit the context): 3.3 tools listed on average, so a guess
             scores ~35%; examples, exact arguments and the guess rates;
  upstream   upstream's tests/test_inference.py cases
             (tests/test_upstream_inference.py --json): upstream's
             assertions and the strict reading (right call and arguments);
             with --weights other than the built-in base this part is
             skipped (the library loads the base beside it);
  bfcl       with --bfcl DIR (tools/bfcl_data.py convert's output): zero-shot
             on DIR/test.jsonl, Berkeley Function-Calling Leaderboard data
             written outside this project: tool names, exact arguments
             (the first acceptable value of each) and arguments accepted by
             BFCL's rules (any acceptable value, optional ones left out);
  finetune   with --finetune TRAIN TEST: `needle finetune TRAIN --epochs E`
             (the checkpoint's recommended settings) from --checkpoint,
             then eval-calls on TEST in float (--checkpoint --lora) and
             as 4-bit and 2-bit archives (needle build --bits).
Writes OUT/scores.json and OUT/table.md (default OUT build/eval-base)."""
import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"eval_base: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def eval_calls(a, data, preds, model=None):
    cmd = [a.needle, "eval-calls"] + (model or a.model) + [data, "--json", "--predictions", preds]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    return json.loads(sh(cmd))


def bfcl_score(pred, data):
    p = subprocess.run([PY, os.path.join(ROOT, "tools", "bfcl_data.py"), "score", pred, data, "--json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"eval_base: bfcl_data.py score: {p.stderr[-1000:]}")
    return json.loads(p.stdout)


def has_bfcl(data):
    with open(data) as fh:
        return "bfcl_accept" in json.loads(fh.readline())


def pct(r):
    return "—" if r is None else f"{100 * r:.1f}%"


FIRST_TOOL_PLAIN = ["--multi-rate", "0", "--nocall-rate", "0", "--synthetic-rate", "0",
                    "--rename-rate", "0", "--redescribe-rate", "0", "--system-rate", "0",
                    "--lower-rate", "0", "--typo-rate", "0", "--preamble-rate", "0"]


def first_tool(a, gen_r, f, part, scores):
    """Parts first-tool (one API's tools) and first-tool-mixed (every set
    given tools of other APIs): the share of examples whose first predicted
    call names the expected tool, beside what guessing scores there."""
    mixed = part == "first-tool-mixed"
    stem = "first-mixed" if mixed else "first"
    sh(gen_r + ["--split", "heldout", "--num", str(a.num), "--seed", "3"] + FIRST_TOOL_PLAIN
       + ["--distractor-rate", "1" if mixed else "0", "-o", f(stem + ".jsonl"),
          "--manifest", f(stem + ".manifest.jsonl")])
    r = eval_calls(a, f(stem + ".jsonl"), f(stem + ".pred.jsonl"))
    exs = [json.loads(x) for x in open(f(stem + ".jsonl"))]
    preds = [json.loads(x) for x in open(f(stem + ".pred.jsonl"))]
    mans = [json.loads(x)["providers"] for x in open(f(stem + ".manifest.jsonl"))]
    by_prov = collections.defaultdict(list)
    right = 0
    for ex, p, m in zip(exs, preds, mans):
        ok = bool(p["predicted"]) and p["predicted"][0].get("name") == ex["answers"][0]["name"]
        right += ok
        if not mixed:  # one provider an example (with distractors the manifest lists several)
            by_prov[m[0] if m else "?"].append(ok)
    # what a guess scores here: a tool drawn at random from the listed ones,
    # and always the first listed
    n_ex = max(len(exs), 1)
    chance = sum(1 / len(ex["tools"]) for ex in exs) / n_ex
    first_listed = sum(ex["answers"][0]["name"] == ex["tools"][0]["name"] for ex in exs) / n_ex
    listed = sum(len(ex["tools"]) for ex in exs) / n_ex
    key = "first_tool_mixed" if mixed else "first_tool"
    scores[key] = {"examples": len(exs), "right": right, "rate": right / n_ex,
                   "chance": chance, "first_listed": first_listed, "tools_listed": listed,
                   "eval_calls": r}
    provs = ""
    if not mixed:
        # a provider counts when most of its examples are right
        provs_ok = sum(sum(v) * 2 > len(v) for v in by_prov.values())
        scores[key].update(providers=len(by_prov), providers_right=provs_ok)
        provs = f" ({provs_ok} of {len(by_prov)} providers)"
    label = ("first-tool choice, held-out real API sets with tools of other APIs" if mixed
             else "first-tool choice, held-out real API sets")
    return (label, len(exs),
            f"{pct(right / n_ex)} of examples{provs}; exact args "
            f"{pct(r['all']['exact_args']['rate'])}; {listed:.1f} tools listed: a random "
            f"listed tool {pct(chance)}, the first listed {pct(first_listed)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--needle", default=os.path.join(ROOT, "build", "needle"))
    ap.add_argument("--weights", help=".cact archive (default build/needle-nano.cact)")
    ap.add_argument("--checkpoint", help="score a checkpoint's float weights instead")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "tokenizer.model"))
    ap.add_argument("--num", type=int, default=100, help="examples per part (default 100)")
    ap.add_argument("--sets", default=os.path.join(ROOT, "tests", "data", "openapi_sample",
                                                    "sets.jsonl"),
                    help="real API tool sets (default the committed sample)")
    ap.add_argument("--parts", default="synthetic,real,first-tool,first-tool-mixed,upstream",
                    help="comma-separated parts (default all but finetune)")
    ap.add_argument("--finetune", nargs=2, metavar=("TRAIN", "TEST"))
    ap.add_argument("--bfcl", help="tools/bfcl_data.py convert's output folder (part bfcl)")
    ap.add_argument("--epochs", type=int, default=10, help="fine-tune epochs (default 10)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "eval-base"))
    a = ap.parse_args()
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    if a.bfcl and "bfcl" not in parts:
        parts.append("bfcl")
    for p in parts:
        if p not in ("synthetic", "real", "first-tool", "first-tool-mixed", "upstream", "bfcl"):
            ap.error(f"--parts: unknown part {p!r}")
    if "bfcl" in parts and not a.bfcl:
        ap.error("--parts bfcl needs --bfcl DIR")
    if a.weights and a.checkpoint:
        ap.error("--weights and --checkpoint exclude each other")
    if not os.path.exists(a.needle):
        ap.error(f"no needle program at {a.needle} (build first)")
    builtin = os.path.join(os.path.dirname(a.needle), "needle-nano.cact")
    if a.checkpoint:
        a.model = ["--checkpoint", a.checkpoint, "--tokenizer", a.tokenizer]
        label = a.checkpoint
    else:
        a.weights = a.weights or builtin
        a.model = ["--weights", a.weights]
        label = a.weights
    if a.finetune and not a.checkpoint:
        ap.error("--finetune needs --checkpoint (the base to fine-tune)")
    os.makedirs(a.out, exist_ok=True)
    gen_t = [PY, os.path.join(ROOT, "tools", "gen_toolcall_corpus.py")]
    gen_r = [PY, os.path.join(ROOT, "tools", "gen_reading_corpus.py"), "--sets", a.sets]
    scores, rows, t0 = {}, [], time.time()
    f = lambda n: os.path.join(a.out, n)  # noqa: E731

    if "synthetic" in parts:
        sh(gen_t + ["--split", "heldout", "--num", str(a.num), "--seed", "2", "-o", f("synthetic.jsonl")])
        r = eval_calls(a, f("synthetic.jsonl"), f("synthetic.pred.jsonl"))
        scores["synthetic"] = r
        rows.append(("zero-shot, held-out synthetic domains", r["all"]["examples"],
                     f"{pct(r['all']['tool_name']['rate'])} / {pct(r['all']['exact_args']['rate'])}"
                     f" (false refusals {r['call']['false_refusal']['count']} of {r['call']['examples']})"))
    if "real" in parts:
        sh(gen_r + ["--split", "heldout", "--num", str(a.num), "--seed", "2", "-o", f("real.jsonl")])
        r = eval_calls(a, f("real.jsonl"), f("real.pred.jsonl"))
        scores["real"] = r
        rows.append(("zero-shot, held-out real API sets (mixed styles)", r["all"]["examples"],
                     f"{pct(r['all']['tool_name']['rate'])} / {pct(r['all']['exact_args']['rate'])}"
                     f" (false refusals {r['call']['false_refusal']['count']} of {r['call']['examples']})"))
    for part in ("first-tool", "first-tool-mixed"):
        if part in parts:
            rows.append(first_tool(a, gen_r, f, part, scores))
    if "bfcl" in parts:
        test = os.path.join(a.bfcl, "test.jsonl")
        with open(test) as src, open(f("bfcl.jsonl"), "w") as dst:
            for i, line in enumerate(src):
                if i < a.num:
                    dst.write(line)
        r = eval_calls(a, f("bfcl.jsonl"), f("bfcl.pred.jsonl"))
        b = bfcl_score(f("bfcl.pred.jsonl"), f("bfcl.jsonl"))
        r["bfcl"] = b
        scores["bfcl"] = r
        rows.append(("zero-shot, BFCL test split (written outside this project)", r["all"]["examples"],
                     f"{pct(r['all']['tool_name']['rate'])} / {pct(r['all']['exact_args']['rate'])}"
                     f" (BFCL-accepted args {pct(b['bfcl_args'])})"))
    if "upstream" in parts:
        if a.checkpoint or os.path.realpath(a.weights) != os.path.realpath(builtin):
            rows.append(("upstream tests/test_inference.py", 5, "skipped (not the built-in base)"))
        else:
            env = dict(os.environ, NEEDLE_BUILD=os.path.dirname(a.needle))
            p = subprocess.run([PY, os.path.join(ROOT, "tests", "test_upstream_inference.py"),
                                "--json"], capture_output=True, text=True, env=env)
            try:
                u = json.loads(p.stdout)
            except ValueError:
                sys.exit(f"eval_base: test_upstream_inference.py: {p.stderr[-1000:]}")
            scores["upstream"] = u
            rows.append(("upstream tests/test_inference.py", u["cases"],
                         f"{u['upstream_pass']}/{u['cases']} upstream's assertions, "
                         f"{u['strict_pass']}/{u['cases']} right call and arguments"))
    if a.finetune:
        train, test = a.finetune
        ad = f("adapter.pkl")
        sh([a.needle, "finetune", train, "--checkpoint", a.checkpoint, "--tokenizer", a.tokenizer,
            "--epochs", str(a.epochs), "--out", ad] + (["--threads", str(a.threads)] if a.threads else []))
        ft = {}
        ft["float"] = eval_calls(a, test, f("ft-float.pred.jsonl"),
                                 ["--checkpoint", a.checkpoint, "--tokenizer", a.tokenizer, "--lora", ad])
        for bits in (4, 2):
            cact = f(f"ft-{bits}bit.cact")
            sh([a.needle, "build", a.checkpoint, "--lora", ad, "--bits", str(bits), "--tokenizer",
                a.tokenizer, "--out", cact])
            ft[f"{bits}-bit"] = eval_calls(a, test, f(f"ft-{bits}bit.pred.jsonl"), ["--weights", cact])
        scores["finetune"] = ft
        for k, r in ft.items():
            extra = ""
            if has_bfcl(test):
                b = bfcl_score(f(f"ft-{k.replace('-', '')}.pred.jsonl"), test)
                r["bfcl"] = b
                extra = f" (BFCL-accepted args {pct(b['bfcl_args'])})"
            rows.append((f"after finetune --epochs {a.epochs} ({os.path.basename(train)}), {k}",
                         r["all"]["examples"],
                         f"{pct(r['all']['tool_name']['rate'])} / {pct(r['all']['exact_args']['rate'])}{extra}"))

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cmd = "tools/eval_base.py " + " ".join(sys.argv[1:])
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    table = [f"Scores of {label} ({when}; {machine}; `{cmd.strip()}`, {time.time() - t0:.0f} s):",
             "", "| part | examples | tool name / exact args |", "|---|---|---|"]
    table += [f"| {p} | {n} | {s} |" for p, n, s in rows]
    scores["meta"] = {"model": label, "date": when, "machine": machine, "command": cmd.strip(),
                      "num": a.num, "sets": a.sets}
    with open(f("scores.json"), "w") as fh:
        json.dump(scores, fh, indent=1)
    with open(f("table.md"), "w") as fh:
        fh.write("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
