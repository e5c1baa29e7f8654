"""Paged attention kernels for Sluice replicas.

`paged_attention_reference` is the plain torch definition of what every
kernel must compute; Triton kernels (decode, chunked prefill) are compared
against it in tests.
"""

from sluice.kernels.paged_attention_reference import paged_attention, write_kv

__all__ = ["paged_attention", "write_kv"]
