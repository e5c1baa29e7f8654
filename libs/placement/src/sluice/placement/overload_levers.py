"""Which overload lever applies to one request, from its pool's stage.

    stage >= 1, batch                      -> PAUSE_BATCH      (429 batch_paused)
    stage >= 3, the key allows a fallback,
      and the fallback pool is below 3     -> FALLBACK         (enqueue there instead)
    stage >= 2, degradable, long prompt    -> REFUSE_LONG_PROMPT (429 over_capacity)
    stage >= 2, degradable, output > cap   -> CAP_OUTPUT       (the ask with max_tokens capped)
    otherwise                              -> NONE

Critical requests never get here (the scheduler skips them). Stage 4's
early rejection needs the request's predicted start, so the scheduler
applies it after its own checks. Pure: the scheduler turns the choice into
a refusal (with its Retry-After), a queue entry, or an enqueue elsewhere.
"""

from dataclasses import dataclass, replace
from enum import Enum

from sluice.admission.overload import OverloadStage
from sluice.placement.asks import Ask, ServiceClass
from sluice.placement.config import OverloadLevers


class Lever(Enum):
    NONE = "none"
    PAUSE_BATCH = "batch_paused"
    FALLBACK = "fallback"
    REFUSE_LONG_PROMPT = "long_prompt"
    CAP_OUTPUT = "output_capped"


@dataclass(frozen=True, slots=True)
class LeverChoice:
    lever: Lever
    ask: Ask                    # with CAP_OUTPUT: capped; with FALLBACK: aimed at the fallback version
    output_cap_tokens: int = 0  # with CAP_OUTPUT: the cap


def choose_lever(ask: Ask, stage: OverloadStage, levers: OverloadLevers, fallback_stage: OverloadStage) -> LeverChoice:
    """`fallback_stage`: the stage of the ask's fallback pool (pass
    REJECTING when it has none or it already refused the request)."""
    if stage >= OverloadStage.BATCH_PAUSED and ask.service_class is ServiceClass.BATCH:
        return LeverChoice(Lever.PAUSE_BATCH, ask)
    fallback = ask.fallback_model_version
    if (
        stage >= OverloadStage.FALLBACK and fallback and fallback != ask.model_version
        and fallback_stage < OverloadStage.FALLBACK
    ):
        return LeverChoice(Lever.FALLBACK, replace(ask, model_version=fallback, fallback_model_version=""))
    degradable = ask.degradable or ask.service_class in levers.degradable_classes
    if stage < OverloadStage.OUTPUT_CAPPED or not degradable:
        return LeverChoice(Lever.NONE, ask)
    if ask.prompt_tokens >= levers.degraded_prompt_tokens:
        return LeverChoice(Lever.REFUSE_LONG_PROMPT, ask)
    cap = levers.degraded_output_tokens
    bound = ask.requested_output_tokens or ask.max_output_tokens
    if bound <= cap:
        return LeverChoice(Lever.NONE, ask)
    capped = replace(ask, requested_output_tokens=cap, max_output_tokens=min(ask.max_output_tokens, cap))
    return LeverChoice(Lever.CAP_OUTPUT, capped, cap)
