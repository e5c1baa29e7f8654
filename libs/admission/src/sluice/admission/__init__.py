"""Pure KV admission rules (no I/O, the clock passed in)."""
