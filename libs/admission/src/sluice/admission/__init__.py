"""KV admission: the arithmetic and the rules that decide, before a request
waits anywhere, whether it may wait at all.

Pure (no I/O, no asyncio, the clock passed in) so the scheduler service, the
unit tests and the simulator run the same code:

- `kv`: bytes per token from the model config, blocks for a token count;
- `reservation`: what a request reserves (prompt + bounded output + buffer);
- `tenant_caps`: per-tenant caps on active sequences and KV share;
- `prediction`: when a queued request would start, from the work ahead and
  the work running, and the Retry-After for one refused now.
"""
