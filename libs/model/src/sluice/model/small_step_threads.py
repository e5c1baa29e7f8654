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
been faster per token lately, and every `explore_every` small steps runs a
few on the other arm, so a change in the machine's load is noticed. Pure:
the caller times its steps and reports them.
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


@dataclass(slots=True)
class SmallStepThreads:
    """Chooses between one thread and `all_threads` for steps of at most
    `max_step_tokens` tokens; larger steps always run on all."""

    max_step_tokens: int
    all_threads: int
    explore_every: int = 64  # small steps between two spells on the other arm
    explore_steps: int = 4   # steps in such a spell
    min_samples: int = 8     # an arm is not judged on fewer steps
    _arms: tuple[_Arm, _Arm] = field(init=False)
    _current: int = 0        # index into _arms: 0 = one thread
    _since_explore: int = 0
    _exploring_left: int = 0

    def __post_init__(self) -> None:
        if self.max_step_tokens < 0 or self.all_threads < 1:
            raise ValueError("max_step_tokens must be >= 0 and all_threads >= 1")
        self._arms = (_Arm(1), _Arm(self.all_threads))

    @property
    def choosing(self) -> bool:
        """Whether there is a choice to make: small steps exist and there is more than one thread."""
        return self.max_step_tokens > 0 and self.all_threads > 1

    @property
    def preferred_threads(self) -> int:
        """The arm small steps run on outside exploration."""
        return self._arms[self._current].threads

    def threads_for(self, num_tokens: int) -> int:
        """Threads for the next step of `num_tokens`; report its time with `observe`."""
        if not self.choosing or num_tokens > self.max_step_tokens:
            return self.all_threads
        if self._exploring_left:
            return self._arms[1 - self._current].threads
        return self._arms[self._current].threads

    def observe(self, threads: int, num_tokens: int, seconds: float) -> None:
        """A step of `num_tokens` ran on `threads` in `seconds` (its wall time)."""
        if not self.choosing or num_tokens > self.max_step_tokens or num_tokens <= 0:
            return
        arm = self._arms[0] if threads == 1 else self._arms[1]
        arm.observe(seconds / num_tokens)
        self._decide()
        if self._exploring_left:
            self._exploring_left -= 1
            return
        self._since_explore += 1
        other = self._arms[1 - self._current]
        # Early on, until the other arm has enough steps, and then now and again.
        if other.samples < self.min_samples or self._since_explore >= self.explore_every:
            self._since_explore = 0
            self._exploring_left = self.explore_steps

    def _decide(self) -> None:
        one, many = self._arms
        if one.samples < self.min_samples or many.samples < self.min_samples:
            return
        self._current = 0 if one.seconds_per_token <= many.seconds_per_token else 1
