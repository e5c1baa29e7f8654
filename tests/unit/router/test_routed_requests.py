"""RoutedRequests (Router.GenerateMany's server side): relays run as tasks,
their events leave batched, refusals become RequestFailed events, a cancel
stops only its relay, and a closed call ends once nothing runs."""

import asyncio

import grpc

from sluice.router.multiplex import RoutedRequests
from sluice.rpc.errors import ServiceError
from sluice.v1 import router_pb2


class FakeRelay:
    """Streams `tokens` deltas and a finish; refuses prompts that say 'refuse';
    records cancellations."""

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    async def generate(self, request):
        if request.prompt_text == "refuse":
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "over_capacity", "busy", retry_after_s=1.5)
        try:
            yield router_pb2.GenerateEvent(admitted=router_pb2.Admitted(model_version="v1"))
            if request.prompt_text == "hang":
                await self.release.wait()
            for i in range(self.tokens):
                await asyncio.sleep(0)
                yield router_pb2.GenerateEvent(delta=router_pb2.Delta(text=str(i)))
            yield router_pb2.GenerateEvent(finished=router_pb2.Finished())
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise


def request(request_id: str, prompt: str = "hi") -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(request_id=request_id, prompt_text=prompt)


async def drain(routed: RoutedRequests) -> tuple[list[router_pb2.RoutedEvent], int]:
    events, batches = [], 0
    while (batch := await routed.next_batch()) is not None:
        events += batch.events
        batches += 1
    return events, batches


async def test_streams_are_batched_refusals_are_events_and_close_waits_for_the_running():
    relay = FakeRelay()
    routed = RoutedRequests(relay)
    for rid in ("a", "b", "c"):
        routed.submit(request(rid))
    routed.submit(request("r", "refuse"))
    routed.submit(request("a"))  # a duplicate id while "a" runs
    routed.close()
    events, batches = await drain(routed)
    by_id: dict[str, list[router_pb2.RoutedEvent]] = {}
    for event in events:
        by_id.setdefault(event.request_id, []).append(event)
    for rid in ("b", "c"):
        kinds = [e.event.WhichOneof("event") for e in by_id[rid]]
        assert kinds == ["admitted", "delta", "delta", "delta", "finished"]
    refused = by_id["r"][0].failed
    assert refused.reason == "over_capacity" and refused.retry_after_s == 1.5
    assert [e.WhichOneof("outcome") for e in by_id["a"]].count("failed") == 1  # the duplicate, refused
    assert batches < len(events) / 2, "events of the running streams should share messages"


async def test_cancel_stops_only_that_relay_and_cancel_all_stops_the_rest():
    relay = FakeRelay()
    routed = RoutedRequests(relay)
    routed.submit(request("x", "hang"))
    routed.submit(request("y", "hang"))
    first = await routed.next_batch()
    assert {e.request_id for e in first.events} == {"x", "y"}  # both admitted
    routed.cancel("x")
    await asyncio.sleep(0.01)
    assert relay.cancelled == ["x"]
    routed.cancel_all()
    await asyncio.sleep(0.01)
    assert sorted(relay.cancelled) == ["x", "y"]
    routed.close()
    assert await routed.next_batch() is None
