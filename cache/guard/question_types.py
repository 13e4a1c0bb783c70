"""The kind of answer a question asks for (`question_type`), from cues: (question type,
regex over the lower-cased words). The earliest cue in a clause wins, ties go to the
first listed; "what"/"which" count only when no other cue is present. The words the
regexes name as alternatives (units, nouns) are lists in `guard_words.json`."""

from __future__ import annotations

import itertools
import re

from cache.guard import lexicon
from cache.guard.words import strip_possessive, tokenize

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

# Where a clause ends: punctuation before a space or the end, or a free-standing dash.
_CLAUSE = re.compile(r"[,;:.!?()]+(?:\s|$)|\s[-\u2013\u2014]+\s")
# Words after which a question word still opens a question ("at what age", "do you know
# when"), as offsets just past them in a clause's joined words.
_CUE_OPENERS = r"\b(?:" + "|".join(sorted(lexicon.CUE_OPENERS)) + r") "


def question_type(text: str, text_words: list[str]) -> str:
    """The type whose cue comes first ("when did the man who..." is a when-question). A cue
    counts where it opens a clause, or follows a preposition or a verb of asking ("at what
    age", "do you know when"); elsewhere "when", "where" and "whose" join a clause to a
    noun or verb ("stays visible when I scroll", "a circle whose radius is 5"). With no
    cue, `text_words` (the whole text's) may still ask yes or no."""
    for clause in _CLAUSE.split(text):
        words = [strip_possessive(lower) for _, lower in tokenize(clause)]
        joined = " ".join(words)
        opens = {0} | {m.end() for m in re.finditer(_CUE_OPENERS, joined)}
        best, best_at = "other", len(joined) + 1
        for qtype, pattern in QUESTION_TYPES:
            for match in re.finditer(pattern, joined):
                if match.start() in opens and match.start() < best_at:
                    best, best_at = qtype, match.start()
                    break
        if best == "other":
            continue
        if best in {"count", "amount"} and lexicon.PRICE_WORDS & set(words):
            return "price"
        return best
    return _yes_or_no(text_words) or "other"


def _yes_or_no(text_words: list[str]) -> str | None:
    """A question with no question word that opens with an auxiliary asks yes or no, a
    different answer from how much or when: "whether" a fact holds ("does the app support
    dark mode", which "how do I turn on dark mode" is not), else "yes/no" ("can I cancel
    online", near enough to "how can I cancel online"). Not requests ("can you check my
    order"), questions whether a thing exists ("is there a limit": the limit) nor
    questions between alternatives ("is it the landlord's job or mine")."""
    words = list(itertools.dropwhile(lambda w: w in lexicon.GREETINGS, text_words))
    if len(words) < 2 or words[0] not in lexicon.POLAR_AUXILIARIES:
        return None
    if (words[0] in lexicon.REQUEST_AUXILIARIES and words[1] == "you") or words[1] == "there":
        return None
    if any(w == "or" and nxt != "not" for w, nxt in itertools.pairwise([*words, ""])):
        return None
    return "whether" if words[0] in lexicon.DO_AUXILIARIES else "yes/no"
