"""How many torch threads a small engine step runs on, chosen by measuring.

A step's parallel regions each wait at a barrier for every thread; where
other processes share the cores (the gateway, router and clients beside a
CPU replica), a thread kept off a core makes the rest wait. Whether one
thread or all is faster for a small step (decodes, small chunks) depends on
the CPU and on how busy the other cores are, and the answer measured alone
is the wrong one: alone, two threads win on every machine tried, while in
a busy stack one thread won on an AVX-512 Xeon (whose greedy head is a
short bf16 screen) and two on an AVX2 EPYC (whose head is one long GEMM).

So the runner measures in place: it runs small steps on the arm that has
been faster per token lately for steps of their size, and every
`explore_every` such steps runs a few on the other arm, so a change in the
machine's load is noticed. Pure: the caller times its steps and reports
them.
"""

from dataclasses import dataclass, field

# Weight of a new step in an arm's average time per token: ~the arm's last
# 5 steps, so a spell of exploration speaks for the arm as it is now, and
# one step slowed by another process does not decide alone.
EWMA_WEIGHT = 0.2


@dataclass(slots=True)
class _Arm:
    threads: int
    seconds_per_token: float = 0.0
    samples: int = 0

    def observe(self, seconds_per_token: float) -> None:
        if self.samples == 0:
            self.seconds_per_token = seconds_per_token
        else:
            self.seconds_per_token += EWMA_WEIGHT * (seconds_per_token - self.seconds_per_token)
        self.samples += 1


def size_class(num_tokens: int) -> int:
    """Steps compared with each other: within a power of two of tokens.

    A step's time per token falls steeply with its size (a one-token
    step's fixed cost is all its own; 64 decodes share theirs), so an arm
    judged on every size at once is judged on which sizes it happened to
    run: an arm explored during a warm-up of one-token steps looked ~20x
    slower per token than the other arm running 64-decode steps, and kept
    that name for hundreds of steps (the whole of a benchmark run)."""
    return num_tokens.bit_length()


@dataclass(slots=True)
class _SizeClass:
    """The two arms' times for steps of one size class, and which one runs them."""

    arms: tuple[_Arm, _Arm]
    current: int = 0  # index into arms: 0 = one thread
    since_explore: int = 0
    exploring_left: int = 0


@dataclass(slots=True)
class SmallStepThreads:
    """Chooses between one thread and `all_threads` for steps of at most
    `max_step_tokens` tokens, per size class (see `size_class`); larger
    steps always run on all."""

    max_step_tokens: int
    all_threads: int
    explore_every: int = 64  # a size class's steps between two spells on its other arm
    explore_steps: int = 4   # steps in such a spell
    min_samples: int = 8     # an arm is not judged on fewer steps
    _classes: dict[int, _SizeClass] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_step_tokens < 0 or self.all_threads < 1:
            raise ValueError("max_step_tokens must be >= 0 and all_threads >= 1")

    @property
    def choosing(self) -> bool:
        """Whether there is a choice to make: small steps exist and there is more than one thread."""
        return self.max_step_tokens > 0 and self.all_threads > 1

    def _chooses_for(self, num_tokens: int) -> bool:
        """Whether steps of `num_tokens` are small steps, the ones it chooses for."""
        return self.choosing and 0 < num_tokens <= self.max_step_tokens

    def preferred_threads(self, num_tokens: int) -> int:
        """The arm steps of `num_tokens` run on outside exploration."""
        if not self._chooses_for(num_tokens):
            return self.all_threads
        size = self._classes.get(size_class(num_tokens))
        return 1 if size is None or size.current == 0 else self.all_threads

    def threads_for(self, num_tokens: int) -> int:
        """Threads for the next step of `num_tokens`; report its time with `observe`."""
        if not self._chooses_for(num_tokens):
            return self.all_threads
        size = self._size(num_tokens)
        arm = 1 - size.current if size.exploring_left else size.current
        return size.arms[arm].threads

    def observe(self, threads: int, num_tokens: int, seconds: float) -> None:
        """A step of `num_tokens` ran on `threads` in `seconds` (its wall time)."""
        if not self._chooses_for(num_tokens):
            return
        size = self._size(num_tokens)
        size.arms[0 if threads == 1 else 1].observe(seconds / num_tokens)
        self._decide(size)
        if size.exploring_left:
            size.exploring_left -= 1
            return
        size.since_explore += 1
        other = size.arms[1 - size.current]
        # Early on, until the other arm has enough steps, and then now and again.
        if other.samples < self.min_samples or size.since_explore >= self.explore_every:
            size.since_explore = 0
            size.exploring_left = self.explore_steps

    def _size(self, num_tokens: int) -> _SizeClass:
        key = size_class(num_tokens)
        size = self._classes.get(key)
        if size is None:
            size = self._classes[key] = _SizeClass((_Arm(1), _Arm(self.all_threads)))
        return size

    def _decide(self, size: _SizeClass) -> None:
        one, many = size.arms
        if one.samples < self.min_samples or many.samples < self.min_samples:
            return
        size.current = 0 if one.seconds_per_token <= many.seconds_per_token else 1
