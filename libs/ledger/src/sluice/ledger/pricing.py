"""What a model version costs, and what a request's tokens cost. Pure.

Prices are per million tokens, in a currency's major unit (USD 0.15 per
million input tokens). The `prices` table stores them as integer millionths
(`input_micros_per_mtok = 150000`) rather than NUMERIC: the ledger runs on
SQLite too, and SQLAlchemy's Numeric goes through a float there, so an
integer column is the one type that is exact on both databases. Six decimals
of a currency unit per million tokens is far finer than any list price;
a price with more decimals is refused, never rounded.

All money arithmetic runs in `MONEY`, a Decimal context that traps
`Inexact`: a cost is either exact or an error, never silently rounded.

    cost = ( (prompt - cached) * input            cached tokens are part of
           + cached            * cached_input     prompt_tokens, billed once,
           + output            * output ) / 1e6   at the cached rate
    batch: cost * (1 - batch_discount)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Context, Decimal, Inexact, InvalidOperation

from sluice.ledger.records import SERVICE_CLASSES

# 60 significant digits: token counts (< 1e15) times prices (< 1e13 with six
# decimals) sum to well under that, so no product or sum can round.
MONEY = Context(prec=60, traps=[Inexact, InvalidOperation])
MICROS_PER_UNIT = 1_000_000
TOKENS_PER_MTOK = 1_000_000
DEFAULT_CURRENCY = "USD"


def _require_money(name: str, value: Decimal, maximum: Decimal | None = None) -> None:
    # float is refused on purpose: 0.1 as a float is not 0.1, and a price
    # that came through a float is already wrong.
    if not isinstance(value, Decimal) or not value.is_finite():
        raise ValueError(f"{name} must be a finite Decimal, got {value!r}")
    if value < 0 or (maximum is not None and value > maximum):
        bound = f" and at most {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be at least 0{bound}, got {value}")
    if MONEY.multiply(value, MICROS_PER_UNIT) % 1 != 0:
        raise ValueError(f"{name} has more than 6 decimals: {value}")


@dataclass(slots=True, frozen=True)
class Price:
    """One model version's price. Written by LedgerStore.set_price; read by
    usage summaries. `batch_discount` is the fraction taken off batch
    requests (0.5: batch costs half)."""

    model_version: str
    input_per_mtok: Decimal
    cached_input_per_mtok: Decimal
    output_per_mtok: Decimal
    batch_discount: Decimal = Decimal(0)
    currency: str = DEFAULT_CURRENCY
    updated_at: datetime | None = None  # set by the store; None before the first write

    def __post_init__(self) -> None:
        if not isinstance(self.model_version, str) or not self.model_version:
            raise ValueError(f"model_version must be a non-empty string, got {self.model_version!r}")
        _require_money("input_per_mtok", self.input_per_mtok)
        _require_money("cached_input_per_mtok", self.cached_input_per_mtok)
        _require_money("output_per_mtok", self.output_per_mtok)
        _require_money("batch_discount", self.batch_discount, maximum=Decimal(1))
        if not (isinstance(self.currency, str) and len(self.currency) == 3
                and self.currency.isascii() and self.currency.isupper()):
            raise ValueError(f"currency must be an upper-case ISO 4217 code, got {self.currency!r}")


def to_micros(value: Decimal) -> int:
    """A validated price or fraction as integer millionths (exact)."""
    return int(MONEY.multiply(value, MICROS_PER_UNIT))


def from_micros(micros: int) -> Decimal:
    return MONEY.divide(Decimal(micros), MICROS_PER_UNIT)


def cost_of(price: Price, prompt_tokens: int, cached_tokens: int, output_tokens: int,
            service_class: str) -> Decimal:
    """The exact cost of these tokens at `price`, in `price.currency`.
    Linear in the counts, so the cost of summed counts equals the sum of the
    per-request costs: summaries price whole groups at once."""
    for name, count in (("prompt_tokens", prompt_tokens), ("cached_tokens", cached_tokens),
                        ("output_tokens", output_tokens)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{name} must be a non-negative int, got {count!r}")
    if cached_tokens > prompt_tokens:
        raise ValueError(f"cached_tokens ({cached_tokens}) exceeds prompt_tokens ({prompt_tokens})")
    if service_class not in SERVICE_CLASSES:
        raise ValueError(f"service_class must be one of {SERVICE_CLASSES}, got {service_class!r}")
    per_mtok = MONEY.add(
        MONEY.add(MONEY.multiply(price.input_per_mtok, prompt_tokens - cached_tokens),
                  MONEY.multiply(price.cached_input_per_mtok, cached_tokens)),
        MONEY.multiply(price.output_per_mtok, output_tokens))
    cost = MONEY.divide(per_mtok, TOKENS_PER_MTOK)
    if service_class == "batch":
        cost = MONEY.multiply(cost, MONEY.subtract(Decimal(1), price.batch_discount))
    return cost


def money_text(amount: Decimal) -> str:
    """A cost as a plain decimal string, exact, without trailing zeros or
    an exponent: Decimal('1.2300E+1') -> '12.3'."""
    text = format(amount.normalize(MONEY), "f")
    return "0" if text in ("-0", "0") else text
