"""The near-miss guards: after a vector match, reject a candidate whose answer would
differ. `Guard` reads English (certain rules, then a fitted verifier with the
cross-encoder); `LanguageGuard` the multilingual tier's languages (checks that hold in
any language, then its own verifier). Both answer with a `Verdict`."""

from cache.guard.english_guard import Guard
from cache.guard.language_guard import LanguageGuard
from cache.guard.verdict import Verdict

__all__ = ["Guard", "LanguageGuard", "Verdict"]
