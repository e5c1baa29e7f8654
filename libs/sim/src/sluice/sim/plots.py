"""PNG plots of simulation results (matplotlib, the `sluice-sim[plots]` extra).

    latency_cdfs(results_by_policy, path)   TTFT and inter-token CDFs, a column per class,
                                            one line per policy
    kv_occupancy(results, path)             each replica's KV occupancy over time
    goodput_vs_rate(points, path)           goodput against arrival rate, one line per policy
    cdf_panels(panels, path)                any samples' CDFs, a panel each, a line per source
                                            (the fidelity bench: real stack against simulator)

matplotlib is imported when a plot is drawn, never when this module is, so
the simulator runs without it; a missing matplotlib raises an ImportError
that says what to install. Figures are built as `Figure` objects on an Agg
canvas, not through pyplot: no global figure state, no GUI backend, and
nothing to close.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from sluice.sim.results import SimResults

CLASSES = ("interactive", "batch")
# A CDF line needs no more points than a figure has pixels across: larger
# samples (an hour of inter-token gaps is millions) are thinned to this many
# evenly spaced ranks, which keeps every percentile in place.
MAX_CDF_POINTS = 2000
INSTALL_HINT = "plots need matplotlib: pip install 'sluice-sim[plots]' (or matplotlib)"


def require_matplotlib() -> None:
    """Raise ImportError with an install hint where matplotlib is missing."""
    _figure_class()


def _figure_class():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error

    def new_figure(**kwargs):
        figure = Figure(**kwargs)
        FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg
        return figure

    return new_figure


def _cdf(values) -> tuple[list[float], list[float]]:
    """(sorted values, cumulative share) thinned to at most MAX_CDF_POINTS."""
    ordered = sorted(values)
    count = len(ordered)
    if count <= MAX_CDF_POINTS:
        ranks = range(count)
    else:
        ranks = sorted({round(i * (count - 1) / (MAX_CDF_POINTS - 1)) for i in range(MAX_CDF_POINTS)})
    return [ordered[i] for i in ranks], [(i + 1) / count for i in ranks]


def latency_cdfs(results_by_policy: Mapping[str, SimResults], path: str | Path,
                 classes: Sequence[str] = CLASSES) -> Path:
    """TTFT (finished requests) and inter-token gap CDFs: a row per metric,
    a column per service class, a line per policy; log-scaled time."""
    new_figure = _figure_class()
    figure = new_figure(figsize=(5.0 * len(classes), 8.0), layout="constrained")
    axes = figure.subplots(2, len(classes), squeeze=False)
    for column, service_class in enumerate(classes):
        ttfts = {policy: [r.ttft_s for r in results.records
                          if r.service_class == service_class and r.outcome == "finished" and r.ttft_s is not None]
                 for policy, results in results_by_policy.items()}
        gaps = {policy: results.gaps_by_class.get(service_class, ())
                for policy, results in results_by_policy.items()}
        _draw_cdfs(axes[0][column], ttfts, f"{service_class}: TTFT", "share of requests")
        _draw_cdfs(axes[1][column], gaps, f"{service_class}: inter-token time", "share of gaps")
    return _save(figure, path)


def _draw_cdfs(target, lines: Mapping[str, Sequence[float]], title: str, ylabel: str,
               min_s: float | None = None) -> None:
    """A CDF line per name on one axes, log-scaled time from `min_s` where
    given (zero and negative samples cannot sit on a log axis and are left
    off; the legend counts every sample)."""
    from matplotlib.ticker import NullFormatter

    for name, values in lines.items():
        xs, ys = _cdf(value for value in values if value > 0)
        if xs:
            target.step(xs, ys, where="post", label=f"{name} ({len(values):,})")
    target.set_title(title)
    target.set_xlabel("seconds")
    target.set_ylabel(ylabel)
    target.set_ylim(0, 1.01)
    target.grid(True, which="both", alpha=0.3)
    if target.has_data():
        target.set_xscale("log")
        if min_s is not None:
            target.set_xlim(left=min_s)
        # Over less than a decade a log axis labels its minor ticks too, and they overlap.
        target.xaxis.set_minor_formatter(NullFormatter())
        target.legend(fontsize="small", loc="lower right")


def kv_occupancy(results: SimResults, path: str | Path, title: str | None = None) -> Path:
    """Each replica's used share of its KV blocks at every state report."""
    new_figure = _figure_class()
    figure = new_figure(figsize=(10.0, 4.5), layout="constrained")
    axes = figure.subplots()
    by_replica: dict[str, tuple[list[float], list[float]]] = {}
    for sample in results.samples:
        times, shares = by_replica.setdefault(sample.replica, ([], []))
        times.append(sample.at_s)
        shares.append(100.0 * sample.kv_occupancy)
    for replica, (times, shares) in sorted(by_replica.items()):
        axes.plot(times, shares, linewidth=0.8, label=replica)
    axes.set_title(title or f"KV occupancy, {len(by_replica)} replica(s)")
    axes.set_xlabel("simulated time (s)")
    axes.set_ylabel("KV blocks in use (%)")
    axes.set_ylim(0, 100)
    axes.grid(True, alpha=0.3)
    if 0 < len(by_replica) <= 16:
        axes.legend(fontsize="small", ncols=min(len(by_replica), 8), loc="upper right")
    return _save(figure, path)


def goodput_vs_rate(points: Mapping[str, Sequence[tuple[float, float]]], path: str | Path,
                    title: str | None = None) -> Path:
    """`points[policy]` = [(arrival rate, goodput requests per second), ...]."""
    new_figure = _figure_class()
    figure = new_figure(figsize=(7.0, 4.5), layout="constrained")
    axes = figure.subplots()
    for policy, pairs in points.items():
        ordered = sorted(pairs)
        if ordered:
            axes.plot([rate for rate, _ in ordered], [goodput for _, goodput in ordered], marker="o", label=policy)
    axes.set_title(title or "goodput vs arrival rate")
    axes.set_xlabel("arrival rate (requests/s)")
    axes.set_ylabel("goodput (requests/s meeting the SLOs)")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    if axes.has_data():
        axes.legend(fontsize="small")
    return _save(figure, path)


def cdf_panels(panels: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path,
               title: str | None = None, columns: int = 2, min_s: float | None = None) -> Path:
    """`panels[name][source]` = samples in seconds: a panel per name, in
    order, `columns` across, a CDF line per source; log-scaled time, from
    `min_s` where given (a few bunched tokens' near-zero gaps would
    otherwise stretch the axis over decades nobody reads)."""
    new_figure = _figure_class()
    rows = max(1, -(-len(panels) // columns))
    figure = new_figure(figsize=(5.0 * columns, 4.0 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, (name, by_source) in enumerate(panels.items()):
        _draw_cdfs(axes[index // columns][index % columns], by_source, name, "share", min_s)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    if title:
        figure.suptitle("\n".join(textwrap.wrap(title, width=45 * columns)), fontsize="medium")
    return _save(figure, path)


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=110)
    return path
