"""The quality gate's verdict from what the two versions produced on the
prompt set (pure: plain lists of token ids and log-probabilities in, no
torch; the runner computes them).

Per prompt the runner observes:

    serving greedy   g = g0 g1 … gn        the serving version's greedy answer (EOS included if it stopped)
    candidate top-1  c = c0 c1 … cn        the candidate's argmax at each position, fed the prompt + g
                                           (teacher forcing: one mistake does not derail the rest)
    reference        log p(r_i | prompt, r_<i) per token of the reference answer, under each version
    answers          each version's own greedy answer as text, and whether it stopped (EOS) in bounds

Gates (QualityThresholds):

    greedy agreement   Σ [c_i == g_i] / Σ n       >= min_greedy_agreement
    log-likelihood     mean_serving - mean_candidate (nats/token) <= max_logprob_drop
    checks             prompts where the serving answer passes a check and the candidate's fails it
                       (non_empty, no_refusal, stops, json)          <= max_check_regressions

Checks count only as regressions: a check the serving version fails too
says something about the prompt set or today's model, not the candidate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from statistics import fmean

from sluice.rollout.quality.prompts import PromptSpec

# Lower-cased openings of a refusal (matched anywhere in the first 200 characters).
REFUSAL_PHRASES = (
    "i can't", "i cannot", "i can not", "i won't", "i will not", "i'm sorry", "i am sorry",
    "i'm unable", "i am unable", "as an ai", "i'm not able to", "i am not able to",
)


@dataclass(frozen=True, slots=True)
class QualityThresholds:
    min_greedy_agreement: float = 0.9
    max_logprob_drop: float = 0.1  # nats per reference token
    max_check_regressions: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_greedy_agreement <= 1:
            raise ValueError(f"min_greedy_agreement must be within 0..1, got {self.min_greedy_agreement}")
        if not (math.isfinite(self.max_logprob_drop) and self.max_logprob_drop >= 0):
            raise ValueError(f"max_logprob_drop must be >= 0, got {self.max_logprob_drop}")
        if self.max_check_regressions < 0:
            raise ValueError(f"max_check_regressions must be >= 0, got {self.max_check_regressions}")


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    stopped: bool  # ended with EOS before max_new_tokens


@dataclass(frozen=True, slots=True)
class PromptObservation:
    prompt_id: str
    serving_greedy: tuple[int, ...]
    candidate_top1: tuple[int, ...]  # aligned with serving_greedy
    serving_reference_logprobs: tuple[float, ...]
    candidate_reference_logprobs: tuple[float, ...]
    serving_answer: Answer
    candidate_answer: Answer

    def __post_init__(self) -> None:
        if len(self.serving_greedy) != len(self.candidate_top1):
            raise ValueError(f"{self.prompt_id}: {len(self.candidate_top1)} candidate tokens for "
                             f"{len(self.serving_greedy)} serving ones")
        if not self.serving_reference_logprobs or (
                len(self.serving_reference_logprobs) != len(self.candidate_reference_logprobs)):
            raise ValueError(f"{self.prompt_id}: reference log-probabilities missing or misaligned")


@dataclass(frozen=True, slots=True)
class QualityReport:
    greedy_agreement: float
    serving_logprob: float  # mean per reference token
    candidate_logprob: float
    regressions: tuple[str, ...]  # "prompt-id: check"
    failures: tuple[str, ...]  # the gates it failed, in words

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def logprob_drop(self) -> float:
        return self.serving_logprob - self.candidate_logprob

    def summary(self) -> str:
        scores = (f"greedy agreement {self.greedy_agreement:.3f}, log-likelihood drop {self.logprob_drop:+.3f} "
                  f"nats/token, {len(self.regressions)} check regressions")
        return scores if self.passed else f"{scores}: " + "; ".join(self.failures)


def check_passes(check: str, answer: Answer) -> bool:
    text = answer.text.strip()
    if check == "non_empty":
        return bool(text)
    if check == "stops":
        return answer.stopped
    if check == "no_refusal":
        head = text[:200].lower().replace("\u2019", "'")
        return not any(phrase in head for phrase in REFUSAL_PHRASES)
    if check == "json":
        return _parses_as_json(text)
    raise ValueError(f"unknown check {check!r}")


def score(prompts: tuple[PromptSpec, ...], observations: tuple[PromptObservation, ...],
          thresholds: QualityThresholds) -> QualityReport:
    by_id = {o.prompt_id: o for o in observations}
    missing = [p.id for p in prompts if p.id not in by_id]
    if missing:
        raise ValueError(f"no observation for prompts {missing}")
    positions = sum(len(o.serving_greedy) for o in observations)
    matches = sum(a == b for o in observations for a, b in zip(o.serving_greedy, o.candidate_top1))
    agreement = matches / positions if positions else 1.0
    serving_lp = fmean(lp for o in observations for lp in o.serving_reference_logprobs)
    candidate_lp = fmean(lp for o in observations for lp in o.candidate_reference_logprobs)
    regressions = tuple(
        f"{p.id}: {check}" for p in prompts for check in p.checks
        if check_passes(check, by_id[p.id].serving_answer) and not check_passes(check, by_id[p.id].candidate_answer)
    )
    failures: list[str] = []
    if agreement < thresholds.min_greedy_agreement:
        failures.append(f"greedy agreement {agreement:.3f} < {thresholds.min_greedy_agreement:g}")
    if serving_lp - candidate_lp > thresholds.max_logprob_drop:
        failures.append(f"log-likelihood of the references {serving_lp - candidate_lp:.3f} nats/token below "
                        f"the serving version's (limit {thresholds.max_logprob_drop:g})")
    if len(regressions) > thresholds.max_check_regressions:
        shown = ", ".join(regressions[:5]) + (" …" if len(regressions) > 5 else "")
        failures.append(f"{len(regressions)} check regressions (limit {thresholds.max_check_regressions}): {shown}")
    return QualityReport(agreement, serving_lp, candidate_lp, regressions, tuple(failures))


def _parses_as_json(text: str) -> bool:
    """The answer is JSON, alone or in one ``` fenced block."""
    if text.startswith("```"):
        text = text.strip("`")
        text = text[4:] if text.lower().startswith("json") else text
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
