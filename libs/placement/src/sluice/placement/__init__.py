"""The cluster placement policy the scheduler service applies: which replica
gets a request and how much KV it reserves there. Pure: no I/O, no asyncio,
the clock passed in. Class queues and tenant fairness grow here."""
