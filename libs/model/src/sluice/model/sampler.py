"""Per-request token sampling over a batch of logits rows.

Each row carries its own ``SamplingParams``. Everything is vectorised over
the batch except drawing noise for seeded rows: a seeded request draws from
its own ``torch.Generator`` (owned by the caller, advanced once per step),
so its tokens depend only on its seed and its logits, never on which other
requests share the batch or at which row it sits.

Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. is
an exact sample from p (the Gumbel-max trick in another form), and lets
every row draw its noise independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from sluice.kernels.argmax import argmax_rows

# Rows at temperature 0 take the argmax; no softmax, no noise.
GREEDY_TEMPERATURE = 0.0


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How one request picks its tokens.

    temperature: 0 = greedy (argmax); otherwise logits are divided by it.
    top_p: keep the smallest set of tokens whose probability reaches top_p (1 = off).
    top_k: keep the k most likely tokens (0 = off).
    seed: makes the request reproducible; the caller builds its generator once
        with ``make_generator`` and passes it on every step.
    min_tokens: EOS and stop_token_ids are masked until this many tokens were produced.
    ignore_eos: EOS does not end the request (the engine keeps going; the
        sampler then need not mask EOS for min_tokens).
    stop_token_ids: extra ids that end the request (the engine checks them).
    max_tokens: output cap; None = until EOS or the context limit (engine's job).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} > max_tokens {self.max_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == GREEDY_TEMPERATURE

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A fresh generator for a seeded request (None when unseeded)."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


@dataclass(slots=True, frozen=True)
class SampleRequest:
    """One logits row's sampling state for this step.

    num_generated: output tokens the request already has (for min_tokens).
    generator: the request's own generator when seeded, on the logits' device.
    """

    params: SamplingParams
    num_generated: int = 0
    generator: torch.Generator | None = None


class Sampler:
    def __init__(self, eos_token_ids: Sequence[int] = ()) -> None:
        self.eos_token_ids = tuple(eos_token_ids)

    def argmax_suffices(self, requests: Sequence[SampleRequest]) -> bool:
        """True when every row takes the plain argmax of its logits: all
        greedy and none with EOS or stop ids still masked (min_tokens). The
        runner may then ask the model for the argmax alone
        (sluice.model.greedy_head) instead of full logits."""
        return all(r.params.is_greedy and not self._banned_ids(r) for r in requests)

    def _banned_ids(self, r: SampleRequest) -> set[int]:
        """The ids masked for this row: EOS (unless ignored) and its stop
        ids while it is below min_tokens; none after."""
        p = r.params
        if r.num_generated >= p.min_tokens:
            return set()
        banned = set(p.stop_token_ids)
        if not p.ignore_eos:
            banned.update(self.eos_token_ids)
        return banned

    def sample(self, logits: torch.Tensor, requests: Sequence[SampleRequest]) -> list[int]:
        """logits: [N, vocab] (one row per request) -> N token ids."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(requests)} requests")
        if not requests:
            return []
        logits = self._mask_early_stops(logits.float(), requests)  # [N, vocab]
        greedy_ids = argmax_rows(logits)  # [N]
        if all(r.params.is_greedy for r in requests):
            return greedy_ids.tolist()

        probs = self._probs(logits, requests)  # [N, vocab]
        noise = torch.empty_like(probs).exponential_()  # [N, vocab], default generator
        for row, r in enumerate(requests):
            if r.generator is not None:
                noise[row].exponential_(generator=r.generator)
        sampled_ids = argmax_rows(probs / noise)  # [N]

        is_greedy = torch.tensor([r.params.is_greedy for r in requests], device=logits.device)
        return torch.where(is_greedy, greedy_ids, sampled_ids).tolist()

    def _mask_early_stops(
        self, logits: torch.Tensor, requests: Sequence[SampleRequest]
    ) -> torch.Tensor:
        """-inf on EOS/stop ids for rows still below min_tokens."""
        rows: list[int] = []
        cols: list[int] = []
        for row, r in enumerate(requests):
            banned = self._banned_ids(r)
            rows.extend([row] * len(banned))
            cols.extend(banned)
        if not rows:
            return logits
        logits = logits.clone()
        logits[torch.tensor(rows), torch.tensor(cols)] = float("-inf")
        return logits

    @staticmethod
    def _probs(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
        """Temperature, then top-k, then top-p (on the top-k renormalised mass)."""
        num_rows, vocab = logits.shape
        device = logits.device
        # Greedy rows get temperature 1 here; their sample is discarded anyway.
        temps = torch.tensor(
            [r.params.temperature or 1.0 for r in requests], device=device
        )  # [N]
        logits = logits / temps[:, None]  # [N, vocab]
        top_ks = [r.params.top_k for r in requests]
        top_ps = [r.params.top_p for r in requests]
        if all(k == 0 for k in top_ks) and all(p == 1.0 for p in top_ps):
            return torch.softmax(logits, dim=-1)

        sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)  # [N, vocab] each
        rank = torch.arange(vocab, device=device)  # [vocab]
        k = torch.tensor([k if k > 0 else vocab for k in top_ks], device=device)  # [N]
        sorted_logits = sorted_logits.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
        sorted_probs = torch.softmax(sorted_logits, dim=-1)  # [N, vocab]
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, vocab]
        p = torch.tensor(top_ps, device=device)  # [N]
        # Keep a token while the mass of the more likely ones is below top_p;
        # the first token always survives (mass_before = 0 < p).
        sorted_probs = sorted_probs.masked_fill(mass_before >= p[:, None], 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        return torch.zeros_like(sorted_probs).scatter_(-1, sorted_ids, sorted_probs)
