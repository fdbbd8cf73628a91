"""Try a peer's candidate configurations, so that its "best" option set is measured, not guessed.

    python -m benchmarks.peer_options pgqueuer              # every candidate, one round each
    python -m benchmarks.peer_options pgqueuer --rounds 3   # median of 3 interleaved rounds
    python -m benchmarks.peer_options procrastinate --drain 10000 --single 1000
    python -m benchmarks.peer_options pgqueuer --where driver=asyncpg,uvloop=True --rounds 3

Each candidate of the peer's ``CANDIDATES`` (benchmarks/peers/<peer>.py) gets a fresh database
(``<BENCH_DATABASE_PREFIX>_<peer>``), its schema installed with those options, and the scenarios
of run.py's rounds: enqueue one by one, enqueue in bulk, drain. Rounds are interleaved across
candidates, as run.py interleaves subjects. The table is printed with each figure's ratio to the
peer's "defaults" set when that is a candidate, otherwise to the first candidate; copy the
fastest drain into the module's ``OPTIONS["best"]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/peer_options.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from benchmarks.peers import PEERS
from benchmarks.run import environment, log, start_server, subjects

METRICS = [("enqueue_single", "enqueue one"), ("enqueue_many", "enqueue many"), ("drain", "drain")]


def describe(options: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in options.items()) or "(none)"


def measure(
    peer: str, candidates: list[dict[str, Any]], sizes: dict[str, Any], rounds: int
) -> list[list[dict[str, Any]]]:
    """Each candidate's round results, rounds interleaved across candidates."""
    subject = subjects({peer})[0]
    server, _ = start_server(argparse.Namespace())
    results: list[list[dict[str, Any]]] = [[] for _ in candidates]
    with tempfile.TemporaryDirectory(prefix="eddyq-peer-options-") as log_dir:
        for number in range(1, rounds + 1):
            for index, options in enumerate(candidates):
                url = common.recreate_database(server, common.bench_database(peer))
                env = environment(subject, url)
                config = {"options": options}
                setup = common.run_subject(subject.module, "setup", config, env, sizes["timeout"])
                if setup.error:
                    results[index].append({"error": f"setup: {setup.error}"})
                    continue
                config.update(sizes, log_dir=log_dir, scenarios=["single", "many", "drain"])
                outcome = common.run_subject(
                    subject.module, "round", config, env, sizes["timeout"] * 3
                )
                result = outcome.result or {"error": outcome.error}
                results[index].append(result)
                figures = ", ".join(
                    f"{name} {result[key]:,.0f}/s"
                    for key, name in METRICS
                    if isinstance(result.get(key), float)
                )
                log(f"round {number}/{rounds}: {describe(options)}: {figures or result}")
        common.recreate_database(server, common.bench_database(peer))
    return results


def median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if isinstance(r.get(key), float)]
    return common.median(values) if values else None


def table(
    peer: str,
    candidates: list[dict[str, Any]],
    results: list[list[dict[str, Any]]],
    reference: int,
) -> str:
    labels = [describe(options) for options in candidates]
    width = max(len(label) for label in labels)
    lines = [
        f"{peer}: {len(candidates)} candidates; jobs/s, median of {len(results[0])} round(s); "
        f"x = ratio to {labels[reference]}",
        f"  {'options':<{width}} " + " ".join(f"{name:>22}" for _, name in METRICS),
    ]
    for label, rounds in zip(labels, results, strict=True):
        cells = []
        for key, _ in METRICS:
            value, base = median_of(rounds, key), median_of(results[reference], key)
            if value is None:
                errors = [r[key]["error"] for r in rounds if isinstance(r.get(key), dict)]
                errors += [r["error"] for r in rounds if "error" in r]
                cells.append(f"{'failed: ' + (errors[0] if errors else '?'):>22.22}")
            else:
                ratio = f"x{value / base:.2f}" if base else ""
                cells.append(f"{value:>14,.0f} {ratio:>7}")
        lines.append(f"  {label:<{width}} " + " ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("peer", choices=[module for module, _, _ in PEERS])
    parser.add_argument("--single", type=int, default=2_000, help="enqueues one by one")
    parser.add_argument("--many", type=int, default=20_000, help="jobs enqueued in bulk")
    parser.add_argument("--chunk", type=int, default=10_000, help="jobs per bulk call")
    parser.add_argument("--drain", type=int, default=10_000, help="jobs drained")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (median taken)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per scenario")
    parser.add_argument(
        "--where",
        metavar="KEY=VALUE,...",
        help="only the candidates with these options (values as printed, e.g. uvloop=True)",
    )
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()

    module = importlib.import_module(f"benchmarks.peers.{args.peer}")
    candidates: list[dict[str, Any]] = getattr(module, "CANDIDATES", [module.OPTIONS["best"]])
    if args.where:
        wanted = dict(pair.split("=", 1) for pair in args.where.split(","))
        candidates = [
            options
            for options in candidates
            if all(str(options.get(key)) == value for key, value in wanted.items())
        ]
        if not candidates:
            raise SystemExit(f"no candidate has {args.where}")
    sizes = {
        "single": args.single,
        "many": args.many,
        "chunk": args.chunk,
        "drain": args.drain,
        "timeout": args.timeout,
    }
    results = measure(args.peer, candidates, sizes, args.rounds)
    defaults = module.OPTIONS["defaults"]
    reference = candidates.index(defaults) if defaults in candidates else 0
    print(table(args.peer, candidates, results, reference))
    if args.json:
        document = {"peer": args.peer, "sizes": sizes, "candidates": candidates}
        args.json.write_text(json.dumps({**document, "results": results}, indent=2))


if __name__ == "__main__":
    main()
