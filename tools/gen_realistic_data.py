#!/usr/bin/env python3
"""Realistic fine-tune data for benchmarks: a few tool sets (domains) of
five tools each with long, documented JSON schemas, and many short queries
per set whose answers are one short call (or none). Like real fine-tune
data, the tools block is most of every prompt and is identical for every
example of a domain. Deterministic by --seed; upstream's JSONL format.

  tools/gen_realistic_data.py OUT.jsonl [--examples 1600] [--domains 8] [--seed 1]
"""
import argparse
import json
import random

DOMAINS = {
    "weather": ["city", "country", "date", "unit", "hours"],
    "calendar": ["title", "date", "time", "duration_minutes", "attendee"],
    "messaging": ["contact", "body", "channel", "priority", "attachment"],
    "music": ["artist", "track", "playlist", "volume", "shuffle"],
    "smart_home": ["room", "device", "level", "color", "schedule"],
    "travel": ["origin", "destination", "date", "passengers", "cabin"],
    "finance": ["account", "amount", "currency", "recipient", "note"],
    "fitness": ["activity", "minutes", "distance_km", "heart_rate", "goal"],
    "shopping": ["item", "quantity", "store", "budget", "delivery"],
    "notes": ["title", "text", "folder", "tag", "pinned"],
    "navigation": ["place", "mode", "avoid", "arrive_by", "stops"],
    "recipes": ["dish", "servings", "diet", "max_minutes", "ingredient"],
}
VERBS = ["get", "set", "create", "find", "update", "cancel", "list", "share", "start", "check"]
WORDS = ("city oslo paris lima tokyo cairo rome quito perth dublin bern kyiv lagos hanoi "
         "morning evening tomorrow monday friday noon weekend jazz rock coffee bread milk "
         "kitchen garage office team mom alex sam kim lee ana max zoe ivan meeting lunch "
         "report invoice budget flight train hotel taxi run swim yoga pasta salad soup").split()
PHRASES = ["could you", "please", "I need to", "can you", "quickly", "hey,", "help me",
           "I want to", "would you", "go ahead and"]


def param_schema(rng, name):
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum"])
    desc = f"The {name.replace('_', ' ')} the user gave"
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, 4), "description": desc}
    s = {"type": kind, "description": desc}
    if kind == "integer":
        s["minimum"], s["maximum"] = 0, rng.choice([10, 100, 1000])
    return s


def tool_set(rng, domain, params):
    tools = []
    for verb in rng.sample(VERBS, 5):
        ps = rng.sample(params, rng.randint(2, 3))
        tools.append({
            "name": f"{verb}_{domain}",
            "description": f"{verb.capitalize()} {domain.replace('_', ' ')} items for the user",
            "parameters": {"type": "object",
                           "properties": {p: param_schema(rng, p) for p in ps},
                           "required": ps[:rng.randint(1, 2)]},
        })
    return tools


def value(rng, schema):
    t = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if t == "integer":
        return rng.randint(schema.get("minimum", 0), schema.get("maximum", 100))
    if t == "number":
        return round(rng.uniform(0, 100), 1)
    if t == "boolean":
        return rng.random() < 0.5
    return rng.choice(WORDS)


def example(rng, tools):
    if rng.random() < 0.1:
        q = rng.choice(["thanks!", "ok great", "what can you do?", "never mind", "hello there"])
        return {"query": q, "tools": tools, "answers": [],
                "reasoning": "No tool fits this message."}
    tool = rng.choice(tools)
    props = tool["parameters"]["properties"]
    args = {}
    for p in tool["parameters"]["required"] + rng.sample(list(props), rng.randint(0, 1)):
        args[p] = value(rng, props[p])
    words = " ".join(str(v) for v in args.values())
    q = f"{rng.choice(PHRASES)} {tool['name'].split('_')[0]} {words}"
    return {"query": q, "tools": tools, "answers": [{"name": tool["name"], "arguments": args}],
            "reasoning": f"The user wants {tool['name']}."}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=1600)
    ap.add_argument("--domains", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    names = sorted(DOMAINS)[: a.domains]
    sets = [tool_set(rng, d, DOMAINS[d]) for d in names]
    with open(a.out, "w") as f:
        for i in range(a.examples):
            f.write(json.dumps(example(rng, sets[rng.randrange(len(sets))])) + "\n")


if __name__ == "__main__":
    main()
