"""Where a worker's time goes: py-spy's raw samples of one prefork worker, tallied.

The file is what ``py-spy record -f raw --subprocesses --idle --threads
--full-filenames --nolineno`` writes: one line per distinct stack, its frames
from the root (process, then thread) to the leaf, then its sample count.
With ``--idle`` a sample is wall-clock time, whether the thread runs or
waits, so a share of the pool child's main thread is a share of its time.

Three tallies, for the two threads that do the work (the others wait on a
condition throughout):

* the pool child's main thread by phase of the step task: waiting for a
  task, Celery's wrapper around it, loading the run, the checkpoint
  statements, the tool call, the model turn, sending the next message,
  observability (harness.observability), anything else of the step;
* the same thread by layer, from the leaf: waiting on PostgreSQL (psycopg's
  ``wait``), waiting on Redis (redis-py reading a reply), psycopg,
  SQLAlchemy, redis-py, Celery/kombu/billiard, logging, json, harness, other
  packages; a standard-library frame other than logging and json counts as
  its caller's;
* the main process's thread (the consumer: it fetches messages from Redis and
  hands them to the child) by layer, with its waits in the event loop apart.

And the leaf functions where the working samples of both threads fall.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RATE = 200  # samples per second, as bench.many asks py-spy

_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^()]*)\)$")

#: (phase, test on one frame's "name (path)"), checked in this order against
#: the frames of a step task's stack: the first that any frame passes.
PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("observability (harness.observability)", re.compile(r"/harness/observability/")),
    ("sending the next message", re.compile(r"^dispatch \(.*/harness/engine/runner\.py")),
    ("loading the run (store.load)", re.compile(r"^SQLStore\.load \(")),
    ("checkpoint statements (store.checkpoint)", re.compile(r"^SQLStore\.checkpoint \(")),
    ("tool call (record, cache)", re.compile(r"/harness/(tools|engine/executor)\.py")),
    ("model turn", re.compile(r"/harness/(models|engine/steps)\.py|next_turn \(")),
    ("logging", re.compile(r"/logging/")),
]

#: (layer, test on a frame's path), from the leaf: the first frame that one passes.
LAYERS: list[tuple[str, re.Pattern[str]]] = [
    ("logging", re.compile(r"/logging/")),
    ("json", re.compile(r"/json/")),
    ("psycopg", re.compile(r"/psycopg(_c|_pool)?/")),
    ("SQLAlchemy", re.compile(r"/sqlalchemy/")),
    ("redis-py", re.compile(r"/site-packages/redis/")),
    ("Celery, kombu, billiard", re.compile(r"/site-packages/(celery|kombu|billiard|vine|amqp)/")),
    ("harness", re.compile(r"/harness/")),
    ("bench (the agent, the hop)", re.compile(r"/bench/")),
]
_SITE = re.compile(r"/site-packages/([^/]+)/")
_REPO = re.escape(f"{Path(__file__).resolve().parents[1]}/")
_STDLIB = re.compile(r"/lib/python3\.\d+/|^<frozen")

PG_WAIT = "waiting on PostgreSQL (psycopg wait)"
REDIS_WAIT = "waiting on Redis (redis-py reading a reply)"
IDLE_CHILD = "waiting for a task (idle)"
IDLE_LOOP = "waiting in the event loop (epoll)"


@dataclass(frozen=True)
class Frame:
    name: str
    path: str

    @staticmethod
    def parse(text: str) -> Frame:
        m = _FRAME.match(text)
        return Frame(m["name"], m["path"]) if m else Frame(text, "")

    def __str__(self) -> str:
        return f"{self.name} ({self.path})"

    def short(self) -> str:
        path = re.sub(rf"^.*/site-packages/|^{_REPO}|^.*/lib/python3\.\d+/", "", self.path)
        return f"{self.name} ({path})"


def layer(frames: list[Frame]) -> str:
    """The layer a stack's time belongs to, from the leaf up."""
    leaf = frames[-1]
    psycopg_wait = leaf.name == "Connection.wait" and "/psycopg/" in leaf.path
    if psycopg_wait or "/psycopg/waiting" in leaf.path:
        return PG_WAIT
    if "/redis/_parsers/socket.py" in leaf.path:
        return REDIS_WAIT
    for frame in reversed(frames):
        for name, test in LAYERS:
            if test.search(frame.path):
                return name
        site = _SITE.search(frame.path)
        if site:
            return site[1]
        if frame.path and not _STDLIB.search(frame.path):
            return "other"
    return "python (standard library)"


def phase(frames: list[Frame]) -> str:
    """The phase of the step task a pool child's stack is in."""
    texts = [str(f) for f in frames]
    if not any("/celery/app/trace.py" in t for t in texts):
        return IDLE_CHILD if "/billiard/" in frames[-1].path else "pool, between tasks"
    if not any(t.startswith("run_step (") and "/harness/engine/runner.py" in t for t in texts):
        return "Celery's task wrapper (trace, ack)"
    for name, test in PHASES:
        if any(test.search(t) for t in texts):
            return name
    return "the rest of the step (runner, transitions)"


@dataclass
class Profile:
    samples: int = 0
    #: "child MainThread" etc. -> samples
    threads: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)
    child_layers: Counter[str] = field(default_factory=Counter)
    parent_layers: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)

    def add(self, stack: str, count: int) -> None:
        parts = stack.split(";")
        processes = [p for p in parts if p.startswith("process ")]
        thread = next((p for p in parts if p.startswith("thread (")), "thread (?): ?")
        role = "child" if len(processes) > 1 else "main process"
        name = thread.split(": ", 1)[-1]
        self.samples += count
        self.threads[f"{role} {name}"] += count
        if name != "MainThread":
            return
        frames = [Frame.parse(p) for p in parts[parts.index(thread) + 1 :]]
        if not frames:
            return
        if role == "child":
            where = phase(frames)
            self.phases[where] += count
            if where == IDLE_CHILD:
                return
            self.child_layers[layer(frames)] += count
        else:
            if frames[-1].name in ("_epoll.poll", "poll") or "/eventio.py" in frames[-1].path:
                self.parent_layers[IDLE_LOOP] += count
                return
            self.parent_layers[layer(frames)] += count
        self.leaves[frames[-1].short()] += count

    def table(self, top: int = 15) -> str:
        seconds = self.threads.get("child MainThread", 0) / RATE
        lines = [f"profile of one worker, {seconds:.0f} s of its pool child (py-spy, {RATE}/s)"]
        lines += _shares("pool child, main thread, by phase of the step task", self.phases)
        lines += _shares("pool child, main thread, in a task, by layer", self.child_layers)
        lines += _shares("main process (consumer), main thread, by layer", self.parent_layers)
        busy = sum(self.child_layers.values()) + sum(
            n for k, n in self.parent_layers.items() if k != IDLE_LOOP
        )
        lines += [f"\ntop leaf functions (share of both threads' {busy} working samples)"]
        for name, n in self.leaves.most_common(top):
            lines.append(f"  {n / busy:6.1%}  {name}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "phases": dict(self.phases),
            "child_layers": dict(self.child_layers),
            "parent_layers": dict(self.parent_layers),
            "leaves": dict(self.leaves.most_common(30)),
        }


def _shares(title: str, counts: Counter[str]) -> list[str]:
    total = sum(counts.values()) or 1
    lines = [f"\n{title} ({total} samples)"]
    for name, n in counts.most_common():
        lines.append(f"  {n / total:6.1%}  {name}")
    return lines


def read(path: Path) -> Profile:
    """Tally a raw py-spy file line by line (it is never held whole)."""
    profile = Profile()
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                profile.add(stack, int(count))
    return profile


if __name__ == "__main__":
    import sys

    print(read(Path(sys.argv[1])).table())
