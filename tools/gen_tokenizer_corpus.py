#!/usr/bin/env python3
"""Generate examples/tokenizer_corpus.txt: a small, deterministic,
tool-calling flavoured English + JSON corpus for training the demo
tokenizer (tools/train_tokenizer.sh). Output is < 1 MB."""
import json
import random
import sys

R = random.Random(20240531)

VERBS = """get set find search book cancel create update delete list send schedule remind
convert translate calculate check play pause stop start open close read write add remove
fetch lookup order reserve track compare summarize explain show turn adjust rename move
copy share upload download sync record call text email notify plan estimate filter sort
merge split count measure locate navigate route subscribe unsubscribe archive restore""".split()
NOUNS = """weather forecast temperature flight hotel restaurant table meeting event calendar
reminder alarm timer message email contact file folder document photo video song playlist
album artist podcast news article stock price currency exchange rate recipe ingredient
order package delivery shipment invoice payment account balance transfer budget expense
receipt ticket movie showtime theater train bus taxi ride route traffic map location
address city country language word sentence paragraph note task project issue bug report
device light thermostat lock camera speaker volume brightness battery network password
user profile setting preference language timezone date time duration distance speed
height weight calorie step workout exercise medication appointment doctor hospital
pharmacy school class course exam grade homework library book author chapter page
question answer summary result error warning status code query database record field
table column row index key value list array object string number boolean schema tool
function argument parameter option flag command request response server client token
model dataset example batch epoch loss metric score label category tag comment review
rating star photo gallery image color size shape font style theme layout button window
screen keyboard mouse printer scanner router modem cable charger adapter headphone""".split()
ADJS = """new old big small fast slow cheap expensive nearby remote local public private
early late next previous first last daily weekly monthly yearly urgent important quiet
loud bright dark warm cold hot cool sunny rainy cloudy windy snowy foggy humid dry
vegetarian vegan spicy sweet sour fresh frozen organic simple complex short long
detailed brief formal casual friendly polite quick careful exact approximate total
average minimum maximum current recent upcoming pending completed failed successful""".split()
CITIES = """London Paris Berlin Madrid Rome Lisbon Vienna Prague Warsaw Budapest Athens
Dublin Amsterdam Brussels Copenhagen Stockholm Oslo Helsinki Zurich Geneva Munich
Hamburg Milan Naples Barcelona Seville Porto Lyon Marseille Tokyo Osaka Kyoto Seoul
Beijing Shanghai Singapore Bangkok Jakarta Manila Sydney Melbourne Auckland Toronto
Vancouver Montreal Chicago Boston Seattle Denver Austin Dallas Houston Miami Atlanta
Phoenix Portland Nairobi Lagos Cairo Casablanca Johannesburg Istanbul Dubai Mumbai
Delhi Bangalore Chennai Karachi Lima Bogota Santiago Quito Caracas Havana Mexico""".split()
NAMES = """Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah
Olivia Peter Quinn Rachel Samuel Tina Umar Victor Wendy Xavier Yara Zoe Ahmed Priya
Chen Wei Yuki Hiro Sofia Mateo Lucas Mia Ethan Ava Isabella Mason Logan Chloe Ella
Jonas Lena Felix Clara Hugo Ines Tomas Anya Dmitri Olga Kofi Amara Zainab Ravi""".split()
UNITS = "celsius fahrenheit kelvin meters kilometers miles feet inches kilograms pounds".split()
CURRENCIES = "USD EUR GBP JPY CHF CAD AUD CNY INR BRL MXN KRW SEK NOK".split()
WORDS = VERBS + NOUNS + ADJS
FILLER = """the a an to for of in on at with from by about please could you would
can me my our your this that these those and or but if when while before after
then also just now today tomorrow tonight morning afternoon evening week month
year is are was were be been will should must may might do does did have has""".split()


def snake(*parts):
    return "_".join(parts)


def camel(*parts):
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def make_tool():
    verb, noun = R.choice(VERBS), R.choice(NOUNS)
    name = snake(verb, noun) if R.random() < 0.7 else camel(verb, noun)
    props, req = {}, []
    for _ in range(R.randint(1, 4)):
        pname = R.choice(NOUNS + ["query", "id", "limit", "unit", "when", "to", "from"])
        kind = R.choice(["string", "string", "integer", "number", "boolean", "array"])
        spec = {"type": kind, "description": f"The {R.choice(ADJS)} {pname} to use"}
        if kind == "string" and R.random() < 0.3:
            spec["enum"] = R.sample(UNITS + CURRENCIES, 3)
        if kind == "array":
            spec["items"] = {"type": "string"}
        props[pname] = spec
        if R.random() < 0.6:
            req.append(pname)
    return {"name": name,
            "description": f"{verb.capitalize()} the {R.choice(ADJS)} {noun} for a user.",
            "parameters": {"type": "object", "properties": props, "required": req}}


def value_for(spec):
    t = spec["type"]
    if "enum" in spec:
        return R.choice(spec["enum"])
    if t == "integer":
        return R.choice([R.randint(0, 20), R.randint(0, 5000), R.randint(1900, 2030)])
    if t == "number":
        return round(R.uniform(-50, 500), R.choice([1, 2, 3]))
    if t == "boolean":
        return R.random() < 0.5
    if t == "array":
        return R.sample(CITIES + NAMES, R.randint(1, 3))
    return R.choice([R.choice(CITIES), R.choice(NAMES), " ".join(R.sample(WORDS, 2)),
                     f"{R.randint(1, 28):02d}/{R.randint(1, 12):02d}/{R.randint(2020, 2030)}",
                     f"{R.randint(0, 23):02d}:{R.choice(['00', '15', '30', '45'])}",
                     f"{R.choice(NAMES).lower()}@example.com"])


def sentence():
    n = R.randint(5, 16)
    words = [R.choice(FILLER if R.random() < 0.45 else WORDS + CITIES + NAMES) for _ in range(n)]
    s = " ".join(words)
    return s[0].upper() + s[1:] + R.choice([".", ".", "?", "!"])


def example():
    tools = [make_tool() for _ in range(R.randint(1, 3))]
    tool = R.choice(tools)
    args = {k: value_for(v) for k, v in tool["parameters"]["properties"].items()
            if k in tool["parameters"]["required"] or R.random() < 0.5}
    query = f"{R.choice(['Please', 'Can you', 'Could you', 'I need to', 'Help me'])} " \
            f"{tool['name'].replace('_', ' ')} " + " ".join(str(v) for v in args.values())
    reasoning = f"The user wants to {tool['name'].replace('_', ' ')}; I will call {tool['name']}."
    answers = [{"name": tool["name"], "arguments": args}]
    return tools, query, reasoning, answers


def main(out):
    lines = []
    size = 0
    while size < 900_000:
        tools, query, reasoning, answers = example()
        kind = R.random()
        if kind < 0.35:
            line = json.dumps({"query": query, "tools": tools, "answers": answers},
                              separators=(",", ":"))
        elif kind < 0.55:
            line = ("<|im_start|>user\n<tools>" + json.dumps(tools, separators=(",", ":"))
                    + "</tools>\n" + query + "<|im_end|>\n<|im_start|>assistant\n<think>"
                    + reasoning + "</think>\n<tool_call>"
                    + json.dumps(answers, separators=(",", ":")) + "</tool_call><|im_end|>")
        elif kind < 0.65:
            line = "<tool_result>" + json.dumps({"status": "ok", "result": value_for(
                {"type": R.choice(["string", "number", "integer"])})}) + "</tool_result>"
        else:
            line = " ".join(sentence() for _ in range(R.randint(1, 4)))
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/tokenizer_corpus.txt")
