"""Context-length arithmetic, decided before any replica work."""

from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError


def output_budget_tokens(prompt_tokens: int, requested_output_tokens: int, context_length_tokens: int) -> int:
    """How many tokens the request may generate; `requested_output_tokens`
    of 0 means as many as the context allows."""
    if prompt_tokens >= context_length_tokens:
        raise ServiceError.of(
            Reason.CONTEXT_LENGTH_EXCEEDED,
            f"The prompt is {prompt_tokens} tokens, but this model's context holds {context_length_tokens} "
            "tokens in all (prompt and completion). Shorten the messages.",
        )
    room = context_length_tokens - prompt_tokens
    if requested_output_tokens == 0:
        return room
    if requested_output_tokens > room:
        raise ServiceError.of(
            Reason.CONTEXT_LENGTH_EXCEEDED,
            f"This model's context holds {context_length_tokens} tokens, but the request needs "
            f"{prompt_tokens + requested_output_tokens} ({prompt_tokens} in the prompt, "
            f"{requested_output_tokens} asked for the completion). Shorten the messages or lower max_tokens.",
        )
    return requested_output_tokens


def check_class_prompt_cap(prompt_tokens: int, cap_tokens: int, class_name: str) -> None:
    """A class's prompt cap (0 = none) is refused like the context limit."""
    if cap_tokens and prompt_tokens > cap_tokens:
        raise ServiceError.of(
            Reason.CONTEXT_LENGTH_EXCEEDED,
            f"The prompt is {prompt_tokens} tokens; {class_name} requests take at most {cap_tokens}. "
            "Shorten the messages or send it with service_tier=flex.",
        )
