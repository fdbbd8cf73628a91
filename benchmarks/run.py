"""django-eddyq side by side with the raw limit and its Python peers, on one PostgreSQL, in one run.

    python benchmarks/run.py                  # the table: median of 3 rounds (several minutes)
    python benchmarks/run.py --quick          # fewer jobs, one round (a few minutes)
    python benchmarks/run.py --retained       # + drain with a million completed rows retained
    python benchmarks/run.py --plans          # + EXPLAIN of claim, heartbeat, finish at 1M rows
    python benchmarks/run.py --limits         # + what bounds enqueue_many and the drain
    python benchmarks/run.py --soak 1000000   # + a million jobs through one worker: dead
                                              #   tuples and the worker's RSS over time
    python benchmarks/run.py --subjects none --soak 1000000 --soak-concurrency 100
    python benchmarks/run.py --subjects none --plans     # only the plans
    python benchmarks/run.py --servers        # all of it on DATABASE_URL's server, then on
                                              #   the embedded PostgreSQL 18: two tables
    python benchmarks/run.py --peer-options defaults   # the peers at their defaults, not at
                                                       #   their best (benchmarks/peers/)

PostgreSQL is ``DATABASE_URL``'s server when set, otherwise a throw-away embedded cluster
started with durable settings (fsync and synchronous_commit on) and removed at the end. Every
subject gets a database of its own on that server, named ``eddyq_bench_run[_<subject>]``,
dropped and created afresh by each run; no other database is touched.

Rounds are interleaved (round 1 of every subject, then round 2, ...) so that a slow spell of a
shared machine hits every subject alike; each figure is the median of the rounds. The table is
printed and written, with every round's figures, to ``benchmarks/results/latest.json`` (and a
timestamped copy). docs/performance.md explains each row.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from benchmarks.peers import PEERS

RESULTS = common.REPO / "benchmarks" / "results"

FULL = {
    "single": 10_000,
    "many": 100_000,
    "chunk": 10_000,
    "drain": 20_000,
    "flow": 20_000,
    "workflow_steps": 10_000,
    "chains": 1_000,
    "chain_length": 10,
    "latency": 500,
    "interval": 0.010,
    "runs": 3,
    "retained_rows": 1_000_000,
    "sample_every": 5.0,
    "timeout": 900,
}
QUICK = {
    **FULL,
    "single": 2_000,
    "many": 20_000,
    "drain": 5_000,
    "flow": 5_000,
    "latency": 100,
    "runs": 1,
    "retained_rows": 200_000,
    "sample_every": 2.0,
    "timeout": 300,
}


@dataclass
class Subject:
    key: str  # run.py's name, and the database suffix
    module: str
    label: str
    distribution: str | None = None  # for peers: what pip installs
    import_name: str | None = None
    settings: str | None = None  # DJANGO_SETTINGS_MODULE
    # Peers too slow to drain the full count in reasonable time drain a fraction of it.
    drain_fraction: float = 1.0
    many_limit: int | None = None
    status: str = "ok"
    version: str | None = None
    options: dict[str, Any] | None = None  # for peers: the option set they ran with
    rounds: list[dict[str, Any]] = field(default_factory=list)


def subjects(selected: set[str] | None) -> list[Subject]:
    every = [
        Subject("eddyq", "benchmarks.eddyq", "django-eddyq", "django-eddyq", "django_eddyq"),
        Subject("raw", "benchmarks.raw", "raw psycopg", "psycopg", "psycopg"),
    ]
    for module, distribution, label in PEERS:
        subject = Subject(
            module,
            f"benchmarks.peers.{module}",
            label,
            distribution,
            distribution.replace("-", "_"),
        )
        if module == "django_tasks_db":
            subject.settings = "benchmarks.peers.django_tasks_db_settings"
            subject.drain_fraction = 0.1  # it drains ~100 jobs/s: 2,000 jobs, not 20,000
            subject.many_limit = 10_000  # no bulk API: enqueue() in a loop, one transaction
        every.append(subject)
    return [s for s in every if selected is None or s.key in selected]


# --------------------------------------------------------------------------------------------------
# Server


def start_server(args: argparse.Namespace) -> tuple[str, str]:
    """The server URL (any database) and how it was obtained."""
    url = os.environ.get("DATABASE_URL")
    if url and not os.environ.get("EDDYQ_EMBEDDED_PGDATA"):
        return url, "DATABASE_URL"
    from django_eddyq import embedded

    cluster = embedded.start_throwaway(durable=True)
    return cluster.url, f"embedded throw-away cluster ({cluster.cluster_dir})"


# --------------------------------------------------------------------------------------------------
# Running subjects


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def environment(subject: Subject, url: str, **extra: str) -> dict[str, str]:
    env = common.subject_environment(url, **extra)
    if subject.settings:
        env["DJANGO_SETTINGS_MODULE"] = subject.settings
    else:
        env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def prepare(subject: Subject, server: str, timeout: float, peer_options: str) -> None:
    if subject.import_name and importlib.util.find_spec(subject.import_name) is None:
        subject.status = 'not installed (pip install -e ".[bench]")'
        return
    subject.version = common.version(subject.distribution) if subject.distribution else None
    url = common.recreate_database(server, common.bench_database(_db_suffix(subject)))
    config = {"peer_options": peer_options}
    outcome = common.run_subject(
        subject.module, "setup", config, environment(subject, url), timeout
    )
    if outcome.error:
        subject.status = f"failed: setup: {outcome.error}"
    elif outcome.result is not None:
        subject.options = outcome.result.get("options")


def _db_suffix(subject: Subject) -> str:
    return "" if subject.key == "eddyq" else subject.key


def round_config(
    subject: Subject, sizes: dict[str, Any], log_dir: Path, peer_options: str = "best"
) -> dict[str, Any]:
    config = {
        key: sizes[key]
        for key in (
            "single",
            "many",
            "chunk",
            "drain",
            "flow",
            "workflow_steps",
            "chains",
            "chain_length",
            "latency",
            "interval",
        )
    }
    config["drain"] = int(sizes["drain"] * subject.drain_fraction)
    if subject.many_limit is not None:
        config["many"] = min(config["many"], subject.many_limit)
    config["log_dir"] = str(log_dir)
    config["timeout"] = sizes["timeout"]
    config["peer_options"] = peer_options
    return config


def run_round(
    subject: Subject, server: str, sizes: dict[str, Any], log_dir: Path, peer_options: str
) -> None:
    url = common.database_url(server, common.bench_database(_db_suffix(subject)))
    config = round_config(subject, sizes, log_dir, peer_options)
    outcome = common.run_subject(
        subject.module, "round", config, environment(subject, url), sizes["timeout"] * 4
    )
    if outcome.error:
        subject.rounds.append({"error": outcome.error})
        log(f"{subject.label}: round failed: {outcome.error}")
    else:
        assert outcome.result is not None
        subject.rounds.append(outcome.result)
        log(f"{subject.label}: round done in {outcome.seconds:.0f}s: {_brief(outcome.result)}")


def _brief(result: dict[str, Any]) -> str:
    parts = []
    for key, value in result.items():
        if isinstance(value, dict) and "error" in value:
            parts.append(f"{key}=ERROR({value['error'][:80]})")
        elif isinstance(value, dict):
            parts.append(f"{key}=p50 {value['p50']:.1f}ms p99 {value['p99']:.1f}ms")
        elif isinstance(value, (int, float)):
            parts.append(f"{key}={value:,.0f}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Figures: medians over rounds


def figure(subject: Subject | None, metric: str) -> tuple[Any, str | None]:
    """(median value, None) or (None, why there is none)."""
    if subject is None:
        return None, "not run"
    if subject.status != "ok":
        return None, subject.status
    values, errors = [], []
    for result in subject.rounds:
        if "error" in result:
            errors.append(result["error"])
            continue
        value = result.get(metric)
        if value is None:
            continue
        if isinstance(value, dict) and "error" in value:
            errors.append(value["error"])
        else:
            values.append(value)
    if not values:
        return None, f"failed: {errors[0]}" if errors else "not measured"
    if isinstance(values[0], dict):
        return {k: common.median([v[k] for v in values]) for k in values[0]}, None
    return common.median(values), None


# --------------------------------------------------------------------------------------------------
# The table


@dataclass
class Row:
    subject: str
    metric: str
    label: str


@dataclass
class Section:
    title: str
    unit: str  # "jobs/s" or "ms"
    rows: list[Row]
    reference: tuple[str, str]  # (subject, metric) the ratios are to
    compared_to: str = "django-eddyq"  # what the reference is, in the title


def sections(sizes: dict[str, Any], by_key: dict[str, Subject]) -> list[Section]:
    drain_note = {
        key: f" ({int(sizes['drain'] * s.drain_fraction):,} jobs)"
        for key, s in by_key.items()
        if s.drain_fraction != 1.0
    }
    many_note = {
        key: f" ({min(sizes['many'], s.many_limit):,} jobs)"
        for key, s in by_key.items()
        if s.many_limit is not None
    }
    every = [
        Section(
            f"Enqueue, one call per job, each its own transaction ({sizes['single']:,} jobs; "
            "django-eddyq's four rows interleaved)",
            "jobs/s",
            [
                Row("eddyq", "enqueue_single", "django-eddyq     task.enqueue()"),
                Row("eddyq", "raw_insert", "raw psycopg      INSERT … RETURNING id, minimal table"),
                Row(
                    "eddyq",
                    "raw_insert_same_row",
                    "raw psycopg      INSERT … RETURNING id, same row",
                ),
                Row("eddyq", "orm_insert", "Django ORM       Job.objects.create(), same row"),
                Row("procrastinate", "enqueue_single", "Procrastinate    task.defer()"),
                Row("pgqueuer", "enqueue_single", "PgQueuer         await Queries.enqueue()"),
                Row("chancy", "enqueue_single", "Chancy           await chancy.push()"),
                Row("django_tasks_db", "enqueue_single", "django-tasks-db  task.enqueue()"),
            ],
            ("eddyq", "enqueue_single"),
        ),
        Section(
            f"Enqueue in bulk ({sizes['many']:,} jobs, {sizes['chunk']:,} per call and "
            "transaction)",
            "jobs/s",
            [
                Row("eddyq", "enqueue_many", "django-eddyq     task.enqueue_many()"),
                Row("raw", "copy", "raw psycopg      COPY … FROM STDIN"),
                Row("procrastinate", "enqueue_many", "Procrastinate    task.batch_defer()"),
                Row("pgqueuer", "enqueue_many", "PgQueuer         await Queries.enqueue([...])"),
                Row("chancy", "enqueue_many", "Chancy           await chancy.push_many()"),
                Row(
                    "django_tasks_db",
                    "enqueue_many",
                    "django-tasks-db  enqueue() in a loop, one transaction (no bulk API)"
                    + many_note.get("django_tasks_db", ""),
                ),
            ],
            ("eddyq", "enqueue_many"),
        ),
        Section(
            f"Drain {sizes['drain']:,} no-op jobs, one worker process: spawn → last completion",
            "jobs/s",
            [
                Row("eddyq", "drain_c10", "django-eddyq     eddyq_worker --burst --concurrency 10"),
                Row(
                    "eddyq",
                    "drain_c10_instrumented",
                    "django-eddyq     --concurrency 10, metrics and tracing on",
                ),
                Row(
                    "eddyq",
                    "drain_c10_atomic",
                    "django-eddyq     --concurrency 10, atomic jobs (@task(atomic=True))",
                ),
                Row("eddyq", "drain_c1", "django-eddyq     eddyq_worker --burst --concurrency 1"),
                Row("eddyq", "drain_p2", "django-eddyq     --processes 2 --concurrency 10"),
                Row("raw", "claim_batch100", "raw psycopg      claim + complete, batch 100"),
                Row("raw", "claim_batch1", "raw psycopg      claim + complete, batch 1"),
                Row("procrastinate", "drain", "Procrastinate    run_worker()"),
                Row("pgqueuer", "drain", "PgQueuer         QueueManager.run(drain)"),
                Row("chancy", "drain", "Chancy           Worker, AsyncExecutor"),
                Row(
                    "django_tasks_db",
                    "drain",
                    "django-tasks-db  db_worker --batch" + drain_note.get("django_tasks_db", ""),
                ),
            ],
            ("eddyq", "drain_c10"),
        ),
        Section(
            f"Latency, idle worker, {sizes['latency']:,} jobs {sizes['interval'] * 1000:g} ms "
            "apart: enqueue call → handler start",
            "ms",
            [
                Row("eddyq", "latency", "django-eddyq     eddyq_worker"),
                Row("raw", "latency", "raw psycopg      INSERT + NOTIFY → LISTENing claim loop"),
                Row("procrastinate", "latency", "Procrastinate"),
                Row("pgqueuer", "latency", "PgQueuer"),
                Row("chancy", "latency", "Chancy"),
                Row("django_tasks_db", "latency", "django-tasks-db"),
            ],
            ("eddyq", "latency"),
        ),
    ]
    if "flow" in sizes:  # not in the runs of earlier commits
        every.insert(
            3,
            Section(
                f"Flow control: drain {sizes['flow']:,} jobs of 5 ms from one queue, 4 worker "
                "processes (--processes 4 --concurrency 10, serving): spawn → last completion",
                "jobs/s",
                [
                    Row("eddyq", "flow_unlimited", "django-eddyq     no limit on the queue"),
                    Row(
                        "eddyq",
                        "flow_concurrency40",
                        "django-eddyq     concurrency 40 on the queue",
                    ),
                    Row("eddyq", "flow_rate2000", 'django-eddyq     rate "2000/s" on the queue'),
                    Row(
                        "eddyq",
                        "flow_keys_limit1",
                        f"django-eddyq     {sizes['flow'] // 20:,} keys of 20 jobs, "
                        "concurrency 1 per key",
                    ),
                ],
                ("eddyq", "flow_unlimited"),
                "no limit",
            ),
        )
    if "chains" in sizes:  # not in the runs of earlier commits
        every.insert(
            -1,
            Section(
                f"Workflows: drain {sizes['chains'] * sizes['chain_length']:,} no-op jobs, one "
                "worker process (--concurrency 10, serving): spawn → last completion",
                "jobs/s",
                [
                    Row("eddyq", "workflow_plain", "django-eddyq     plain jobs"),
                    Row(
                        "eddyq",
                        "workflow_chains",
                        f"django-eddyq     {sizes['chains']:,} chains of "
                        f"{sizes['chain_length']} steps",
                    ),
                ],
                ("eddyq", "workflow_plain"),
                "plain jobs",
            ),
        )
    return every


def workflow_rows(
    sizes: dict[str, Any], eddyq: Subject | None
) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The enqueue of a large workflow, and the workflow drains without their start-up."""
    if "workflow_steps" not in sizes:  # not in the runs of earlier commits
        return []
    rows = []
    seconds = figure(eddyq, "workflow_enqueue")[0]
    if isinstance(seconds, float):
        steps = sizes["workflow_steps"]
        rows.append(
            (
                "Workflows: enqueue [seconds, lower is better]",
                [
                    (
                        f"Workflow.add() x {steps:,} (one, {steps - 2:,} after it, one after "
                        "all), enqueue()",
                        f"{seconds:.2f} s",
                        f"{steps / seconds:,.0f} steps/s",
                    )
                ],
            )
        )
    plain = figure(eddyq, "workflow_plain_steady")[0]
    chains = figure(eddyq, "workflow_chains_steady")[0]
    if isinstance(plain, float) and isinstance(chains, float):
        rows.append(
            (
                "Workflows, first claim → last completion [jobs/s; x = ratio to plain jobs]",
                [
                    ("plain jobs", f"{plain:,.0f} /s", "x1.00"),
                    (
                        f"{sizes['chains']:,} chains of {sizes['chain_length']} steps",
                        f"{chains:,.0f} /s",
                        f"x{chains / plain:.2f}",
                    ),
                ],
            )
        )
    return rows


def render(
    header: list[str],
    table_sections: list[Section],
    by_key: dict[str, Subject],
    extra_rows: list[tuple[str, list[tuple[str, str, str]]]],
) -> str:
    lines = list(header)
    width = max(
        [len(row.label) for section in table_sections for row in section.rows]
        + [len(label) for _, rows in extra_rows for label, _, _ in rows]
    )
    for section in table_sections:
        better = "higher is better" if section.unit == "jobs/s" else "lower is better"
        lines.append("")
        lines.append(
            f"{section.title}  [{section.unit}, {better}; x = ratio to {section.compared_to}]"
        )
        reference, _ = figure(by_key.get(section.reference[0]), section.reference[1])
        for row in section.rows:
            value, why = figure(by_key.get(row.subject), row.metric)
            if row.subject not in by_key:
                continue
            if value is None:
                lines.append(f"  {row.label:<{width}} {why}")
            elif section.unit == "ms":
                cells = []
                for key in ("p50", "p95", "p99"):
                    ratio = (
                        f"x{value[key] / reference[key]:.2f}"
                        if isinstance(reference, dict) and reference[key]
                        else ""
                    )
                    cells.append(f"{key} {value[key]:7.1f} ms {ratio:>7}")
                lines.append(f"  {row.label:<{width}} " + "   ".join(cells))
            else:
                ratio = f"x{value / reference:.2f}" if isinstance(reference, float) else ""
                lines.append(f"  {row.label:<{width}} {value:>10,.0f} /s  {ratio:>7}")
    for title, rows in extra_rows:
        lines.append("")
        lines.append(title)
        for label, value, note in rows:
            lines.append(f"  {label:<{width}} {value:>13}  {note}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Targets of the issues


def targets(by_key: dict[str, Subject], extras: dict[str, Any]) -> list[dict[str, Any]]:
    def get(subject: str, metric: str) -> Any:
        return figure(by_key.get(subject), metric)[0]

    checks: list[dict[str, Any]] = []

    def check(name: str, measured: Any, goal: str, holds: bool | None) -> None:
        checks.append({"target": name, "measured": measured, "goal": goal, "holds": holds})

    drain = get("eddyq", "drain_c10")
    steady = get("eddyq", "drain_c10_steady")
    pgq = get("pgqueuer", "drain")
    raw100 = get("raw", "claim_batch100")
    if drain and pgq:
        check("drain, one process ≥ 3x PgQueuer", f"x{drain / pgq:.2f}", "≥ x3", drain >= 3 * pgq)
    if steady and raw100:
        # The raw loop runs in a process already up: the drain is held to it after its first
        # claim, as the issue that set the target measured it.
        check(
            "drain after its first claim, one process ≥ 60 % of raw batch-100 loop",
            f"{steady / raw100:.0%}",
            "≥ 60 %",
            steady >= 0.6 * raw100,
        )
    instrumented = get("eddyq", "drain_c10_instrumented")
    if drain and instrumented:
        check(
            "drain with metrics and tracing on ≥ 90 % of the plain drain",
            f"{instrumented / drain:.0%}",
            "≥ 90 %",
            instrumented >= 0.9 * drain,
        )
    many = get("eddyq", "enqueue_many")
    copy = get("raw", "copy")
    pgq_many = get("pgqueuer", "enqueue_many")
    if many:
        check("enqueue_many ≥ 100,000 jobs/s", f"{many:,.0f}/s", "≥ 100,000/s", many >= 100_000)
    if many and copy:
        check("enqueue_many ≈ half of COPY", f"{many / copy:.0%}", "≥ 50 %", many >= 0.5 * copy)
    if many and pgq_many:
        check("enqueue_many ≈ 3x PgQueuer", f"x{many / pgq_many:.2f}", "≥ x3", many >= 3 * pgq_many)
    single = get("eddyq", "enqueue_single")
    insert = get("eddyq", "raw_insert")
    orm = get("eddyq", "orm_insert")
    if single and insert:
        check(
            "single enqueue ≥ 80 % of raw INSERT",
            f"{single / insert:.0%}",
            "≥ 80 %",
            single >= 0.8 * insert,
        )
    if single and orm:
        check(
            "single enqueue within 20 % of bare ORM insert",
            f"{single / orm:.0%}",
            "≥ 80 %",
            single >= 0.8 * orm,
        )
    unlimited = get("eddyq", "flow_unlimited")
    limited = get("eddyq", "flow_concurrency40")
    if unlimited and limited:
        check(
            "drain of a queue limited to concurrency 40 ≥ 80 % of it unlimited",
            f"{limited / unlimited:.0%}",
            "≥ 80 %",
            limited >= 0.8 * unlimited,
        )
    keyed = get("eddyq", "flow_keys_limit1")
    if unlimited and keyed:
        check(
            "drain of keys limited to concurrency 1 (20 jobs each) ≥ 70 % of it unlimited",
            f"{keyed / unlimited:.0%}",
            "≥ 70 %",
            keyed >= 0.7 * unlimited,
        )
    fan = get("eddyq", "workflow_enqueue")
    if fan:
        check("enqueue of a 10,000-step fan-out + fan-in < 1 s", f"{fan:.2f} s", "< 1 s", fan < 1)
    plain = get("eddyq", "workflow_plain")
    chained = get("eddyq", "workflow_chains")
    if plain and chained:
        check(
            "drain of 1,000 chains of 10 steps ≥ 50 % of the plain drain",
            f"{chained / plain:.0%}",
            "≥ 50 %",
            chained >= 0.5 * plain,
        )
    lat = get("eddyq", "latency")
    if lat:
        check("idle latency p50 ≤ 2 ms", f"{lat['p50']:.1f} ms", "≤ 2 ms", lat["p50"] <= 2)
        check("idle latency p99 ≤ 10 ms", f"{lat['p99']:.1f} ms", "≤ 10 ms", lat["p99"] <= 10)
    retained = extras.get("retained")
    if retained and retained.get("ratio") is not None:
        check(
            f"drain with {retained['rows']:,} retained rows within 20 % of empty table",
            f"{retained['ratio']:.0%}",
            "≥ 80 %",
            retained["ratio"] >= 0.8,
        )
    plans = extras.get("plans")
    if plans and "plans" in plans:
        problems = plan_problems(plans["plans"])
        check(
            f"claim, heartbeat, finish stay index scans at {plans['rows']:,} rows",
            "; ".join(problems) if problems else "yes",
            "index scans; claim in index order",
            not problems,
        )
    soak = extras.get("soak")
    if soak and "samples" in soak:
        if "reloptions" in soak:
            options = [o for o in soak["reloptions"] or [] if o.startswith("autovacuum")]
            check(
                "migration sets autovacuum settings on eddyq_jobs",
                ", ".join(options) if options else "none (server defaults)",
                "per-table settings",
                bool(options),
            )
        # Bounded: not growing with the table. The first third holds the spike before autovacuum's
        # first pass, so the steady state is the middle third, compared with the last.
        samples = soak["samples"]
        third = max(1, len(samples) // 3)
        middle = max(s["dead"] for s in samples[third : 2 * third] or samples)
        late = max(s["dead"] for s in samples[-third:])
        live = max(samples[-1]["live"], 1)
        autovacuums = samples[-1]["autovacuums"]
        # Dead tuples grow between two autovacuum visits (autovacuum_naptime, a minute by
        # default) and fall at each: a soak that saw fewer than two visits cannot tell bounded
        # from growing (a million jobs take a minute on a fast machine).
        vacuumed = autovacuums >= 2
        check(
            f"soak of {soak['jobs']:,} jobs: dead tuples bounded",
            f"peak {middle:,} in middle third, {late:,} in last ({late / live:.0%} of live rows)"
            + (
                ""
                if vacuumed
                else f"; autovacuum ran {autovacuums} time(s): too short to tell (or it is off)"
            ),
            "last ≤ 1.5 x middle",
            late <= 1.5 * max(middle, 10_000) if soak["jobs"] >= 200_000 and vacuumed else None,
        )
        check(
            f"soak of {soak['jobs']:,} jobs: worker RSS flat",
            f"{soak['rss_first_mib']:.0f} → {soak['rss_last_mib']:.0f} MiB "
            f"(max {soak['rss_max_mib']:.0f})",
            "growth ≤ 10 %",
            soak["rss_max_mib"] <= 1.1 * soak["rss_first_mib"],
        )
    return checks


def render_targets(checks: list[dict[str, Any]]) -> str:
    lines = ["", "", "Targets (from this run)"]
    for item in checks:
        mark = {True: "holds", False: "MISSED", None: "?"}[item["holds"]]
        lines.append(f"  {mark:<7} {item['target']}: {item['measured']} (goal {item['goal']})")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Extra modes: retained history, plans, soak


def run_retained(
    server: str, sizes: dict[str, Any], log_dir: Path, runs: int, eddyq: Subject
) -> dict[str, Any]:
    rows = sizes["retained_rows"]
    url = common.recreate_database(server, common.bench_database("retained"))
    empty_url = common.database_url(server, common.bench_database())
    env = environment(eddyq, url)
    log(f"retained: loading {rows:,} completed jobs")
    loaded = common.run_subject(
        "benchmarks.eddyq", "load_retained", {"rows": rows}, env, sizes["timeout"] * 2
    )
    if loaded.error:
        return {"rows": rows, "error": f"load failed: {loaded.error}"}
    assert loaded.result is not None
    log(f"retained: loaded in {loaded.seconds:.0f}s ({loaded.result['size']})")
    out: dict[str, Any] = {"rows": rows, "load": loaded.result, "rounds": []}
    for _ in range(runs):
        outcome = common.run_subject(
            "benchmarks.eddyq",
            "retained_round",
            {
                "drain": sizes["drain"],
                "retained_url": url,
                "empty_url": empty_url,
                "log_dir": str(log_dir),
                "timeout": sizes["timeout"],
            },
            env,
            sizes["timeout"] * 3,
        )
        _record_round(out["rounds"], outcome, "retained")
    good = [
        r
        for r in out["rounds"]
        if isinstance(r.get("drain_empty"), float) and isinstance(r.get("drain_retained"), float)
    ]
    if good:
        out["drain_empty"] = common.median([r["drain_empty"] for r in good])
        out["drain_retained"] = common.median([r["drain_retained"] for r in good])
        out["ratio"] = out["drain_retained"] / out["drain_empty"]
    else:
        out["error"] = str(out["rounds"][0]) if out["rounds"] else "no round"
    out["url"] = url
    return out


def _record_round(rounds: list[dict[str, Any]], outcome: common.SubjectRun, label: str) -> None:
    """Keep an extra mode's round (its result, or its error) and log it."""
    if outcome.error:
        rounds.append({"error": outcome.error})
        log(f"{label}: round failed: {outcome.error}")
    else:
        assert outcome.result is not None
        rounds.append(outcome.result)
        log(f"{label}: {_brief(outcome.result)}")


def run_plans(
    server: str, sizes: dict[str, Any], eddyq: Subject, retained: dict[str, Any] | None
) -> dict[str, Any]:
    if retained and "url" in retained and "error" not in retained:
        url = retained["url"]
    else:
        url = common.recreate_database(server, common.bench_database("retained"))
        log(f"plans: loading {sizes['retained_rows']:,} completed jobs")
        loaded = common.run_subject(
            "benchmarks.eddyq",
            "load_retained",
            {"rows": sizes["retained_rows"]},
            environment(eddyq, url),
            sizes["timeout"] * 2,
        )
        if loaded.error:
            return {"error": f"load failed: {loaded.error}"}
    outcome = common.run_subject(
        "benchmarks.eddyq",
        "plans",
        {"retained_url": url, "available": 10_000},
        environment(eddyq, url),
        sizes["timeout"],
    )
    if outcome.error:
        return {"error": outcome.error}
    assert outcome.result is not None
    return outcome.result


def plan_problems(plans: dict[str, list[str]]) -> list[str]:
    """What keeps a plan from scaling: a sequential scan of eddyq_jobs, or a claim that does not
    read the claim index in order (it then sorts every available job at each claim)."""
    import re

    found: dict[str, list[str]] = {}
    for label, plan in plans.items():
        text = "\n".join(plan)
        name, kind = label.split(" (")[0], "generic" if "generic" in label else "custom"
        if "Seq Scan on eddyq_jobs" in text:
            problem = "seq scan of eddyq_jobs"
        elif name == "claim" and "claim_idx on eddyq_jobs" not in text:
            used = sorted(
                set(re.findall(r"[Ss]can (?:using|on) (eddyq_jobs_\w+)", text))
                - {"eddyq_jobs_pkey"}
            )
            sort = "Sort Key: eddyq_jobs.priority" in text
            problem = (f"reads {', '.join(used)} and " if used else "") + (
                "sorts every available job" if sort else "not in claim-index order"
            )
        else:
            continue
        found.setdefault(f"{name}: {problem}", []).append(kind)
    return [f"{problem} ({' and '.join(kinds)} plan)" for problem, kinds in found.items()]


def render_plans(plans: dict[str, Any]) -> str:
    if "error" in plans:
        return f"\nPlans: failed: {plans['error']}"
    lines = [
        "",
        f"Plans at {plans['rows']:,} rows ({plans['available']:,} available, the rest completed)",
    ]
    for label, plan in plans["plans"].items():
        lines.append("")
        lines.append(f"-- {label}")
        lines.extend(f"   {line}" for line in plan)
    return "\n".join(lines)


def run_limits(
    server: str, sizes: dict[str, Any], log_dir: Path, runs: int, eddyq: Subject
) -> dict[str, Any]:
    """benchmarks/eddyq.py ``limits``, once a round, on the main benchmark database."""
    url = common.database_url(server, common.bench_database())
    config = {
        "single": sizes["single"],
        "many": sizes["many"],
        "chunk": sizes["chunk"],
        "drain": sizes["drain"],
        "log_dir": str(log_dir),
        "timeout": sizes["timeout"],
    }
    out: dict[str, Any] = {"rounds": []}
    for number in range(1, runs + 1):
        log(f"limits: round {number}/{runs}")
        outcome = common.run_subject(
            "benchmarks.eddyq", "limits", config, environment(eddyq, url), sizes["timeout"] * 2
        )
        _record_round(out["rounds"], outcome, "limits")
    good = [r for r in out["rounds"] if "error" not in r]
    if not good:
        out["error"] = str(out["rounds"][0]) if out["rounds"] else "no round"
        return out
    out.update({key: common.median([r[key] for r in good]) for key in good[0]})
    return out


def limits_rows(
    limits: dict[str, Any], sizes: dict[str, Any], by_key: dict[str, Subject]
) -> list[tuple[str, list[tuple[str, str, str]]]]:
    if "error" in limits:
        return [("What limits the figures (--limits)", [("limits", "failed", limits["error"])])]
    floor = limits["copy_eddyq_jobs"]
    copies = [
        (
            "raw psycopg      COPY into the minimal table (above)",
            figure(by_key.get("raw"), "copy")[0],
        ),
        ("COPY into eddyq_jobs", floor),
        (
            "COPY into eddyq_jobs without its per-queue claim index",
            limits["copy_without_queue_claim_index"],
        ),
        ("COPY into eddyq_jobs without either claim index", limits["copy_without_claim_indexes"]),
        ("task.enqueue_many() (above)", figure(by_key.get("eddyq"), "enqueue_many")[0]),
    ]
    copy_rows = [
        (label, f"{value:,.0f} /s", f"x{value / floor:.2f}")
        for label, value in copies
        if isinstance(value, float)
    ]
    single = limits["single_enqueue"]
    single_rows = [
        (label, f"{limits[key]:,.0f} /s", f"x{limits[key] / single:.2f}")
        for label, key in [
            ("raw psycopg      INSERT … RETURNING id, same row", "single_same_row"),
            ("raw psycopg      task.enqueue()'s own INSERT statement", "single_own_statement"),
            ("django-eddyq     task.enqueue()", "single_enqueue"),
        ]
    ]
    jobs = sizes["drain"]
    start = limits["drain_start_s"]
    drain_rows = [
        (
            "eddyq_worker --burst, nothing to do: spawn → exit",
            f"{limits['idle_worker_s']:.2f} s",
            "",
        ),
        (f"drain of {jobs:,}: spawn → first claim", f"{start:.2f} s", ""),
        ("then first claim → last completion", f"{limits['drain_steady']:,.0f} /s", ""),
    ]
    raw100 = figure(by_key.get("raw"), "claim_batch100")[0]
    if isinstance(raw100, float):
        budget = jobs / (0.6 * raw100)
        left = budget - start
        drain_rows.append(
            (
                f"60 % of raw batch-100 ({0.6 * raw100:,.0f} /s) drains {jobs:,} in",
                f"{budget:.2f} s",
                f"after this start-up: {jobs / left:,.0f} /s steady (raw loop {raw100:,.0f})"
                if left > 0
                else "less than this start-up alone",
            )
        )
    return [
        (
            f"What limits the figures (--limits): COPY of enqueue_many's own {sizes['many']:,} "
            f"rows, pre-built, {sizes['chunk']:,} a transaction [rows/s; x = ratio to eddyq_jobs]",
            copy_rows,
        ),
        (
            f"One job per call, {sizes['single']:,} each, interleaved "
            "[calls/s; x = ratio to task.enqueue()]",
            single_rows,
        ),
        ("Drain at --concurrency 10, split at its first claim", drain_rows),
    ]


def drain_steady_rows(
    by_key: dict[str, Subject],
) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The plain drain without its start-up, beside the raw loop (which has none)."""
    steady = figure(by_key.get("eddyq"), "drain_c10_steady")[0]
    raw100 = figure(by_key.get("raw"), "claim_batch100")[0]
    if not isinstance(steady, float):
        return []
    share = f"{steady / raw100:.0%} of raw" if isinstance(raw100, float) else ""
    rows = [("django-eddyq  --concurrency 10", f"{steady:,.0f} /s", share)]
    if isinstance(raw100, float):
        rows.append(("raw psycopg   claim + complete, batch 100", f"{raw100:,.0f} /s", "100 %"))
    return [("Drain, first claim → last completion [jobs/s; % of the raw batch-100 loop]", rows)]


def flow_steady_rows(eddyq: Subject | None) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The flow-control drains without their start-up: a worker reads which queues are limited
    at its first pass, so its first claim of a limited queue may wait a poll interval."""
    figures = [
        (label, figure(eddyq, f"{key}_steady")[0])
        for label, key in [
            ("no limit", "flow_unlimited"),
            ("concurrency 40", "flow_concurrency40"),
            ('rate "2000/s"', "flow_rate2000"),
            ("keys at concurrency 1", "flow_keys_limit1"),
        ]
    ]
    reference = figures[0][1]
    rows = [
        (label, f"{value:,.0f} /s", f"x{value / reference:.2f}" if reference else "")
        for label, value in figures
        if isinstance(value, float)
    ]
    if not rows:
        return []
    return [("Flow control, first claim → last completion [jobs/s; x = ratio to no limit]", rows)]


def run_soak(
    server: str,
    sizes: dict[str, Any],
    jobs: int,
    concurrency: int,
    log_dir: Path,
    eddyq: Subject,
) -> dict[str, Any]:
    url = common.recreate_database(server, common.bench_database("soak"))
    env = environment(eddyq, url)
    outcome = common.run_subject(
        "benchmarks.soak",
        "soak",
        {
            "jobs": jobs,
            "concurrency": concurrency,
            "chunk": sizes["chunk"],
            "log_dir": str(log_dir),
            "sample_every": sizes["sample_every"],
        },
        env,
        max(3600.0, jobs / 200),
    )
    if outcome.error:
        return {"jobs": jobs, "error": outcome.error}
    assert outcome.result is not None
    return outcome.result


def render_soak(soak: dict[str, Any]) -> str:
    if "error" in soak:
        return f"\nSoak: failed: {soak['error']}"
    lines = [
        "",
        f"Soak: {soak['jobs']:,} jobs through one worker "
        f"(--concurrency {soak.get('concurrency', 10)}) in "
        f"{soak['seconds']:.0f}s ({soak['rate']:,.0f} jobs/s), enqueue_many of "
        f"{soak['chunk']:,} while the backlog is under {soak['backlog']:,}",
        f"  {'time':>6} {'done':>10} {'live tuples':>12} {'dead tuples':>12} {'table+idx':>10}"
        f" {'autovac':>8} {'RSS MiB':>8}",
    ]
    samples = soak["samples"]
    step = max(1, len(samples) // 20)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    for s in shown:
        lines.append(
            f"  {s['t']:>5.0f}s {s['done']:>10,} {s['live']:>12,} {s['dead']:>12,}"
            f" {s['size_mib']:>8.0f}Mi {s['autovacuums']:>8} {s['rss_mib']:>8.1f}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------


def report(document: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The table and the target checks of a run's document (also for ``--render``)."""
    sizes, extras = document["sizes"], document["extras"]
    by_key: dict[str, Subject] = {}
    for key, saved in document["subjects"].items():
        subject = next(iter(subjects({key})), None) or Subject(key, "", saved["label"])
        subject.status, subject.version = saved["status"], saved["version"]
        subject.options = saved.get("options")
        subject.rounds = saved["rounds"]
        by_key[key] = subject
    postgres = document["postgres"]
    runs = document["runs"]
    header = [
        f"django-eddyq benchmarks — {document['stamp']}, commit {document['commit']}",
        f"PostgreSQL {postgres['version']} ({postgres['origin']}; fsync="
        f"{postgres['settings'].get('fsync')}, synchronous_commit="
        f"{postgres['settings'].get('synchronous_commit')}), Python {document['python']}, "
        f"{document['cpus']} CPUs; median of {runs} round{'s' if runs > 1 else ''}"
        f"{' (--quick)' if document['quick'] else ''}",
    ]
    versions = ", ".join(
        f"{s.label} {s.version}"
        for s in by_key.values()
        if s.version and s.key not in {"eddyq", "raw"}
    )
    if versions:
        header.append(f"Peers: {versions}")
    configured = "; ".join(
        f"{s.label} " + ", ".join(f"{k}={v}" for k, v in s.options.items())
        for s in by_key.values()
        if s.options
    )
    if configured:
        header.append(f"Peer options ({document.get('peer_options', 'defaults')}): {configured}")
    extra_rows = []
    retained = extras.get("retained")
    if retained:
        if "error" in retained:
            rows = [("drain, --concurrency 10", "failed", retained["error"][:120])]
        else:
            rows = [
                ("django-eddyq  empty table", f"{retained['drain_empty']:,.0f} /s", "x1.00"),
                (
                    f"django-eddyq  {retained['rows']:,} completed rows retained",
                    f"{retained['drain_retained']:,.0f} /s",
                    f"x{retained['ratio']:.2f}",
                ),
            ]
        extra_rows.append(
            (
                f"Drain {sizes['drain']:,} no-op jobs (--concurrency 10) with retained history "
                "[jobs/s; x = ratio to the empty table]",
                rows,
            )
        )
    extra_rows.extend(drain_steady_rows(by_key))
    extra_rows.extend(flow_steady_rows(by_key.get("eddyq")))
    extra_rows.extend(workflow_rows(sizes, by_key.get("eddyq")))
    if "limits" in extras:
        extra_rows.extend(limits_rows(extras["limits"], sizes, by_key))
    table = render(header, sections(sizes, by_key), by_key, extra_rows)
    checks = targets(by_key, extras)
    output = table + render_targets(checks)
    if "plans" in extras:
        output += "\n" + render_plans(extras["plans"])
    if "soak" in extras:
        output += "\n" + render_soak(extras["soak"])
    return output, checks


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs, one round")
    parser.add_argument("--runs", type=int, help="rounds (median taken); default 3, 1 with --quick")
    parser.add_argument(
        "--subjects",
        help="comma-separated subset of: eddyq, raw, "
        + ", ".join(module for module, _, _ in PEERS)
        + " (or 'none')",
    )
    parser.add_argument("--retained", action="store_true", help="drain with 1M retained rows")
    parser.add_argument("--plans", action="store_true", help="EXPLAIN claim/heartbeat/finish")
    parser.add_argument(
        "--limits", action="store_true", help="COPY floors of eddyq_jobs; drain start-up"
    )
    parser.add_argument("--soak", type=int, metavar="N", help="N jobs through one worker")
    parser.add_argument(
        "--soak-concurrency",
        type=int,
        default=10,
        metavar="C",
        help="the soak's worker's --concurrency (default 10)",
    )
    parser.add_argument(
        "--servers",
        action="store_true",
        help="run everything on DATABASE_URL's server, then on an embedded PostgreSQL 18",
    )
    parser.add_argument(
        "--peer-options",
        choices=["best", "defaults"],
        default="best",
        help="the peers' option sets (OPTIONS in benchmarks/peers/<peer>.py): their best "
        "documented configuration (default), or their defaults",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--render", type=Path, metavar="FILE", help="print the table of a saved run and exit"
    )
    args = parser.parse_args()
    if args.render:
        print(render_saved(json.loads(args.render.read_text())))
        return

    sizes = dict(QUICK if args.quick else FULL)
    runs = args.runs or sizes["runs"]
    selected = None
    if args.subjects:
        selected = set() if args.subjects == "none" else set(args.subjects.split(","))

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = RESULTS / "logs" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    commit = _git_commit()

    compile_bytecode()
    servers = [start_server(args)] if not args.servers else both_servers()
    documents = []
    for number, (server, origin) in enumerate(servers, 1):
        server_logs = log_dir if len(servers) == 1 else log_dir / f"server{number}"
        server_logs.mkdir(parents=True, exist_ok=True)
        documents.append(
            run_on_server(server, origin, args, sizes, runs, selected, stamp, server_logs)
        )
    for document in documents:
        document["commit"] = (
            commit if _git_commit() == commit else f"{commit} (then {_git_commit()})"
        )
        document["table"], document["targets"] = report(document)
    saved: dict[str, Any] = (
        documents[0]
        if len(documents) == 1
        else {"stamp": stamp, "commit": documents[0]["commit"], "servers": documents}
    )
    saved["seconds"] = time.time() - started
    print(render_saved(saved))
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(saved, indent=2, default=str)
    (RESULTS / f"{stamp}.json").write_text(text)
    (RESULTS / "latest.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    log(f"done in {time.time() - started:.0f}s; results in {RESULTS / 'latest.json'}")
    for path in sorted(log_dir.rglob("*"), reverse=True):
        if path.is_file() and path.stat().st_size == 0:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    if not any(log_dir.iterdir()):
        shutil.rmtree(log_dir)


def both_servers() -> list[tuple[str, str]]:
    """``--servers``: DATABASE_URL's server, then a throw-away embedded PostgreSQL 18."""
    url = os.environ.get("DATABASE_URL")
    if not url or os.environ.get("EDDYQ_EMBEDDED_PGDATA"):
        raise SystemExit(
            "--servers compares DATABASE_URL's server with the embedded PostgreSQL: set "
            "DATABASE_URL to the other server (a role with CREATEDB)"
        )
    from django_eddyq import embedded

    cluster = embedded.start_throwaway(durable=True)
    return [
        (url, "DATABASE_URL"),
        (cluster.url, f"embedded throw-away cluster ({cluster.cluster_dir})"),
    ]


def render_saved(saved: dict[str, Any]) -> str:
    """The table of a saved run: one per server for a run of ``--servers``."""
    if "servers" not in saved:
        return str(report(saved)[0])
    return "\n\n\n".join(str(report(document)[0]) for document in saved["servers"])


def run_on_server(
    server: str,
    origin: str,
    args: argparse.Namespace,
    sizes: dict[str, Any],
    runs: int,
    selected: set[str] | None,
    stamp: str,
    log_dir: Path,
) -> dict[str, Any]:
    """Every subject's rounds and the extra modes on one server: the run's document."""
    chosen = subjects(selected)
    by_key = {s.key: s for s in chosen}
    eddyq_subject = Subject("eddyq", "benchmarks.eddyq", "django-eddyq")
    described = common.server_description(common.database_url(server, "postgres"))
    log(f"PostgreSQL {described['version']} from {origin}: {described['settings']}")

    # The main database always exists: the retained comparison drains it as the empty table.
    common.recreate_database(server, common.bench_database())
    for subject in chosen:
        prepare(subject, server, sizes["timeout"], args.peer_options)
        log(
            f"{subject.label}: {subject.status}"
            + (f" ({subject.version})" if subject.version else "")
        )
    if "eddyq" not in by_key and (args.retained or args.plans or args.limits or args.soak):
        prepare(eddyq_subject, server, sizes["timeout"], args.peer_options)

    for number in range(1, runs + 1):
        for subject in chosen:
            if subject.status == "ok":
                log(f"round {number}/{runs}: {subject.label}")
                run_round(subject, server, sizes, log_dir, args.peer_options)

    extras: dict[str, Any] = {}
    if args.retained:
        extras["retained"] = run_retained(server, sizes, log_dir, runs, eddyq_subject)
    if args.plans:
        extras["plans"] = run_plans(server, sizes, eddyq_subject, extras.get("retained"))
    if args.limits:
        extras["limits"] = run_limits(server, sizes, log_dir, runs, eddyq_subject)
    if args.soak:
        log(f"soak: {args.soak:,} jobs")
        extras["soak"] = run_soak(
            server, sizes, args.soak, args.soak_concurrency, log_dir, eddyq_subject
        )

    return {
        "stamp": stamp,
        "postgres": {**described, "origin": origin.split(" (")[0]},
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "runs": runs,
        "sizes": sizes,
        "peer_options": args.peer_options,
        "subjects": {
            s.key: {
                "label": s.label,
                "version": s.version,
                "status": s.status,
                "options": s.options,
                "rounds": s.rounds,
            }
            for s in chosen
        },
        "medians": {
            s.key: {
                metric: figure(s, metric)[0]
                for metric in sorted({m for r in s.rounds for m in r if m != "error"})
            }
            for s in chosen
        },
        "extras": extras,
    }


def compile_bytecode() -> None:
    """Compile the repository's modules, as installing a package does: an editable install, or
    PYTHONDONTWRITEBYTECODE, would leave every worker start compiling them anew (about 60 ms of
    a drain's start-up), which a deployed queue, and every peer (installed by pip), never pays."""
    for folder in ("django_eddyq", "testproject", "benchmarks"):
        compileall.compile_dir(common.REPO / folder, quiet=1)


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=common.REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "django_eddyq"],
            cwd=common.REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
