"""GET /v1/usage?start=&end=&group_by=model|day|model,day[&tenant=]

Totals from the usage ledger for the caller's tenant; an admin key may ask
for another tenant (or every tenant with `tenant=*`). Times are unix
seconds or ISO 8601; the range is [start, end). Rows reach the ledger
through the gateway's outbox, normally within a fraction of a second.
`group_by=model,day` gives one bucket per (day, model), sorted by day.

Each bucket carries its cost beside the tokens, in the shape of OpenAI's
costs API (an amount object, lower-case ISO 4217 currency), with the value
as a decimal string rather than a JSON number: it is exact (the ledger
computes it in Decimal from the price table) and a client that sums it
should not do so in floats:

    "cost": {"value": "0.00434", "currency": "usd"}

`cost` is null when any request in the bucket ran on a model version with
no price; `unpriced_model_versions` names those versions (empty when the
cost is complete). Costs are at the current price of each version, with
the batch discount for batch requests.
"""

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.gateway.auth import authenticate
from sluice.gateway.errors import ApiError
from sluice.gateway.state import GatewayState
from sluice.ledger import UsageRow
from sluice.ledger.pricing import money_text
from sluice.outcomes import Reason

log = logging.getLogger(__name__)

DEFAULT_WINDOW = timedelta(days=30)
# The query's spelling -> the ledger's grouping.
GROUPINGS = {None: None, "model": "model", "day": "day", "model,day": "model_day", "day,model": "model_day"}
# Instants a usage query may name: the window arithmetic (a default start
# 30 days before the end) and every database's timestamp type stay in range.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _instant(raw: str | None, name: str, default: datetime) -> datetime:
    if raw is None or raw == "":
        return default
    try:
        if raw.replace(".", "", 1).isdigit():
            parsed = datetime.fromtimestamp(float(raw), UTC)
        else:
            parsed = datetime.fromisoformat(raw)
            parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        in_range = EARLIEST <= parsed <= LATEST
    except (ValueError, OverflowError, OSError):
        raise ApiError.of(Reason.INVALID_REQUEST, f"'{name}' must be unix seconds or an ISO 8601 time.",
                          param=name) from None
    if not in_range:
        raise ApiError.of(Reason.INVALID_REQUEST, f"'{name}' must be between {EARLIEST.date()} and "
                          f"{LATEST.date()}.", param=name)
    return parsed


async def usage(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    try:
        tenant = authenticate(request, state.authenticator)
        now = datetime.now(UTC)
        params = request.query_params
        end = _instant(params.get("end"), "end", now)
        start = _instant(params.get("start"), "start", max(end - DEFAULT_WINDOW, EARLIEST))
        if start > end:
            raise ApiError.of(Reason.INVALID_REQUEST, "'start' must not be after 'end'.", param="start")
        group_by = params.get("group_by") or None
        if group_by not in GROUPINGS:
            raise ApiError.of(Reason.INVALID_REQUEST, "'group_by' must be 'model', 'day' or 'model,day'.",
                              param="group_by")
        asked = params.get("tenant")
        if asked is not None and asked != tenant.name and not tenant.is_admin:
            raise ApiError.of(Reason.PERMISSION_DENIED, "Only an admin key may read another tenant's usage.",
                              param="tenant")
        scope = None if asked == "*" else (asked or tenant.name)
    except ApiError as error:
        return error.response()
    try:
        rows = await asyncio.to_thread(state.resources.ledger.usage_summary, scope, start, end, GROUPINGS[group_by])
    except SQLAlchemyError:
        log.exception("usage query failed")
        return ApiError.of(Reason.LEDGER_UNAVAILABLE, "The usage ledger is unreachable right now; retry shortly.",
                           retry_after_s=5.0).response()
    data = [
        {
            "object": "usage.bucket",
            "tenant": row.tenant if scope is None else scope,
            "model": row.model,
            "day": row.day.isoformat() if row.day else None,
            "requests": row.requests,
            "prompt_tokens": row.prompt_tokens,
            "cached_tokens": row.cached_tokens,
            "completion_tokens": row.output_tokens,
            "total_tokens": row.prompt_tokens + row.output_tokens,
            "cost": _cost(row),
            "unpriced_model_versions": list(row.unpriced_versions),
        }
        for row in rows
    ]
    return JSONResponse({"object": "list", "tenant": scope or "*", "start": int(start.timestamp()),
                         "end": int(end.timestamp()), "group_by": group_by, "data": data})


def _cost(row: UsageRow) -> dict[str, str] | None:
    if row.cost is None or row.currency is None:
        return None
    return {"value": money_text(row.cost), "currency": row.currency.lower()}
