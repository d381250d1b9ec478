#!/usr/bin/python3
"""Generate examples/data.jsonl: a small synthetic tool-calling dataset in
upstream's JSONL format (query, tools, answers), deterministic (seed 0).
Used by the demo and the fine-tuning tests."""
import json
import random
import sys

TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city"]}},
    {"name": "set_timer", "description": "Start a countdown timer",
     "parameters": {"type": "object", "properties": {
         "minutes": {"type": "integer", "minimum": 1, "maximum": 180}}, "required": ["minutes"]}},
    {"name": "send_message", "description": "Send a text message to a contact",
     "parameters": {"type": "object", "properties": {
         "to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}},
]
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Perth", "Quito"]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo"]
BODIES = ["running late", "see you at noon", "call me back", "dinner at 7", "on my way"]


def example(r):
    k = r.randrange(4)
    if k == 0:
        c = r.choice(CITIES)
        unit = r.choice(["celsius", "fahrenheit"])
        q = r.choice(["What's the weather in {c}?", "Is it cold in {c} right now?",
                      "Weather for {c} in {u} please"]).format(c=c, u=unit)
        args = {"city": c, "unit": unit} if "{u}" in q or unit == "celsius" else {"city": c}
        return q, [{"name": "get_weather", "arguments": args}]
    if k == 1:
        m = r.choice([1, 2, 5, 10, 15, 20, 25, 30, 45, 60, 90])
        q = r.choice(["Set a timer for {m} minutes", "Timer {m} min", "Remind me in {m} minutes"])
        return q.format(m=m), [{"name": "set_timer", "arguments": {"minutes": m}}]
    if k == 2:
        n, b = r.choice(NAMES), r.choice(BODIES)
        q = r.choice(["Text {n} that I'm {b}", "Send {n} a message: {b}", "Tell {n} {b}"])
        return q.format(n=n, b=b), [{"name": "send_message", "arguments": {"to": n, "body": b}}]
    q = r.choice(["Tell me a joke", "Who wrote Hamlet?", "How are you today?", "Thanks!"])
    return q, []


def main():
    if len(sys.argv) > 3 or any(a.startswith("-") for a in sys.argv[1:]):
        print("usage: tools/make_example_data.py [OUT.jsonl [N]]  (default examples/data.jsonl 96)",
              file=sys.stderr)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data.jsonl"
    r = random.Random(0)
    with open(out, "w") as f:
        for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 96):
            q, calls = example(r)
            f.write(json.dumps({"query": q, "tools": TOOLS, "answers": calls}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
