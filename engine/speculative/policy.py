"""How many tokens to propose for each sequence next step: speculate only where the
expected extra tokens are worth the extra step time.

Two things are learnt while serving:
- per sequence, the chance that a draft token is accepted given the ones before it
  were (an exponentially weighted count, so it follows the text as it changes);
- the step's cost, time = a + b * tokens (exponentially weighted least squares over
  recent steps), and for draft models the time of one draft forward.

Proposing the j-th token for a sequence with acceptance alpha adds alpha**j expected
tokens and costs b (plus a draft forward when no other sequence is that deep yet).
Tokens are added greedily, best first, while each one's gain per second beats the
step's tokens per second so far. A big batch makes a step slow in b * tokens, so
speculation stops there by itself; a sequence whose drafts keep failing gets k = 0
and is probed with one token after PROBE_EVERY steps, in case its text turned
repetitive (twice as long after each failed probe, up to 16x). A new sequence
starts from the acceptance of the method's recent verifications, so a proposer
that rarely works (a shallow self-draft on open chat) is not tried at full k on
every new request.

Seeded requests must give the same tokens however the machine is loaded, so their
k depends on their own acceptance only (the longest run still likely enough to be
accepted), never on measured times.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.8  # weight of the past in the acceptance counts: about the last 5 verifications
METHOD_DECAY = 0.98  # the method-wide counts: about the last 50 verifications
PRIOR_ACCEPTANCE = 0.6
PRIOR_TRIALS = 2.0
PROBE_EVERY = 16
MAX_PROBE_BACKOFF = 4  # probe intervals double up to 2**4 times
MAX_ACCEPTANCE = 0.98  # never certain: keeps alpha**j decreasing
SEEDED_MIN_CHANCE = 0.3  # a seeded request's j-th draft needs alpha**j at least this


@dataclass
class _Acceptance:
    accepted: float = PRIOR_TRIALS * PRIOR_ACCEPTANCE  # a prior worth PRIOR_TRIALS trials
    trials: float = PRIOR_TRIALS
    idle_steps: int = 0
    failed_probes: int = 0

    @property
    def rate(self) -> float:
        return min(self.accepted / self.trials, MAX_ACCEPTANCE)

    def add(self, accepted: int, trials: int, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.trials = decay * self.trials + trials


class StepCost:
    """time = a + b * tokens, fitted by exponentially weighted least squares."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        # A prior of a few pseudo-steps: 20 ms a step plus 0.5 ms a token.
        self.sw, self.sx, self.sy, self.sxx, self.sxy = 0.0, 0.0, 0.0, 0.0, 0.0
        for tokens in (1, 8, 64):
            self.observe(tokens, 0.020 + 0.0005 * tokens)

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self.sw = d * self.sw + 1
        self.sx = d * self.sx + tokens
        self.sy = d * self.sy + seconds
        self.sxx = d * self.sxx + tokens * tokens
        self.sxy = d * self.sxy + tokens * seconds

    def fit(self) -> tuple[float, float]:
        var = self.sxx * self.sw - self.sx * self.sx
        b = (self.sxy * self.sw - self.sx * self.sy) / var if var > 1e-9 else 0.0
        b = max(b, 1e-5)  # a token is never free
        a = max((self.sy - b * self.sx) / self.sw, 1e-4)
        return a, b


class SpecPolicy:
    def __init__(self, uses_draft_model: bool) -> None:
        self.uses_draft_model = uses_draft_model
        self.acceptance: dict[str, _Acceptance] = {}
        self.method = _Acceptance()  # every sequence's verifications, for new sequences
        self.cost = StepCost()
        self.draft_forward_s = 0.005  # learnt from the draft's forwards

    def record(self, request_id: str, proposed: int, accepted: int) -> None:
        """A verification: `accepted` of `proposed` drafts were kept."""
        if proposed == 0:
            return
        stats = self._stats(request_id)
        trials = accepted + (1 if accepted < proposed else 0)
        stats.add(accepted, trials, DECAY)
        if accepted:
            stats.failed_probes = 0
        elif proposed == 1:  # a probe (or a lone guess) that failed
            stats.failed_probes += 1
        self.method.add(accepted, trials, METHOD_DECAY)

    def _stats(self, request_id: str, seeded: bool = False) -> _Acceptance:
        stats = self.acceptance.get(request_id)
        if stats is None:
            # A seeded request starts from the fixed prior: other requests' luck
            # must not change its tokens.
            rate = PRIOR_ACCEPTANCE if seeded else self.method.rate
            stats = _Acceptance(PRIOR_TRIALS * rate, PRIOR_TRIALS)
            self.acceptance[request_id] = stats
        return stats

    def observe_step(self, tokens: int, seconds: float) -> None:
        self.cost.observe(tokens, seconds)

    def observe_draft(self, forwards: int, seconds: float) -> None:
        if forwards:
            self.draft_forward_s = 0.8 * self.draft_forward_s + 0.2 * seconds / forwards

    def release(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)

    def choose(
        self, caps: dict[str, int], other_tokens: int, seeded: frozenset[str] = frozenset()
    ) -> dict[str, int]:
        """k for each decoding sequence (request id -> the most it may take).

        other_tokens: tokens the next step computes anyway (one per decode, plus
        whatever prefill is expected). seeded: requests whose k must not depend on time.
        """
        a, b = self.cost.fit()
        ks = dict.fromkeys(caps, 0)
        rates = {rid: self._stats(rid, rid in seeded).rate for rid in caps}
        for rid in seeded & caps.keys():
            while ks[rid] < caps[rid] and rates[rid] ** (ks[rid] + 1) >= SEEDED_MIN_CHANCE:
                ks[rid] += 1
        gained = float(len(caps))
        seconds = a + b * other_tokens
        depth = 0  # the deepest k so far: a draft model runs one forward per level
        while True:
            best, best_value, best_cost = None, 0.0, 0.0
            for rid, k in ks.items():
                if k >= caps[rid] or rid in seeded:
                    continue
                gain = rates[rid] ** (k + 1)
                cost = b + (self.draft_forward_s if self.uses_draft_model and k >= depth else 0.0)
                if gain / cost > best_value:
                    best, best_value, best_cost = rid, gain / cost, cost
            if best is None or best_value * seconds <= gained:
                break
            gain = rates[best] ** (ks[best] + 1)
            ks[best] += 1
            depth = max(depth, ks[best])
            gained += gain
            seconds += best_cost
        return self._with_probes(ks, caps)

    def _with_probes(self, ks: dict[str, int], caps: dict[str, int]) -> dict[str, int]:
        """Sequences left at k = 0 for PROBE_EVERY steps try one token again."""
        for rid, k in ks.items():
            stats = self.acceptance[rid]
            if k or not caps[rid]:
                stats.idle_steps = 0
                continue
            stats.idle_steps += 1
            if stats.idle_steps >= PROBE_EVERY << min(stats.failed_probes, MAX_PROBE_BACKOFF):
                stats.idle_steps = 0
                ks[rid] = 1
        return ks
