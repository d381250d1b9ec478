#!/usr/bin/python3
"""Synthetic tool-calling corpus in upstream's JSONL training format
({"query", "tools", "answers", "reasoning"[, "system"]}), for pre-training the
needle-nano base. Python standard library only; the same arguments and --seed
give byte-identical output.

  tools/gen_toolcall_corpus.py --num 20000 --split pretrain --seed 1 --output corpus.jsonl
  tools/gen_toolcall_corpus.py --list-domains

Each example draws a domain (its 1-8 tools, in one of three fixed orders,
sometimes plus distractor tools of other domains of the same split) and
either one intent, several intents (a multi-call answer), or a message no
tool serves (answer []). Every string argument is said verbatim in the query,
every integer as digits or English words ("three" -> 3), enums verbatim,
booleans by a phrase. The held-out split's domains never occur in the
pretrain split (not even as distractors)."""
import argparse
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_alias import alias_example  # noqa: E402
from corpus_domains import DOMAINS, HELDOUT  # noqa: E402

PREFIXES = ["", "", "", "", "please ", "can you ", "could you ", "hey, ", "I'd like to ",
            "would you ", "quick one: ", "hi! ", "go ahead and ", "I need you to ",
            "can you please ", "ok so ", "yo, "]
SUFFIXES = ["", "", "", ".", ".", "?", " please", " thanks", " asap", "!", " when you can",
            ", thank you"]
JOINERS = [" and ", " and then ", ", then ", ". Also ", "; also ", " and also ", ". After that, "]
CHAT = ["thanks!", "ok great", "what can you do?", "never mind", "hello there", "good morning!",
        "lol that's funny", "how are you today?", "who made you?", "you're awesome",
        "tell me a joke", "what's the meaning of life?", "who wrote Hamlet?",
        "what is the capital of Australia?", "how tall is Mount Everest?", "sorry, wrong chat",
        "can you explain photosynthesis?", "I'm bored", "what's 17 times 3?", "bye",
        "is a tomato a fruit?", "why is the sky blue?", "hmm let me think", "ok cancel that",
        "write me a poem about the sea", "what year did the Berlin wall fall?"]
SYSTEMS = ["You are a helpful assistant that calls tools.",
           "You are an on-device assistant. Call a tool only when one fits the request.",
           "Answer with tool calls. The user's locale is en-US."]


class Param:
    """A parameter of a tool: its schema and how it is drawn and said."""

    def __init__(self, name, spec, required):
        self.name, self.spec, self.required = name, spec, required
        if "object" in spec:
            desc, props, _ = spec["object"]
            self.kind, self.desc = "object", desc
            self.props = [Param(n, p, r) for n, p, r in props]
        elif "array_of" in spec:
            desc, obj, lo, hi = spec["array_of"]
            self.kind, self.desc, self.lo, self.hi = "array_of", desc, lo, hi
            self.item = Param("item", obj, True)
        else:
            self.kind = "bool" if "bool" in spec else "plain"

    def schema(self):
        if self.kind == "object":
            return {"type": "object", "description": self.desc,
                    "properties": {p.name: p.schema() for p in self.props},
                    "required": [p.name for p in self.props if p.required]}
        if self.kind == "array_of":
            return {"type": "array", "description": self.desc, "items": self.item.schema(),
                    "minItems": self.lo, "maxItems": self.hi}
        return self.spec["schema"]

    def draw(self, rng):
        """(value, phrase as said in the query, reasoning fragment)."""
        if self.kind == "bool":
            v = rng.random() < 0.6
            said = rng.choice(self.spec["bool"][0 if v else 1])
            return v, said, f'{self.name} {json.dumps(v)} from "{said}"'
        if self.kind == "object":
            val, parts, why = self._draw_fields(rng)
            lead = rng.choice(self.spec["lead"])
            said = (lead + " " if lead else "") + " ".join(parts)
            return val, said, f"{self.name} {{{', '.join(why)}}}"
        if self.kind == "array_of":
            vals, saids, whys = [], [], []
            for _ in range(rng.randint(self.lo, self.hi)):
                v, parts, why = self.item._draw_fields(rng)
                vals.append(v)
                saids.append(" ".join(parts))
                whys.append("{" + ", ".join(why) + "}")
            said = saids[0] if len(saids) == 1 else ", ".join(saids[:-1]) + " and " + saids[-1]
            return vals, said, f"{self.name} [{', '.join(whys)}]"
        v, surface = self.spec["gen"](rng)
        said = rng.choice(self.spec["phrases"]).format(v=surface)
        if isinstance(v, str):
            why = f'{self.name} "{v}"'
        elif isinstance(v, list):
            why = f"{self.name} {json.dumps(v)}"
        else:
            why = f"{self.name} {json.dumps(v)}" + (f' from "{surface}"' if surface != str(v) else "")
        return v, said, why

    def _draw_fields(self, rng):
        val, parts, why = {}, [], []
        for p in self.props:
            if p.required or rng.random() < 0.5:
                v, said, w = p.draw(rng)
                val[p.name] = v
                parts.append(said)
                why.append(w)
        return val, parts, why


class Tool:
    def __init__(self, spec):
        self.name, self.desc, self.verbs = spec["name"], spec["description"], spec["verbs"]
        self.params = [Param(n, p, r) for n, p, r in spec["params"]]
        self.json = {"name": self.name, "description": self.desc,
                     "parameters": {"type": "object",
                                    "properties": {p.name: p.schema() for p in self.params},
                                    "required": [p.name for p in self.params if p.required]}}

    def intent(self, rng):
        """One request for this tool: (clause, call, reasoning)."""
        for _ in range(8):  # redraw when two arguments would be said the same way
            chosen = [p for p in self.params if p.required or rng.random() < 0.45]
            drawn = [(p, *p.draw(rng)) for p in chosen]
            said = [d[2] for d in drawn if d[2]] + [d[1] for d in drawn if isinstance(d[1], str)]
            if len(set(said)) == len(said):
                break
        phrases = [d[2] for d in drawn]
        if rng.random() < 0.6:
            rng.shuffle(phrases)
        clause = " ".join([maybe_typo(rng, rng.choice(self.verbs))] + [s for s in phrases if s])
        args = {p.name: v for p, v, _, _ in drawn}
        why = ", ".join(d[3] for d in drawn)
        return clause, {"name": self.name, "arguments": args}, self.name + (f": {why}" if why else "")


def maybe_typo(rng, text, rate=0.07):
    """Swap two letters of one longer word now and then (never inside a value)."""
    words = text.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    if not long_words or rng.random() >= rate:
        return text
    i = rng.choice(long_words)
    w = words[i]
    j = rng.randrange(1, len(w) - 2)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


QUESTION_WORDS = ("what", "how", "when", "where", "is ", "do ", "did ", "any ", "who")


def sentence(rng, clause):
    # "can you what's the weather" reads badly: questions take no prefix
    prefix = "" if clause.lower().startswith(QUESTION_WORDS) else rng.choice(PREFIXES)
    q = prefix + clause + rng.choice(SUFFIXES)
    return q[0].upper() + q[1:] if rng.random() < 0.7 else q


class Corpus:
    def __init__(self, names, seed):
        self.domains = {name: [Tool(t) for t in tools] for name, tools in DOMAINS if name in names}
        self.names = names
        self.rng = random.Random(seed)
        # three fixed tool orders per domain: shuffled lists that still share prefixes
        self.orders = {}
        for name in names:
            tools = [t.json for t in self.domains[name]]
            self.orders[name] = []
            for k in range(3):
                perm = list(tools)
                random.Random(f"{seed}:{name}:{k}").shuffle(perm)
                self.orders[name].append(perm)

    def tool_list(self, domain):
        rng = self.rng
        tools = list(rng.choice(self.orders[domain]))
        others = [n for n in self.names if n != domain]
        used = {domain}
        if others and rng.random() < 0.3:
            for _ in range(rng.randint(1, 3)):
                d = rng.choice(others)
                extra = rng.choice(self.domains[d]).json
                if extra not in tools:
                    used.add(d)
                    tools.insert(rng.randint(0, len(tools)), extra)
        return tools, used

    def example(self, args):
        rng = self.rng
        domain = rng.choice(self.names)
        tools, used = self.tool_list(domain)
        ex = {}
        if rng.random() < args.system_rate:
            ex["system"] = rng.choice(SYSTEMS)
        r = rng.random()
        if r < args.nocall_rate:
            outside = [n for n in self.names if n not in used]
            if outside and rng.random() < 0.5:
                tool = rng.choice(self.domains[rng.choice(outside)])
                clause, _, _ = tool.intent(rng)
                query = sentence(rng, clause)
                why = f"The user wants: {tool.desc.lower()}. No listed tool does that, so no call."
            else:
                query = maybe_typo(rng, rng.choice(CHAT))
                why = "Chit-chat or a general question; no tool fits, so no call."
            ex.update(query=query, tools=tools, answers=[], reasoning=why)
            return ex
        n_calls = 1 if r >= args.nocall_rate + args.multi_rate else rng.choice([2, 2, 2, 3])
        clauses, calls, whys = [], [], []
        for _ in range(n_calls):
            clause, call, why = rng.choice(self.domains[domain]).intent(rng)
            clauses.append(clause)
            calls.append(call)
            whys.append(why)
        query = clauses[0]
        for c in clauses[1:]:
            query += rng.choice(JOINERS) + c
        ex.update(query=sentence(rng, query), tools=tools, answers=calls,
                  reasoning="; then ".join(whys) if n_calls > 1 else whys[0])
        return ex


def split_domains(split):
    names = [n for n, _ in DOMAINS]
    if split == "heldout":
        return [n for n in names if n in HELDOUT]
    return [n for n in names if n not in HELDOUT]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--num", type=int, default=1000, help="examples to write (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--split", choices=["pretrain", "heldout"], default="pretrain",
                    help="pretrain (default) or the held-out domains")
    ap.add_argument("--domains", help="comma-separated domains of the split to use (default all)")
    ap.add_argument("--list-domains", action="store_true",
                    help="print each domain, its split and tools, and exit")
    ap.add_argument("--output", "-o", help="output JSONL (written atomically; default stdout)")
    ap.add_argument("--multi-rate", type=float, default=0.2, help="share of multi-call examples")
    ap.add_argument("--nocall-rate", type=float, default=0.12, help="share of no-call examples")
    ap.add_argument("--system-rate", type=float, default=0.08, help="share with a system turn")
    ap.add_argument("--alias-rate", type=float, default=0.0,
                    help="share of examples whose tools and parameters are renamed (synonyms, "
                         "casings, opaque names; default 0)")
    a = ap.parse_args()

    if a.list_domains:
        for name, tools in DOMAINS:
            split = "heldout" if name in HELDOUT else "pretrain"
            print(f"{name}\t{split}\t{' '.join(t['name'] for t in tools)}")
        return 0
    if a.num < 0:
        ap.error("--num must be >= 0")
    for flag in ("multi_rate", "nocall_rate", "system_rate", "alias_rate"):
        if not 0 <= getattr(a, flag) <= 1:
            ap.error(f"--{flag.replace('_', '-')} must be in [0, 1]")
    if a.multi_rate + a.nocall_rate > 1:
        ap.error("--multi-rate + --nocall-rate must be <= 1")
    names = split_domains(a.split)
    if a.domains:
        wanted = [d.strip() for d in a.domains.split(",") if d.strip()]
        known = [n for n, _ in DOMAINS]
        for d in wanted:
            if d not in known:
                ap.error(f"--domains: unknown domain '{d}' (see --list-domains)")
            if d not in names:
                ap.error(f"--domains: '{d}' is not in the {a.split} split (see --list-domains)")
        names = [n for n in names if n in wanted]

    corpus = Corpus(names, a.seed)
    # its own stream: --alias-rate 0 leaves the corpus of a seed unchanged
    alias_rng = random.Random(f"alias:{a.seed}")
    lines, n_multi, n_none, n_alias, used = [], 0, 0, 0, set()
    for _ in range(a.num):
        ex = corpus.example(a)
        if a.alias_rate and alias_rng.random() < a.alias_rate:
            # one of 8 renamings per tool list, so renamed examples still
            # share their tools prefix (--group-by-tools batches them)
            key = f"{a.seed}:{alias_rng.randrange(8)}:" + ",".join(t["name"] for t in ex["tools"])
            ex = alias_example(random.Random(key), ex)
            n_alias += 1
        n_multi += len(ex["answers"]) > 1
        n_none += not ex["answers"]
        used.update(t["name"] for t in ex["tools"])
        lines.append(json.dumps(ex) + "\n")
    data = "".join(lines)
    if a.output:
        d = os.path.dirname(os.path.abspath(a.output))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".corpus-", dir=d)
        except OSError as e:
            print(f"gen_toolcall_corpus: {a.output}: {e.strerror}", file=sys.stderr)
            return 1
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; keep the usual mode
            os.replace(tmp, a.output)
        except BaseException:
            os.unlink(tmp)
            raise
    else:
        sys.stdout.write(data)
    n = max(a.num, 1)
    print(f"corpus: {a.num} examples, split {a.split}, {len(names)} domains, "
          f"{len(used)} tools, {100 * n_multi / n:.1f}% multi-call, "
          f"{100 * n_none / n:.1f}% no-call"
          + (f", {100 * n_alias / n:.1f}% renamed" if a.alias_rate else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
