"""`sluice rollout`: upgrade a model alias to a new version, in steps.

    sluice rollout start  --alias A --candidate V [--serving V0] WHERE [gates] [--config FILE]
    sluice rollout check  --alias A --candidate V [--serving V0] WHERE [quality flags]
    sluice rollout status WHERE
    sluice rollout pause|resume|abort WHERE

WHERE is the routing catalog: `--catalog FILE` (a local stack's models
file) or `--configmap NAME [--namespace NS] [--context CTX]` (the chart's
catalog ConfigMap). `start` runs the controller to the end in the
foreground: the quality check, then each step. It exits 0 when the
candidate serves all of the alias, 1 when it rolled back, 2 on bad input
or when the catalog cannot be read or written. `pause`, `resume` and
`abort` reach a running `start` through the catalog (a file beside it, or
an annotation on the ConfigMap); `check` runs only the quality gate
(exit 0 pass, 1 fail).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from sluice.rollout.machine import Command, Phase, QualityResult
from sluice.rollout.records import RecordError
from sluice.rollout.settings import RolloutSettings, build_settings, load_config_file, merged
from sluice.rollout.store import RolloutStore, StoreError
from sluice.rollout.weights import CatalogError, alias_weights

EXIT_COMPLETED, EXIT_ROLLED_BACK, EXIT_ERROR = 0, 1, 2


def _number(text: str) -> float | None:
    """A float, or "off" to turn a gate off."""
    if text.lower() in ("off", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'off', got {text!r}") from None


def _steps(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated whole percentages, got {text!r}") from None


def _where(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--catalog", type=Path, help="a local routing catalog file (make run's models file)")
    group.add_argument("--configmap", help="the chart's catalog ConfigMap (<release>-catalog)")
    parser.add_argument("--namespace", default="default", help="the ConfigMap's namespace (default: default)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: in-cluster, else current)")


def _rollout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alias", required=True, help="the model alias clients ask for")
    parser.add_argument("--candidate", required=True, help="the version to move the alias's traffic to")
    parser.add_argument("--serving", default=None,
                        help="the version serving it now (default: the alias's version with the most weight)")
    parser.add_argument("--config", type=Path, default=None, help="a JSON file of settings (see sluice.rollout.settings)")
    quality = parser.add_argument_group("quality gate")
    quality.add_argument("--serving-dir", type=Path, default=None, help="serving weights (default: its catalog path)")
    quality.add_argument("--candidate-dir", type=Path, default=None, help="candidate weights (default: its catalog path)")
    quality.add_argument("--prompts", type=Path, default=None, help="a prompt set file (default: the built-in set)")
    quality.add_argument("--device", default="cpu", help="torch device for the check (cpu, cuda)")
    quality.add_argument("--min-greedy-agreement", type=float, default=None)
    quality.add_argument("--max-logprob-drop", type=float, default=None, help="nats per reference token")
    quality.add_argument("--max-check-regressions", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice rollout", description="Shift a model alias to a new version in "
                                     "steps, behind a quality check and per-version SLO gates")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="run a rollout to its end (foreground)")
    _rollout_arguments(start)
    _where(start)
    start.add_argument("--steps", type=_steps, default=None, help="candidate percentages, e.g. 1,5,25,50,100")
    start.add_argument("--dwell-s", type=float, default=None, help="seconds each step is held at least")
    start.add_argument("--min-requests", type=int, default=None, help="candidate requests a step needs to be judged")
    start.add_argument("--max-step-s", type=_number, default=None, help="roll back a step starved this long (off)")
    start.add_argument("--poll-s", type=float, default=None, help="seconds between metric samples")
    start.add_argument("--skip-quality", action="store_true", help="no quality gate (the operator vouches)")
    gates = start.add_argument_group("SLO gates (a number, or 'off')")
    for flag in ("max-ttft-p99-s", "max-itl-p99-s", "max-error-rate", "max-ttft-p99-ratio", "max-itl-p99-ratio",
                 "max-error-rate-increase", "relative-slack-s"):
        gates.add_argument(f"--{flag}", type=_number, default=argparse.SUPPRESS)
    metrics = start.add_argument_group("metrics")
    metrics.add_argument("--prometheus", default=None, help="Prometheus base URL")
    metrics.add_argument("--class", dest="service_class", choices=("interactive", "batch", "all"), default=None,
                         help="the traffic class the latency gates judge (default interactive)")
    metrics.add_argument("--min-window-s", type=float, default=None, help="the shortest rate() window")

    check = commands.add_parser("check", help="run only the quality gate")
    _rollout_arguments(check)
    _where(check)
    for name, text in (("status", "where a rollout stands"), ("pause", "hold the current weights"),
                       ("resume", "continue a paused rollout"), ("abort", "roll back to the serving version")):
        _where(commands.add_parser(name, help=text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = _store(args)
        if args.command == "status":
            return _status(store)
        if args.command in ("pause", "resume", "abort"):
            return _send(store, Command(args.command))
        settings = _settings(args, store)
        if args.command == "check":
            result = _quality_check(args, store, settings)()
            print(result.summary)
            return EXIT_COMPLETED if result.passed else EXIT_ROLLED_BACK
        return _start(args, store, settings)
    except (StoreError, CatalogError, RecordError, ValueError) as error:
        print(f"sluice rollout: {error}", file=sys.stderr)
        return EXIT_ERROR


def _store(args: argparse.Namespace) -> RolloutStore:
    if args.catalog is not None:
        from sluice.rollout.local_store import LocalCatalogStore

        return LocalCatalogStore(args.catalog)
    from sluice.rollout.kube_store import KubeCatalogStore, core_api_from_environment

    return KubeCatalogStore(core_api_from_environment(args.context), args.configmap, args.namespace)


def _settings(args: argparse.Namespace, store: RolloutStore) -> RolloutSettings:
    serving = args.serving or _serving_version(store, args.alias, args.candidate)
    layers = [load_config_file(args.config)] if args.config else []
    layers.append(_flags_layer(args))
    return build_settings(merged(*layers), alias=args.alias, serving=serving, candidate=args.candidate)


def _flags_layer(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, in the config file's keys."""
    given = vars(args)
    top = {"steps": "steps", "dwell_s": "dwellSeconds", "min_requests": "minRequests",
           "max_step_s": "maxStepSeconds", "poll_s": "pollSeconds"}
    layer: dict[str, Any] = {key: given[name] for name, key in top.items() if given.get(name) is not None}
    slo_flags = {"max_ttft_p99_s": "maxTtftP99Seconds", "max_itl_p99_s": "maxItlP99Seconds",
                 "max_error_rate": "maxErrorRate", "max_ttft_p99_ratio": "maxTtftP99Ratio",
                 "max_itl_p99_ratio": "maxItlP99Ratio", "max_error_rate_increase": "maxErrorRateIncrease",
                 "relative_slack_s": "relativeSlackSeconds"}
    layer["slo"] = {key: given[name] for name, key in slo_flags.items() if name in given}  # None here is "off"
    quality = {"min_greedy_agreement": "minGreedyAgreement", "max_logprob_drop": "maxLogprobDrop",
               "max_check_regressions": "maxCheckRegressions"}
    layer["quality"] = {key: given[name] for name, key in quality.items() if given.get(name) is not None}
    if given.get("skip_quality"):
        layer["quality"]["enabled"] = False
    layer["prometheus"] = {key: given[name] for name, key in (
        ("prometheus", "url"), ("service_class", "class"), ("min_window_s", "minWindowSeconds"))
        if given.get(name) is not None}
    return layer


def _serving_version(store: RolloutStore, alias: str, candidate: str) -> str:
    weights = [(weight, name) for name, weight in alias_weights(store.read_catalog(), alias).weights
               if name != candidate]
    if not weights:
        raise CatalogError(f"{alias!r} has no version besides {candidate!r} to roll out from")
    weights.sort(reverse=True)
    if len(weights) > 1 and weights[0][0] == weights[1][0]:
        raise CatalogError(f"{alias!r}: {weights[0][1]} and {weights[1][1]} carry the same weight; name --serving")
    return weights[0][1]


def _quality_check(args: argparse.Namespace, store: RolloutStore, settings: RolloutSettings):  # type: ignore[no-untyped-def]
    """The quality gate as the controller calls it; torch is imported only
    when it runs."""
    plan = settings.plan
    paths = {v["version"]: Path(v["path"]) for m in store.read_catalog()["models"] if m.get("name") == plan.alias
             for v in m["versions"] if "path" in v}
    serving_dir = args.serving_dir or paths.get(plan.serving)
    candidate_dir = args.candidate_dir or paths.get(plan.candidate)
    if serving_dir is None or candidate_dir is None:
        raise ValueError("the catalog names no path for a version: give --serving-dir and --candidate-dir")

    def check() -> QualityResult:
        try:
            from sluice.rollout.quality.prompts import default_prompt_set, load_prompt_set
            from sluice.rollout.quality.runner import run_quality_check
        except ModuleNotFoundError as missing:
            return QualityResult(False, f"the quality check needs sluice-rollout[quality] ({missing.name} missing)")
        try:
            prompts = load_prompt_set(args.prompts) if args.prompts else default_prompt_set()
            report = run_quality_check(serving_dir, candidate_dir, prompts, settings.quality, device=args.device)
        except (OSError, ValueError) as error:  # weights missing or unreadable: not a pass
            return QualityResult(False, f"could not run: {error}")
        return QualityResult(report.passed, report.summary())

    return check


def _start(args: argparse.Namespace, store: RolloutStore, settings: RolloutSettings) -> int:
    from sluice.rollout.controller import RolloutController
    from sluice.rollout.prometheus import PrometheusReader

    metrics = PrometheusReader(settings.metrics.prometheus_url, service_class=settings.metrics.service_class,
                               min_window_s=settings.metrics.min_window_s)
    quality = _quality_check(args, store, settings) if settings.plan.quality_gate else None
    controller = RolloutController(settings.plan, store, metrics, quality, poll_s=settings.poll_s, log=_log)
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        signal.signal(signal.SIGTERM, _interrupt)  # a Job's pod being stopped rolls back like Ctrl-C
    try:
        state = controller.run()
    except KeyboardInterrupt:
        _log("stopped: the alias's traffic is back on the serving version")
        return EXIT_ROLLED_BACK
    finally:
        metrics.close()
    if state.phase == Phase.COMPLETED:
        _log(f"done: {settings.plan.candidate} serves all of {settings.plan.alias}; "
             f"{settings.plan.serving} (weight 0) can be removed from the catalog and its replicas scaled down")
        return EXIT_COMPLETED
    return EXIT_ROLLED_BACK


def _status(store: RolloutStore) -> int:
    status = store.read_status()
    if status is None:
        print(f"no rollout has run on {store.where}", file=sys.stderr)
        return EXIT_ERROR
    print(status.describe())
    return EXIT_COMPLETED


def _send(store: RolloutStore, command: Command) -> int:
    status = store.read_status()
    if status is None or status.finished:
        state = "no rollout" if status is None else f"the last rollout {status.phase}"
        print(f"nothing to {command}: {state} on {store.where}", file=sys.stderr)
        return EXIT_ERROR
    record = store.send_command(command, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    print(f"{command} sent to the rollout of {status.alias} (command {record.seq}); "
          "it is applied at the controller's next poll", file=sys.stderr)
    return EXIT_COMPLETED


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _log(line: str) -> None:
    print(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
