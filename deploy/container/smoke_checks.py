"""The checks smoke.sh runs against the compose stack, over HTTP on loopback (standard
library only: it runs on the host's python3, outside any virtualenv).

Each subcommand proves one claim, prints one line saying what it saw, and exits 1 with the
reason when the claim does not hold."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

KEY = os.environ.get("GOQUEUE_API_KEY", "")
# Long enough for a CPU-bound report to still be running when it is cancelled (the
# actor's timeout, 120 s, ends it otherwise).
ENDLESS = {"rounds": 10**10}


T = TypeVar("T")


class Failed(Exception):
    """A claim that does not hold; its message says what was seen instead."""


def call(method: str, url: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
    """One request with the API key; the status and the decoded JSON (or text) answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("X-API-Key", KEY)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def until(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """Probe every 0.2 s until it returns something other than None, or fail after timeout."""
    deadline = time.monotonic() + timeout
    error: OSError | None = None
    while True:
        try:
            seen = probe()
        except OSError as exc:  # not listening yet, connection reset while restarting
            seen, error = None, exc
        if seen is not None:
            return seen
        if time.monotonic() > deadline:
            last = f" (the last request failed: {error!r})" if error is not None else ""
            raise Failed(f"{what}: not within {timeout:.0f} s{last}")
        time.sleep(0.2)


def enqueue(node: str, job_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    status, job = call("POST", f"{node}/jobs", {"type": job_type, "payload": payload})
    if status != 201:
        raise Failed(f"POST {node}/jobs answered {status}: {job}")
    return dict(job)


def job(node: str, job_id: str) -> dict[str, Any]:
    status, found = call("GET", f"{node}/jobs/{job_id}")
    if status != 200:
        raise Failed(f"GET {node}/jobs/{job_id} answered {status}: {found}")
    return dict(found)


def events(node: str, job_id: str) -> list[dict[str, Any]]:
    status, found = call("GET", f"{node}/jobs/{job_id}/events")
    if status != 200:
        raise Failed(f"GET {node}/jobs/{job_id}/events answered {status}: {found}")
    return list(found["events"])


def runner(node: str, job_id: str, timeout: float = 30) -> str:
    """The id of the node running the job, once it runs."""

    def running_on() -> str | None:
        if job(node, job_id)["status"] != "running":
            return None
        starts = [e["node"] for e in events(node, job_id) if e["event"] == "started"]
        return str(starts[-1])

    return until(f"job {job_id} running", running_on, timeout)


def metric(node: str, name: str, labels: str) -> float:
    """One sample of a node's /metrics, 0 when absent."""
    status, text = call("GET", f"{node}/metrics")
    if status != 200:
        raise Failed(f"GET {node}/metrics answered {status}")
    found = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", str(text), re.M)
    return float(found[1]) if found else 0.0


def answers_ready(node: str) -> bool | None:
    return call("GET", f"{node}/ready")[0] == 200 or None


def ready(args: argparse.Namespace) -> str:
    for node in args.nodes:
        until(f"{node}/ready", functools.partial(answers_ready, node), args.timeout)
    return f"ready: {len(args.nodes)} node(s) answer /ready 200"


def exactly_once(args: argparse.Namespace) -> str:
    """Enqueue through every node in turn; each job is done after one attempt, its result
    is its own, and its trail shows one start and one success."""
    nodes: list[str] = args.nodes
    marker = f"smoke-{os.getpid()}-{time.time_ns()}"
    ids = {}
    for i in range(args.count):
        to = f"{marker}-{i}@example.com"
        payload = {"to": to, "fail_rate": 0, "sleep": 0.01}
        ids[enqueue(nodes[i % len(nodes)], "email", payload)["id"]] = to

    def all_finished() -> list[dict[str, Any]] | None:
        jobs = [job(nodes[0], job_id) for job_id in ids]
        return jobs if all(j["status"] in ("done", "failed", "cancelled") for j in jobs) else None

    jobs = until(f"{args.count} jobs finished", all_finished, args.timeout)
    ran_on: Counter[str] = Counter()
    for finished in jobs:
        result, trail = finished["result"] or {}, events(nodes[1], finished["id"])
        kinds = Counter(e["event"] for e in trail)
        if (
            finished["status"] != "done"
            or finished["attempts"] != 1
            or result.get("to") != ids[finished["id"]]
            or result.get("attempt") != 1
            or kinds["started"] != 1
            or kinds["succeeded"] != 1
        ):
            raise Failed(f"job {finished['id']} did not run exactly once: {finished}, {kinds}")
        ran_on.update(e["node"] for e in trail if e["event"] == "started")
    spread = ", ".join(f"{node} ran {n}" for node, n in sorted(ran_on.items()))
    return f"exactly once: {args.count} jobs through {len(nodes)} nodes, each done once ({spread})"


def seen_by(urls: dict[str, str], job_id: str) -> str:
    """What each node says of a job and of its own workers, for a failure's message."""
    seen = []
    for name, url in urls.items():
        try:
            found = call("GET", f"{url}/jobs/{job_id}", timeout=5)[1]
            state = found.get("status") if isinstance(found, dict) else found
            busy = metric(url, "goqueue_workers", 'state="busy"')
            seen.append(f"{name}: job {state}, trail {events(url, job_id)}, busy {busy}")
        except (OSError, Failed) as exc:
            seen.append(f"{name}: {exc!r}")
    return "; ".join(seen)


def cancel(args: argparse.Namespace) -> str:
    """A running job cancelled through the node that does not run it: the node running it
    kills its worker (it counts a worker restart for a cancel) and the job ends
    cancelled. Either node may claim the job: the cancel goes through the other one."""
    urls = dict(args.node)
    names = [name for name, _ in args.node]
    target = enqueue(urls[names[0]], "report", ENDLESS)["id"]
    try:
        ran_on = runner(urls[names[0]], target)
    except Failed as failed:
        raise Failed(f"{failed}; {seen_by(urls, target)}") from None
    if ran_on not in urls:
        raise Failed(f"job {target} runs on {ran_on}, not one of {names}")
    other = next(name for name in names if name != ran_on)
    killed_before = metric(urls[ran_on], "goqueue_worker_restarts_total", 'reason="cancel"')
    status, answer = call("DELETE", f"{urls[other]}/jobs/{target}?force=true")
    if status != 200:
        raise Failed(f"DELETE on {other} answered {status}: {answer}")

    def worker_killed() -> bool | None:
        killed = metric(urls[ran_on], "goqueue_worker_restarts_total", 'reason="cancel"')
        return killed > killed_before or None

    until(f"{ran_on} killing the worker of job {target}", worker_killed, 30)
    ended = job(urls[other], target)
    if ended["status"] != "cancelled" or ended["result"] is not None:
        raise Failed(f"job {target} after the cancel: {ended}")
    return (
        f"cancel: a job running on {ran_on}, cancelled through {other}: "
        f"{ran_on} killed its worker, the job is cancelled"
    )


def targets(args: argparse.Namespace) -> str:
    """Prometheus' targets (what its /targets page shows) are all up, and as many as asked."""

    def all_up() -> list[str] | None:
        status, answer = call("GET", f"{args.prometheus}/api/v1/targets?state=active")
        if status != 200:
            return None
        active = answer["data"]["activeTargets"]
        up = [t["scrapeUrl"] for t in active if t["health"] == "up"]
        return up if len(up) == len(active) == args.expect else None

    up = until(f"{args.expect} Prometheus targets up", all_up, args.timeout)
    # The page itself: upstream's is drawn in the browser from the API above; Debian's
    # build serves the older, server-drawn page under /classic, which counts them itself
    # ("goqueue (2/2 up)").
    for page in ("/targets", "/classic/targets"):
        status, html = call("GET", f"{args.prometheus}{page}")
        if status == 200:
            break
    else:
        raise Failed(f"GET {args.prometheus}/targets answered {status}")
    if page == "/classic/targets":
        shown = re.search(r"goqueue \((\d+)/(\d+) up\)", str(html))
        if not shown or shown[1] != shown[2] or int(shown[1]) != args.expect:
            raise Failed(f"{page} says {shown[0] if shown else 'nothing'} for job goqueue")
        page += f' ("{shown[0]}")'
    return f"prometheus: {len(up)} targets up, page {page} ({', '.join(sorted(up))})"


def drain(args: argparse.Namespace) -> str:
    """SIGTERM through the engine's stop, given the compose file's stop_grace_period: a job
    longer than the engines' default stop timeout (10 s) finishes, and the node exits 0
    within its grace."""
    urls = {name: url for name, url in args.node}
    containers = {name: ctr for name, ctr in args.container}
    anyone = next(iter(urls.values()))
    payload = {"to": "drain@example.com", "fail_rate": 0, "sleep": 12}
    target = enqueue(anyone, "email", payload)["id"]
    node = runner(anyone, target)
    begun = time.monotonic()
    stop = [args.engine, "stop", "-t", str(args.stop_timeout), containers[node]]
    subprocess.run(stop, check=True, capture_output=True)
    took = time.monotonic() - begun
    code = subprocess.run(
        [args.engine, "inspect", "--format", "{{.State.ExitCode}}", containers[node]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    other = next(url for name, url in urls.items() if name != node)
    finished = job(other, target)
    done_once = finished["status"] == "done" and finished["attempts"] == 1
    if code != "0" or took >= args.grace or not done_once:
        raise Failed(f"{node} stopped in {took:.1f} s with exit code {code}; the job: {finished}")
    return (
        f"drain: {node} stopped by SIGTERM in {took:.1f} s (grace {args.grace:.0f} s), "
        f"exit code 0, its running job finished"
    )


def put(args: argparse.Namespace) -> str:
    """Run one job to completion; print its id for `has`."""
    created = enqueue(args.url, "report", {"rounds": 10})
    until("the job done", lambda: job(args.url, created["id"])["status"] == "done" or None, 60)
    print(created["id"])
    return f"sqlite: job {created['id']} done"


def has(args: argparse.Namespace) -> str:
    found = job(args.url, args.id)
    if found["status"] != "done":
        raise Failed(f"job {args.id} after the restart: {found}")
    return f"sqlite: job {args.id} still done after the restart"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__)
    sub = top.add_subparsers(required=True)

    def command(name: str, run: Callable[[argparse.Namespace], str]) -> argparse.ArgumentParser:
        one = sub.add_parser(name)
        one.set_defaults(run=run)
        return one

    one = command("ready", ready)
    one.add_argument("nodes", nargs="+")
    one.add_argument("--timeout", type=float, default=120)
    one = command("exactly-once", exactly_once)
    one.add_argument("nodes", nargs="+")
    one.add_argument("--count", type=int, default=200)
    one.add_argument("--timeout", type=float, default=120)
    one = command("cancel", cancel)
    one.add_argument("--node", nargs=2, action="append", required=True, metavar=("ID", "URL"))
    one = command("targets", targets)
    one.add_argument("prometheus")
    one.add_argument("--expect", type=int, default=2)
    one.add_argument("--timeout", type=float, default=60)
    one = command("drain", drain)
    one.add_argument("--engine", required=True)
    one.add_argument("--grace", type=float, default=30)
    one.add_argument("--stop-timeout", type=int, default=45)
    one.add_argument("--node", nargs=2, action="append", required=True, metavar=("ID", "URL"))
    one.add_argument("--container", nargs=2, action="append", required=True, metavar=("ID", "NAME"))
    one = command("put", put)
    one.add_argument("url")
    one = command("has", has)
    one.add_argument("url")
    one.add_argument("id")
    return top


def main() -> int:
    args = parser().parse_args()
    try:
        print(args.run(args), file=sys.stderr)
    except Failed as failure:
        print(f"FAILED {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
