"""Turn a stream of generated token ids into a stream of text, per request.

Decoding the whole output on every token costs O(n) per token (O(n^2) per
request). Instead only a short window of recent tokens is decoded:

    token ids:  ... | t5 t6 | t7 t8 t9 |
                      ^prefix  ^read     ^end
    prefix_text = decode(ids[prefix:read])   # already emitted
    window_text = decode(ids[prefix:end])
    new text    = window_text[len(prefix_text):]

The window starts one emitted chunk back (prefix) rather than at read so
that decoders which depend on the previous token — SentencePiece's leading
space, byte-level tokens that together form one UTF-8 character — see that
context. When window_text ends with U+FFFD the tail is an incomplete UTF-8
sequence (an emoji split over byte tokens): nothing is emitted and the
offsets stay put until the next token completes it, so the output never
contains a broken character.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.tokenization.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Stateful per-request detokenizer; push() ids as they arrive, flush() at the end."""

    __slots__ = ("_tokenizer", "_skip_special_tokens", "_window_ids", "_read_index", "_prefix_text")

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True, context_token_ids: Sequence[int] = (),
    ) -> None:
        """context_token_ids: optional last few prompt ids, decoded only as
        context (never emitted) so the first output token is spelled as it
        would be mid-text (e.g. keeps a SentencePiece leading space)."""
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Only ids from the prefix offset on are kept, so memory stays
        # bounded by the window, not the output length.
        self._window_ids: list[int] = list(context_token_ids)
        # Index into _window_ids of the first id whose text is not yet emitted.
        self._read_index = len(self._window_ids)
        self._prefix_text = self._decode(self._window_ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add newly generated ids; return the text they complete (may be "")."""
        if not token_ids:
            return ""
        self._window_ids.extend(token_ids)
        window_text = self._decode(self._window_ids)
        if len(window_text) <= len(self._prefix_text) or window_text.endswith(_REPLACEMENT_CHAR):
            # Either nothing visible yet (a skipped special token) or a
            # character still split across tokens: hold until more arrive.
            return ""
        return self._advance(window_text)

    def flush(self) -> str:
        """Return whatever is still held back (possibly with U+FFFD if the
        stream really ended mid-character); call once at end of stream."""
        window_text = self._decode(self._window_ids)
        if len(window_text) <= len(self._prefix_text):
            return ""
        return self._advance(window_text)

    def _advance(self, window_text: str) -> str:
        new_text = window_text[len(self._prefix_text):]
        # The ids just emitted become the next window's context.
        del self._window_ids[: self._read_index]
        self._read_index = len(self._window_ids)
        self._prefix_text = self._decode(self._window_ids)
        return new_text

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
