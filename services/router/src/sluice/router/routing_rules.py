"""Small-model routing as product policy: catalog rules that send easy
requests of an alias to a smaller version.

    {"name": "auto", "versions": [{"version": "llama-70b-v3", ...}],
     "routes": [{"to": "llama-8b-v2", "max_prompt_tokens": 512, "max_output_tokens": 256,
                 "classes": ["interactive"], "tenants": ["acme", "globex"]}]}

A rule matches when every condition it names holds (an absent one always
does): the prompt (after the chat template) is at most `max_prompt_tokens`,
the request bounds its output at most `max_output_tokens` (a request that
gives no max_tokens never matches a rule with that condition: nothing says
its answer is short), its class is listed, its tenant is listed. The first
matching rule wins; none matching leaves the alias's weighted choice. The
response's `model` and `system_fingerprint` say which version served, and
it is billed as that version.

Pure: the router evaluates it after tokenizing, with the counts it has.
"""

from dataclasses import dataclass

CLASS_NAMES = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class RouteRule:
    to: str                          # the version that serves a matching request
    max_prompt_tokens: int = 0       # 0 = any
    max_output_tokens: int = 0       # 0 = any
    classes: frozenset[str] = frozenset()  # empty = any
    tenants: frozenset[str] = frozenset()  # empty = any

    def __post_init__(self) -> None:
        if not self.to:
            raise ValueError("a route names the version it goes to")
        if self.max_prompt_tokens < 0 or self.max_output_tokens < 0:
            raise ValueError(f"route to {self.to}: token bounds must be >= 0")
        unknown = self.classes - set(CLASS_NAMES)
        if unknown:
            raise ValueError(f"route to {self.to}: unknown classes {sorted(unknown)}")

    def matches(self, prompt_tokens: int, requested_output_tokens: int, service_class: str, tenant: str) -> bool:
        if self.max_prompt_tokens and prompt_tokens > self.max_prompt_tokens:
            return False
        if self.max_output_tokens and not 0 < requested_output_tokens <= self.max_output_tokens:
            return False
        if self.classes and service_class not in self.classes:
            return False
        return not self.tenants or tenant in self.tenants

    @classmethod
    def from_document(cls, document: dict) -> "RouteRule":
        return cls(
            to=document["to"],
            max_prompt_tokens=int(document.get("max_prompt_tokens", 0)),
            max_output_tokens=int(document.get("max_output_tokens", 0)),
            classes=frozenset(document.get("classes", ())),
            tenants=frozenset(document.get("tenants", ())),
        )


def route_for(
    rules: tuple[RouteRule, ...], prompt_tokens: int, requested_output_tokens: int, service_class: str, tenant: str
) -> str | None:
    """The version the first matching rule sends the request to, if any."""
    for rule in rules:
        if rule.matches(prompt_tokens, requested_output_tokens, service_class, tenant):
            return rule.to
    return None
