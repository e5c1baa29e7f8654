"""Rich renderables from the view model. Absent signals read "n/a"."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sluice.top.model import FleetView

NA = "n/a"


def _number(value: float | None, digits: int = 0) -> str:
    return NA if value is None else f"{value:,.{digits}f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return NA
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _percent(value: float | None) -> str:
    return NA if value is None else f"{value * 100:.1f}%"


def _table(title: str, *columns: str, text_columns: int = 2) -> Table:
    """Names in the first `text_columns` columns (left), numbers after (right)."""
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < text_columns else "right")
    return table


def header(view: FleetView) -> Text:
    down = [t for t in view.targets if not t.up]
    text = Text()
    text.append("sluice top", style="bold")
    text.append(f"  over {view.interval_s:.1f}s  output {_number(view.output_tokens_per_s, 1)} tok/s"
                f"  replicas ready {_number(view.replicas_ready)}")
    text.append(f"  targets up {len(view.targets) - len(down)}/{len(view.targets)}")
    for target in down:
        text.append(f"\n  DOWN {target.kind} {target.url}: {target.error}", style="bold red")
    return text


def models_table(view: FleetView) -> Table:
    table = _table("Models", "model", "overload", "tok/s", "tokens")
    for row in view.models:
        stage = NA if row.overload_stage is None else f"{row.overload_stage} {row.overload_stage_name}"
        style = "bold red" if row.overload_stage else None
        table.add_row(row.model, Text(stage, style=style or ""), _number(row.output_tokens_per_s, 1),
                      _number(row.generated_tokens))
    return table


def classes_table(view: FleetView) -> Table:
    table = _table("Queues and latency", "model", "class", "queued", "oldest", "TTFT p50", "TTFT p99",
                   "ITL p50", "ITL p99")
    for row in view.classes:
        table.add_row(row.model, row.service_class, _number(row.queue_length), _seconds(row.queue_oldest_age_s),
                      _seconds(row.ttft_p50_s), _seconds(row.ttft_p99_s), _seconds(row.itl_p50_s),
                      _seconds(row.itl_p99_s))
    return table


def replicas_table(view: FleetView) -> Table:
    # KV%: used / (free + used) blocks on the replica; rsvd: blocks the
    # scheduler has promised it (admitted work not yet all in KV).
    table = _table("Replicas", "replica", "model", "ready", "KV%", "free", "used", "rsvd", "run", "wait", "step",
                   "tok/s")
    for row in view.replicas:
        ready = NA if row.ready is None else ("yes" if row.ready else "NO")
        table.add_row(
            row.replica + ("" if row.source == "replica" else " (scheduler's view)"), row.model or NA,
            Text(ready, style="bold red" if row.ready is False else ""), _percent(row.kv_occupancy),
            _number(row.kv_free_blocks), _number(row.kv_used_blocks), _number(row.kv_reserved_blocks),
            _number(row.running), _number(row.waiting), _seconds(row.step_time_s),
            _number(row.output_tokens_per_s, 1),
        )
    return table


def tenants_table(view: FleetView) -> Table:
    table = _table("Top tenants", "model", "tenant", "served tok/s", "KV share", "active seqs")
    for row in view.tenants:
        table.add_row(row.model, row.tenant, _number(row.served_tokens_per_s, 1), _percent(row.reserved_kv_share),
                      _number(row.active_sequences))
    return table


def rejections_table(view: FleetView) -> Table:
    source = NA if view.rejections_source is None else f"counted by the {view.rejections_source}"
    title = f"Rejections ({source})"
    table = _table(title, "reason", "per s", text_columns=1)
    table.min_width = len(title)  # a narrow table would wrap its title
    for row in view.rejections:
        table.add_row(row.reason, f"{row.per_s:.2f}")
    if not view.rejections:
        table.add_row(NA if view.rejections_source is None else "none", "")
    return table


def render_view(view: FleetView) -> Group:
    """One frame: the header, then a table per concern."""
    return Group(header(view), models_table(view), classes_table(view), replicas_table(view),
                 tenants_table(view), rejections_table(view))
