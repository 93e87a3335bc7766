"""taskfleet side by side with pgqueuer and procrastinate: every workload, interleaved.

    python -m bench.run [--reps 3] [--only enqueue,drain,latency,idle,fairness,convergence,scale]
                        [--json results.json] [--database-url URL]

Each workload measures the systems in turn inside every repetition, in a rotated order (A B C,
B C A, C A B, ...), so drift on a shared machine spreads over all of them; a cell is the median
of the repetitions and their min-max; a ratio is taskfleet / peer per repetition (measured
minutes apart at most), then the median and min-max of those. Every run gets a fresh database
cloned from a per-system template. The tables print as each workload finishes, in markdown.

Some counts are smaller than the issue's by default, to keep the whole run near 15 minutes on
two cores; the rates they measure are steady-state (per call or per task) and the flags restore
the full counts: ``--enqueue-single-tasks`` (one-by-one enqueue, default 2,000 per path) and
``--slow-drain-tasks`` (procrastinate's drain, default 2,000: it fetches one job per round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import backlog, drain, enqueue, fairness, http_submit, idle, latency, machine, noisy
from bench.report import Series, paired_ratio, ratio_cell, rotated, table
from bench.scratch import DEFAULT_SERVER, Templates
from bench.systems import Pgqueuer, Procrastinate, System, Taskfleet

WORKLOADS = (
    "enqueue",
    "drain",
    "drain-backlog",
    "latency",
    "idle",
    "fairness",
    "noisy",
    "http-submit",
    "convergence",
    "scale",
)

LABELS = {
    "taskfleet": "taskfleet (default: worker commits async)",
    "taskfleet-sync": "taskfleet (TASKFLEET_SYNCHRONOUS_COMMIT=true)",
    "pgqueuer": "pgqueuer (defaults: batch 10, no slot cap)",
    "procrastinate": "procrastinate (concurrency 10)",
    "taskfleet-http": "taskfleet HTTP API",
    "taskfleet-python": "taskfleet Python (task_insert_batch)",
}
OURS = ("taskfleet", "taskfleet-sync")
PEERS = ("pgqueuer", "procrastinate")


def _systems() -> list[System]:
    return [Taskfleet(), Taskfleet(synchronous_commit=True), Pgqueuer(), Procrastinate()]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ratio_rows(
    series: dict[str, dict[str, Series]], columns: list[str], ours: tuple[str, ...]
) -> list[list[str]]:
    rows = []
    for mine in ours:
        for peer in PEERS:
            if mine in series and peer in series:
                rows.append(
                    [f"ratio {mine} / {peer}"]
                    + [ratio_cell(paired_ratio(series[mine][c], series[peer][c])) for c in columns]
                )
    return rows


def _per_rep_ratios(series: dict[str, dict[str, Series]], columns: list[str]) -> str:
    """Every repetition's taskfleet / pgqueuer ratio, in order (the table shows min-max)."""
    if "taskfleet" not in series or "pgqueuer" not in series:
        return ""
    parts = []
    for c in columns:
        ratio = paired_ratio(series["taskfleet"][c], series["pgqueuer"][c])
        parts.append(f"{c}: " + ", ".join(f"{x:.2f}x" for x in ratio.values))
    return " Ratios taskfleet / pgqueuer per repetition: " + "; ".join(parts) + "."


def _convergence_tables(text: str) -> str:
    """bench/convergence.py prints one JSON object per run: a table of its p50..max figures."""
    parts = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        stats = {k: v for k, v in doc.items() if isinstance(v, dict) and "p50" in v}
        settings = {k: v for k, v in doc.items() if not isinstance(v, dict)}
        cols = ["p50", "p95", "p99", "max"]
        rows = [[k] + [f"{v.get(c, float('nan')):.4f}" for c in cols] for k, v in stats.items()]
        extra = {k: v for k, v in doc.items() if isinstance(v, dict) and "p50" not in v}
        parts.append(
            ", ".join(f"{k}={v}" for k, v in settings.items())
            + (", " + json.dumps(extra) if extra else "")
            + "\n\n"
            + table(["figure", *cols], rows)
        )
    if not parts:
        return "```\n" + "\n".join(text.splitlines()[-40:]) + "\n```"
    return "\n\n".join(parts)


def _extra_cell(items: list[fairness.Shares], key: str) -> str:
    s = Series()
    for item in items:
        s.add(float(item.extra[key]) * 100)
    return s.cell("{:.2f}%")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.templates = Templates(args.database_url)
        self.results: dict[str, Any] = {}
        self.markdown: list[str] = []
        #: The flushed-commit cost measured just before the current workload, in ms.
        self.commit_ms: float | None = None

    def emit(self, title: str, body: str, note: str = "") -> None:
        if self.commit_ms is not None:
            note = (note + " " if note else "") + (
                f"A flushed commit cost {self.commit_ms:.2f} ms when this workload started."
            )
        text = f"### {title}\n\n{body}\n" + (f"\n{note}\n" if note else "")
        self.markdown.append(text)
        print(text, flush=True)

    # -------------------------------------------------------------------------------------------

    async def enqueue(self) -> None:
        a = self.args
        paths = list(enqueue.PATHS)
        series = {p: {"single": Series(), "batch": Series()} for p in paths}
        for rep in range(a.reps):
            for path in rotated(paths, rep):
                _say(f"enqueue rep {rep + 1}/{a.reps}: {path}")
                rates = await enqueue.measure_enqueue(
                    self.templates,
                    path,
                    tasks=a.enqueue_single_tasks,
                    batch_tasks=a.enqueue_tasks,
                    inflight=8,
                    batch=1000,
                )
                series[path]["single"].add(rates.single)
                series[path]["batch"].add(rates.batch)
        cols = ["single", "batch"]
        rows = [[LABELS[p]] + [series[p][c].cell() for c in cols] for p in paths]
        rows += _ratio_rows(series, cols, ("taskfleet-python", "taskfleet-http"))
        self.results["enqueue"] = {
            p: {c: s.values for c, s in v.items()} for p, v in series.items()
        }
        self.emit(
            "Enqueue (tasks/s, higher is better)",
            table(
                [
                    "path",
                    f"one by one, 8 in flight ({a.enqueue_single_tasks:,} tasks)",
                    f"batches of 1,000 ({a.enqueue_tasks:,} tasks)",
                ],
                rows,
            ),
        )

    # -------------------------------------------------------------------------------------------

    def _drain_tasks(self, system: System) -> int:
        tasks = self.args.slow_drain_tasks if system.name == "procrastinate" else self.args.tasks
        return int(tasks)

    async def drain(self) -> None:
        a = self.args
        systems = [x for x in _systems() if x.name in self.args.systems]
        configs = list(a.drain_configs)
        cols = [f"{w} worker{'s' if w > 1 else ''} x {c}" for w, c in configs]
        series = {s.name: {c: Series() for c in cols} for s in systems}
        by_name = {s.name: s for s in systems}
        for rep in range(a.reps):
            for (workers, conc), col in zip(configs, cols, strict=True):
                for name in rotated(list(by_name), rep):
                    system = by_name[name]
                    tasks = self._drain_tasks(system)
                    _say(f"drain rep {rep + 1}/{a.reps}: {name} {col}, {tasks} tasks")
                    window = await drain.measure_drain(
                        self.templates, system, tasks=tasks, workers=workers, concurrency=conc
                    )
                    series[name][col].add(window.rate)
        rows = [[LABELS[s.name]] + [series[s.name][c].cell() for c in cols] for s in systems]
        rows += _ratio_rows(series, cols, OURS)
        self.results["drain"] = {n: {c: s.values for c, s in v.items()} for n, v in series.items()}
        self._drain_series = series
        self.emit(
            "Drain (tasks/s from first start to last finish, higher is better)",
            table(["system", *cols], rows),
            f"Tasks: {a.tasks:,} queued no-op tasks (procrastinate: {a.slow_drain_tasks:,}), "
            "submitted in one statement once every worker listens." + _per_rep_ratios(series, cols),
        )

    # -------------------------------------------------------------------------------------------

    async def latency(self) -> None:
        a = self.args
        systems = [x for x in _systems() if x.name in self.args.systems]
        cols = ["p50", "p95", "p99", "max", "enqueue call p50"]
        e2e_cols = ["p50", "p95", "p99", "max"]
        series = {s.name: {c: Series() for c in cols} for s in systems}
        e2e = {s.name: {c: Series() for c in e2e_cols} for s in systems}
        by_name = {s.name: s for s in systems}
        for rep in range(a.reps):
            for name in rotated(list(by_name), rep):
                _say(f"latency rep {rep + 1}/{a.reps}: {name}")
                pickup = await latency.measure_pickup(self.templates, by_name[name])
                ms = series[name]
                ms["p50"].add(pickup.p(50) * 1000)
                ms["p95"].add(pickup.p(95) * 1000)
                ms["p99"].add(pickup.p(99) * 1000)
                ms["max"].add(max(pickup.seconds) * 1000)
                ms["enqueue call p50"].add(pickup.enqueue_call * 1000)
                es = e2e[name]
                es["p50"].add(pickup.handler_p(50) * 1000)
                es["p95"].add(pickup.handler_p(95) * 1000)
                es["p99"].add(pickup.handler_p(99) * 1000)
                es["max"].add(max(pickup.handler_seconds) * 1000)
        fmt = "{:.1f}"
        rows = [[LABELS[s.name]] + [series[s.name][c].cell(fmt) for c in cols] for s in systems]
        rows += _ratio_rows(series, cols, OURS)
        e2e_rows = [
            [LABELS[s.name]] + [e2e[s.name][c].cell(fmt) for c in e2e_cols] for s in systems
        ]
        e2e_rows += _ratio_rows(e2e, e2e_cols, OURS)
        self.results["latency"] = {
            n: {c: s.values for c, s in v.items()} for n, v in series.items()
        }
        self.results["latency_end_to_end"] = {
            n: {c: s.values for c, s in v.items()} for n, v in e2e.items()
        }
        self.emit(
            "Pickup latency (ms from enqueue to start by the database stamps, lower is better)",
            table(["system", *cols], rows),
            "Idle fleet of one worker (10 slots), 200 tasks submitted one at a time 20 ms apart "
            "through each system's Python enqueue path. The enqueue stamp is the submitting "
            "transaction's now() everywhere, and the start stamp the now() of the statement "
            "that claimed the task (with no label limit active, taskfleet's claim stamps when "
            "it began, as the peers' dequeues do). 'enqueue call p50' is the submitter's median "
            "wall time per enqueue "
            "call (mostly its commit), which every pickup includes."
            + _per_rep_ratios(series, ["p50"]),
        )
        self.emit(
            "Pickup end to end (ms from the enqueue call to the handler's first line, lower "
            "is better)",
            table(["system", *e2e_cols], e2e_rows),
            "The same runs on the wall clock: the submitter stamps time.time() just before its "
            "enqueue call, every system's no-op handler appends its job id and time.time() to "
            "one file as its first act (bench/stamps.py). Everything a submitter waits for: its "
            "call, the commit, the wake-up, the whole claim, the dispatch to the handler."
            + _per_rep_ratios(e2e, ["p50"]),
        )

    # -------------------------------------------------------------------------------------------

    async def idle(self) -> None:
        a = self.args
        subjects = [
            idle.IdleSubject("taskfleet x 10", Taskfleet(), 10),
            idle.IdleSubject("taskfleet x 100", Taskfleet(), 100),
            idle.IdleSubject("pgqueuer (defaults)", Pgqueuer(), 10),
            idle.IdleSubject("procrastinate x 10", Procrastinate(), 10),
            idle.IdleSubject("procrastinate x 100", Procrastinate(), 100),
        ]
        _say(f"idle: {a.reps} windows of {a.idle_seconds:g}s, all workers at once")
        await idle.measure_idle(
            self.templates, subjects, windows=a.reps, window_seconds=a.idle_seconds
        )
        fmt = "{:.2f}"
        rows = []
        for s in subjects:
            st, tx = Series(), Series()
            for v in s.statements_per_s:
                st.add(v)
            for v in s.transactions_per_s:
                tx.add(v)
            rows.append([s.label, st.cell(fmt), tx.cell(fmt)])
        self.results["idle"] = {
            s.label: {"statements_per_s": s.statements_per_s, "xacts_per_s": s.transactions_per_s}
            for s in subjects
        }
        self.emit(
            "Idle load (per idle worker, lower is better)",
            table(["worker", "statements/s (wire)", "transactions/s (pg_stat_database)"], rows),
            f"{a.reps} windows of {a.idle_seconds:g} s after a 5 s settle, every worker idle at "
            "the same time on a database of its own; statements counted on the wire by "
            "bench.wire_counter (pg_stat_statements is not loaded on this server).",
        )

    # -------------------------------------------------------------------------------------------

    async def fairness(self) -> None:
        a = self.args
        weights: list[fairness.Shares] = []
        strict: list[fairness.Shares] = []
        strict_only = Series()
        fleet: list[fairness.Shares] = []
        slot_time: list[fairness.Shares] = []
        for rep in range(a.reps):
            _say(f"fairness rep {rep + 1}/{a.reps}")
            weights.append(await fairness.measure_weights(self.templates))
            strict.append(await fairness.measure_strict(self.templates))
            strict_only.add(await fairness.measure_strict_only(self.templates))
            fleet.append(await fairness.measure_fleet(self.templates))
            slot_time.append(await fairness.measure_slot_time(self.templates))

        def col(items: list[fairness.Shares], key: str, scale: float = 100) -> str:
            s = Series()
            for item in items:
                s.add(item.observed[key] * scale)
            return s.cell("{:.2f}%")

        def err(items: list[fairness.Shares], rel: bool) -> str:
            s = Series()
            for item in items:
                s.add((item.max_rel_error if rel else item.max_abs_error) * 100)
            return s.cell("{:.2f}%")

        slot = Series()
        for item in strict:
            slot.add(item.extra["slot_time_share"] * 100)
        rows = [
            ["a (weight 5)", "71.43%", col(weights, "a")],
            ["b (weight 1)", "14.29%", col(weights, "b")],
            ["default (weight 1)", "14.29%", col(weights, "default")],
            ["max error, share points", "", err(weights, rel=False)],
            ["max error, relative", "", err(weights, rel=True)],
            ["strict lane: share of claims (cap 3 of 10)", "30.00%", col(strict, "strict")],
            ["strict lane: share of busy slot time", "30.00%", slot.cell("{:.2f}%")],
            ["strict lane: error, relative", "", err(strict, rel=True)],
            [
                "only strict work queued (30 x 20 ms): tasks/s",
                "~150 (3 slots / 20 ms)",
                strict_only.cell("{:.1f}"),
            ],
            [
                "fleet of 2 + 5 + 10 slots, a:3 / b:1: a's share of starts",
                "75.00%",
                col(fleet, "a"),
            ],
            ["a:1 / b:1, a 10 ms, b 40 ms: a's share of starts", "50.00%", col(slot_time, "a")],
            [
                "... and a's share of busy slot time",
                "(weights share starts)",
                _extra_cell(slot_time, "slot_time_a"),
            ],
        ]
        claims = statistics.median(w.claims for w in weights)
        self.results["fairness"] = {
            "weights": [asdict(w) for w in weights],
            "strict": [asdict(s) for s in strict],
            "strict_only_tasks_per_s": strict_only.values,
            "fleet": [asdict(f) for f in fleet],
            "slot_time": [asdict(f) for f in slot_time],
        }
        self.emit(
            "Fairness (taskfleet only; the peers have no weighted groups or strict-lane cap)",
            table(["group", "target", "observed"], rows),
            "One worker x 10 slots, config inserted before it starts. Weights: 10,000 demo.echo "
            "tasks evenly over label a, label b and no label; shares of the claims made while "
            f"all three groups had pending work (median {claims:,.0f} claims). Strict: "
            "maxStrictPercentage 30, 900 strict and 2,100 normal demo.sleep(20 ms) tasks, "
            "while both lanes had pending work; then 30 strict tasks alone. Fleet: three worker "
            "processes (2, 5 and 10 slots) started together on 40,000 tasks split over a and b, "
            "the first 10,000 starts. Slot time: 400 + 400 demo.sleep tasks, one worker x 10, "
            "while both groups had work.",
        )

    # -------------------------------------------------------------------------------------------

    async def drain_backlog(self) -> None:
        """The backlog queued before the workers start (taskfleet through POST /tasks/batch),
        taskfleet against pgqueuer, interleaved pairs."""
        a = self.args
        systems = [Taskfleet(), Pgqueuer()]
        col = "1 worker x 10"
        series = {s.name: {col: Series()} for s in systems}
        by_name = {s.name: s for s in systems}
        for rep in range(a.reps):
            for name in rotated(list(by_name), rep):
                _say(f"drain-backlog rep {rep + 1}/{a.reps}: {name}, {a.tasks} tasks")
                window = await backlog.measure_backlog_drain(
                    self.templates, by_name[name], tasks=a.tasks, workers=1, concurrency=10
                )
                series[name][col].add(window.rate)
        rows = [[LABELS[s.name], series[s.name][col].cell()] for s in systems]
        ratio = paired_ratio(series["taskfleet"][col], series["pgqueuer"][col])
        rows.append(["ratio taskfleet / pgqueuer", ratio_cell(ratio)])
        self.results["drain-backlog"] = {n: v[col].values for n, v in series.items()}
        self.emit(
            "Drain of a backlog queued before the worker starts (tasks/s, higher is better)",
            table(["system", col], rows),
            f"{a.tasks:,} no-op tasks queued first (taskfleet: POST /tasks/batch, 1,000 a "
            "request; pgqueuer: its batch enqueue), then one worker started; first start to "
            "last finish, from each system's own timestamps. Values per repetition: "
            + json.dumps({n: [round(x) for x in v[col].values] for n, v in series.items()}),
        )

    async def noisy(self) -> None:
        a = self.args
        configs = [(1, 10), (1, 100), (4, 10)]
        results: dict[str, list[noisy.Noisy]] = {}
        for rep in range(a.reps):
            for workers, conc in configs:
                label = f"{workers} worker{'s' if workers > 1 else ''} x {conc}"
                _say(f"noisy rep {rep + 1}/{a.reps}: {label}")
                result = await noisy.measure_noisy(
                    self.templates,
                    a_tasks=a.noisy_a_tasks,
                    b_tasks=a.noisy_b_tasks,
                    workers=workers,
                    concurrency=conc,
                )
                _say(f"  {result}")
                results.setdefault(label, []).append(result)
        rows = []
        for label, items in results.items():
            mixed, alone, ratio, share = Series(), Series(), Series(), Series()
            for item in items:
                mixed.add(item.mixed_rate)
                alone.add(item.alone_rate)
                ratio.add(item.ratio)
                share.add(item.b_share * 100)
            rows.append(
                [label, mixed.cell(), alone.cell(), ratio.cell("{:.2f}x"), share.cell("{:.1f}%")]
            )
        self.results["noisy"] = {k: [asdict(i) for i in v] for k, v in results.items()}
        self.emit(
            "Noisy neighbour (tasks/s started, higher is better)",
            table(
                [
                    "fleet",
                    "both groups have work",
                    "a alone, right after",
                    "ratio (target >= 0.8x)",
                    "b's share (target 50% +- 2.5)",
                ],
                rows,
            ),
            f"{a.noisy_a_tasks:,} tasks labelled a queued before {a.noisy_b_tasks:,} labelled b, "
            'config {"labelWeights": {"a": 1, "b": 1}}, then the workers; starts counted from '
            "the database's started_at (python -m bench.noisy runs one).",
        )

    async def http_submit(self) -> None:
        a = self.args
        http, raw, ratio, cpu = Series(), Series(), Series(), Series()
        for rep in range(a.reps):
            _say(f"http-submit rep {rep + 1}/{a.reps}")
            rates = await http_submit.measure(
                self.templates, tasks=a.http_tasks, inflight=16, rep=rep
            )
            _say(f"  {rates} ratio {rates.ratio:.3f}")
            http.add(rates.http)
            raw.add(rates.raw)
            ratio.add(rates.ratio)
            cpu.add(rates.api_cpu_per_request * 1000)
        self.results["http-submit"] = {
            "http": http.values,
            "raw": raw.values,
            "ratio": ratio.values,
            "api_cpu_ms_per_request": cpu.values,
        }
        self.emit(
            "HTTP submission against raw INSERT + NOTIFY (16 in flight)",
            table(
                ["POST /tasks/s", "raw INSERT+NOTIFY/s", "ratio (target >= 0.4)", "API CPU ms/req"],
                [[http.cell(), raw.cell(), ratio.cell("{:.2f}"), cpu.cell("{:.2f}")]],
            ),
            f"{a.http_tasks:,} tasks per path per repetition after a warm-up, one taskfleet api "
            "process (auth, validation, metrics, NOTIFY); raw: one INSERT ... RETURNING with "
            "pg_notify per autocommit statement over 16 asyncpg connections. Ratios per "
            "repetition: " + ", ".join(f"{x:.3f}" for x in ratio.values),
        )

    async def convergence(self) -> None:
        script = Path(__file__).with_name("convergence.py")
        if not script.exists():
            self.results["convergence"] = {"skipped": "bench/convergence.py does not exist"}
            self.emit("Convergence", "Skipped: bench/convergence.py does not exist yet.")
            return
        _say("convergence: python -m bench.convergence")
        argv = [sys.executable, "-m", "bench.convergence"]
        if self.args.database_url != DEFAULT_SERVER:
            argv += ["--database-url", self.args.database_url]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.args.convergence_timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self.emit("Convergence", "bench/convergence.py did not finish in time; skipped.")
            return
        text = out.decode(errors="replace").strip()
        self.results["convergence"] = {"exit": proc.returncode, "output": text}
        self.emit(
            "Convergence (bench/convergence.py, its own defaults)",
            _convergence_tables(text),
            f"exit status {proc.returncode}; figures in seconds (see bench/convergence.py).",
        )

    # -------------------------------------------------------------------------------------------

    async def scale(self) -> None:
        a = self.args
        counts = [1, 2, 4, 8]
        reuse = getattr(self, "_drain_series", {}).get("taskfleet", {})
        series: dict[int, Series] = {}
        for n in (1, 2):
            column = reuse.get(f"{n} worker{'s' if n > 1 else ''} x 10")
            if column is not None and column.measured:
                series[n] = column
        todo = [n for n in counts if n not in series]
        for n in todo:
            series[n] = Series()
        for rep in range(a.reps):
            for name in rotated([str(n) for n in todo], rep):
                _say(f"scale rep {rep + 1}/{a.reps}: {name} workers")
                window = await drain.measure_drain(
                    self.templates, Taskfleet(), tasks=a.tasks, workers=int(name), concurrency=10
                )
                series[int(name)].add(window.rate)
        base = series[1].median or math.nan
        rows = [
            [
                str(n),
                series[n].cell(),
                f"{(series[n].median or math.nan) / base:.2f}x",
            ]
            for n in counts
        ]
        self.results["scale"] = {str(n): series[n].values for n in counts}
        reused = [n for n in counts if n not in todo]
        self.emit(
            "Scale (taskfleet, tasks/s, concurrency 10 per worker)",
            table(["worker processes", "tasks/s", "vs 1 worker"], rows),
            f"{a.tasks:,} tasks per run."
            + (f" Rows {reused} are the drain workload's taskfleet runs." if reused else ""),
        )

    # -------------------------------------------------------------------------------------------

    async def run(self) -> None:
        started = time.monotonic()
        try:
            _say("machine: measuring the commit cost")
            self.results["machine"] = await machine.describe(self.templates)
            m = self.results["machine"]
            self.emit(
                "Machine",
                "```\n" + json.dumps(m, indent=2) + "\n```",
            )
            runners: dict[str, Callable[[], Awaitable[None]]] = {
                "enqueue": self.enqueue,
                "drain": self.drain,
                "drain-backlog": self.drain_backlog,
                "noisy": self.noisy,
                "http-submit": self.http_submit,
                "latency": self.latency,
                "idle": self.idle,
                "fairness": self.fairness,
                "convergence": self.convergence,
                "scale": self.scale,
            }
            for name in WORKLOADS:
                if name in self.args.only:
                    t0 = time.monotonic()
                    cost = await machine.sample_commit_cost(self.templates)
                    self.results.setdefault("commit_ms", {})[name] = cost
                    self.commit_ms = cost["commit_ms_sync_on"]
                    await runners[name]()
                    _say(f"{name}: {time.monotonic() - t0:.0f}s")
            self.results["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            await self.templates.close()
            elapsed = time.monotonic() - started
            self.results["elapsed_seconds"] = round(elapsed, 1)
            _say(f"total: {elapsed:.0f}s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads (default all: {','.join(WORKLOADS)})",
    )
    parser.add_argument("--tasks", type=int, default=20_000, help="drain and scale tasks")
    parser.add_argument("--slow-drain-tasks", type=int, default=2_000)
    parser.add_argument("--enqueue-tasks", type=int, default=20_000, help="batched enqueue")
    parser.add_argument("--enqueue-single-tasks", type=int, default=2_000)
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="per window")
    parser.add_argument("--noisy-a-tasks", type=int, default=1_000_000)
    parser.add_argument("--noisy-b-tasks", type=int, default=10_000)
    parser.add_argument("--http-tasks", type=int, default=4_000, help="http-submit, per path")
    parser.add_argument("--convergence-timeout", type=float, default=300.0)
    parser.add_argument(
        "--systems",
        default="taskfleet,taskfleet-sync,pgqueuer,procrastinate",
        help="drain and latency: which systems (default all four)",
    )
    parser.add_argument(
        "--drain-configs",
        default="1x10,2x10",
        help="drain: worker processes x slots, comma-separated (default 1x10,2x10)",
    )
    parser.add_argument("--json", help="also write every raw value to this file")
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    args.only = only
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    args.drain_configs = [
        (int(w), int(c)) for w, c in (x.split("x") for x in args.drain_configs.split(","))
    ]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bench = Bench(args)
    try:
        asyncio.run(bench.run())
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(bench.results, indent=2, default=str))


if __name__ == "__main__":
    main()
