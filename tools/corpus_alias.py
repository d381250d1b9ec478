"""Per-example renaming of tools and parameters for tools/gen_toolcall_corpus.py
(--alias-rate): the same intent under names the model has not memorised
(synonym verbs, other casings, prefixes, now and then an opaque name), so a
base learns to read the tools block instead of recalling its domains."""
import re

VERBS = {
    "get": ["fetch", "lookup", "retrieve", "read", "query", "show"],
    "set": ["update", "change", "configure", "adjust"],
    "search": ["find", "query", "browse", "lookup"],
    "find": ["search", "locate", "lookup", "discover"],
    "add": ["create", "insert", "append", "new"],
    "create": ["add", "new", "make"],
    "start": ["begin", "launch", "run", "kick_off"],
    "log": ["record", "track", "register", "save"],
    "list": ["show", "enumerate", "get_all"],
    "play": ["stream", "start", "put_on"],
    "buy": ["purchase", "order", "get"],
    "send": ["post", "dispatch", "deliver", "push"],
    "cancel": ["abort", "revoke", "call_off"],
    "book": ["reserve", "schedule", "arrange"],
    "delete": ["remove", "drop", "erase"],
    "remove": ["delete", "drop"],
    "check": ["verify", "inspect"],
    "share": ["send", "give"],
    "request": ["ask_for", "order"],
    "convert": ["transform", "change"],
    "pay": ["settle", "send_payment"],
    "schedule": ["plan", "book"],
    "track": ["monitor", "follow"],
    "order": ["buy", "purchase"],
    "show": ["display", "get"],
    "lock": ["secure"],
    "place": ["put", "make"],
    "make": ["create", "prepare"],
}
PARAMS = {
    "date": ["day", "on_date", "for_date"],
    "city": ["location", "place", "town", "city_name"],
    "title": ["name", "heading", "label"],
    "time": ["at", "at_time", "clock"],
    "minutes": ["mins", "duration", "length_minutes"],
    "days": ["num_days", "day_count"],
    "amount": ["value", "sum", "total"],
    "count": ["number", "how_many", "n"],
    "name": ["title", "label"],
    "to": ["recipient", "target", "dest"],
    "text": ["content", "message", "body"],
    "query": ["q", "search_text", "terms"],
    "limit": ["max_results", "top_n"],
    "destination": ["to", "dest", "where"],
    "from": ["source", "origin"],
}
PREFIXES = ["app_", "do_", "tool_", "my_", "api_"]
SUFFIXES = ["_v2", "_tool", "_now", "_action"]
CONSONANTS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"


def camel(words):
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


def opaque(rng):
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 3)))


def tool_alias(rng, name):
    words = name.split("_")
    if words[0] in VERBS and rng.random() < 0.6:
        words = rng.choice(VERBS[words[0]]).split("_") + words[1:]
    r = rng.random()
    if r < 0.12:
        return "fn_" + opaque(rng)
    if r < 0.4:
        out = camel(words)
    elif r < 0.5:
        out = "-".join(words)
    else:
        out = "_".join(words)
    r = rng.random()
    if r < 0.2:
        out = rng.choice(PREFIXES) + out
    elif r < 0.3:
        out += rng.choice(SUFFIXES)
    return out


def param_alias(rng, name):
    if name in PARAMS and rng.random() < 0.6:
        name = rng.choice(PARAMS[name])
    words = name.split("_")
    r = rng.random()
    if r < 0.05:
        return "arg_" + opaque(rng)
    if r < 0.35 and len(words) > 1:
        return camel(words)
    if r < 0.5:
        return rng.choice(["the_", "target_", "p_", "in_"]) + name
    return name


def _unique(rng, make, name, taken):
    for _ in range(20):
        a = make(rng, name)
        if a not in taken:
            return a
    return name if name not in taken else name + "_" + str(len(taken))


QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def _rename_words(text, mapping):
    """Replace whole-word names in text, never inside a quoted value."""
    if not mapping:
        return text
    # a name starts a fragment: the segment, or after ": ", ", " or "{"
    pat = re.compile(r"(?:^|(?<=: )|(?<=, )|(?<=\{))("
                     + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True)))
                     + r")(?=[ :]|$)")
    out, last = [], 0
    for m in QUOTED.finditer(text):
        out.append(pat.sub(lambda k: mapping[k.group(1)], text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(pat.sub(lambda k: mapping[k.group(1)], text[last:]))
    return "".join(out)


def alias_example(rng, ex):
    """Rename every tool of ex (and the top-level parameters of some) in
    tools, answers and reasoning, consistently. Returns a new example."""
    tool_map, taken = {}, set()
    for t in ex["tools"]:
        tool_map[t["name"]] = _unique(rng, tool_alias, t["name"], taken)
        taken.add(tool_map[t["name"]])
    param_maps, tools = {}, []
    for t in ex["tools"]:
        props = t["parameters"]["properties"]
        pm, ptaken = {}, set()
        if rng.random() < 0.5:
            for p in props:
                pm[p] = _unique(rng, param_alias, p, ptaken | set(props) - {p})
                ptaken.add(pm[p])
        param_maps[t["name"]] = pm
        params = dict(t["parameters"])
        params["properties"] = {pm.get(k, k): v for k, v in props.items()}
        if "required" in params:
            params["required"] = [pm.get(k, k) for k in params["required"]]
        tools.append({"name": tool_map[t["name"]], "description": t["description"], "parameters": params})
    answers = [{"name": tool_map[a["name"]],
                "arguments": {param_maps[a["name"]].get(k, k): v for k, v in a["arguments"].items()}}
               for a in ex["answers"]]
    # reasoning: "tool: param value, ...; then tool2: ..." -- rename per call segment
    parts = ex["reasoning"].split("; then ") if ex["answers"] else [ex["reasoning"]]
    if ex["answers"] and len(parts) == len(ex["answers"]):
        parts = [_rename_words(p, {a["name"]: tool_map[a["name"]], **param_maps[a["name"]]})
                 for p, a in zip(parts, ex["answers"])]
    out = dict(ex)
    out.update(tools=tools, answers=answers, reasoning="; then ".join(parts))
    return out
