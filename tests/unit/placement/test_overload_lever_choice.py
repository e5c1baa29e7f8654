"""choose_lever: which overload lever one request gets at each stage."""

import pytest

from sluice.admission.overload import OverloadStage
from sluice.placement.config import OverloadLevers
from sluice.placement.overload_levers import Lever, choose_lever

from placement_factories import BATCH, INTERACTIVE, make_ask

S = OverloadStage
LEVERS = OverloadLevers(degraded_output_tokens=32, degraded_prompt_tokens=1000)


def lever(stage, fallback_stage=S.NORMAL, levers=LEVERS, **ask):
    return choose_lever(make_ask("r", **ask), stage, levers, fallback_stage)


@pytest.mark.parametrize("stage", list(S))
def test_a_plain_interactive_request_is_never_touched(stage):
    assert lever(stage).lever is Lever.NONE


@pytest.mark.parametrize(("stage", "expected"), [
    (S.NORMAL, Lever.NONE), (S.BATCH_PAUSED, Lever.PAUSE_BATCH), (S.REJECTING, Lever.PAUSE_BATCH)])
def test_batch_is_paused_from_stage_one(stage, expected):
    assert lever(stage, service_class=BATCH, degradable=True, fallback="small").lever is expected


@pytest.mark.parametrize(("stage", "expected"), [
    (S.BATCH_PAUSED, Lever.NONE), (S.OUTPUT_CAPPED, Lever.CAP_OUTPUT), (S.REJECTING, Lever.CAP_OUTPUT)])
def test_output_is_capped_from_stage_two_for_degradable_requests(stage, expected):
    choice = lever(stage, degradable=True, max_tokens=500)
    assert choice.lever is expected
    if expected is Lever.CAP_OUTPUT:
        assert (choice.output_cap_tokens, choice.ask.requested_output_tokens, choice.ask.max_output_tokens) == (
            32, 32, 32)


def test_a_request_already_under_the_cap_or_with_little_room_is_not_capped():
    assert lever(S.OUTPUT_CAPPED, degradable=True, max_tokens=32).lever is Lever.NONE
    assert lever(S.OUTPUT_CAPPED, degradable=True, max_tokens=0, room=20).lever is Lever.NONE
    unbounded = lever(S.OUTPUT_CAPPED, degradable=True, max_tokens=0, room=4000)
    assert unbounded.lever is Lever.CAP_OUTPUT and unbounded.ask.requested_output_tokens == 32


def test_a_class_can_be_degradable_for_every_key():
    levers = OverloadLevers(degraded_output_tokens=32, degradable_classes=frozenset({INTERACTIVE}))
    assert lever(S.OUTPUT_CAPPED, levers=levers, max_tokens=500).lever is Lever.CAP_OUTPUT


def test_long_degradable_prompts_are_refused_from_stage_two():
    assert lever(S.OUTPUT_CAPPED, degradable=True, prompt=1000).lever is Lever.REFUSE_LONG_PROMPT
    assert lever(S.OUTPUT_CAPPED, degradable=True, prompt=999).lever is Lever.CAP_OUTPUT


def test_the_fallback_from_stage_three_while_its_own_pool_is_below_three():
    choice = lever(S.FALLBACK, fallback="small", degradable=True)
    assert choice.lever is Lever.FALLBACK
    assert (choice.ask.model_version, choice.ask.fallback_model_version) == ("small", "")
    assert lever(S.OUTPUT_CAPPED, fallback="small").lever is Lever.NONE
    # The fallback pool overloaded as well (or it refused): the pool's next lever.
    assert lever(S.FALLBACK, S.FALLBACK, fallback="small", degradable=True).lever is Lever.CAP_OUTPUT
    assert lever(S.REJECTING, fallback="v1").lever is Lever.NONE  # its own version is no fallback
