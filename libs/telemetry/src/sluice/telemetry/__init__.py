"""Tracing, trace-context carriers, exemplars, JSON logs and tenant labels.

Torch-free: every service (control plane and replica) imports it.
"""
