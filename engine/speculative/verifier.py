"""Lossless verification of proposed tokens against the target model's logits.

Greedy requests keep the drafts while they equal the target's argmax, then take
the target's own token (a bonus token when every draft was accepted), so the
output is exactly greedy decoding. Sampled requests use rejection sampling
(Leviathan et al.): draft d with draft probability q(d) is accepted with
probability min(1, p(d) / q(d)); on rejection the token is drawn from the
normalised max(p - q, 0). Every emitted token is then distributed exactly as p,
the target's distribution after temperature, top-k and top-p. An n-gram draft
is a point mass (q = one-hot), so acceptance is p(d) and the residual is p with
d removed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampler import race, sampling_probs
from engine.sampling_params import SamplingParams


def verify_greedy(drafts: list[int], target: list[int]) -> list[int]:
    """The drafts while they equal the target's argmax (target[i]: after drafts[:i]),
    then the target's own token."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target[accepted]:
        accepted += 1
    return [*drafts[:accepted], target[accepted]]


def verify_sampled(
    logits: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generators: Sequence[torch.Generator],
) -> list[int]:
    """The accepted drafts plus one token of the target's: 1 to len(drafts) + 1 tokens.

    logits: [len(drafts) + 1, vocab], row i the target's logits for the token after
    drafts[:i]. draft_probs: [len(drafts), vocab] or None for point-mass drafts.
    generators[i]: the randomness for output offset i (a seeded request's is keyed by
    position, so its tokens do not depend on how many drafts each step verified).
    """
    k = len(drafts)
    p = sampling_probs(logits, [params] * (k + 1))
    draft_ids = torch.tensor(drafts, device=p.device)
    rows = torch.arange(k, device=p.device)
    p_draft = p[rows, draft_ids]
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs[rows, draft_ids]
    uniform = torch.stack(
        [torch.rand((), device=p.device, generator=generators[i]) for i in range(k)]
    )
    # u < p/q, written without the division (q of a sampled draft is > 0).
    accept = (uniform * q_draft < p_draft).tolist()
    accepted = accept.index(False) if False in accept else k
    if accepted == k:
        return [*drafts, int(race(p[k], generators[k]))]
    row = p[accepted]
    if draft_probs is None:
        residual = row.clone()
        residual[drafts[accepted]] = 0.0
    else:
        residual = (row - draft_probs[accepted]).clamp_(min=0.0)
    if residual.sum() <= 0:  # p == q up to rounding: nothing to correct
        residual = row
    return [*drafts[:accepted], int(race(residual, generators[accepted]))]
