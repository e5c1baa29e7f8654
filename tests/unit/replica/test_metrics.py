from prometheus_client import generate_latest

from sluice.replica.engine_loop import EngineSnapshot
from sluice.replica.metrics import ReplicaCollector, ReplicaCounters, create_registry


def test_prefix_cache_counters_are_exported_in_tokens():
    snapshot = EngineSnapshot(
        total_kv_blocks=100, free_kv_blocks=60, block_size_tokens=16, num_running=2, num_waiting=1,
        step_time_s=0.01, steps_total=5, generated_tokens_total=9, preemptions_total=1, last_step_at_s=0.0,
        prefix_cache_queried_tokens_total=640, prefix_cache_hit_tokens_total=512, cached_free_kv_blocks=7,
    )
    collector = ReplicaCollector("r0", "tiny-v1", lambda: snapshot, ReplicaCounters(), lambda: True)
    text = generate_latest(create_registry(collector)).decode()
    labels = '{model="tiny-v1",replica="r0"}'
    assert f"sluice_prefix_cache_queries_total{labels} 640.0" in text
    assert f"sluice_prefix_cache_hits_total{labels} 512.0" in text
    assert f"sluice_kv_cached_free_blocks{labels} 7.0" in text
    assert 'sluice_kv_blocks{model="tiny-v1",replica="r0",state="free"} 60.0' in text
