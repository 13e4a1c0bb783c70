"""The cues that tell what kind of answer a question asks for: (question type, regex over
the lower-cased words). The earliest cue in a clause wins, ties go to the first listed;
"what"/"which" count only when no other cue is present. The words the regexes name as
alternatives (units, nouns) are lists in `guard_words.json`."""

from __future__ import annotations

from cache.guard import lexicon

_TIME_UNITS = "|".join(lexicon.ASKED_TIME_UNITS)
_LENGTH_UNITS = "|".join(lexicon.ASKED_LENGTH_UNITS)
_DURATION_NOUNS = "|".join(lexicon.DURATION_NOUNS)
_AGENT_NOUNS = "|".join(lexicon.AGENT_NOUNS)
# A word between "which"/"what" and an agent noun, unless it opens a phrase of its own (a
# preposition, "if", "when"): the noun is then that phrase's ("what happens to a person
# who ..." and "what happens if a man ..." ask what, not who).
_NOT_OPENING_A_PHRASE = r"(?!(?:to|for|with|from|into|about|at|on|in|if|when)\b)"
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
