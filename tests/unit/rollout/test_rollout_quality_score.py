import json

import pytest

from sluice.rollout.quality.prompts import CHECKS, PromptSpec, default_prompt_set, parse_prompt_set
from sluice.rollout.quality.score import (
    Answer, PromptObservation, QualityThresholds, check_passes, score,
)

GOOD = Answer("Paris", stopped=True)


def spec(prompt_id: str, checks: tuple[str, ...] = ("non_empty",)) -> PromptSpec:
    return PromptSpec(prompt_id, (("user", "q"),), "ref", checks)


def observation(prompt_id: str, serving=(5, 6, 7, 2), candidate=(5, 6, 7, 2), serving_lp=(-1.0, -2.0),
                candidate_lp=(-1.0, -2.0), serving_answer=GOOD, candidate_answer=GOOD) -> PromptObservation:
    return PromptObservation(prompt_id, tuple(serving), tuple(candidate), tuple(serving_lp), tuple(candidate_lp),
                             serving_answer, candidate_answer)


def test_identical_behaviour_passes_with_full_agreement():
    report = score((spec("a"), spec("b")), (observation("a"), observation("b")), QualityThresholds())
    assert report.passed
    assert report.greedy_agreement == 1.0 and report.logprob_drop == 0.0 and report.regressions == ()


def test_agreement_is_token_level_over_all_prompts():
    # 3 of 4 and 1 of 4 tokens agree: 4 of 8 overall.
    observations = (observation("a", candidate=(5, 6, 7, 9)), observation("b", candidate=(5, 0, 0, 0)))
    report = score((spec("a"), spec("b")), observations, QualityThresholds(min_greedy_agreement=0.9))
    assert report.greedy_agreement == 0.5
    assert not report.passed and "greedy agreement 0.500 < 0.9" in report.summary()
    assert score((spec("a"), spec("b")), observations, QualityThresholds(min_greedy_agreement=0.5)).passed


def test_a_lower_reference_log_likelihood_past_the_limit_fails():
    worse = observation("a", candidate_lp=(-1.2, -2.2))  # 0.2 nats/token lower
    assert not score((spec("a"),), (worse,), QualityThresholds(max_logprob_drop=0.1)).passed
    report = score((spec("a"),), (worse,), QualityThresholds(max_logprob_drop=0.25))
    assert report.passed and abs(report.logprob_drop - 0.2) < 1e-9
    better = observation("a", candidate_lp=(-0.5, -0.5))
    assert score((spec("a"),), (better,), QualityThresholds(max_logprob_drop=0.0)).passed


def test_checks_count_only_where_the_serving_version_passes_them():
    prompts = (spec("json", ("non_empty", "json")), spec("stop", ("stops", "no_refusal")))
    observations = (
        # Both fail json: not the candidate's regression. The candidate is empty: a regression.
        observation("json", serving_answer=Answer("not json", True), candidate_answer=Answer("  ", True)),
        # The serving version stops and answers; the candidate refuses and runs on.
        observation("stop", serving_answer=Answer("Yes", True),
                    candidate_answer=Answer("I'm sorry, but I can't help", False)),
    )
    report = score(prompts, observations, QualityThresholds())
    assert report.regressions == ("json: non_empty", "stop: stops", "stop: no_refusal")
    assert not report.passed and "3 check regressions" in report.summary()
    assert score(prompts, observations, QualityThresholds(max_check_regressions=3)).passed


@pytest.mark.parametrize("check, text, stopped, passes", [
    ("non_empty", " \n", True, False),
    ("stops", "x", False, False),
    ("no_refusal", "As an AI language model I cannot", True, False),
    ("no_refusal", "I can\u2019t do that", True, False),
    ("no_refusal", "Sure: 42", True, True),
    ("json", '{"name": "Ada", "age": 36}', True, True),
    ("json", '```json\n[2, 3, 5]\n```', True, True),
    ("json", "{name: Ada}", True, False),
])
def test_each_check(check, text, stopped, passes):
    assert check_passes(check, Answer(text, stopped)) is passes


def test_misaligned_observations_are_refused():
    with pytest.raises(ValueError, match="candidate tokens"):
        observation("a", candidate=(1, 2))
    with pytest.raises(ValueError, match="no observation"):
        score((spec("a"), spec("b")), (observation("a"),), QualityThresholds())


def test_the_built_in_prompt_set_loads_and_covers_every_check():
    prompts = default_prompt_set()
    assert len(prompts.prompts) >= 10 and prompts.max_new_tokens >= 8
    assert {c for p in prompts.prompts for c in p.checks} == set(CHECKS)


@pytest.mark.parametrize("document, message", [
    ({"prompts": []}, "no prompts"),
    ({"prompts": [{"id": "a", "messages": [{"role": "user", "content": "q"}], "reference": "r",
                   "checks": ["rhymes"]}]}, "unknown checks"),
    ({"prompts": [{"id": "a", "messages": [{"role": "user", "content": "q"}], "reference": "r"}] * 2}, "repeats"),
    ({"prompts": [{"id": "a"}]}, "invalid prompt set"),
])
def test_a_bad_prompt_set_is_refused(document, message):
    with pytest.raises(ValueError, match=message):
        parse_prompt_set(json.dumps(document), "test.json")


@pytest.mark.parametrize("field, value", [("min_greedy_agreement", 1.5), ("max_logprob_drop", -0.1),
                                          ("max_check_regressions", -1)])
def test_bad_quality_thresholds_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        QualityThresholds(**{field: value})
