"""The iteration scheduler's knobs, each with the reason for its default.

Validated once at construction; the replica builds one from its settings
(sluice.replica.settings), the simulator from its scenario.
"""

from dataclasses import dataclass

from sluice.engine.request import EngineRequest, ServiceClass


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Tokens per model step. Bigger steps prefill faster but every decode in
    # the batch waits for the whole step: this bounds inter-token latency.
    max_num_batched_tokens: int = 512
    # Sequences resident at once; bounds the decode batch and runner buffers.
    max_num_seqs: int = 128
    max_model_len_tokens: int = 4096
    # How long an interactive sequence may wait at the head of the line for
    # KV blocks or a sequence slot before it takes them from running batch
    # sequences. Batch work that fills the KV cache otherwise holds an
    # interactive request's TTFT hostage for a whole batch decode. Not 0: a
    # recompute costs the batch sequence its computed tokens not found in
    # the prefix cache, and running work often frees room within a few steps
    # (tens of ms); 0.25 s is a small share of an interactive TTFT target of
    # seconds. None: waiting sequences never preempt.
    interactive_preempt_after_s: float | None = 0.25
    # One sequence's prefill chunk is at most this many tokens, and at most
    # `max_long_prefills_per_step` long prompts (see the threshold below)
    # get a chunk in one step: near-context prompts then prefill a chunk at
    # a time instead of making every decode and every short prompt wait
    # for whole max_num_batched_tokens steps (inter-token latency and TTFT
    # spikes). Also alone on the replica: a request that arrives during
    # the step waits for one capped step, not for a whole prompt, and the
    # prompt pays little for it (tiny model on CPU, 1,500 tokens alone: 71
    # ms in chunks of 256 vs 65 ms in one step). 0 = no cap.
    long_prefill_chunk_tokens: int = 256
    max_long_prefills_per_step: int = 1
    # While another tenant's chats are live (a short interactive prompt of
    # theirs arrived within `interactive_recent_s`), a long prompt's chunk
    # is at most this many tokens (counted at the prompt's start, as the
    # cap above is). A chat that arrives mid-step waits out the step under
    # way, and on a CPU a long chunk is most of that step: a tenant's long
    # prompts then set another tenant's TTFT. Smaller chunks cost the long
    # prompt more steps (its own TTFT) only while someone else is chatting.
    # Measured on the tiny model on 2 cores, 8 resident 1,500-token
    # requests of one tenant beside another's chats at 4/s: the chats' p99
    # TTFT 2.3x alone with 128-token chunks, 1.5x with 48. 0 = the cap above.
    long_prefill_chunk_tokens_beside_chats: int = 0
    # A prompt with more than this left to prefill at admission is long:
    # it takes one of the step's `max_long_prefills_per_step` slots (its
    # tail included). Prompts between the chunk cap and this are chunked
    # but not limited in number, so a burst of ordinary prompts still
    # prefills many per step (64 prompts of 200 tokens at once: max TTFT
    # 694 ms when every prompt over a 128-token cap was long, vs 396 ms).
    long_prefill_threshold_tokens: int = 512
    # A chunk deep into a long prompt costs more than one at its start: each
    # of its tokens attends to everything before it. With this set, a long
    # prefill's chunk is sized so its cost, counted in tokens at the start
    # of a prompt, stays within long_prefill_chunk_tokens: n tokens starting
    # at position s cost n x (1 + (s + n/2) / scale). The scale is the depth
    # at which attention costs a token as much as its linear layers (from
    # the model's shape; ~1,400 tokens for the tiny model, ~50k for a 70B).
    # Measured on the tiny model with 32 decodes: a 256-token chunk took
    # 12 ms at the prompt's start and 37 ms at 3,300 tokens deep. 0 = chunk
    # size independent of depth.
    prefill_depth_scale_tokens: int = 0
    # While interactive work is live (see below), batch prefill takes at
    # most this many tokens of a step, counted at the prompt's start as the
    # chunk cap is (fewer deep into a prompt): the step, and so every
    # interactive token and every interactive arrival's wait for the step
    # under way, stays short however much batch work is prefilling. 0 = no cap.
    batch_prefill_tokens_beside_interactive: int = 256
    # Interactive work is live while an interactive sequence is resident or
    # waiting, and for this long after one arrived: a steady interactive
    # stream has gaps between its requests, and a batch step begun in a gap
    # at full size is what the next arrival waits out. Measured on the tiny
    # model on 2 cores, batch cap 64, a 64-stream flex flood beside 4 chats/s: batch steps
    # 22-24 ms -> 15 ms, the chats' wait at the replica p99 35-48 ms -> 27-33
    # ms, batch output 0.9x -> 0.75x of alone. 0 = only while resident or
    # waiting.
    interactive_recent_s: float = 1.0
    # A step that is mostly work a chat need not wait for may be given up
    # part-way (between two layers, before any token is sampled) when a
    # chat (see `is_chat`) arrives while it runs: the chat's first-token
    # step runs at once, with the interactive decodes but without batch or
    # long chunks, and the work given up is planned again after it. Mostly
    # means more batch sequences than interactive ones, or, while another
    # tenant's chats are live, one long prompt's chunk holding more tokens
    # than the rest of the step together. The step under way is otherwise
    # what an arriving chat waits out first, and on a CPU such a step in a
    # busy stack is 15-60 ms (tiny model, 2 cores, chats at 4/s: beside a
    # 64-stream flex flood their wait for it p50 12 ms, p90 31 ms, yielding
    # 5 and 10 ms; beside another tenant's eight 1,500-token requests p50
    # 8.3 ms, p90 11.9 ms, yielding 2.2 and 3.4 ms). Not for a step that is
    # mostly other sequences' decodes (32 chats beside one long chunk): they
    # would each lose the part given up, and the chats then wait for that
    # CPU. Never the step right after a first-token step or a given-up one:
    # batch and long prompts still advance at least every third step
    # however fast chats arrive.
    # Off on a GPU, where the host queues a step's layers ahead of the
    # device, so a check between them cuts little and wastes what was queued.
    yield_to_chats: bool = False

    def is_chat(self, request: EngineRequest) -> bool:
        """A short interactive prompt (not a health probe): what a first-token
        step is held for, and what a yielding step gives way to."""
        return (request.service_class is ServiceClass.INTERACTIVE and not request.probe
                and not self.is_long_prefill(len(request.prompt_token_ids)))

    def is_long_prefill(self, uncomputed_tokens: int) -> bool:
        """A prefill of this many tokens is long: chunked one chunk a step in
        a long-prefill slot (only where chunks are capped at all)."""
        cap = self.long_prefill_chunk_tokens
        return bool(cap) and uncomputed_tokens > max(self.long_prefill_threshold_tokens, cap)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.interactive_preempt_after_s is not None and self.interactive_preempt_after_s < 0:
            raise ValueError("interactive_preempt_after_s must be >= 0 or None")
        if self.max_long_prefills_per_step < 1:
            raise ValueError("max_long_prefills_per_step must be >= 1")
        if self.interactive_recent_s < 0:
            raise ValueError("interactive_recent_s must be >= 0")
        if self.prefill_depth_scale_tokens < 0:
            raise ValueError("prefill_depth_scale_tokens must be >= 0")
        if min(self.long_prefill_chunk_tokens, self.batch_prefill_tokens_beside_interactive,
               self.long_prefill_chunk_tokens_beside_chats) < 0:
            raise ValueError("long_prefill_chunk_tokens, long_prefill_chunk_tokens_beside_chats and "
                             "batch_prefill_tokens_beside_interactive must be >= 0")
