"""The rate-limit headers' durations, as OpenAI writes them."""

import pytest

from sluice.limits import BucketStatus
from sluice.limits.rate_status import go_duration


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (-1, "0s"), (0.0061, "7ms"), (0.5, "500ms"), (1, "1s"), (1.5, "1.5s"), (59.9991, "60s"),
    (60, "1m0s"), (360, "6m0s"), (3725, "1h2m5s"),
])
def test_durations_read_like_openais(seconds, text):
    assert go_duration(seconds) == text


def test_a_bucket_in_debt_reports_nothing_left_and_more_than_a_minute_to_reset():
    debt = BucketStatus(limit=600, remaining=-300)
    assert debt.reset_s == pytest.approx(90.0)

