"""Runs waiting on the world in memory (harness.store.Waits), each rule the
same as its SQL statement's in :mod:`harness.store.schema.waits`."""

from __future__ import annotations

from collections import Counter

from harness.records import Run, RunStatus, StepStatus, Wait
from harness.store import mapping, schema
from harness.store.checkpoint import Completion, StepPatch
from harness.store.memory import rows
from harness.store.memory.rows import SIGNALS, Row
from harness.store.memory.tables import MemoryBase
from harness.store.schema.waits import CHILD_OF, TIMED_OUT
from harness.store.values import MESSAGE, KeptSignal, OldestWait, SignalDraft


class MemoryWaits(MemoryBase):
    """Answers to deferred steps, kept signals, children, due waits."""

    def complete_deferred(self, completion: Completion) -> bool:
        c = completion
        patch = StepPatch(
            c.index, status=c.status, result=c.result, error=c.error, finished_at=c.now
        )
        values = rows.step_values(patch)
        with self._lock:
            t = self._tables
            row = t.runs.get(c.run_id)
            step = None if row is None else t.step_at(row, c.index)
            # schema.answer_deferred: the step deferred, answered once, its run going.
            if row is None or step is None or step["status"] != StepStatus.DEFERRED.value:
                return False
            if row["status"] in schema.TERMINAL:
                return False
            signal = None if c.signal is None else t.signals.get(c.signal)
            # schema.take_signal: a kept signal, taken once.
            if c.signal is not None and (signal is None or signal["taken_step"] is not None):
                return False
            step.update(values)
            if signal is not None:
                signal.update(taken_step=c.index, taken_at=c.now)
            if c.usage is not None:
                row["input_tokens"] += c.usage[0]
                row["output_tokens"] += c.usage[1]
                row["cost_usd"] += c.usage[2]
            waiting = row["status"] == RunStatus.WAITING.value
            if waiting and row["wake_at"] is not None:  # schema.nudge_waiting
                row["wake_at"] = c.now
            event = rows.event_row(c.run_id, row["version"], c.worker, c.now, c.event)
            t.add_events(c.run_id, [event])
            return True

    def keep_signal(self, draft: SignalDraft) -> int | None:
        values = mapping.signal_row(draft)
        with self._lock:
            t = self._tables
            if draft.signal_id is not None and any(
                s["run_id"] == draft.run_id and s["signal_id"] == draft.signal_id
                for s in t.signals.values()
            ):
                return None  # ix_harness_signals_sender_id
            t.last_signal_id += 1
            t.signals[t.last_signal_id] = {"id": t.last_signal_id, **SIGNALS.row(values)}
            run = t.runs.get(draft.run_id)  # schema.nudge_waiting: the sweeper looks
            waiting = run is not None and run["status"] == RunStatus.WAITING.value
            if waiting and run is not None and run["wake_at"] is not None:
                run["wake_at"] = draft.now
            return t.last_signal_id

    def keep_message(
        self, run_id: str, text: str, now: float, message_id: str | None = None
    ) -> int | None:
        draft = SignalDraft(run_id, MESSAGE, {"text": text}, None, message_id, now)
        values = mapping.signal_row(draft)
        with self._lock:
            t = self._tables
            if message_id is not None and any(
                s["run_id"] == run_id and s["signal_id"] == message_id for s in t.signals.values()
            ):
                return None  # ix_harness_signals_sender_id
            t.last_signal_id += 1
            t.signals[t.last_signal_id] = {"id": t.last_signal_id, **SIGNALS.row(values)}
            run = t.runs.get(run_id)
            if run is not None and run["inbox_at"] is None:  # schema.mark_inbox
                run["inbox_at"] = now
            return t.last_signal_id

    def clear_inbox(self, run_id: str) -> None:
        with self._lock:
            t = self._tables
            run = t.runs.get(run_id)
            waiting = any(  # schema.clear_inbox: unless a message still waits
                s["run_id"] == run_id and s["name"] == MESSAGE and s["taken_step"] is None
                for s in t.signals.values()
            )
            if run is not None and not waiting:
                run["inbox_at"] = None

    def stranded_inboxes(self, before: float, limit: int = 500) -> list[str]:
        with self._lock:  # schema.stranded_inboxes
            found = [
                r
                for r in self._tables.runs.values()
                if r["inbox_at"] is not None
                and r["inbox_at"] < before
                and r["status"] == RunStatus.COMPLETED.value
            ]
        found.sort(key=lambda r: r["inbox_at"])
        return [r["run_id"] for r in found[:limit]]

    def kept_signals(self, run_id: str) -> list[KeptSignal]:
        with self._lock:
            kept = [
                _signal(s)
                for s in self._tables.signals.values()
                if s["run_id"] == run_id and s["taken_step"] is None
            ]
        return sorted(kept, key=lambda s: s.id)

    def has_signal(self, run_id: str, signal_id: str) -> bool:
        with self._lock:
            return any(
                s["run_id"] == run_id and s["signal_id"] == signal_id
                for s in self._tables.signals.values()
            )

    def children(self, run_id: str) -> list[Run]:
        with self._lock:
            found = [r for r in self._tables.runs.values() if r["parent_run"] == run_id]
            return [rows.to_run(r) for r in sorted(found, key=lambda r: r["run_id"])]

    def due_waits(self, now: float, limit: int = 500) -> list[Run]:
        with self._lock:
            due = [
                r
                for r in self._tables.runs.values()
                if r["status"] == RunStatus.WAITING.value
                and r["deferred_from"] is not None
                and r["wake_at"] is not None
                and r["wake_at"] < now
            ]
            due.sort(key=lambda r: r["wake_at"])
            return [rows.to_run(r) for r in due[:limit]]

    def wait_counts(self) -> dict[str, int]:
        kinds: Counter[str] = Counter()
        with self._lock:
            t = self._tables
            for run in t.runs.values():
                start = run["deferred_from"]
                if start is None or run["status"] not in ("running", "waiting"):
                    continue
                for index, step in t.steps.get(run["run_id"], {}).items():
                    if index < start or step["status"] != StepStatus.DEFERRED.value:
                        continue
                    wait = _wait(step)
                    if wait is not None:
                        kinds[wait.kind.value] += 1
            kept = sum(  # schema.count_kept_signals: of runs not ended
                1
                for s in t.signals.values()
                if s["taken_step"] is None
                and s["run_id"] in t.runs
                and t.runs[s["run_id"]]["status"] not in schema.TERMINAL
            )
        return {**dict(kinds), "signals_kept": kept}

    def oldest_wait(self) -> OldestWait | None:
        found: list[tuple[float, str, int]] = []
        with self._lock:
            t = self._tables
            for run in t.runs.values():  # schema.oldest_wait
                start = run["deferred_from"]
                if start is None or run["status"] != RunStatus.WAITING.value:
                    continue
                for index, step in t.steps.get(run["run_id"], {}).items():
                    deferred = step["status"] == StepStatus.DEFERRED.value
                    if index >= start and deferred and step["started_at"] is not None:
                        found.append((step["started_at"], run["run_id"], index))
        if not found:
            return None
        since, run_id, index = min(found)
        return OldestWait(run_id, index, since)

    def wait_events(self) -> dict[str, int]:
        timeouts = children = 0
        with self._lock:  # schema.count_wait_events
            for recorder in self._tables.events.values():
                for event in recorder:
                    detail = event["detail"] or ""
                    timeouts += detail.startswith(TIMED_OUT)
                    pending = event["to_status"] == RunStatus.PENDING.value
                    children += pending and CHILD_OF in detail
        return {"timeouts": timeouts, "children_started": children}


def _wait(step: Row) -> Wait | None:
    text = step["wait"]
    return None if text is None else Wait.from_json(mapping.loads(text))


def _signal(row: Row) -> KeptSignal:
    return KeptSignal(
        row["id"],
        row["run_id"],
        row["name"],
        mapping.loads(row["data"]),
        row["error"],
        row["signal_id"],
        row["created_at"],
    )
