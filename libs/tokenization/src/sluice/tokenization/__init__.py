"""Tokenizer, chat template and incremental detokenizer for the router (torch-free)."""

from sluice.tokenization.chat_template import ChatTemplate, ChatTemplateError
from sluice.tokenization.detokenizer import IncrementalDetokenizer
from sluice.tokenization.stop_strings import StopMatch, StopStringMatcher
from sluice.tokenization.tokenizer import Tokenizer

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "StopMatch",
    "StopStringMatcher",
    "Tokenizer",
]
