"""Turns logits into next tokens: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Masks (to -inf) every token outside each row's top-k and top-p nucleus."""
    vocab = logits.shape[-1]
    if any(k > 0 for k in top_k):
        k = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=logits.device)
        sorted_desc = logits.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(-1, (k - 1).unsqueeze(-1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if any(p < 1.0 for p in top_p):
        p = torch.tensor(top_p, device=logits.device, dtype=logits.dtype).unsqueeze(-1)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach p; the
        # first token always stays, and rows with p = 1 keep everything (a
        # float cumsum can reach 1.0 before the tail).
        drop = ((probs.cumsum(dim=-1) - probs) >= p) & (p < 1.0)
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's distribution after its temperature, top-k and top-p (greedy rows: T = 1)."""
    temps = torch.tensor(
        [p.temperature if not p.greedy else 1.0 for p in params], device=logits.device
    ).unsqueeze(-1)
    logits = apply_top_k_top_p(logits / temps, [p.top_k for p in params], [p.top_p for p in params])
    return logits.softmax(dim=-1)


def race(
    probs: torch.Tensor,
    generator: torch.Generator | None,
    row_generators: Sequence[torch.Generator | None] = (),
) -> torch.Tensor:
    """One draw from each row of probs: argmax(p / E) with E ~ Exp(1) draws from p.
    A row with its own generator (a seeded request) draws its noise from it, so its
    token does not depend on what else is in the batch."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for row, gen in enumerate(row_generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams] | None,
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """params: each row's, or None when every row is greedy (the caller knows);
        generators: each row's own (seeded requests), or [] when every row is greedy."""
        return self.sample(logits, params, generators).tolist()

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams] | None,
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """__call__'s tokens as a tensor on the logits' device."""
        greedy = logits.argmax(dim=-1)
        if params is None or all(p.greedy for p in params):
            return greedy
        sampled = race(sampling_probs(logits, params), self.generator, generators)
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy, sampled)
