"""harness.aio: one event loop per thread, kept across calls, and cancellation
that lets a coroutine's ``finally`` run (a timeout, or the process stopping
the call the way Celery's soft time limit does)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from harness import aio


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_calls_in_one_thread_share_one_loop_that_stays_open() -> None:
    first = aio.run(_running_loop())
    second = aio.run(_running_loop())
    assert first is second is aio.loop()
    assert not first.is_running() and not first.is_closed()


def test_each_thread_has_a_loop_of_its_own_closed_when_the_thread_ends() -> None:
    mine = aio.run(_running_loop())
    theirs: list[asyncio.AbstractEventLoop] = []

    def in_a_thread() -> None:
        theirs.append(aio.run(_running_loop()))
        theirs.append(aio.run(_running_loop()))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    gc.collect()
    assert theirs[0] is theirs[1] and theirs[0] is not mine
    assert theirs[0].is_closed()  # its thread ended
    assert not mine.is_closed()


def test_a_result_and_an_error_come_back_as_they_would_from_await() -> None:
    async def answer() -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": 1}

    async def fails() -> None:
        raise ValueError("upstream said no")

    assert aio.run(answer()) == {"n": 1}
    with pytest.raises(ValueError, match="upstream said no"):
        aio.run(fails())
    with pytest.raises(TypeError, match="takes a coroutine"):
        aio.run(answer)  # type: ignore[arg-type]


def test_a_timeout_cancels_the_coroutine_and_its_finally_runs() -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    with pytest.raises(aio.TimedOut, match=r"cancelled after 0\.05 s") as err:
        aio.run(slow(), timeout=0.05)
    assert isinstance(err.value, TimeoutError)
    assert seen == ["cancelled", "finally"]
    assert aio.run(_running_loop()) is aio.loop()  # the loop goes on serving


def test_a_timeout_already_past_does_not_start_the_coroutine() -> None:
    started: list[bool] = []

    async def never() -> None:
        started.append(True)

    with pytest.raises(aio.TimedOut):
        aio.run(never(), timeout=0)
    assert started == []


def test_the_coroutines_own_timeout_error_is_not_taken_for_ours() -> None:
    async def own() -> None:
        raise TimeoutError("the upstream timed out")

    with pytest.raises(TimeoutError, match="the upstream") as err:
        aio.run(own(), timeout=30)
    assert not isinstance(err.value, aio.TimedOut)


@pytest.fixture
def soft_limit() -> Iterator[threading.Event]:
    """SIGUSR1 raises SoftTimeLimitExceeded in the main thread, as in a prefork
    child at Celery's soft time limit; set the event to send it 20 ms later."""
    armed = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)

    def raise_soft_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    def sender() -> None:
        if armed.wait(30) and not stop.wait(0.02):
            os.kill(os.getpid(), signal.SIGUSR1)

    stop = threading.Event()
    signal.signal(signal.SIGUSR1, raise_soft_limit)
    thread = threading.Thread(target=sender)
    thread.start()
    try:
        yield armed
    finally:
        stop.set()
        armed.set()
        thread.join()
        signal.signal(signal.SIGUSR1, previous)


def test_a_soft_time_limit_in_the_loop_cancels_the_coroutine_first(
    soft_limit: threading.Event,
) -> None:
    seen: list[str] = []

    async def waits() -> None:
        soft_limit.set()
        try:
            await asyncio.sleep(60)  # the signal arrives while the loop waits
        finally:
            seen.append("finally")

    with pytest.raises(SoftTimeLimitExceeded):
        aio.run(waits())
    assert seen == ["finally"]
    assert aio.run(_running_loop()) is aio.loop()


def test_a_soft_time_limit_in_the_coroutines_own_code_unwinds_it(
    soft_limit: threading.Event,
) -> None:
    seen: list[str] = []

    async def busy() -> None:
        soft_limit.set()
        try:
            while True:  # never yields: the signal lands in this frame
                pass
        finally:
            seen.append("finally")

    with pytest.raises(SoftTimeLimitExceeded):
        aio.run(busy())
    assert seen == ["finally"]


def test_a_coroutine_that_will_not_end_when_cancelled_leaves_its_loop_behind(
    soft_limit: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio, "CANCEL_GRACE", 0.05)

    async def stubborn() -> None:
        soft_limit.set()
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue  # refuses to stop

    before = aio.run(_running_loop())
    with pytest.raises(SoftTimeLimitExceeded):
        aio.run(stubborn())
    assert aio.run(_running_loop()) is not before  # a new loop; the old one is left as it is
    assert not before.is_closed()


def test_called_where_a_loop_runs_it_runs_on_a_helper_threads_loop() -> None:
    """From async code (which should await), or a pool whose thread runs a loop:
    the caller blocks, as for a plain function, and the call still gets a loop."""

    async def where() -> tuple[str, asyncio.AbstractEventLoop]:
        await asyncio.sleep(0)
        return threading.current_thread().name, asyncio.get_running_loop()

    async def users_code() -> tuple[asyncio.AbstractEventLoop, Any]:
        return asyncio.get_running_loop(), aio.run(where())

    outer, (thread, inner) = asyncio.run(users_code())
    assert inner is not outer and thread.startswith("harness-aio")
    assert not inner.is_closed()  # the helper thread's loop, kept for its next call


def test_a_timeout_cancels_on_a_helper_thread_too() -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            seen.append("finally")

    async def users_code() -> None:
        aio.run(slow(), timeout=0.05)

    with pytest.raises(aio.TimedOut):
        asyncio.run(users_code())
    assert seen == ["finally"]


def test_a_soft_time_limit_while_a_helper_thread_runs_the_call_cancels_it_there(
    soft_limit: threading.Event,
) -> None:
    seen: list[str] = []

    async def slow() -> None:
        soft_limit.set()
        try:
            await asyncio.sleep(60)
        finally:
            seen.append(threading.current_thread().name)

    async def users_code() -> None:
        aio.run(slow())  # this thread blocks: the signal lands while it waits

    with pytest.raises(SoftTimeLimitExceeded):
        asyncio.run(users_code())
    assert len(seen) == 1 and seen[0].startswith("harness-aio")


def test_close_cancels_what_a_loop_holds_and_the_next_call_makes_a_new_one() -> None:
    seen: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            seen.append("background finally")

    async def leaves_a_task() -> asyncio.AbstractEventLoop:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    old = aio.run(leaves_a_task())
    aio.close()
    assert old.is_closed() and seen == ["background finally"]
    assert aio.run(_running_loop()) is not old


def test_close_all_closes_every_loop_not_running() -> None:
    mine = aio.run(_running_loop())
    assert aio.close_all() >= 1
    assert mine.is_closed()
    assert aio.run(_running_loop()) is not mine


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_loop_and_leaves_the_parents_working() -> None:
    parent = aio.run(_running_loop())
    pid = os.fork()
    if pid == 0:  # the child: exit status says what it saw
        try:
            child = aio.run(_running_loop())
            os._exit(0 if child is not parent and not parent.is_closed() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    async def woken_from_another_thread() -> str:
        done = asyncio.get_running_loop().create_future()
        threading.Thread(
            target=parent.call_soon_threadsafe, args=(done.set_result, "woken")
        ).start()
        return await asyncio.wait_for(done, 10)

    # The parent's loop still wakes: the child closed none of its descriptors.
    assert aio.run(woken_from_another_thread()) == "woken"
    assert aio.loop() is parent


@pytest.mark.parametrize("stopping", ["worker_shutdown", "worker_process_shutdown"])
def test_a_stopping_worker_or_pool_child_closes_its_loops(stopping: str) -> None:
    from celery import signals

    from harness.celery import hooks
    from harness.settings import Settings

    hooks.install_celery_hooks(Settings.from_env)
    mine = aio.run(_running_loop())
    getattr(signals, stopping).send(sender=None)
    assert mine.is_closed()


def test_a_coroutine_that_turns_the_cancel_into_its_own_error_still_timed_out() -> None:
    """Stopped at the timeout, a wrapper that raises its own error instead of
    CancelledError (or a finally whose clean-up fails) was still cut off mid-call:
    the caller must be told it timed out, not that the call failed."""

    class Unwound(Exception):
        pass

    async def pays() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise Unwound("payment aborted") from None

    with pytest.raises(aio.TimedOut) as stopped:
        aio.run(pays(), timeout=0.05)
    assert isinstance(stopped.value.__cause__, Unwound)

    async def fails_first() -> None:  # its own error before the timeout is its own
        raise Unwound("declined")

    with pytest.raises(Unwound):
        aio.run(fails_first(), timeout=5)


def test_tasks_a_timed_out_call_left_are_cancelled_not_run_by_a_later_call() -> None:
    charged: list[str] = []

    async def charge() -> None:
        await asyncio.sleep(0.1)
        charged.append("charged")

    async def pays() -> None:
        await asyncio.shield(asyncio.ensure_future(charge()))

    with pytest.raises(aio.TimedOut):
        aio.run(pays(), timeout=0.02)
    aio.run(asyncio.sleep(0.3))  # a later call on the same loop
    assert charged == []


def test_tasks_a_finished_call_left_still_run_in_a_later_call() -> None:
    done: list[str] = []

    async def later() -> None:
        done.append("ran")

    async def starts() -> None:
        asyncio.get_running_loop().create_task(later())

    aio.run(starts())
    aio.run(asyncio.sleep(0.01))
    assert done == ["ran"]
