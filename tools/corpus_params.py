"""Parameter library for tools/gen_toolcall_corpus.py: each entry is a JSON
schema plus how a value is drawn and said in a query. Standard library only.

A parameter is a dict: schema (what goes in the tool), gen(rng) -> (value,
surface), phrases (templates with {v} for the surface). Every string value is
said verbatim in the query and every integer as digits or words, so a test can
check that arguments are grounded in the query."""

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


# Share of integers below 1000 said in words rather than digits
# (gen_reading_corpus.py --words-rate sets it; 0.35 gives the corpora the
# recipe's stages 1-6 were trained on).
WORDS_RATE = 0.35


def int_words(n):
    """English words for 0 <= n < 1000 ("forty-two", "one hundred and five")."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    rest = n % 100
    return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + int_words(rest))


CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Perth",
          "Quito", "Berlin", "Nairobi", "Denver", "Madrid", "Hanoi", "Dublin", "Toronto",
          "Mumbai", "Chicago", "Lisbon", "San Francisco", "New York", "Buenos Aires",
          "Cape Town", "Kyoto", "Reykjavik", "Montreal", "Athens", "S\u00e3o Paulo",
          "Z\u00fcrich", "Krak\u00f3w", "Istanbul", "Jakarta", "Melbourne", "Vienna"]
PEOPLE = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Priya", "Liam",
          "Sofia", "Kenji", "Olivia", "Mateo", "Aisha", "Noah", "Yuki", "Lucas", "Fatima",
          "Oscar", "Mei", "Jonas", "Zo\u00eb", "Ren\u00e9e", "Tom\u00e1s", "Ingrid", "Omar",
          "Mom", "Dad", "Grandma", "my boss", "Dr. Patel", "Sarah Kim", "James O'Neil"]
DATES = ["today", "tomorrow", "tonight", "this Friday", "next Monday", "next Tuesday",
         "on Saturday", "this weekend", "March 3", "April 21", "June 14", "July 4th",
         "2026-05-12", "2026-11-30", "December 24", "the 15th", "next week", "Sunday morning"]
ISO_DATES = ["2026-01-09", "2026-02-14", "2026-03-30", "2026-05-12", "2026-06-01",
             "2026-07-18", "2026-08-23", "2026-09-05", "2026-10-31", "2026-12-24"]
TIMES = ["7:30 am", "8 pm", "noon", "09:15", "18:45", "6:00", "half past five", "10 am",
         "midnight", "3:20 pm", "quarter to nine", "21:00"]
HHMM = ["06:30", "07:00", "08:15", "09:45", "12:00", "13:30", "17:05", "19:20", "22:10"]
ARTISTS = ["Adele", "Miles Davis", "Taylor Swift", "Radiohead", "Beyonc\u00e9", "Bach",
           "Daft Punk", "Fela Kuti", "Nina Simone", "Coldplay", "BTS", "Bob Marley"]
SONGS = ["Hey Jude", "Bohemian Rhapsody", "Clair de Lune", "Blue in Green", "Halo",
         "Yellow", "Redemption Song", "Dancing Queen", "Feeling Good", "Around the World"]
GENRES = ["jazz", "rock", "classical", "hip hop", "lo-fi", "reggae", "pop", "afrobeat"]
ROOMS = ["kitchen", "living room", "bedroom", "garage", "office", "hallway", "bathroom",
         "kids room", "basement", "patio"]
DISHES = ["lasagna", "pad thai", "shakshuka", "banana bread", "chicken curry", "ramen",
          "tacos", "risotto", "pancakes", "falafel", "jollof rice", "minestrone"]
ITEMS = ["milk", "eggs", "bread", "coffee", "apples", "rice", "olive oil", "toilet paper",
         "batteries", "tomatoes", "cheese", "dish soap", "oat milk", "bananas", "pasta"]
TOPICS = ["budget review", "team sync", "dentist", "yoga class", "project kickoff",
          "parent meeting", "lunch with Ana", "quarterly report", "car service", "haircut"]
MESSAGES = ["running ten minutes late", "see you at the station", "call me when you land",
            "dinner is ready", "happy birthday!", "can we move our meeting?",
            "I left the keys under the mat", "thanks for today", "on my way",
            "don't forget the tickets"]
NOTES = ["buy a birthday gift for Liam", "renew passport", "ideas for the garden",
         "call the plumber", "book club questions", "password hint: blue door",
         "pick up dry cleaning", "draft of the speech"]
EMAILS = ["ana@example.com", "ben.t@mail.org", "priya.k@work.io", "support@shop.example",
          "hugo99@inbox.net", "team@startup.dev"]
SUBJECTS = ["Invoice for March", "Trip plans", "Quick question", "Meeting notes",
            "Weekend?", "Contract draft", "Re: the offer"]
AIRPORTS = ["JFK", "LHR", "CDG", "NRT", "LOS", "SFO", "DXB", "GRU", "SYD", "AMS"]
STOCKS = ["AAPL", "TSLA", "MSFT", "NVDA", "AMZN", "GOOG", "SHOP", "SONY"]
TEAMS = ["Arsenal", "Lakers", "Real Madrid", "Yankees", "Celtics", "Al Ahly", "Boca Juniors"]
LANGS = ["Spanish", "French", "Japanese", "German", "Swahili", "Portuguese", "Korean",
         "Italian", "Hindi", "Arabic"]
PHRASES_TR = ["where is the train station", "good morning", "how much does this cost",
              "thank you very much", "I am allergic to peanuts", "see you tomorrow"]
BOOKS = ["Dune", "Beloved", "The Hobbit", "Things Fall Apart", "Educated", "Sapiens",
         "Pachinko", "The Road"]
MOVIES = ["Inception", "Spirited Away", "Black Panther", "Parasite", "Arrival", "Coco",
          "The Matrix", "Amelie"]
PLACES = ["the airport", "Central Park", "the office", "Union Station", "the nearest pharmacy",
          "Mom's house", "the gym", "the museum", "a gas station", "the beach"]
STREETS = ["12 Baker Street", "450 Market St", "7 Rue Cler", "88 Queen Road",
           "31 Elm Avenue", "1600 Ocean Drive", "5 Harbour Lane"]
ZIPS = ["94103", "10001", "60614", "73301", "02139", "98101"]
PETS = ["Max", "Luna", "Bella", "Charlie", "Milo", "Coco", "Rocky", "Nala"]
PLANTS = ["monstera", "fiddle leaf fig", "basil", "orchid", "snake plant", "tomato plants",
          "fern", "cactus"]
CARS = ["Tesla", "the Civic", "my truck", "the van", "the Corolla"]
DRUGS = ["ibuprofen", "vitamin D", "amoxicillin", "insulin", "allergy pills", "metformin"]
EXERCISES = ["running", "cycling", "swimming", "yoga", "rowing", "hiking", "pilates"]
COURSES = ["calculus", "organic chemistry", "world history", "Spanish 101", "piano",
           "machine learning"]
PROJECTS = ["website redesign", "mobile app", "Q3 launch", "data migration", "onboarding"]
TASKS = ["fix the login bug", "write release notes", "review the budget", "update the roadmap",
         "clean the garage", "pay the electricity bill", "email the landlord"]
RESTAURANTS = ["Nobu", "Chez Panisse", "the sushi place", "Luigi's", "Dishoom", "Zuma"]
CUISINES = ["Italian", "Thai", "Mexican", "Ethiopian", "Japanese", "Indian", "Lebanese"]
PODCASTS = ["Radiolab", "The Daily", "Serial", "Hardcore History", "Planet Money"]
COLORS = ["red", "warm white", "blue", "green", "purple", "orange"]
CHANNELS = ["general", "random", "design", "engineering", "announcements"]
GAMES = ["chess", "Minecraft", "Fortnite", "Zelda", "FIFA", "Tetris"]
CHARITIES = ["Red Cross", "UNICEF", "Doctors Without Borders", "the food bank"]
DOCS = ["passport", "lease agreement", "tax return", "resume", "insurance card"]


def S(desc, values, phrases, **extra):
    """A string said verbatim."""
    sch = {"type": "string", "description": desc}
    sch.update(extra)

    def gen(rng):
        v = rng.choice(values)
        return v, v
    return {"schema": sch, "gen": gen, "phrases": phrases}


def I(desc, lo, hi, phrases, words=True, span=None):
    """An integer in [lo, hi] said as digits or, sometimes, as words."""
    a, b = span or (lo, hi)

    def gen(rng):
        v = rng.randint(a, b)
        if words and v < 1000 and rng.random() < WORDS_RATE:
            return v, int_words(v)
        return v, str(v)
    sch = {"type": "integer", "description": desc, "minimum": lo, "maximum": hi}
    return {"schema": sch, "gen": gen, "phrases": phrases}


def N(desc, lo, hi, phrases, span=None):
    """A number (float, never integral) in [lo, hi], said in digits."""
    a, b = span or (lo, hi)

    def gen(rng):
        v = round(rng.randint(int(a), int(b) - 1) + rng.choice([0.25, 0.5, 0.75, 0.1, 0.9]), 2)
        return v, repr(v)
    sch = {"type": "number", "description": desc, "minimum": lo, "maximum": hi}
    return {"schema": sch, "gen": gen, "phrases": phrases}


def B(desc, true_phrases, false_phrases):
    """A boolean: which phrase is said decides the value."""
    def gen(rng):
        return (True, "") if rng.random() < 0.6 else (False, "")
    return {"schema": {"type": "boolean", "description": desc}, "gen": gen,
            "phrases": None, "bool": (true_phrases, false_phrases)}


def E(desc, values, phrases):
    """An enum whose value is said verbatim."""
    def gen(rng):
        v = rng.choice(values)
        return v, v
    return {"schema": {"type": "string", "enum": list(values), "description": desc},
            "gen": gen, "phrases": phrases}


def A(desc, values, phrases, lo=1, hi=3):
    """An array of distinct strings, said as "a, b and c"."""
    def gen(rng):
        vs = rng.sample(values, rng.randint(lo, hi))
        said = vs[0] if len(vs) == 1 else ", ".join(vs[:-1]) + " and " + vs[-1]
        return vs, said
    sch = {"type": "array", "description": desc, "items": {"type": "string"},
           "minItems": lo, "maxItems": hi}
    return {"schema": sch, "gen": gen, "phrases": phrases}


def O(desc, props, lead, required=()):
    """A nested object: its fields are said one after another after a lead word."""
    return {"schema": None, "object": (desc, props, list(required)), "lead": lead}


def AO(desc, obj, lo=1, hi=3):
    """An array of nested objects, said as "X, Y and Z"."""
    return {"schema": None, "array_of": (desc, obj, lo, hi)}
