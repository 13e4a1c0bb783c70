"""Word lists for the guard: number words, units, negations, opposites, contrast sets,
names users type in lower case, and question types. Kept apart from the rules so the
rules stay readable and the lists can grow without touching logic."""

from __future__ import annotations

# Word lists read better packed than one word per line.
# fmt: off

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINALS = [
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth",
]

TENS_WORDS = frozenset(_TENS)
MULTIPLIER_WORDS = frozenset({"hundred", "thousand", "million", "billion", "trillion", "dozen"})
NUMBER_WORDS: dict[str, float] = {
    **{w: float(i) for i, w in enumerate(_ONES) if i},  # "zero"/"one" are too often words
    **{w: float(20 + 10 * i) for i, w in enumerate(_TENS)},
    **{w: float(i + 2) for i, w in enumerate(_ORDINALS[1:])},  # "first" is usually not a rank
    "hundred": 100.0, "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12,
    "dozen": 12.0, "half": 0.5, "quarter": 0.25, "twice": 2.0, "double": 2.0, "triple": 3.0,
    "zero": 0.0,
    # Roman numerals as in "World War II", "Rocky III" ("i", "v", "x" are too often words).
    "ii": 2.0, "iii": 3.0, "iv": 4.0, "vi": 6.0, "vii": 7.0, "viii": 8.0, "ix": 9.0, "xi": 11.0,
    "xii": 12.0,
}

_UNIT_GROUPS: dict[str, list[str]] = {
    "fahrenheit": ["fahrenheit", "°f", "° f", "farenheit"],
    "celsius": ["celsius", "°c", "° c", "centigrade", "celcius"], "kelvin": ["kelvin", "°k"],
    "km": ["km", "kms", "kilometer", "kilometers", "kilometre", "kilometres"],
    "mile": ["mile", "miles", "mi"], "meter": ["meter", "meters", "metre", "metres"],
    "cm": ["cm", "centimeter", "centimeters", "centimetre", "centimetres"],
    "mm": ["mm", "millimeter", "millimeters", "millimetre", "millimetres"],
    "foot": ["ft", "foot", "feet"], "inch": ["inch", "inches"], "yard": ["yard", "yards", "yd"],
    "kg": ["kg", "kgs", "kilogram", "kilograms", "kilo", "kilos"],
    "gram": ["gram", "grams", "gr"], "mg": ["mg", "milligram", "milligrams"],
    "pound": ["lb", "lbs", "pound", "pounds"], "ounce": ["oz", "ounce", "ounces"],
    "stone": ["stone", "stones"], "ton": ["ton", "tons", "tonne", "tonnes"],
    "liter": ["liter", "liters", "litre", "litres"],
    "ml": ["ml", "milliliter", "milliliters", "millilitre", "millilitres"],
    "gallon": ["gallon", "gallons", "gal"], "quart": ["quart", "quarts"],
    "pint": ["pint", "pints"], "cup": ["cup", "cups"],
    "tablespoon": ["tablespoon", "tablespoons", "tbsp"],
    "teaspoon": ["teaspoon", "teaspoons", "tsp"], "second": ["sec", "secs", "seconds"],
    "minute": ["min", "mins", "minute", "minutes"],
    "hour": ["hour", "hours", "hr", "hrs", "hourly"],
    "day": ["day", "days", "daily"], "week": ["week", "weeks", "weekly"],
    "month": ["month", "months", "monthly"],
    "year": ["year", "years", "yr", "yrs", "yearly", "annual", "annually"], "mph": ["mph"],
    "kph": ["kph", "kmh", "km/h"],
    "byte": ["byte", "bytes"], "kb": ["kb", "kilobyte", "kilobytes"],
    "mb": ["mb", "megabyte", "megabytes"], "gb": ["gb", "gigabyte", "gigabytes"],
    "tb": ["tb", "terabyte", "terabytes"], "megabit": ["mbps", "megabit", "megabits", "mbit"],
    "gigabit": ["gbps", "gigabit", "gigabits", "gbit"],
    "newton-meter": ["nm", "newton", "newtons", "newton-meter", "newton-meters"],
    "foot-pound": ["ft-lb", "ft-lbs", "foot-pound", "foot-pounds"], "psi": ["psi"],
    "bar": ["bar"], "pascal": ["pa", "kpa", "pascal", "pascals"], "mmol": ["mmol", "mmol/l"],
    "mg/dl": ["mg/dl"], "watt": ["watt", "watts", "w"], "kw": ["kw", "kilowatt", "kilowatts"],
    "kwh": ["kwh"], "volt": ["volt", "volts", "v"], "amp": ["amp", "amps", "ampere", "amperes"],
    "calorie": ["calorie", "calories", "kcal", "cal"], "joule": ["joule", "joules"],
    "acre": ["acre", "acres"], "hectare": ["hectare", "hectares"],
    "usd": ["$", "usd", "dollar", "dollars", "bucks"], "eur": ["€", "eur", "euro", "euros"],
    "gbp": ["£", "gbp", "sterling", "quid"], "jpy": ["¥", "jpy", "yen"],
    "inr": ["₹", "inr", "rupee", "rupees"], "cad": ["cad"], "aud": ["aud"],
    "chf": ["chf", "franc", "francs"], "cny": ["cny", "yuan", "rmb"],
    "mxn": ["mxn", "peso", "pesos"], "btc": ["btc", "bitcoin", "bitcoins"],
    "eth": ["eth", "ethereum"], "percent": ["%", "percent", "percentage"],
    "degree": ["degree", "degrees", "°"],
}
CURRENCY_SIGNS = frozenset({"$", "€", "£", "¥", "₹"})
UNITS: dict[str, str] = {alias: unit for unit, aliases in _UNIT_GROUPS.items() for alias in aliases}
UNIT_NAMES = frozenset(_UNIT_GROUPS)
# Single letters are units only right after a number ("100 f", "5 l").
LETTER_UNITS = {
    "c": "celsius", "f": "fahrenheit", "g": "gram", "l": "liter", "h": "hour", "m": "meter",
    "s": "second",
}

# Time units a whole number of another makes: "14 days" is "2 weeks", "12 months" "1 year".
# Tried in order (days make years before weeks: 365 days is a year, not 52.1 weeks).
LARGER_TIME_UNITS: dict[str, list[tuple[int, str]]] = {
    "second": [(60, "minute")], "minute": [(60, "hour")], "hour": [(24, "day")],
    "day": [(365, "year"), (7, "week")], "month": [(12, "year")],
}
CARDINAL_WORDS = frozenset(_ONES[1:] + _TENS)
# A unit right after these is what the question asks for: "how many miles", "what percent".
ASKING_WORDS = frozenset({"what", "which", "many", "much"})
TIME_UNIT_NAMES = frozenset({"second", "minute", "hour", "day", "week", "month", "year"})
# "second" after these is the unit ("per second"), not the ordinal.
ORDINAL_UNIT_WORDS = frozenset({"second"})
PER_WORDS = frozenset({"per", "a", "an", "each", "every", "one"})
# A preposition shortly before a time ("in the first 48 hours", "after 30 days") says
# whether the question asks before, during or after it. "in" directly before a number
# ("in 10 years") means "after", as often as "during": only "in the ..." counts.
TEMPORAL_PREPOSITIONS = {
    "in": "during", "within": "during", "during": "during", "inside": "during",
    "after": "after", "past": "after", "beyond": "after", "later": "after",
    "before": "before", "until": "before", "till": "before", "prior": "before",
}
TIME_ORDINALS = frozenset({"first", "last", "next", "initial", "final"})

NEGATIONS = frozenset(
    {
        "not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor",
        "without", "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt",
        "werent", "wont", "wouldnt", "shouldnt", "couldnt", "havent", "hasnt", "hadnt",
        "unable", "fail", "fails", "failed", "failing", "unless",
    }
)
# Verbs that carry a negation: "to avoid the fee" is "to not pay the fee", "my bulb
# ignores commands" is "my bulb is not responding", "forgot" is "can't remember".
IMPLIED_NEGATIVES = frozenset(
    {
        "avoid", "ignore", "forget", "forgot", "forgotten", "skip", "prevent", "refuse", "lack",
        "lost", "lose", "missing", "stop", "stopped", "empty",
    }
)
# "without losing the changes" asks to keep them: a negation that cancels out.
LOSS_VERBS = frozenset(
    {
        "lose", "losing", "delete", "deleting", "break", "breaking", "damage", "damaging",
        "erase", "erasing", "wipe", "wiping", "ruin", "ruining", "hurt", "hurting",
        "remove", "removing", "overwrite", "overwriting",
    }
)

# Opposites: one side in one question and the other side in the other flips the answer.
ANTONYM_PAIRS: list[tuple[str, str]] = [
    ("before", "after"), ("within", "after"), ("within", "beyond"), ("above", "below"),
    ("over", "under"), ("more", "less"), ("more", "fewer"), ("most", "least"), ("max", "min"),
    ("maximum", "minimum"), ("increase", "decrease"), ("increase", "reduce"),
    ("raise", "lower"), ("higher", "lower"), ("high", "low"), ("highest", "lowest"),
    ("up", "down"), ("upload", "download"), ("import", "export"), ("input", "output"),
    ("buy", "sell"), ("buying", "selling"), ("buyer", "seller"), ("add", "remove"),
    ("add", "subtract"), ("plus", "minus"), ("multiply", "divide"), ("sum", "difference"),
    ("install", "uninstall"), ("enable", "disable"), ("activate", "deactivate"),
    ("encrypt", "decrypt"), ("encode", "decode"), ("compress", "decompress"), ("zip", "unzip"),
    ("serialize", "deserialize"), ("lock", "unlock"), ("open", "close"), ("opening", "closing"),
    ("on", "off"), ("start", "stop"), ("start", "end"), ("begin", "end"), ("first", "last"),
    ("earliest", "latest"), ("early", "late"), ("oldest", "newest"), ("youngest", "oldest"),
    ("best", "worst"), ("better", "worse"), ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "drawbacks"), ("largest", "smallest"), ("biggest", "smallest"),
    ("big", "small"), ("large", "small"), ("long", "short"), ("longest", "shortest"),
    ("tallest", "shortest"), ("fast", "slow"), ("faster", "slower"), ("fastest", "slowest"),
    ("cheap", "expensive"), ("cheapest", "expensive"), ("cheaper", "expensive"),
    ("hot", "cold"), ("warm", "cool"), ("heat", "cool"), ("heating", "cooling"),
    ("push", "pull"), ("send", "receive"), ("sent", "received"), ("win", "lose"), ("won", "lost"),
    ("gain", "lose"), ("gain", "loss"), ("profit", "loss"), ("positive", "negative"),
    ("pass", "fail"), ("accept", "reject"), ("allow", "block"), ("allow", "deny"),
    ("approve", "deny"), ("approve", "reject"), ("include", "exclude"), ("inside", "outside"),
    ("internal", "external"), ("left", "right"), ("north", "south"), ("east", "west"),
    ("light", "dark"), ("light", "heavy"), ("wet", "dry"), ("full", "empty"), ("hard", "soft"),
    ("easy", "hard"), ("easy", "difficult"), ("safe", "dangerous"), ("safe", "unsafe"),
    ("safe", "toxic"), ("legal", "illegal"), ("healthy", "unhealthy"), ("true", "false"),
    ("synchronous", "asynchronous"), ("sync", "async"), ("client", "server"),
    ("frontend", "backend"), ("public", "private"), ("static", "dynamic"), ("local", "remote"),
    ("lowercase", "uppercase"), ("ascending", "descending"), ("horizontal", "vertical"),
    ("horizontally", "vertically"), ("row", "column"), ("width", "height"), ("read", "write"),
    ("get", "post"), ("attach", "detach"), ("mount", "unmount"), ("connect", "disconnect"),
    ("subscribe", "unsubscribe"), ("login", "logout"), ("debit", "credit"),
    ("deposit", "withdraw"), ("deposit", "withdrawal"), ("borrow", "lend"),
    ("lender", "borrower"), ("landlord", "tenant"), ("employer", "employee"),
    ("inhale", "exhale"), ("arrival", "departure"), ("arrive", "depart"),
    ("incoming", "outgoing"), ("inbound", "outbound"), ("forward", "backward"),
    ("next", "previous"), ("ahead", "behind"), ("top", "bottom"), ("front", "back"),
    ("upper", "lower"), ("odd", "even"), ("acidic", "alkaline"), ("acid", "base"),
    ("visible", "invisible"), ("domestic", "international"), ("weekday", "weekend"),
    ("keep", "discard"), ("keep", "throw"), ("give", "receive"), ("giving", "receiving"),
    ("raw", "cooked"), ("uncooked", "cooked"), ("fresh", "frozen"), ("maximize", "minimize"),
    ("overestimate", "underestimate"), ("overweight", "underweight"), ("rich", "poor"),
    ("strong", "weak"), ("thick", "thin"), ("tight", "loose"), ("expand", "collapse"),
    ("expand", "shrink"), ("merge", "split"), ("join", "leave"), ("hire", "fire"),
    ("ban", "unban"), ("follow", "unfollow"), ("mute", "unmute"), ("pause", "resume"),
    ("archive", "unarchive"), ("pin", "unpin"), ("hide", "show"), ("undo", "redo"),
    ("agree", "disagree"), ("like", "dislike"), ("true", "false"), ("success", "failure"),
    ("upgrade", "downgrade"), ("upstream", "downstream"), ("uphill", "downhill"),
    ("overcharged", "undercharged"), ("overpaid", "underpaid"), ("refund", "charge"),
    ("thicken", "thin"), ("thick", "thinner"), ("accept", "decline"), ("accept", "refuse"),
    ("peak", "off"), ("most", "fewest"), ("introduction", "conclusion"), ("beginning", "end"),
    ("minimum", "max"), ("min", "maximum"), ("entry", "exit"), ("sunrise", "sunset"),
    ("asleep", "awake"), ("sleep", "wake"), ("bull", "bear"), ("bullish", "bearish"),
    ("offense", "defense"), ("attack", "defend"), ("winner", "loser"), ("wins", "losses"),
    ("cause", "cure"), ("indoors", "outdoors"), ("indoor", "outdoor"),
    ("permanent", "temporary"), ("permanently", "temporarily"), ("same", "different"),
    ("similar", "different"), ("possible", "impossible"), ("likely", "unlikely"),
    ("necessary", "unnecessary"), ("required", "optional"), ("mandatory", "optional"),
    ("free", "paid"), ("online", "offline"), ("wired", "wireless"), ("open", "closed"),
    ("alive", "dead"), ("inclusive", "exclusive"), ("often", "rarely"),
    ("earlier", "later"), ("sooner", "later"), ("overcook", "undercook"),
    ("overwatering", "underwatering"), ("compile", "decompile"), ("legal", "unlawful"),
    ("refundable", "nonrefundable"), ("asleep", "wake"), ("taxable", "tax-free"), ("rise", "fall"),
]

# Who a question is for. The answer depends on it, so naming one on one side only asks a
# narrower question ("side effects of the flu shot in children" vs "... of the flu shot").
# Adults are left out: a question that names no one is usually about adults.
_SKILLS = {"beginner", "beginners", "novice", "novices", "intermediate", "expert", "experts"}
_AGES = {
    "baby", "babies", "infant", "infants", "toddler", "toddlers", "child", "children",
    "kid", "kids", "teen", "teens", "teenager", "teenagers", "adolescent", "adolescents",
    "senior", "seniors", "elderly", "puppy", "puppies", "kitten", "kittens",
}
AUDIENCE_GROUPS: list[set[str]] = [_SKILLS, _AGES]

# Sets of alternatives: naming a different member asks a different question.
CONTRAST_GROUPS: list[set[str]] = [
    {"spring", "summer", "autumn", "winter"},
    {"morning", "afternoon", "evening", "night", "midnight", "noon"},
    {"breakfast", "lunch", "dinner", "brunch"},
    # "advanced" ("in advance") and "adult" (the default) only as alternatives.
    _SKILLS | {"advanced"},
    _AGES | {"adult", "adults"},
    {"economy", "business", "premium"},
    {"man", "woman"},
    {"men", "women"},
    {"male", "female"},
    {"boy", "girl"},
    {"city", "state", "county", "country", "province", "dc", "continent"},
    {
        "mother", "father", "mom", "dad", "son", "daughter", "brother", "sister", "husband",
        "wife", "grandmother", "grandfather", "aunt", "uncle",
    },
    {
        "cat", "cats", "dog", "dogs", "rabbit", "hamster", "horse", "bird", "parrot", "fish",
        "goldfish", "turtle", "snake", "cow", "pig", "chicken", "sheep", "goat",
    },
    {
        "beef", "pork", "chicken", "lamb", "turkey", "salmon", "tuna", "shrimp", "tofu", "fish",
        "steak",
    },
    {"rice", "pasta", "quinoa", "oats", "bread", "potato", "potatoes"},
    {"coffee", "tea", "beer", "wine", "milk", "juice", "soda", "water"},
    {
        "bake", "baking", "fry", "frying", "boil", "boiling", "grill", "grilling", "roast",
        "roasting", "steam", "steaming", "microwave", "air-fry",
    },
    {"vegan", "vegetarian", "keto", "paleo", "gluten-free"},
    {
        "red", "orange", "yellow", "green", "blue", "purple", "pink", "black", "white", "brown",
        "gray", "grey",
    },
    {
        "car", "truck", "motorcycle", "bicycle", "bus", "train", "plane", "boat", "van",
        "scooter", "suv",
    },
    {"walking", "running", "cycling", "swimming", "hiking", "jogging", "rowing"},
    {
        "soccer", "basketball", "baseball", "tennis", "golf", "cricket", "hockey", "rugby",
        "volleyball", "badminton", "chess",
    },
    {"piano", "guitar", "violin", "drums", "flute", "cello", "ukulele", "saxophone", "trumpet"},
    {"laptop", "desktop", "tablet", "phone", "smartphone", "printer", "router", "tv"},
    {"checking", "savings"},
    {"mortgage", "lease", "rent"},
    {"monthly", "weekly", "daily", "yearly", "annual", "annually", "quarterly", "hourly"},
    {"sedan", "hatchback", "coupe", "convertible", "minivan"},
    {"gas", "petrol", "diesel", "electric", "hybrid"},
    {"email", "sms", "text", "phone", "mail", "fax"},
    {
        "csv", "json", "xml", "yaml", "pdf", "excel", "docx", "html", "markdown", "txt", "png",
        "jpg", "jpeg", "gif", "svg", "mp3", "mp4", "wav", "parquet",
    },
    {"get", "put", "patch", "delete"},
    # Operations on a thing: "list all pods" and "delete all pods" differ.
    {"list", "create", "delete", "rename", "copy", "move", "install", "upgrade", "merge"},
    {"key", "value"},
    {"reset", "restart"},
    {"mean", "median", "mode", "average"},
    {"solid", "liquid", "gas", "plasma"},
    {"addition", "subtraction", "multiplication", "division"},
    {"sine", "cosine", "tangent", "sin", "cos", "tan"},
    {"derivative", "integral"},
    {"noun", "verb", "adjective", "adverb", "pronoun", "preposition"},
    {"past", "present", "future"},
    {"heart", "lung", "lungs", "liver", "kidney", "kidneys", "brain", "stomach", "skin"},
    {"hurricane", "tornado", "earthquake", "tsunami", "flood", "wildfire"},
    {"wedding", "funeral", "birthday", "graduation", "anniversary"},
    {"cardio", "strength", "yoga", "pilates", "stretching"},
    {"protein", "carbs", "fat", "fiber", "sugar", "sodium", "caffeine", "calcium", "iron"},
    {"single", "double", "triple", "married", "divorced", "widowed"},
    {"bachelor", "bachelor's", "master", "master's", "phd", "doctorate", "associate"},
    {"undergraduate", "graduate", "postgraduate"},
    {"freelancer", "contractor", "employee", "intern"},
    {"rent", "own"},
    {"new", "used"},
    {"manual", "automatic"},
    {"sunny", "rainy", "snowy", "cloudy", "windy"},
    # Where food keeps: "last in the fridge" and "sit out at room temperature" differ
    # (fridge and refrigerator are synonyms below, so they never oppose each other).
    {"fridge", "refrigerator", "freezer", "room", "counter", "pantry"},
]

# Names users often type in lower case. Capitalised words are found without this list.
GAZETTEER = frozenset(
    {
        # countries
        "afghanistan", "albania", "algeria", "argentina", "armenia", "australia", "austria",
        "bangladesh", "belgium", "bolivia", "brazil", "bulgaria", "cambodia", "cameroon",
        "canada", "chile", "china", "colombia", "croatia", "cuba", "cyprus", "czechia",
        "denmark", "ecuador", "egypt", "england", "estonia", "ethiopia", "finland", "france",
        "germany", "ghana", "greece", "guatemala", "hungary", "iceland", "india", "indonesia",
        "iran", "iraq", "ireland", "israel", "italy", "jamaica", "japan", "jordan", "kenya",
        "korea", "kuwait", "latvia", "lebanon", "lithuania", "luxembourg", "malaysia", "mexico",
        "mongolia", "morocco", "nepal", "netherlands", "holland", "nigeria", "norway",
        "pakistan", "panama", "peru", "philippines", "poland", "portugal", "qatar", "romania",
        "russia", "scotland", "serbia", "singapore", "slovakia", "slovenia", "somalia", "spain",
        "sweden", "switzerland", "syria", "taiwan", "tanzania", "thailand", "tunisia", "turkey",
        "uganda", "ukraine", "uruguay", "venezuela", "vietnam", "wales", "yemen", "zimbabwe",
        "new zealand", "south africa", "saudi arabia", "north korea", "south korea",
        "sri lanka", "costa rica", "puerto rico", "dominican republic", "czech republic",
        "hong kong",
        # cities
        "amsterdam", "athens", "atlanta", "austin", "bangkok", "barcelona", "beijing", "berlin",
        "boston", "brussels", "budapest", "cairo", "chicago", "copenhagen", "dallas", "delhi",
        "denver", "dubai", "dublin", "edinburgh", "frankfurt", "geneva", "hamburg", "helsinki",
        "houston", "istanbul", "jakarta", "lisbon", "london", "madrid", "manchester",
        "melbourne", "miami", "milan", "montreal", "moscow", "mumbai", "munich", "nairobi",
        "oslo", "ottawa", "paris", "philadelphia", "phoenix", "portland", "prague", "rome",
        "seattle", "seoul", "shanghai", "stockholm", "sydney", "tokyo", "toronto", "vancouver",
        "vienna", "warsaw", "zurich", "kyoto", "osaka", "lagos", "lima", "bogota", "santiago",
        "new york", "los angeles", "san francisco", "las vegas", "san diego", "rio de janeiro",
        "buenos aires", "mexico city", "washington", "new orleans", "cape town", "tel aviv",
        # US states
        "alabama", "alaska", "arizona", "arkansas", "california", "colorado", "connecticut",
        "delaware", "florida", "georgia", "hawaii", "idaho", "illinois", "indiana", "iowa",
        "kansas", "kentucky", "louisiana", "maine", "maryland", "massachusetts", "michigan",
        "minnesota", "mississippi", "missouri", "montana", "nebraska", "nevada", "ohio",
        "oklahoma", "oregon", "pennsylvania", "tennessee", "texas", "utah", "vermont",
        "virginia", "wisconsin", "wyoming", "new jersey", "new mexico", "north carolina",
        "south carolina", "north dakota", "south dakota", "west virginia", "rhode island",
        "new hampshire", "ontario", "quebec", "bavaria",
        # languages and peoples
        "english", "french", "spanish", "german", "italian", "portuguese", "dutch", "russian",
        "chinese", "mandarin", "cantonese", "japanese", "korean", "arabic", "hindi", "urdu",
        "bengali", "turkish", "greek", "polish", "swedish", "norwegian", "danish", "finnish",
        "hebrew", "persian", "farsi", "thai", "vietnamese", "indonesian", "swahili", "latin",
        "ukrainian", "czech", "hungarian", "romanian", "tagalog", "american", "british",
        "canadian", "australian", "european", "asian", "african", "mexican", "indian",
        # programming, software, platforms
        "python", "java", "javascript", "typescript", "ruby", "rust", "golang", "kotlin",
        "swift", "scala", "haskell", "perl", "php", "lua", "julia", "matlab", "fortran",
        "cobol", "dart", "elixir", "erlang", "clojure", "bash", "powershell", "sql", "mysql",
        "postgresql", "sqlite", "mongodb", "redis", "cassandra", "elasticsearch", "kafka",
        "rabbitmq", "docker", "kubernetes", "terraform", "ansible", "jenkins", "github",
        "gitlab", "bitbucket", "git", "svn", "npm", "yarn", "pip", "conda", "poetry", "maven",
        "gradle", "react", "angular", "vue", "svelte", "django", "flask", "fastapi", "rails",
        "laravel", "spring", "express", "nextjs", "numpy", "pandas", "scipy", "matplotlib",
        "pytorch", "tensorflow", "keras", "sklearn", "scikit-learn", "jupyter", "vscode", "vim",
        "emacs", "intellij", "pycharm", "eclipse", "xcode", "linux", "ubuntu", "debian",
        "fedora", "centos", "arch", "windows", "macos", "ios", "android", "chromebook",
        "chrome", "firefox", "safari", "edge", "nginx", "apache", "aws", "azure", "gcp",
        "heroku", "vercel", "netlify", "cloudflare", "s3", "ec2", "lambda", "excel", "word",
        "powerpoint", "outlook", "gmail", "slack", "zoom", "teams", "discord", "whatsapp",
        "telegram", "signal", "instagram", "facebook", "twitter", "tiktok", "youtube",
        "linkedin", "reddit", "spotify", "netflix", "hulu", "paypal", "venmo", "stripe",
        "shopify", "wordpress", "photoshop", "figma", "notion", "dropbox", "onedrive", "icloud",
        "iphone", "ipad", "macbook", "airpods", "pixel", "galaxy", "playstation", "xbox",
        "nintendo", "switch", "steam", "minecraft", "fortnite", "bluetooth", "wifi",
        # companies and brands
        "google", "apple", "microsoft", "amazon", "meta", "tesla", "nvidia", "intel", "amd",
        "ibm", "oracle", "samsung", "sony", "toyota", "honda", "ford", "bmw", "audi",
        "mercedes", "volkswagen", "nissan", "hyundai", "kia", "chevrolet", "subaru", "mazda",
        "volvo", "porsche", "ferrari", "boeing", "airbus", "uber", "lyft", "airbnb", "ikea",
        "walmart", "costco", "target", "starbucks", "mcdonalds", "visa", "mastercard", "amex",
        "chase", "fedex", "ups", "usps", "dhl", "verizon", "comcast", "openai", "chatgpt",
        "claude", "gemini", "copilot", "llama",
        # drugs users name by brand or generic
        "ibuprofen", "acetaminophen", "aspirin", "naproxen", "amoxicillin", "metformin",
        "insulin", "melatonin", "omeprazole", "benadryl", "zyrtec", "claritin",
        # sky and calendar
        "mercury", "venus", "mars", "jupiter", "saturn", "uranus", "neptune", "pluto", "sun",
        "moon", "january", "february", "april", "june", "july", "august", "september",
        "october", "november", "december", "monday", "tuesday", "wednesday", "thursday",
        "friday", "saturday", "sunday", "christmas", "easter", "thanksgiving", "halloween",
        "ramadan", "diwali", "hanukkah",
    }
)

# Different spellings of one name; the value is the canonical name.
ENTITY_ALIASES: dict[str, str] = {
    "us": "united states", "usa": "united states", "u.s": "united states",
    "u.s.a": "united states", "america": "united states", "united states": "united states",
    "states": "united states", "uk": "united kingdom", "britain": "united kingdom",
    "great britain": "united kingdom", "united kingdom": "united kingdom", "nyc": "new york",
    "new york city": "new york", "sf": "san francisco", "js": "javascript",
    "node": "javascript", "node.js": "javascript", "nodejs": "javascript", "ts": "typescript",
    "k8s": "kubernetes", "postgres": "postgresql", "psql": "postgresql", "mongo": "mongodb",
    "mac": "macos", "osx": "macos", "os x": "macos", "macbook": "macos", "iphone": "ios",
    "ipad": "ios", "golang": "go", "py": "python", "python3": "python",
    "tylenol": "acetaminophen", "paracetamol": "acetaminophen", "advil": "ibuprofen",
    "motrin": "ibuprofen", "aleve": "naproxen", "vs code": "vscode",
    "visual studio code": "vscode", "ms excel": "excel", "amazon web services": "aws",
    "google cloud": "gcp", "american": "united states", "americans": "united states",
    "british": "united kingdom", "oscar": "academy awards", "oscars": "academy awards",
    "academy award": "academy awards", "academy awards": "academy awards",
    "holland": "netherlands", "the netherlands": "netherlands", "czechia": "czech republic",
}

# Names that are a kind of another, or live in it: "on Ubuntu" and "in bash" ask what
# "on Linux" asks, while Ubuntu and Fedora are still two names.
ENTITY_PARENTS: dict[str, str] = {
    name: "linux"
    for name in ("ubuntu", "debian", "fedora", "centos", "mint", "rhel", "redhat", "kali", "bash")
}

# Capitalised words that are not names.
NOT_ENTITIES = frozenset(
    {
        "i", "i'm", "i've", "i'd", "i'll", "ok", "okay", "hi", "hey", "hello", "please",
        "thanks", "thank", "asap", "faq", "eli5", "tldr", "fyi", "btw", "imo", "pls", "plz",
        "q", "a",
    }
)

STOPWORDS = frozenset(
    {
        "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does",
        "did", "doing", "have", "has", "had", "having", "i", "me", "my", "mine", "we", "our",
        "us", "you", "your", "he", "she", "it", "its", "they", "them", "their", "this", "that",
        "these", "those", "of", "in", "on", "at", "for", "with", "about", "as", "by", "to",
        "from", "into", "than", "then", "so", "if", "or", "and", "but", "can", "could", "would",
        "should", "will", "shall", "may", "might", "must", "what", "which", "who", "whom",
        "whose", "when", "where", "why", "how", "there", "here", "any", "some", "much", "many",
        "all", "very", "sized", "just", "also", "please", "hi", "hey", "hello", "thanks", "get",
        "got", "go", "going", "want", "need", "way", "best", "good", "one", "i'm", "it's",
        "what's", "how's", "there's", "that's", "let", "tell", "know", "like", "quick",
        "question",
        # Hedges and chat filler: they soften a question without changing what it asks.
        "roughly", "approximately", "usually", "typically", "generally", "actually",
        "really", "basically", "exactly", "pls", "plz", "thx", "q", "whats", "hows",
        "wheres", "whens", "whos",
        # Chat spellings and common typos of the words above.
        "u", "ur", "teh", "hte", "adn", "waht", "wht", "hwo", "yuo", "cn", "plese",
    }
)
# Words joining two sides that may trade places: "17 times 23" is "23 times 17", "cats
# and dogs" are "dogs and cats".
SYMMETRIC = frozenset(
    {"times", "x", "plus", "multiplied", "added", "vs", "versus", "and", "or", "nor", "+", "*"}
)
# "the equation for the combustion of methane" is "the methane combustion equation".
GENITIVE_WORDS = frozenset({"of", "for"})
# Words an acronym's letters skip: "USA" spells "United States of America".
ACRONYM_SKIPPED = frozenset({"of", "and", "the", "&", "for"})
DIRECTION_WORDS = frozenset({"to", "from", "into", "onto", "towards", "toward"})
ARTICLES = frozenset({"a", "an", "the"})
# Words that open a condition or scope tacked onto a whole question ("... at high
# altitude", "... while roaming", "... on the free plan", "... bought during the sale").
QUALIFIER_OPENERS = frozenset(
    {
        "at", "for", "while", "whilst", "of", "on", "in", "during", "with", "without",
        "under", "over", "after", "before", "from", "by", "when", "if", "unless", "using",
        "via", "and", "inside", "outside", "near", "except", "beyond", "within",
    }
)
# Verbs of asking, seeming or going on, and hedges, added before what a question is
# about ("define photosynthesis", "why does the sky look blue", "my dog keeps eating
# grass", "technically a fruit"): they do not narrow it the way a modifier does. Not
# every -ly word: "monthly plan" and "family pool" are narrower.
NON_NARROWING = frozenset(
    {
        "define", "explain", "describe", "say", "mean", "means", "meaning", "represent",
        "represents", "look", "looks", "seem", "seems", "keep", "keeps", "track", "show",
        "find", "give", "list", "technically", "literally", "officially", "still", "ever",
    }
)
# Words after which a question word opens a question rather than joining a clause:
# prepositions ("at what age"), conjunctions ("and when"), verbs of asking or knowing
# ("do you know when", "not sure how").
CUE_OPENERS = frozenset(
    {
        "at", "by", "from", "in", "on", "of", "for", "to", "with", "about", "since", "until",
        "out", "and", "or", "but", "so", "then", "know", "tell", "ask", "asking", "wonder",
        "wondering", "explain", "idea", "sure", "unsure", "curious", "confused",
    }
)
# Question words: after one, a tail is a new clause ("iphone not charging, how to fix"),
# not a qualifier.
QUESTION_WORDS = frozenset({"how", "what", "why", "which", "where", "when", "who"})
# Auxiliaries after which a question word is the object: "who did X beat".
DOING_AUXILIARIES = frozenset({"did", "does", "do", "will", "would", "can", "could", "should"})
CLAUSE_BREAKS = frozenset({"and", "or", "but", "because", "while", "if", "so", "vs", "versus"})
COMPARATIVE_WORDS = frozenset(
    {
        "more", "less", "better", "worse", "bigger", "smaller", "larger", "faster", "slower",
        "cheaper", "older", "younger", "higher", "lower", "longer", "shorter", "heavier",
        "lighter", "stronger", "weaker", "safer", "harder", "easier",
    }
)
DIRECTIONAL_TO = frozenset({"to", "into", "onto", "towards", "toward"})
# "A to B" is directed only in sentences about moving or converting something.
MOTION_WORDS = frozenset(
    {
        "convert", "conversion", "converting", "translate", "translation", "translating",
        "transfer", "transferring", "move", "moving", "migrate", "migrating", "migration",
        "switch", "switching", "send", "sending", "copy", "copying", "fly", "flight", "flights",
        "drive", "driving", "travel", "train", "ship", "shipping", "exchange", "port",
        "porting", "upgrade", "downgrade", "redirect", "forward", "wire", "ratio", "cast",
        "casting", "change", "changing", "distance", "route", "commute", "mail", "import",
        "export", "rate", "merge", "merging", "rebase", "push", "pull", "sync", "backup",
        "restore", "cherry-pick",
    }
)
# Operators and relations where the order of the numbers matters.
NONCOMMUTATIVE = frozenset(
    {
        "minus", "subtract", "subtracted", "divide", "divided", "over", "to", "from", "than",
        "into", "power", "exponent", "mod", "modulo", "percent", "%", "of", "out", "ratio",
        "before", "after", "between", "-",
    }
)

_TIME_UNITS = "seconds|minutes|hours|days|weeks|months|years"
_LENGTH_UNITS = "miles|kilometers|kilometres|km|meters|metres|feet|inches|yards"
_DURATION_NOUNS = (
    "duration|lifespan|life span|lifetime|runtime|run time|processing time|delivery time"
    "|shipping time|turnaround time|wait time|waiting time|transit time|boiling time"
)
# Nouns for whoever did or holds something: "which composer wrote ..." asks who wrote it.
_AGENT_NOUNS = (
    "person|people|company|country|nation|team|club|player|athlete|actor|actress|singer"
    "|band|author|writer|novelist|poet|composer|artist|painter|president|scientist"
    "|inventor|director|character|man|woman|king|queen|emperor|ruler|leader"
)
# A word between "which"/"what" and an agent noun, unless it opens a phrase of its own (a
# preposition, "if", "when"): the noun is then that phrase's ("what happens to a person
# who ..." and "what happens if a man ..." ask what, not who).
_NOT_OPENING_A_PHRASE = r"(?!(?:to|for|with|from|into|about|at|on|in|if|when)\b)"
# (question type, regex over the lower-cased words). The earliest cue wins, ties go to
# the first listed; "what"/"which" count only when no other cue is present.
QUESTION_TYPES: list[tuple[str, str]] = [
    # "how many days a week" asks how often, not how long.
    (
        "frequency",
        rf"\bhow (often|frequently)\b|\bhow many times\b"
        rf"|\bhow many ({_TIME_UNITS}) (a|per|each|every)\b",
    ),
    # "how far in advance" and "what's the last day" ask for a time, not a distance.
    # "how early should I arrive", "how soon" and "how many hours before departure" ask
    # when, too: a time counted from an event is a point in time.
    (
        "when",
        r"\bhow long (until|till|before|after)\b|\bhow far (in advance|ahead)\b"
        r"|\bhow (early|late|soon)\b"
        rf"|\bhow many ({_TIME_UNITS}) (before|after|in advance|prior)\b",
    ),
    # "how long do I have to file" asks for a deadline, not how long filing takes ("how
    # long do I have to wait" does ask how long).
    (
        "deadline",
        r"\bhow long (do|does|did|will|would) (\w+ ){1,2}?have (to|until)\b"
        r"(?! (wait|stay|keep|remain|be)\b)"
        r"|\bwhat(?:'s| is| are)? the (\w+ ){0,2}deadlines?\b|\bby when\b",
    ),
    # "how long is a marathon" asks a length, in time or in space, and no point in time
    # ("when was the movie released" is not "how long is the movie").
    ("length", r"\bhow long (is|are|was|were)\b"),
    # "what's the typical processing time" asks how long, like "how long does it take".
    (
        "duration",
        rf"\bhow long\b|\bhow many ({_TIME_UNITS})\b"
        rf"|\bwhat(?:'s| is| are)? the (\w+ ){{0,2}}({_DURATION_NOUNS})\b",
    ),
    (
        "distance",
        rf"\bhow far\b|\bhow many ({_LENGTH_UNITS})\b|\bwhat(?: is|'s)? the distance\b",
    ),
    ("count", r"\bhow many\b|\bwhat(?: is|'s)? the (\w+ )?number of\b"),
    # "how much is a flight" asks a price; "how much sugar is in" an amount.
    ("price", r"\bhow much (is|are|was|were|will|would)\b"),
    ("amount", r"\bhow much\b|\bwhat(?: is|'s)? the amount of\b"),
    ("age", r"\bhow old\b|\bwhat(?:'s| is)? the (\w+ ){0,2}age\b|\bwhat age\b"),
    # "where can I enter a code" asks for a procedure, like "how do I enter a code".
    ("how", r"\bwhere (\w+ ){0,3}?(can|do|should|would|could) (i|we|you)\b"),
    # Teams and countries win and host things: "which country won" asks who won, and
    # "which male tennis player" who holds a record.
    (
        "who",
        rf"\b(who|whom|whose)\b|\b(which|what(?:'s| is)?) ({_NOT_OPENING_A_PHRASE}\w+ ){{0,3}}?"
        rf"({_AGENT_NOUNS})\b",
    ),
    # "when should I use X" asks for conditions, like "how do I choose X".
    ("how", r"\bwhen (should|do|would|can) (i|you|we) use\b"),
    (
        "when",
        r"\bwhen\b(?! \w+ing\b)|\bwhat (times?(?! zone)|years?|dates?|days?|months?)\b"
        r"|\bwhat(?:'s| is)? the (last|first|earliest|latest) (day|date)\b"
        r"|\bwhat(?:'s| is| are)? the (\w+ ){0,2}dates?\b"
        r"|\bwhich (year|date|day|month)\b|\bwhat(?:'s| is)? the (best|right|ideal) time\b",
    ),
    # "where to put a coupon code" asks how, like "where can I" above.
    ("how", r"\bwhere to\b"),
    ("where", r"\bwhere\b|\b(what|which) (place|location|store|website)\b"),
    (
        "why",
        r"\bwhy\b|\bhow come\b|\bwhat(?: is|'s| are)? the (\w+ )?(reasons?|causes?)\b"
        r"|\bwhat(?:'s| is| could be| might be)? (causes|caused|causing|makes|made|leads? to"
        r"|led to)\b"
        r"|\breasons? for\b"
        # "what am I doing wrong", "what's wrong with my code": the cause.
        r"|\bwhat(?:'s| is| am i| are we) (doing )?wrong\b",
    ),
    ("how", r"\bhow\b"),
    ("what", r"\b(what|which|what's)\b"),
]
# Auxiliaries that open a yes/no question; "can you ..." and the like open requests.
POLAR_AUXILIARIES = frozenset(
    {
        "can", "could", "is", "are", "am", "was", "were", "do", "does", "did", "should", "shall",
        "will", "would", "may", "might", "has", "have", "had", "must", "isn't", "aren't",
        "don't", "doesn't", "can't", "won't", "shouldn't",
    }
)
REQUEST_AUXILIARIES = frozenset({"can", "could", "would", "will"})
DO_AUXILIARIES = frozenset({"do", "does", "did", "don't", "doesn't"})
GREETINGS = frozenset({"hey", "hi", "hello", "so", "ok", "okay", "please", "quick", "question"})
# Words that turn a how-much/how-many question into a question about price.
PRICE_WORDS = frozenset(
    {
        "cost", "costs", "price", "prices", "fee", "fees", "charge", "pay", "expensive",
        "cheap", "rate", "rates", "shipping", "postage", "fare", "fares",
    }
)
# Question types that may ask the same thing in other words; any other pair of different
# types asks for a different answer ("when was X founded" vs "who founded X").
COMPATIBLE_QUESTION_TYPES = frozenset(
    {
        frozenset(pair)
        for pair in [
            ("what", "how"), ("what", "count"), ("what", "amount"), ("what", "price"),
            ("count", "amount"), ("amount", "duration"), ("amount", "distance"),
            ("count", "frequency"), ("count", "duration"),
            # "is X bad for Y" / "why is X bad for Y", "can I X" / "how can I X".
            ("yes/no", "what"), ("yes/no", "how"), ("yes/no", "why"), ("yes/no", "whether"),
            ("whether", "what"), ("whether", "why"),
            # "when do babies start walking" / "at what age"; "how long does a refund
            # take" / "what's the refund timeline".
            ("when", "age"), ("duration", "what"),
            # "how long until my refund" / "when will I get my refund"; "what's the
            # deadline for claims" / "when is the last day to claim" / "how many days
            # after buying can I claim" (but not "how long do claims take").
            ("duration", "when"), ("deadline", "when"), ("deadline", "what"),
            # "how many days a week can I work remotely" / "what's the remote work limit".
            ("frequency", "what"),
            ("length", "duration"), ("length", "distance"), ("length", "what"),
            ("length", "amount"),
        ]
    }
)
CURRENCY_UNITS = frozenset(
    {"usd", "eur", "gbp", "jpy", "inr", "cad", "aud", "chf", "cny", "mxn", "btc", "eth"}
)
# Temperatures said as "degrees" match any temperature scale.
TEMPERATURE_UNITS = frozenset({"fahrenheit", "celsius", "kelvin"})

# Verb particles with opposite meanings: "turn on" vs "turn off", "log in" vs "log out".
OPPOSITE_PARTICLES = {
    "on": "off", "off": "on", "in": "out", "out": "in", "up": "down", "down": "up",
}

# Words that may replace each other without changing the question. The substitution rule
# rejects a question that differs from the cached one in exactly one content word unless
# the two words are listed here (or are forms of one word).
SYNONYM_GROUPS: list[set[str]] = [
    {"buy", "purchase", "order", "get"},
    {"fix", "repair", "solve", "resolve", "troubleshoot"},
    {"car", "vehicle", "auto", "automobile"},
    {"movie", "film"},
    {"begin", "start"},
    {"big", "large", "huge"},
    {"small", "little", "tiny"},
    {"tallest", "highest"},
    {"fast", "quick", "rapid"},
    {"choose", "pick", "select"},
    {"cost", "price", "charge", "fee"},
    {"delete", "remove", "erase"},
    {"change", "modify", "edit", "update", "alter"},
    {"help", "assist", "support"},
    {"need", "require"},
    {"make", "create", "build", "generate"},
    {"show", "display", "view", "see"},
    {"find", "locate", "search"},
    {"end", "finish", "stop", "terminate"},
    {"use", "utilize", "employ"},
    {"receive", "get"},
    {"job", "work", "career"},
    {"doctor", "physician"},
    {"kid", "kids", "child", "children"},
    {"mom", "mother"},
    {"dad", "father"},
    {"sofa", "couch"},
    {"shop", "store"},
    {"trip", "journey", "travel"},
    {"error", "bug", "issue", "problem"},
    {"app", "application"},
    {"cell", "mobile", "phone"},
    {"photo", "picture", "image"},
    {"write", "author", "wrote"},
    {"allowed", "permitted"},
    {"correct", "right"},
    {"meaning", "definition", "mean", "define"},
    {"explain", "describe"},
    {"cheap", "inexpensive", "affordable"},
    {"mistake", "error"},
    {"happy", "glad"},
    {"reply", "respond", "answer"},
    {"shut", "close"},
    {"enough", "sufficient"},
    {"speed", "velocity"},
    {"money", "cash", "funds"},
    {"house", "home"},
    {"illness", "sickness", "disease"},
    {"medicine", "medication", "drug"},
    {"recipe", "instructions"},
    {"tip", "advice", "suggestion"},
    {"ideal", "best", "optimal"},
    {"calculate", "compute", "work out", "figure out"},
    {"formula", "equation"},
    {"typical", "normal", "usual", "average"},
    {"quickest", "fastest"},
    {"purpose", "point", "goal"},
    {"rule", "regulation", "law"},
    {"cancel", "terminate"},
    {"symptom", "sign"},
    {"early", "first"},
    {"mountain", "peak"},
    {"set", "configure"},
    # Members of one contrast group that name the same thing.
    {"baby", "babies", "infant"},
    {"teen", "teenager", "adolescent"},
    {"senior", "elderly"}, {"autumn", "fall"}, {"bike", "bicycle"},
    {"phone", "smartphone", "cell"}, {"tv", "television"}, {"average", "mean"},
    {"petrol", "gas"},
    # Common English synonyms.
    {"largest", "biggest"}, {"larger", "bigger", "over", "above", "greater"},
    {"closest", "nearest"},
    {"closer", "nearer"}, {"smallest", "tiniest"}, {"toxic", "poisonous", "poison"}, {"age", "old"},
    {"country", "countries", "nation"},
    {"flash", "blink"}, {"annual", "annually", "yearly"}, {"restart", "reboot"},
    {"often", "frequently"}, {"avoid", "prevent"}, {"undo", "revert"},
    {"build", "built", "construct", "constructed"},
    {"times", "x", "multiplied"}, {"load", "read", "open"}, {"quit", "stop", "exit"},
    {"rich", "wealthy"}, {"smart", "intelligent", "clever"}, {"ill", "sick"},
    {"hard", "difficult"}, {"easy", "simple"}, {"try", "attempt"},
    {"reduce", "decrease", "lower", "cut"}, {"increase", "raise", "boost"},
    {"keep", "retain", "preserve"}, {"teacher", "instructor"}, {"student", "pupil"},
    {"garbage", "trash", "rubbish"}, {"vacation", "holiday"}, {"apartment", "flat"},
    {"elevator", "lift"}, {"pants", "trousers"}, {"sneakers", "trainers"},
    {"refund", "reimbursement"}, {"bill", "invoice"}, {"password", "passcode"},
    {"register", "signup"}, {"laptop", "notebook"}, {"fridge", "refrigerator"},
    {"ship", "deliver"}, {"shipping", "delivery"}, {"package", "parcel"},
    {"worth", "value"}, {"salary", "wage", "pay"},
    {"amount", "quantity"}, {"photograph", "photo", "pic", "picture"},
    {"song", "track"}, {"author", "writer"}, {"stomach", "belly", "tummy"},
    {"street", "road"}, {"answer", "solution"},
    {"verify", "confirm", "check"}, {"present", "gift"},
    {"discount", "deal", "sale"}, {"over", "end", "finish"},
]
