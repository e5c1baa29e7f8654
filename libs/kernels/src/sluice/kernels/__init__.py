"""Paged attention kernels for Sluice replicas.

`paged_attention_reference` is the plain torch definition of what every
kernel must compute; Triton kernels (decode, chunked prefill) are compared
against it in tests.

The CPU path needs only torch (``paged_attention_cpu``), plus, where the
install compiled it, a native C kernel for decode rows
(``paged_attention_native``); nothing imported here imports triton.
``triton_attention`` (the CUDA AttentionBackend) imports the Triton kernel
modules (``triton_paged_decode``, ``triton_paged_prefill``,
``triton_write_kv``) on its first call.
"""

from sluice.kernels.paged_attention_reference import paged_attention, write_kv
from sluice.kernels.triton_backend import triton_attention

__all__ = ["paged_attention", "triton_attention", "write_kv"]
