"""The router/admission service: everything model-specific on the way in and
out. It resolves a model alias to a version, renders that version's chat
template and tokenizes, checks the context, asks the scheduler for a
placement, then relays the replica's tokens back as text (incremental
detokenization, stop strings that cancel the replica call)."""
