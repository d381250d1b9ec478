"""Independent check of sampled tool calls: Debian's python3-jsonschema
validates each call's arguments against its tool's parameters schema.

OpenAPI 3.0 spellings the validator does not know are rewritten first
(as OpenAPI 3.0.3 defines them): `nullable: true` next to a `type` adds
"null" to the types (an `enum` still has to list null itself), and a
boolean `exclusiveMinimum`/`exclusiveMaximum` (draft 4) becomes the
numeric form. Formats are checked where jsonschema has a checker (date,
date-time, time, email, ipv4, ...)."""
import copy
import datetime
import json
import re

import jsonschema

# draft 7's checkers (a copy: the checks added below stay here)
FORMATS = copy.copy(jsonschema.Draft7Validator.FORMAT_CHECKER)
FORMATS.checkers = dict(jsonschema.Draft7Validator.FORMAT_CHECKER.checkers)
_TIME = r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))"


def _time_ok(m):
    h, mi, sec = int(m[0]), int(m[1]), int(m[2])
    oh, om = int(m[5] or 0), int(m[6] or 0)
    return h <= 23 and mi <= 59 and sec <= 60 and oh <= 23 and om <= 59


# RFC 3339 date-time and time where jsonschema has no checker for them
# (Debian's lacks rfc3339-validator): the day must exist in its month
if "date-time" not in FORMATS.checkers:
    @FORMATS.checks("date-time")
    def _date_time(s):
        m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)[Tt]" + _TIME, s) if isinstance(s, str) else None
        if not m:
            return not isinstance(s, str)
        try:
            datetime.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return False
        return _time_ok(m.groups()[3:])
if "time" not in FORMATS.checkers:
    @FORMATS.checks("time")
    def _time(s):
        m = re.fullmatch(_TIME, s) if isinstance(s, str) else None
        return not isinstance(s, str) or bool(m and _time_ok(m.groups()))
# errors() prefix when the validator itself cannot read the schema
UNCHECKED = "unchecked: "


def normalise(s):
    """A copy of schema s in the JSON-Schema draft 7 the validator reads."""
    if isinstance(s, list):
        return [normalise(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: normalise(v) for k, v in s.items()}
    if out.get("nullable") is True and "type" in out:
        t = out["type"]
        t = list(t) if isinstance(t, list) else [t]
        if "null" not in t:
            t.append("null")
        out["type"] = t
    for ex, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(ex), bool):
            if out[ex] and bound in out:
                out[ex] = out.pop(bound)
            else:
                del out[ex]
    return out


def tool_list(tools):
    """name -> parameters schema (None: no parameters) of a tools array"""
    out = {}
    for t in tools:
        if "name" not in t and isinstance(t.get("function"), dict):
            t = t["function"]
        out[t["name"]] = t.get("parameters")
    return out


class Checker:
    def __init__(self, tools):
        self.validators = {}
        for name, params in tool_list(tools).items():
            if params is None:
                params = {"type": "object", "additionalProperties": False}
            self.validators[name] = jsonschema.Draft7Validator(normalise(copy.deepcopy(params)),
                                                               format_checker=FORMATS)

    def errors(self, line):
        """'' when the sampled line is a valid call list, else why not"""
        try:
            calls = json.loads(line)
        except ValueError as e:
            return f"not JSON: {e}"
        if not isinstance(calls, list):
            return "not a JSON array"
        for i, c in enumerate(calls):
            if not isinstance(c, dict) or set(c) != {"name", "arguments"}:
                return f"call {i}: not {{name, arguments}}"
            v = self.validators.get(c["name"])
            if v is None:
                return f"call {i}: undeclared tool {c['name']!r}"
            if not isinstance(c["arguments"], dict):
                return f"call {i}: arguments is not an object"
            try:
                err = next(iter(v.iter_errors(c["arguments"])), None)
            except Exception as e:  # a pattern Python cannot read, a dangling $ref
                return f"{UNCHECKED}call {i} ({c['name']}): {type(e).__name__}: {str(e)[:200]}"
            if err is not None:
                where = "/".join(str(p) for p in err.absolute_path)
                return f"call {i} ({c['name']}) at /{where}: {err.message[:300]}"
        return ""
