"""The cluster placement policy the scheduler service applies. Pure: no I/O,
no asyncio, the clock passed in, so the simulator drives it unchanged.

- `asks`: what the router asks for, and the decisions that answer it;
- `config`: every knob, with its reason;
- `class_queue` + `vtc`: per pool and class, a bounded queue, fair across
  tenants by virtual token counters;
- `reservations`: the KV blocks and seats promised per replica;
- `prefix_index`: which prompt blocks each replica holds in its prefix cache;
- `replica_choice`: filters, scorers and a picker over the replicas;
- `cluster`: the core that ties them together (enqueue, schedule, release).
"""
