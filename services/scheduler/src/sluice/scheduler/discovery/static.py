"""A fixed list of replica addresses (SLUICE_REPLICA_ADDRESSES): local runs,
tests, and any deployment where replicas do not come and go."""

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)

OnAddresses = Callable[[frozenset[str]], None]


class ReplicaDiscovery(Protocol):
    """Started on the asyncio loop; calls `on_addresses` on that loop with the
    whole current set of replica addresses, first once it knows them, then on
    every change."""

    def start(self, on_addresses: OnAddresses) -> None: ...

    async def stop(self) -> None: ...


class StaticDiscovery:
    def __init__(self, addresses: Sequence[str]) -> None:
        self._addresses = frozenset(addresses)

    def start(self, on_addresses: OnAddresses) -> None:
        log.info("replica addresses (static): %s", ", ".join(sorted(self._addresses)) or "none")
        on_addresses(self._addresses)

    async def stop(self) -> None:
        return None
