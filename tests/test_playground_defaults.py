#!/usr/bin/python3
"""The playground shows the base at its best (issue 34):
  * GET /finetune/defaults: the base checkpoint's recommended lr, lora_rank,
    lora_alpha, epochs and batch_size (needle_c_recommended, written here by
    `needle convert --recommend`) over `needle finetune`'s own defaults,
    each marked with where it came from;
  * the page's fine-tune form has no hard-coded settings: it fills them
    from that route;
  * a fine-tune request without epochs / batch_size / lr runs with the
    base's (the finetune log says what it was given and what the base
    recommends: they agree);
  * the page offers ready tool sets, each with a sample query: every set
    compiles and answers through /complete.
stdlib only; a loopback playground."""
import html
import json
import os
import re
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
import playground_util as pu  # noqa: E402

FAIL = []
REC = {"lr": 0.003, "lora_rank": 8, "lora_alpha": 16.0, "epochs": 1, "batch_size": 2}
FINETUNE_DEFAULTS = {"lr": 1e-4, "lora_rank": 16, "lora_alpha": 32.0, "epochs": 3,
                     "batch_size": 16}


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def defaults(pg, want, source):
    status, d = pg.json("GET", "/finetune/defaults")
    check(status == 200, "GET /finetune/defaults: %d %s" % (status, d))
    for k, v in want.items():
        check(d.get(k) == v and d.get("source", {}).get(k) == source,
              "%s: %r (%r), want %r from %s" % (k, d.get(k), d.get("source", {}).get(k), v, source))
    return d


def presets(pg):
    status, _, page = pg.request("GET", "/")
    page = page.decode()
    m = re.search(r'<script type="application/json" id="presets">(.*?)</script>', page, re.S)
    check(m is not None, "the page holds ready tool sets")
    for field in ("ft-epochs", "ft-batch", "ft-lr"):
        tag = re.search(r'<input id="%s"[^>]*>' % field, page)
        check(tag and "value=" not in tag.group(0), "%s is not hard-coded: %r" % (
            field, tag and tag.group(0)))
    check("/finetune/defaults" in page, "the page asks for the base's settings")
    sets = json.loads(html.unescape(m.group(1))) if m else []
    check(len(sets) >= 4, "%d ready tool sets" % len(sets))
    for s in sets:
        check(s.get("name") and s.get("query") and s.get("tools"), "preset shape: %r" % s)
        status, env = pg.json("POST", "/complete", {"tools": s["tools"], "query": s["query"]})
        check(status == 200 and env.get("success") is True and not env.get("warnings"),
              "preset %r: %d %s" % (s.get("name"), status, json.dumps(env)[:300]))
        print("preset %-22s %d tools; %r" % (s["name"], len(s["tools"]), s["query"]))


def main():
    examples = open(os.path.join(SRC, "examples", "data.jsonl")).read().splitlines()[:4]
    with tempfile.TemporaryDirectory() as tmp:
        base, cact = pu.tiny_model(tmp)
        rec = os.path.join(tmp, "recommending.pkl")
        pu.sh("convert", base, rec, "--recommend",
              ",".join("%s=%s" % kv for kv in REC.items()))
        # a base that recommends nothing: finetune's own defaults
        os.makedirs(os.path.join(tmp, "a"))
        pg = pu.Playground(os.path.join(tmp, "a"), base, cact)
        try:
            defaults(pg, FINETUNE_DEFAULTS, "finetune default")
        finally:
            pg.stop()
        os.makedirs(os.path.join(tmp, "b"))
        pg = pu.Playground(os.path.join(tmp, "b"), rec, cact)
        try:
            defaults(pg, REC, "base")
            presets(pg)
            # the form's fields left empty: the base's settings
            status, body = pg.json("POST", "/finetune", {"examples": "\n".join(examples),
                                                         "max_len": 256})
            check(status == 200, "POST /finetune without settings: %d %s" % (status, body))
            final = pu.wait_until(lambda: (lambda s: s if not s["running"] else None)(
                pg.json("GET", "/finetune/status")[1]), 600, 0.2)
            check(final is not None and final["step"] == "done",
                  "the fine-tune finishes: %s" % (final and final.get("error")))
            log = "\n".join(final["log"]) if final else ""
            for key, flag in (("lr", "--lr"), ("batch_size", "--batch-size"),
                              ("epochs", "--epochs")):
                m = re.search(r"settings\s+%s (\S+) \(%s given; the checkpoint recommends (\S+)\)"
                              % (key, flag), log)
                check(m and float(m.group(1)) == float(m.group(2)) == float(REC[key]),
                      "%s: %s" % (key, m.group(0) if m else "no settings line in %r" % log[-800:]))
            m = re.search(r"settings\s+lora_rank (\S+) \(recommended by the checkpoint", log)
            check(m and int(m.group(1)) == REC["lora_rank"], "lora_rank: %s" % (
                m.group(0) if m else log[-800:]))
        finally:
            pg.stop()
    if FAIL:
        print("%d check(s) failed" % len(FAIL))
        return 1
    print("playground defaults: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
