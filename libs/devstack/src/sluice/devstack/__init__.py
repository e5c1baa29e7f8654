"""Runs the whole platform on one machine as separate processes: the
engine behind `make run` and the integration tests."""
