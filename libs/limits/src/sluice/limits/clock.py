"""The clock every limit takes: seconds as a float, injectable for tests.

In-process implementations default to time.monotonic. The Redis ones
default to None, meaning Redis TIME read inside the script, so every
gateway shares one clock; a clock passed in is sent to the script instead.
"""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]
