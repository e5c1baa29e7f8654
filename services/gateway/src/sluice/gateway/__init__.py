"""The gateway: the only door tenants see. OpenAI-compatible HTTP and SSE,
authentication, request validation and a cheap size pre-check. It knows no
model and no tokenizer: text goes to the router, text comes back."""
