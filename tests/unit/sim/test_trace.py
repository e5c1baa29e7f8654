import math
import random
from collections import Counter
from pathlib import Path

import pytest

from sluice.sim.trace import TraceRow, read_trace, scale_to_rate, trace_stats, trace_workload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def write_trace(tmp_path: Path, lines: list[str], header: str = HEADER, newline: str = "\n") -> Path:
    """A trace file in the Azure LLM inference trace's format."""
    path = tmp_path / "trace.csv"
    path.write_text(newline.join([header, *lines]) + newline, encoding="utf-8", newline="")
    return path


def make_rows(count: int, gap_s: float = 0.5, seed: int = 0) -> tuple[TraceRow, ...]:
    rng = random.Random(seed)
    return tuple(TraceRow(n * gap_s, rng.randint(1, 4_000), rng.randint(1, 600)) for n in range(count))


# --- reading ------------------------------------------------------------------------------


def test_reads_seven_digit_fractions_to_the_100_ns(tmp_path):
    path = write_trace(tmp_path, [
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:46.6805901,10,1",   # 100 ns later: beyond what datetime holds
        "2023-11-16 18:15:50.9951690,396,109",
    ])
    rows = read_trace(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in rows] == [(374, 44), (10, 1), (396, 109)]
    assert rows[0].arrival_s == 0.0
    assert rows[1].arrival_s == pytest.approx(1e-7, abs=1e-12)
    assert rows[2].arrival_s == pytest.approx(4.314579, abs=1e-12)


def test_times_cross_midnight_and_other_timestamp_spellings_parse(tmp_path):
    path = write_trace(tmp_path, [
        "2023-12-31 23:59:59.5,1,1",
        "2024-01-01 00:00:00.25,2,2",
        "2024-01-01T00:00:01Z,3,3",
        "2024-01-01 01:00:02.000000+01:00,4,4",  # the same instant as 00:00:02 UTC
    ])
    assert [r.arrival_s for r in read_trace(path)] == pytest.approx([0.0, 0.75, 1.5, 2.5])


def test_skips_blank_lines_and_reads_crlf_and_extra_columns_by_name(tmp_path):
    path = write_trace(tmp_path, [
        "7,2023-11-16 18:15:46.0000000,374,x",
        "",
        "   ",
        "9,2023-11-16 18:15:47.5000000,400,y",
        "",
    ], header="GeneratedTokens,TIMESTAMP,ContextTokens,Note", newline="\r\n")
    assert read_trace(path) == (TraceRow(0.0, 374, 7), TraceRow(1.5, 400, 9))


def test_rows_out_of_order_come_back_in_arrival_order(tmp_path):
    path = write_trace(tmp_path, ["2023-11-16 18:15:48.0,2,2", "2023-11-16 18:15:46.0,1,1"])
    assert read_trace(path) == (TraceRow(0.0, 1, 1), TraceRow(2.0, 2, 2))


@pytest.mark.parametrize(("bad_row", "reason"), [
    ("2023-11-16 18:15:47.0,12x,5", "ContextTokens is not an integer"),
    ("2023-11-16 18:15:47.0,12,-5", "GeneratedTokens is negative"),
    ("2023-11-16 18:15:47.0,12", "expected at least 3 fields"),
    ("yesterday,12,5", "not a timestamp"),
    ("2023-11-16 18:15:61.0,12,5", ""),  # datetime words its own reason
])
def test_a_malformed_row_is_refused_naming_its_line(tmp_path, bad_row, reason):
    path = write_trace(tmp_path, ["2023-11-16 18:15:46.0,1,1", "", bad_row, "2023-11-16 18:15:48.0,1,1"])
    with pytest.raises(ValueError, match=rf"trace\.csv:4: {reason}"):
        read_trace(path)


def test_a_file_without_the_columns_or_rows_is_refused(tmp_path):
    with pytest.raises(ValueError, match="trace.csv:1: header"):
        read_trace(write_trace(tmp_path, ["1,2,3"], header="time,prompt,output"))
    with pytest.raises(ValueError, match="no rows"):
        read_trace(write_trace(tmp_path, ["", ""]))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty file"):
        read_trace(tmp_path / "empty.csv")


# --- stats and scaling --------------------------------------------------------------------


def test_stats_describe_count_duration_rate_and_nearest_rank_percentiles():
    rows = tuple(TraceRow(n * 2.0, prompt_tokens=n + 1, output_tokens=1_000 - n) for n in range(200))
    stats = trace_stats(rows)
    assert (stats.count, stats.duration_s) == (200, 398.0)
    assert stats.mean_rate_per_s == 0.5  # one per 2 s gap
    assert (stats.prompt_p50_tokens, stats.prompt_p99_tokens) == (100, 198)
    assert (stats.output_p50_tokens, stats.output_p99_tokens) == (900, 998)
    assert trace_stats((TraceRow(0.0, 5, 5),)).mean_rate_per_s == math.inf


def test_scale_to_rate_makes_the_replay_arrive_at_that_rate():
    rows = make_rows(1_000, gap_s=0.25)  # 4 per second
    for target_per_s in (1.0, 4.0, 10.0):
        scale = scale_to_rate(rows, target_per_s)
        replay = trace_workload(rows, rate_scale=scale)
        replay_rate_per_s = (len(replay) - 1) / (replay[-1].arrival_s - replay[0].arrival_s)
        assert replay_rate_per_s == pytest.approx(target_per_s, rel=1e-9)
    with pytest.raises(ValueError):
        scale_to_rate((TraceRow(0.0, 1, 1),), 1.0)
    with pytest.raises(ValueError):
        scale_to_rate(rows, 0.0)


# --- replay -------------------------------------------------------------------------------


def test_rate_scale_divides_every_gap_and_keeps_the_lengths():
    rows = make_rows(100)
    base = trace_workload(rows)
    for rate_scale in (2.0, 0.5):
        scaled = trace_workload(rows, rate_scale=rate_scale)
        assert [r.arrival_s for r in scaled] == pytest.approx([r.arrival_s / rate_scale for r in base])
        assert [(r.prompt_tokens, r.output_tokens) for r in scaled] == [(r.prompt_tokens, r.output_tokens)
                                                                       for r in base]
    assert base[1].arrival_s - base[0].arrival_s == 0.5
    twice = trace_workload(rows, rate_scale=2.0)
    assert twice[1].arrival_s - twice[0].arrival_s == 0.25


def test_duration_cuts_replayed_time():
    rows = make_rows(100, gap_s=1.0)  # arrivals 0..99 s
    assert len(trace_workload(rows, duration_s=10.0)) == 10
    # At twice the speed, 10 s of replay holds the first 20 s of the trace.
    cut = trace_workload(rows, rate_scale=2.0, duration_s=10.0)
    assert len(cut) == 20 and cut[-1].arrival_s < 10.0
    assert trace_workload(rows, duration_s=0.0) == []


def test_requests_carry_the_traced_lengths_and_ids():
    rows = (TraceRow(0.0, 374, 44), TraceRow(4.3, 396, 0))
    first, second = trace_workload(rows)
    assert (first.request_id, first.prompt_tokens, first.output_tokens, first.requested_max_tokens) == (
        "r0000000", 374, 44, 44)
    assert (first.tenant, first.service_class, first.shared_prefix_tokens) == ("tenant-0", "interactive", 0)
    assert (second.request_id, second.arrival_s, second.output_tokens) == ("r0000001", 4.3, 1)


def test_tenants_and_batch_marks_are_deterministic_for_a_seed():
    rows = make_rows(20_000)
    tenants = ("acme", "globex", "initech")
    replay = trace_workload(rows, tenants=tenants, batch_share=0.2, seed=5)
    assert replay == trace_workload(rows, tenants=tenants, batch_share=0.2, seed=5)
    assert replay != trace_workload(rows, tenants=tenants, batch_share=0.2, seed=6)

    by_tenant = Counter(r.tenant for r in replay)
    assert set(by_tenant) == set(tenants)
    assert all(n / len(replay) == pytest.approx(1 / 3, abs=0.02) for n in by_tenant.values())
    classes = Counter(r.service_class for r in replay)
    assert classes["batch"] / len(replay) == pytest.approx(0.2, abs=0.015)

    # A row keeps its tenant whatever the share or speed, and a larger share only adds batch rows.
    none = trace_workload(rows, tenants=tenants, batch_share=0.0, seed=5)
    more = trace_workload(rows, tenants=tenants, batch_share=0.4, seed=5, rate_scale=3.0)
    assert [r.tenant for r in none] == [r.tenant for r in replay] == [r.tenant for r in more]
    assert {r.service_class for r in none} == {"interactive"}
    assert all(m.service_class == "batch" for r, m in zip(replay, more) if r.service_class == "batch")


def test_every_row_can_be_batch():
    replay = trace_workload(make_rows(50), service_class="batch")
    assert {r.service_class for r in replay} == {"batch"}
    assert {r.service_class for r in trace_workload(make_rows(50), batch_share=1.0)} == {"batch"}


@pytest.mark.parametrize("overrides", [
    {"rate_scale": 0.0}, {"rate_scale": math.inf}, {"duration_s": -1.0}, {"tenants": ()},
    {"service_class": "flex"}, {"batch_share": 1.5},
])
def test_replay_refuses_bad_parameters(overrides):
    with pytest.raises(ValueError):
        trace_workload(make_rows(3), **overrides)
