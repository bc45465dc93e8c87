"""`python -m benchmarks.soak`: two PostgreSQL nodes under a mixed load for a long while,
with a fault every 30-90 s, judged from the jobs' own log lines (not from the API).

Run it from a checkout with the test extra installed (it drives nodes with the e2e
harness in `tests/`). It makes a private PostgreSQL cluster in a temporary folder (the
machine's shared server is never touched: the soak restarts its database), starts two
nodes on it (`--lease-seconds 3`, webhooks to a receiver on 127.0.0.1), and sends:

- short jobs (1-10 ms), a few slow ones (0.3-1.5 s), jobs that fail once and then
  succeed (retried), jobs that always fail (dead-lettered after their retries), chained
  jobs (`on_success` makes another), a rate-limited type (20/s across both nodes), and a
  one-second schedule; a tenth of the jobs carry a webhook.

Every 30-90 s (random, from `--seed`) it injects one of: kill -9 of a node's process
group, kill -9 of its supervisor alone, SIGSTOP of the group past its lease, SIGSTOP of
the supervisor alone past its lease, or a database restart (down 1-2 leases). A killed
node is replaced at once, so two stay up. Each minute it samples every live
supervisor's RSS and open file descriptors.

At the end it waits until every job is terminal and prints the report: jobs lost, jobs
recorded done twice, executions beyond one (each with its reason), overlapping
executions of one job, schedule ticks fired twice, webhooks never delivered, and the
supervisors' RSS and descriptors over time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import Node
from tests.e2e.conftest import NodeSet
from tests.e2e.support import (
    FaultKind,
    Receiver,
    Run,
    Timeline,
    excused,
    read_runs,
    wait_until,
)
from tests.pgcluster import PgCluster, _bindir

LEASE = 3.0
FAULTS = (
    FaultKind.KILL_GROUP,
    FaultKind.KILL_SUPERVISOR,
    FaultKind.STOP,
    FaultKind.STOP_SUPERVISOR,
    FaultKind.DATABASE,
)
TERMINAL = ("done", "failed", "cancelled")
BATCH = 100


@dataclass
class Sample:
    """One supervisor's RSS and open descriptors at one moment."""

    pid: int
    minute: int
    rss_kb: int
    fds: int


@dataclass
class Soak:
    """The nodes, the database, the load and the faults of one soak."""

    nodes: NodeSet
    database: PgCluster
    directory: Path
    receiver: Receiver
    rng: random.Random
    rate: float  # jobs per second offered
    timeline: Timeline = field(default_factory=Timeline)
    live: list[Node] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    sent: int = 0
    refused: int = 0
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    # -- the nodes ---------------------------------------------------------------------

    def config(self) -> Path:
        path = self.directory / "soak.toml"
        path.write_text(
            "[[schedules]]\n"
            'name = "soak-tick"\ntype = "soak.tick"\nevery_seconds = 1\n'
            f"payload = {{ dir = {json.dumps(str(self.directory))} }}\n"
        )
        return path

    def start_node(self) -> Node:
        node = self.nodes.start(
            "--actors",
            "soakactors",
            "--lease-seconds",
            f"{LEASE:g}",
            "--webhook-allow-hosts",
            "127.0.0.1",
            "--config",
            str(self.directory / "soak.toml"),
            workers=3,
        )
        with self.lock:
            self.live.append(node)
        return node

    def reachable(self) -> list[Node]:
        with self.lock:
            return [n for n in self.live if n.proc.pid not in self.paused]

    # -- the load ------------------------------------------------------------------------

    def job(self) -> dict[str, Any]:
        """One job of the mix."""
        rng, base = self.rng, {"dir": str(self.directory)}
        roll = rng.random()
        if roll < 0.01:
            spec: dict[str, Any] = {
                "type": "soak.work",
                "payload": {**base, "seconds": rng.uniform(0.3, 1.5)},
            }
        elif roll < 0.06:
            spec = {"type": "soak.work", "payload": {**base, "fail_attempts": 1}}
        elif roll < 0.08:
            spec = {"type": "soak.work", "payload": {**base, "fail_attempts": 9}}
            spec["max_retries"] = 1
        elif roll < 0.13:
            then = {"type": "soak.work", "payload": base}
            spec = {"type": "soak.work", "payload": base, "on_success": then}
        elif roll < 0.15:
            spec = {"type": "soak.paced", "payload": base}
        else:
            spec = {"type": "soak.work", "payload": {**base, "seconds": rng.uniform(0.001, 0.01)}}
        if rng.random() < 0.1:
            spec["webhook_url"] = self.receiver.url
        return spec

    def produce(self) -> None:
        """Offer `rate` jobs a second in batches to a random reachable node, until `stop`."""
        began = time.monotonic()
        while not self.stop.is_set():
            due = (time.monotonic() - began) * self.rate
            if self.sent + self.refused >= due:
                self.stop.wait(BATCH / self.rate / 4)
                continue
            jobs = [self.job() for _ in range(BATCH)]
            nodes = self.reachable()
            if not nodes:
                self.stop.wait(0.2)
                continue
            try:
                resp = self.rng.choice(nodes).post("/jobs/batch", {"jobs": jobs})
            except OSError:
                self.refused += BATCH
                continue
            accepted = (
                sum(r["status"] == 201 for r in resp.body["results"]) if resp.status == 200 else 0
            )
            self.sent += accepted
            self.refused += BATCH - accepted

    # -- the faults and the samples ------------------------------------------------------

    def inject(self, kind: FaultKind) -> None:
        """One fault, then whatever brings the cluster back to two live nodes."""
        if kind is FaultKind.DATABASE:
            at = time.monotonic()
            self.database.stop("immediate" if self.rng.random() < 0.5 else "fast")
            try:
                self.stop.wait(self.rng.uniform(1.0, 2.0) * LEASE)
            finally:
                self.database.start()
            self.timeline.add(kind, None, at, time.monotonic())
            return
        victim = self.rng.choice(self.reachable())
        pgid = victim.proc.pid
        if kind in (FaultKind.STOP, FaultKind.STOP_SUPERVISOR):
            with self.lock:
                self.paused.add(pgid)
            at = time.monotonic()
            if kind is FaultKind.STOP:
                os.killpg(pgid, signal.SIGSTOP)
            else:
                os.kill(pgid, signal.SIGSTOP)
            time.sleep(LEASE * 2)  # past its lease: its work is reaped meanwhile
            until = time.monotonic()
            os.killpg(pgid, signal.SIGCONT)
            with self.lock:
                self.paused.discard(pgid)
            self.timeline.add(kind, pgid, at, until)
            return
        with self.lock:
            self.live.remove(victim)
        at = time.monotonic()
        if kind is FaultKind.KILL_GROUP:
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pgid, signal.SIGKILL)
        victim.proc.wait(timeout=10)
        self.timeline.add(kind, pgid, at, at)
        self.start_node()

    def sample(self, minute: int) -> None:
        for node in self.reachable():
            pid = node.proc.pid
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                rss = next(int(x.split()[1]) for x in status.splitlines() if x[:6] == "VmRSS:")
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                self.samples.append(Sample(pid, minute, rss, fds))

    def run(self, minutes: float) -> None:
        """The load for `minutes`, a fault every 30-90 s, a sample every minute."""
        self.config()
        for _ in range(2):
            self.start_node()
        producer = threading.Thread(target=self.produce, daemon=True)
        producer.start()
        began = time.monotonic()
        end = began + minutes * 60
        next_fault = began + self.rng.uniform(30, 90)
        minute = 0
        self.sample(minute)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= began + (minute + 1) * 60:
                minute += 1
                self.sample(minute)
                print(f"minute {minute}: {self.sent} jobs accepted", file=sys.stderr, flush=True)
            if now >= next_fault:
                kind = self.rng.choice(FAULTS)
                print(f"fault: {kind}", file=sys.stderr, flush=True)
                self.inject(kind)
                next_fault = time.monotonic() + self.rng.uniform(30, 90)
            time.sleep(0.5)
        self.stop.set()
        producer.join(timeout=60)

    # -- the verdict -----------------------------------------------------------------------

    def settle(self, timeout: float) -> None:
        """Wait until every job in the database is terminal."""

        def unfinished() -> int:
            with contextlib.suppress(psycopg.Error), self.connect() as conn:
                (row,) = conn.execute(
                    f"SELECT count(*) FROM {self.nodes.schema}.jobs"
                    " WHERE status NOT IN ('done', 'failed', 'cancelled')"
                ).fetchall()
                return int(row[0])
            return -1

        wait_until(lambda: unfinished() == 0, timeout, "every job terminal", interval=1.0)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database.dsn, autocommit=True, connect_timeout=5)

    def report(self) -> dict[str, Any]:
        """What happened, counted from the jobs' own log lines and the database."""
        schema = self.nodes.schema
        with self.connect() as conn:
            jobs = {
                str(row[0]): {"status": row[1], "attempts": row[2], "type": row[3]}
                for row in conn.execute(f"SELECT id, status, attempts, type FROM {schema}.jobs")
            }
            succeeded = Counter(
                str(row[0])
                for row in conn.execute(
                    f"SELECT job_id FROM {schema}.events WHERE event = 'succeeded'"
                )
            )
            ticks = Counter(
                row[0]
                for row in conn.execute(
                    f"SELECT detail FROM {schema}.events e JOIN {schema}.jobs j ON j.id = e.job_id"
                    " WHERE e.event = 'enqueued' AND j.type = 'soak.tick'"
                )
            )
        runs = read_runs(self.directory)
        fails = _fails(self.directory)
        lost = [i for i, j in jobs.items() if j["status"] not in TERMINAL]
        twice = [i for i, n in succeeded.items() if n > 1]
        extra, overlaps = self.extra_runs(runs, fails), _overlaps(runs, fails)
        undelivered = self.undelivered()
        return {
            "jobs": len(jobs),
            "accepted": self.sent,
            "refused": self.refused,
            "statuses": dict(Counter(j["status"] for j in jobs.values())),
            "lost": len(lost),
            "recorded_done_twice": len(twice),
            "executions": sum(len(r) for r in runs.values()),
            "executions_beyond_one": dict(extra),
            "overlapping_executions": len(overlaps),
            "overlap_examples": overlaps[:5],
            "schedule_ticks": len(ticks),
            "schedule_ticks_fired_twice": sum(n > 1 for n in ticks.values()),
            "webhooks_undelivered": undelivered,
            "faults": [
                {"kind": str(f.kind), "at_s": round(f.at - self.timeline.origin, 1)}
                for f in self.timeline.faults
            ],
            "supervisors": _memory(self.samples),
        }

    def extra_runs(
        self, runs: dict[str, list[Run]], fails: dict[tuple[str, int], float]
    ) -> Counter[str]:
        """Each execution beyond a job's first, by why the one before it did not end it."""
        reasons: Counter[str] = Counter()
        for job_id, job_runs in runs.items():
            for before in job_runs[:-1]:
                if (job_id, before.attempt) in fails:
                    reasons["retry after a failed attempt"] += 1
                elif before.end is None:
                    reasons[self._interrupted_by(before)] += 1
                elif excused(before, self.timeline.faults, slack=1.0):
                    reasons["outcome lost to a fault after the run ended"] += 1
                else:
                    reasons["UNEXCUSED: ran again after a completed run"] += 1
        return reasons

    def _interrupted_by(self, run: Run) -> str:
        """The fault that cut `run` short: the first on its node (or the database) that
        began at most 30 s after the run did and not before it by more than its span."""
        for fault in self.timeline.faults:
            mine = fault.pgid in (run.pgid, None)
            if mine and run.start - 1.0 <= fault.until and fault.at <= run.start + 30.0:
                return f"interrupted: {fault.kind}"
        return "UNEXCUSED: interrupted with no fault on its node"

    def undelivered(self) -> int:
        """Terminal jobs with a webhook that the receiver never answered 2xx for."""
        with self.connect() as conn:
            wanted = {
                str(row[0])
                for row in conn.execute(
                    f"SELECT id FROM {self.nodes.schema}.jobs WHERE webhook_url IS NOT NULL"
                    " AND status IN ('done', 'failed', 'cancelled')"
                )
            }
        return len(wanted - self.receiver.delivered())


def _fails(directory: Path) -> dict[tuple[str, int], float]:
    path = directory / "fails.log"
    found = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        job_id, attempt, at = line.split()
        found[(job_id, int(attempt))] = float(at)
    return found


def _overlaps(runs: dict[str, list[Run]], fails: dict[tuple[str, int], float]) -> list[str]:
    """Executions of one job that ran at the same time: a later run began before an
    earlier one ended (ended, or failed on purpose; an interrupted run has no end and is
    judged by the runs of its own node only)."""
    found = []
    for job_id, job_runs in runs.items():
        spans = []
        for run in job_runs:
            end = run.end if run.end is not None else fails.get((job_id, run.attempt))
            spans.append((run.start, end, run))
        for i, (_, end, run) in enumerate(spans):
            for later_start, _, later in spans[i + 1 :]:
                if end is not None and later_start < end:
                    found.append(
                        f"{job_id}: attempt {run.attempt} on {run.pgid} until {end:.2f}, "
                        f"attempt {later.attempt} on {later.pgid} from {later_start:.2f}"
                    )
    return found


def _memory(samples: list[Sample]) -> list[dict[str, Any]]:
    """Per supervisor: RSS and descriptors at its first and last sample, and the most."""
    by_pid: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_pid[sample.pid].append(sample)
    out = []
    for pid, rows in by_pid.items():
        out.append(
            {
                "pid": pid,
                "minutes": [rows[0].minute, rows[-1].minute],
                "rss_mb": [round(r.rss_kb / 1024, 1) for r in rows],
                "fds": [r.fds for r in rows],
            }
        )
    return out


def print_report(report: dict[str, Any]) -> None:
    """The report as a table, then the supervisors' samples."""
    rows = [
        ("jobs in the database", report["jobs"]),
        ("enqueues accepted / refused", f"{report['accepted']} / {report['refused']}"),
        ("statuses", report["statuses"]),
        ("jobs lost (not terminal)", report["lost"]),
        ("recorded done twice", report["recorded_done_twice"]),
        ("executions", report["executions"]),
        ("overlapping executions", report["overlapping_executions"]),
        ("schedule ticks fired / fired twice",
         f"{report['schedule_ticks']} / {report['schedule_ticks_fired_twice']}"),
        ("webhooks never delivered", report["webhooks_undelivered"]),
        ("faults injected", len(report["faults"])),
    ]  # fmt: skip
    print("| what | count |\n|---|--:|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print("\n| execution beyond a job's first, because | count |\n|---|--:|")
    for reason, count in sorted(report["executions_beyond_one"].items()):
        print(f"| {reason} | {count} |")
    print("\n| supervisor | minutes | RSS MB (each minute) | open fds (each minute) |")
    print("|---|---|---|---|")
    for s in report["supervisors"]:
        print(f"| {s['pid']} | {s['minutes'][0]}-{s['minutes'][1]} | {s['rss_mb']} | {s['fds']} |")
    for example in report["overlap_examples"]:
        print("overlap:", example)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=170.0, help="jobs offered per second")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    bindir = _bindir()
    if bindir is None:
        print("the soak needs the PostgreSQL server binaries", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="goqueue-soak-"))
    work = base / "work"
    work.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    database = PgCluster(bindir, base)
    database.init()
    database.start()
    nodes = NodeSet(work, database.dsn)
    print(f"seed {seed}, {args.minutes:g} min at {args.rate:g} jobs/s, in {base}", file=sys.stderr)
    try:
        with Receiver() as receiver:
            soak = Soak(nodes, database, work, receiver, random.Random(seed), args.rate)
            soak.run(args.minutes)
            with contextlib.suppress(AssertionError):  # the report counts what is left
                soak.settle(timeout=600)
                wait_until(lambda: soak.undelivered() == 0, 120, "webhooks delivered", 1.0)
            report = soak.report()
    finally:
        nodes.kill_all()
        with contextlib.suppress(Exception):
            database.stop("immediate")
    report["seed"] = seed
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
