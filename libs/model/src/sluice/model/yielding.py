"""Giving a step up part-way, for work that cannot wait for its end.

The engine loop passes `ModelRunner.execute` a `should_yield` check when
the step's plan allows it (`StepPlan.yields_to_chats`); the model asks it
before each decoder layer and before the LM head, and raises `StepYielded`
once it says yes. Nothing is sampled before the last check, so no sampler
state moves. The K/V the finished layers wrote lie in slots past each
sequence's computed tokens, which no attention reads before the step that
computes those tokens writes them again.
"""

from collections.abc import Callable

YieldCheck = Callable[[], bool]


class StepYielded(Exception):
    """The step was given up before its end; its plan must not be applied."""


def check(should_yield: YieldCheck | None) -> None:
    if should_yield is not None and should_yield():
        raise StepYielded
