"""The dashboard in a real browser: headless Chromium (Debian's package),
driven by Playwright, against a real ``harness serve`` and a real worker.

One stack serves the whole module (server, worker and browser start once);
each test makes its own runs and finds them by id. Runs that must move are
carried by the worker; a huge run, and states a worker reaches only slowly
(a step stuck RUNNING), are written straight into the store. A full-page
screenshot of each page goes to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.records import ParentRef, RunStatus, Step, StepKind, StepStatus, Wait, WaitKind
from tests.web import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    VIEWPORT,
    Stack,
    artifacts_dir,
    chain_steps,
    dashboard_stack,
    require_chromium,
    seed_run,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HOSTILE = "<img src=x onerror=alert(1)>"
HUGE = 20_000
#: Timeline rows the DOM may hold at once: what makes a long run open fast.
MAX_ROWS = 300
#: Playwright waits, milliseconds: generous, for a busy two-core machine.
WAIT = 20_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_chromium()
    home = tmp_path_factory.mktemp("dashboard")
    # A step RUNNING for a minute counts as stuck.
    with dashboard_stack(home, HARNESS_RUNNING_ALERT="60") as s:
        yield s


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            # Scrollbars as a person sees them: whether one is drawn is tested.
            ignore_default_args=["--hide-scrollbars"],
        )
        yield chromium
        chromium.close()


class Tab:
    """A logged-in page, and what it did that a test must see: script errors,
    dialogs (an injected ``alert`` would open one), navigations."""

    def __init__(self, page: Any, stack: Stack) -> None:
        self.page = page
        self.stack = stack
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.navigations: list[str] = []
        page.on("pageerror", lambda err: self.errors.append(str(err)))
        page.on("console", self._console)
        page.on("dialog", self._dialog)
        page.on("framenavigated", self._navigated)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def _navigated(self, frame: Any) -> None:
        if frame == self.page.main_frame:
            self.navigations.append(frame.url)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def goto(self, path: str) -> None:
        self.page.goto(f"{self.stack.base_url}{path}")

    def shot(self, name: str) -> Path:
        path = artifacts_dir() / f"dashboard-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path


@pytest.fixture
def tab(browser: Any, stack: Stack) -> Iterator[Tab]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(WAIT)
    t = Tab(page, stack)
    t.goto(f"/login?token={TOKEN}")  # sets the cookie, then 303 to the runs page
    assert page.url == f"{stack.base_url}/", page.url
    yield t
    context.close()
    assert t.errors == [], t.errors
    assert t.dialogs == [], t.dialogs


def row_of(tab: Tab, run_id: str) -> Any:
    return tab.page.locator(f'#runs-body tr[data-run-id="{run_id}"]')


def count_chip(tab: Tab, status: str) -> Any:
    return tab.page.locator(f'#counts button[data-status="{status}"] .n')


#: The run ids of the listed rows, read in the page.
ids_js = "rows => rows.map(r => r.dataset.runId)"


def shows(locator: Any, text: str) -> Callable[[], bool]:
    """A check that ``locator``'s text holds ``text`` (for :func:`wait_for`)."""
    return lambda: text in locator.inner_text()


def seed_stuck(stack: Stack, run_id: str) -> None:
    """A run whose tool step has been RUNNING for an hour (its worker gone)."""
    steps = chain_steps(run_id, 1)
    started = time.time() - 3600
    steps.append(
        Step(run_id, 1, StepKind.TOOL, StepStatus.RUNNING, attempts=1, tool="effect",
             args={"n": 0}, started_at=started)
    )  # fmt: skip
    seed_run(stack.store, run_id, steps, status=RunStatus.RUNNING, agent="chain", cursor=1)


def test_runs_page_counts_attention_and_filters(tab: Tab, stack: Stack) -> None:
    done = [stack.start("chain", f"count me {i}") for i in range(2)]
    seed_stuck(stack, "stuck-run")
    for run_id in done:
        stack.wait_status(run_id, "completed")
    page = tab.page

    # Live: the page was open before the runs finished, and catches up by itself.
    def counts_shown() -> bool:
        counts = stack.store.run_counts()
        return all(
            count_chip(tab, status).inner_text() == f"{counts.get(status, 0):,}"
            for status in ("completed", "running", "waiting")
        )

    wait_for("the counts to match the store", counts_shown)
    for run_id in done:
        badge = row_of(tab, run_id).locator(".badge")
        wait_for(f"{run_id} listed as completed", shows(badge, "completed"))
    stuck = row_of(tab, "stuck-run")
    assert stuck.locator(".attn").inner_text() == "stuck"
    assert "attention" in (stuck.get_attribute("class") or "")
    assert "RUNNING longer than 60" in page.locator("#stuck-count").inner_text()
    tab.shot("runs")

    # A count is a filter: only running runs are listed, and the address says so.
    page.locator('#counts button[data-status="running"]').click()
    page.wait_for_function("() => location.search.includes('status=running')")
    wait_for("only running runs listed", lambda: row_of(tab, done[0]).count() == 0)
    assert row_of(tab, "stuck-run").count() == 1
    statuses = page.locator("#runs-body .badge").all_inner_texts()
    assert statuses and set(statuses) == {"running"}, statuses

    # The form filters too: by agent, with the status cleared.
    page.select_option("#f-status", "")
    page.fill("#f-agent", "no-such-agent")
    page.click("#filters button[type=submit]")
    page.locator("#runs-body .empty").wait_for()
    page.fill("#f-agent", "chain")
    page.click("#filters button[type=submit]")
    wait_for("the chain runs listed", lambda: row_of(tab, done[0]).count() == 1)
    agents = page.locator("#runs-body tr td:nth-child(2)").all_inner_texts()
    assert set(agents) == {"chain"}, agents

    # Pages follow the API's cursor: two runs a page here, newest first.
    tab.goto("/?agent=chain&limit=2")
    wait_for("the first page", lambda: page.locator("#runs-body tr[data-run-id]").count() == 2)
    first = page.locator("#runs-body tr[data-run-id]").evaluate_all(ids_js)
    page.click("#next")
    wait_for("the next page", lambda: page.locator("#runs-body tr").evaluate_all(ids_js) != first)
    second = page.locator("#runs-body tr[data-run-id]").evaluate_all(ids_js)
    assert second and not set(first) & set(second), (first, second)
    page.click("#prev")
    wait_for(
        "the first page again", lambda: page.locator("#runs-body tr").evaluate_all(ids_js) == first
    )

    # A run's id links to its page.
    row_of(tab, first[0]).locator("a").click()
    page.wait_for_url(f"**/runs/{first[0]}")
    page.locator("#run-status .badge").wait_for()


def test_run_page_of_a_finished_run(tab: Tab, stack: Stack) -> None:
    run_id = stack.start("chain", "three effects, then an answer")
    run = stack.wait_status(run_id, "completed")
    tab.goto(f"/runs/{run_id}")
    page = tab.page
    page.locator("#steps .vrow:not(.loading)").first.wait_for()
    wait_for(
        "every step drawn",
        lambda: page.locator("#steps .vrow:not(.loading)").count() == run["step_count"],
    )
    assert page.locator("#run-status").inner_text() == "completed"
    assert page.locator("#run-goal").inner_text() == "three effects, then an answer"
    assert "3 effects done" in page.locator("#run-result").inner_text()
    rows = page.locator("#steps .vrow")
    kinds = [rows.nth(i).locator("span").nth(1).inner_text() for i in range(7)]
    assert kinds == ["model", "tool"] * 3 + ["model"]
    assert set(page.locator("#steps .vrow .badge").all_inner_texts()) == {"done"}
    assert rows.nth(1).locator("span").nth(2).inner_text() == "effect"
    # The operator sees nothing to do on an ended run (drawn after the rows and
    # the conversation, in the same refresh).
    wait_for("the actions", lambda: "the run has ended" in page.locator("#actions").inner_text())
    # A step's whole record on a click.
    rows.nth(1).click()
    detail = page.locator("#step-detail").inner_text()
    assert '"n": 0' in detail and f"{run_id}:1" in detail
    # The history, version by version, ends with the completion.
    wait_for("the history", lambda: "completed" in page.locator("#events").inner_text())
    versions = [int(v) for v in page.locator("#events .vrow span:nth-child(3)").all_inner_texts()]
    assert versions == sorted(versions) and versions[-1] == run["version"], versions
    tab.shot("run")

    # A session that ends (the cookie gone) is met with a way back in.
    page.context.clear_cookies()
    page.locator("#logged-out a[href='/login']").wait_for()
    assert "log in again" in page.inner_text("#logged-out")
    expected = [e for e in tab.errors if "401 (Unauthorized)" in e]
    assert expected and len(expected) <= 2, tab.errors  # the polling stopped at the first
    tab.errors = [e for e in tab.errors if e not in expected]


def test_an_approval_clicked_through_finishes_the_run_live(tab: Tab, stack: Stack) -> None:
    run_id = stack.start("approver", "charge three cards")
    stack.wait_status(run_id, "waiting")
    tab.goto(f"/runs/{run_id}")
    page = tab.page
    page.locator("#approve").wait_for()
    assert page.locator("#run-attention").inner_text() == "awaiting approval"
    # The whole of the arguments, not one clipped line of them.
    args = page.locator("#approve-args")
    assert args.input_value() == json.dumps({"amount": 10}, indent=2)
    assert args.evaluate("el => el.scrollHeight <= el.clientHeight"), "the arguments are clipped"
    # Who approves is asked once, kept in the browser, and recorded.
    page.fill("#operator-name", "Ada")
    page.reload()
    page.locator("#approve").wait_for()
    assert page.input_value("#operator-name") == "Ada"
    tab.shot("run-awaiting-approval")
    loaded = len(tab.navigations)
    title = page.locator("#approval .title")
    for index in (1, 2, 3):
        title.wait_for()
        wait_for(f"step {index} awaiting", shows(title, f"Step {index}:"))
        if index == 3:  # edit the arguments of the last call before approving it
            page.fill("#approve-args", '{"amount": 35}')
        page.click("#approve")
        page.locator("#outcome.ok").wait_for()
    # The run finishes on the worker; the page follows without a reload.
    page.locator("#run-status .st-completed").wait_for()
    assert len(tab.navigations) == loaded, tab.navigations
    last_call = page.locator('#steps .vrow[data-index="3"]')
    wait_for("the timeline to follow", shows(last_call, "approved by"))
    assert last_call.locator(".badge").inner_text() == "done"
    steps = stack.client.get(f"/api/runs/{run_id}").json()["steps"]
    assert [s["result"]["charged"] for s in steps[1:4]] == [10, 20, 35]
    assert [s["approval"]["decision"] for s in steps[1:4]] == ["approved"] * 3
    assert [s["approval"]["by"] for s in steps[1:4]] == ["Ada"] * 3
    wait_for("the completion in the history", lambda: "completed" in page.inner_text("#events"))
    # More events than the box shows: its scrollbar is drawn, and its note
    # says which rows are on screen, so the earlier ones (it follows the
    # newest) read as scrolled away, not as missing.
    events = page.locator("#events")
    overflows, gutter = events.evaluate(
        "el => [el.scrollHeight > el.clientHeight, el.offsetWidth - el.clientWidth]"
    )
    assert overflows and gutter > 0, (overflows, gutter)
    note = page.locator("#history-note")
    wait_for("the note of the rows shown", shows(note, "shown: scroll for the others"))
    total = int(note.inner_text().split(" ")[0])
    assert re.search(rf"\d+ to {total} shown", note.inner_text()), note.inner_text()
    events.evaluate("el => { el.scrollTop = 0; }")
    wait_for("the note to follow the scroll", shows(note, ", 1 to "))
    tab.shot("run-approved")

    # A cancel takes two clicks, and then the run has ended.
    seed_stuck(stack, "to-cancel")
    tab.goto("/runs/to-cancel")
    page.locator("#cancel").wait_for()
    page.fill("#cancel-reason", "its worker is gone")
    page.click("#cancel")
    assert page.locator("#cancel").inner_text() == "Confirm cancel"
    assert stack.run("to-cancel")["status"] == "running"
    page.click("#cancel")
    page.locator("#run-status .st-cancelled").wait_for()
    assert "its worker is gone" in (stack.run("to-cancel")["error"] or "")


def test_reject_pause_resume_and_resolve_clicked_through(tab: Tab, stack: Stack) -> None:
    page = tab.page
    # Reject the first call with a reason: the next call of the batch awaits its word.
    run_id = stack.start("approver", "charge, but not the first")
    stack.wait_status(run_id, "waiting")
    tab.goto(f"/runs/{run_id}")
    page.locator("#reject").wait_for()
    page.fill("#operator-name", "Grace")
    page.fill("#reject-reason", "wrong card")
    page.click("#reject")
    page.locator("#outcome.ok").wait_for()
    wait_for("the next call to await", shows(page.locator("#approval .title"), "Step 2:"))
    word = stack.client.get(f"/api/runs/{run_id}").json()["steps"][1]["approval"]
    assert (word["decision"], word["reason"], word["by"]) == ("rejected", "wrong card", "Grace")
    # Pause it while it waits, then withdraw the pause before it takes effect.
    page.click("#pause")
    wait_for("the pause requested", lambda: stack.run(run_id)["pause_requested"])
    history = stack.client.get(f"/api/runs/{run_id}/history").json()["events"]
    assert "by Grace" in [e["detail"] for e in history]
    page.locator("#resume").wait_for()
    page.click("#resume")
    wait_for("the pause withdrawn", lambda: not stack.run(run_id)["pause_requested"])

    # A paused run resumed with a raised budget.
    seed_run(stack.store, "paused-run", chain_steps("paused-run", 3), status=RunStatus.PAUSED,
             agent="chain", max_tokens=1000)  # fmt: skip
    tab.goto("/runs/paused-run")
    page.locator("#resume").wait_for()
    page.fill("#resume-tokens", "5000")
    page.click("#resume")
    wait_for("the run resumed", lambda: stack.run("paused-run")["status"] != "paused")
    assert stack.run("paused-run")["max_tokens"] == 5000

    # An at_most_once call in doubt, settled as succeeded: the run finishes on the worker.
    steps = [
        Step("in-doubt", 0, StepKind.MODEL, StepStatus.DONE, attempts=1, args={"turn": 0},
             result={"tool_calls": [{"name": "send_email", "args": {"to": "a@example.com"}}]}),
        Step("in-doubt", 1, StepKind.TOOL, StepStatus.IN_DOUBT, attempts=1, tool="send_email",
             args={"to": "a@example.com"}, error="the call may have happened"),
        Step("in-doubt", 2, StepKind.MODEL, StepStatus.PENDING, args={"turn": 1}),
    ]  # fmt: skip
    seed_run(stack.store, "in-doubt", steps, status=RunStatus.WAITING, agent="mailer", cursor=1)
    tab.goto("/runs/in-doubt")
    page.locator("#resolve-succeeded").wait_for()
    assert page.locator("#run-attention").inner_text() == "in doubt"
    page.fill("#resolve-result", '"sent to a@example.com"')
    page.click("#resolve-succeeded")
    page.locator("#run-status .st-completed").wait_for()
    resolved = stack.client.get("/api/runs/in-doubt").json()
    assert resolved["steps"][1]["result"] == "sent to a@example.com"
    assert resolved["result"] == "mailed"
    tab.shot("run-resolved")


def test_hostile_text_is_shown_as_text(tab: Tab, stack: Stack) -> None:
    run_id = stack.start("chain", HOSTILE)
    stack.wait_status(run_id, "completed")
    # Tool arguments, results and errors are user-supplied too.
    steps = chain_steps("hostile-seeded", 3)
    steps[1] = Step(
        "hostile-seeded", 1, StepKind.TOOL, StepStatus.FAILED, attempts=1, tool="<b>tool</b>",
        args={"html": "<img src=y onerror=alert(2)>"}, result="<script>alert(3)</script>",
        error="<img src=z onerror=alert(4)>",
    )  # fmt: skip
    seed_run(stack.store, "hostile-seeded", steps, goal=HOSTILE, status=RunStatus.FAILED)
    page = tab.page
    row = row_of(tab, run_id)
    row.wait_for()
    assert row.locator("td").nth(2).inner_text() == HOSTILE
    assert row.locator("img").count() == 0
    assert page.locator("#runs-body img, #runs-body script").count() == 0
    tab.shot("hostile-runs")

    tab.goto("/runs/hostile-seeded")
    page.locator('#steps .vrow[data-index="1"]:not(.loading)').wait_for()
    assert page.locator("#run-goal").inner_text() == HOSTILE
    failed = page.locator('#steps .vrow[data-index="1"]')
    assert failed.locator(".err").inner_text() == "<img src=z onerror=alert(4)>"
    assert failed.locator("span").nth(2).inner_text() == "<b>tool</b>"
    failed.click()
    detail = page.locator("#step-detail").inner_text()
    assert "<img src=y onerror=alert(2)>" in detail and "<script>alert(3)</script>" in detail
    assert page.locator("main img, main script, main b:has-text('tool')").count() == 0
    # No element was made of the text, so no handler in it can ever run: no dialog.
    assert tab.dialogs == []
    tab.shot("hostile-run")


def test_a_run_of_20000_steps_opens_with_only_the_rows_on_screen(tab: Tab, stack: Stack) -> None:
    started = time.perf_counter()
    seed_run(stack.store, "huge-run", chain_steps("huge-run", HUGE), goal="a very long run")
    print(f"seeded {HUGE} steps in {time.perf_counter() - started:.2f}s")
    page = tab.page
    started = time.perf_counter()
    tab.goto("/runs/huge-run")
    page.locator('#steps .vrow[data-index="0"]:not(.loading)').wait_for()
    opened = time.perf_counter() - started
    print(f"a {HUGE}-step run's page: first timeline rows visible after {opened * 1000:.0f} ms")
    assert page.locator("#steps .vrow").count() <= MAX_ROWS
    assert f"{HUGE:,} steps" in (page.text_content("#steps-note") or "")
    tab.shot("run-20000-steps")

    # The end is a scroll away: the last window is fetched and drawn, nothing more.
    page.eval_on_selector("#steps", "el => { el.scrollTop = el.scrollHeight; }")
    last = page.locator(f'#steps .vrow[data-index="{HUGE - 1}"]:not(.loading)')
    last.wait_for()
    assert last.locator("span").first.inner_text() == str(HUGE - 1)
    assert page.locator("#steps .vrow").count() <= MAX_ROWS
    assert page.locator('#steps .vrow[data-index="0"]').count() == 0


#: A local time as the dashboard writes it: with its zone.
ZONED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC(?:[+-]\d\d:\d\d)?")


def field_of(tab: Tab, label: str) -> Any:
    """The value of a run header field, by its label."""
    return (
        tab.page.locator("#run-fields div")
        .filter(has=tab.page.locator("dt", has_text=re.compile(f"^{label}$")))
        .locator("dd")
    )


def fits(tab: Tab) -> bool:
    """Nothing spills out of the page sideways (wide tables scroll in their cards)."""
    return bool(tab.page.evaluate("document.documentElement.scrollWidth <= innerWidth"))


def test_a_run_paused_on_its_budget_reads_plainly_at_any_width(tab: Tab, stack: Stack) -> None:
    steps = chain_steps("budget-paused", 5)
    steps.append(Step("budget-paused", 5, StepKind.MODEL, StepStatus.PENDING, args={"turn": 3}))
    reason = "token budget spent: 1,200 of max_tokens=1,000"
    seed_run(stack.store, "budget-paused", steps, status=RunStatus.PAUSED, agent="chain",
             cursor=5, error=reason, cost_usd=0.0000421, max_tokens=1000)  # fmt: skip
    page = tab.page
    row = row_of(tab, "budget-paused")
    row.wait_for()
    # Paused is said once; the cost has its digits (the API gives six places).
    assert row.locator(".badge, .attn").all_inner_texts() == ["paused"]
    cost = row.locator("td").nth(7)
    assert (cost.inner_text(), cost.get_attribute("title")) == ("$0.000042", "$0.000042")
    written = page.evaluate("[0.012345, 4.2e-7, 12.5].map(Harness.cost)")
    assert written == ["$0.0123", "$0.00000042", "$12.5000"]
    assert page.evaluate("Harness.exactCost(0.012345)") == "$0.012345"
    assert ZONED.fullmatch(row.locator("td").nth(6).inner_text())

    tab.goto("/runs/budget-paused")
    page.locator('#steps .vrow[data-index="5"]:not(.loading)').wait_for()
    assert page.locator("#header .badge, #header .attn").all_inner_texts() == ["paused"]
    # Why it is paused, as a note, not as a red error.
    assert page.inner_text("#run-paused") == f"Paused: {reason}"
    assert page.inner_text("#run-error") == ""
    assert field_of(tab, "Budgets").inner_text() == "raised to 1,000 tokens"
    assert field_of(tab, "Cost").get_attribute("title") == "$0.000042"
    assert ZONED.fullmatch(field_of(tab, "Created").inner_text())
    # A model step not yet asked shows nothing of its bookkeeping ({"turn": 3}).
    pending = page.locator('#steps .vrow[data-index="5"]')
    assert pending.locator("span").last.inner_text() == ""
    tab.shot("run-budget-paused")

    # A phone's width: each wide table scrolls inside its card, the page does not.
    page.set_viewport_size({"width": 420, "height": 800})
    wait_for("the run page to fit 420 px", lambda: fits(tab))
    timeline = page.locator("#timeline .hscroll")
    assert timeline.evaluate("el => el.scrollWidth > el.clientWidth")
    tab.shot("run-420px")
    tab.goto("/")
    row.wait_for()
    assert fits(tab)
    assert page.locator("#runs-scroll").evaluate("el => el.scrollWidth > el.clientWidth")
    tab.shot("runs-420px")


def test_times_carry_their_zone(browser: Any, stack: Stack) -> None:
    seed_run(stack.store, "zoned", chain_steps("zoned", 1), created_at=1_700_000_000.0)
    context = browser.new_context(viewport=VIEWPORT, timezone_id="Asia/Kolkata")
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT)
        page.goto(f"{stack.base_url}/login?token={TOKEN}")
        page.goto(f"{stack.base_url}/runs/zoned")
        created = page.locator("#run-fields div", has_text="Created").locator("dd")
        created.wait_for()
        assert created.inner_text() == "2023-11-15 03:43:20 UTC+05:30"
    finally:
        context.close()


def test_a_missing_run_is_said_once_and_not_asked_again(tab: Tab) -> None:
    page = tab.page
    # Count the page's requests for the run in the page itself, and run its
    # timers on a clock of the test's: ten seconds of polling pass at once.
    page.add_init_script(
        """(() => {
          const fetch = window.fetch;
          window.askedForRun = 0;
          window.fetch = (url, init) => {
            if (String(url).startsWith("/api/runs/no-such-run")) window.askedForRun += 1;
            return fetch(url, init);
          };
        })()"""
    )
    page.clock.install()
    tab.goto("/runs/no-such-run")
    page.locator("#run-error", has_text="No such run").wait_for()
    assert page.evaluate("window.askedForRun") == 1
    page.clock.run_for(10_000)
    assert page.evaluate("window.askedForRun") == 1
    assert page.inner_text("#live") == "no such run"
    tab.errors = [e for e in tab.errors if "404 (Not Found)" not in e]


def seed_family(stack: Stack, parent: str) -> str:
    """A parent waiting on two deferred calls of one turn, a child run
    (``{parent}:1``) and a signal; the child waits on an approval."""
    child = f"{parent}:1"
    now = time.time()
    calls = [
        {"name": "researcher", "args": {"task": "look"}},
        {"name": "await_payment", "args": {}},
    ]
    steps = [
        Step(parent, 0, StepKind.MODEL, StepStatus.DONE, attempts=1, args={"turn": 0},
             result={"tool_calls": calls}, started_at=now - 60, finished_at=now - 59),
        Step(parent, 1, StepKind.TOOL, StepStatus.DEFERRED, attempts=1, tool="researcher",
             args={"task": "look"}, started_at=now - 59, wait=Wait(WaitKind.CHILD, child=child)),
        Step(parent, 2, StepKind.TOOL, StepStatus.DEFERRED, attempts=1, tool="await_payment",
             args={}, started_at=now - 59,
             wait=Wait(WaitKind.SIGNAL, until=now + 3600, timeout=3600, signal="paid")),
        Step(parent, 3, StepKind.MODEL, StepStatus.PENDING, args={"turn": 1}),
    ]  # fmt: skip
    seed_run(stack.store, parent, steps, status=RunStatus.WAITING, agent="planner", cursor=3,
             deferred_from=1)  # fmt: skip
    child_steps = [
        Step(child, 0, StepKind.MODEL, StepStatus.DONE, attempts=1, args={"turn": 0},
             result={"tool_calls": [{"name": "charge", "args": {"amount": 10}}]}),
        Step(child, 1, StepKind.TOOL, StepStatus.AWAITING_APPROVAL, tool="charge",
             args={"amount": 10}),
    ]  # fmt: skip
    seed_run(stack.store, child, child_steps, status=RunStatus.WAITING, agent="approver",
             cursor=1, parent=ParentRef(parent, 1))  # fmt: skip
    return child


def test_run_page_shows_what_each_deferred_call_waits_for_and_links_parent_and_child(
    tab: Tab, stack: Stack
) -> None:
    child = seed_family(stack, "planner-run")
    page = tab.page
    tab.goto("/runs/planner-run")
    family = page.locator("#run-children")
    family.wait_for()
    assert page.locator("#run-attention").inner_text() == "child waiting"
    assert family.locator("a.child").inner_text() == child
    call = page.locator('#steps .vrow[data-index="1"]:not(.loading)')
    call.wait_for()
    assert f"waits for child run {child}" in call.inner_text()
    signal = page.locator('#steps .vrow[data-index="2"]')
    assert "waits for signal 'paid' until 20" in signal.inner_text()
    call.click()
    page.locator("#step-waits").wait_for()
    assert page.locator("#step-detail a.child").inner_text() == child
    tab.shot("run-family")

    # The child links back to its parent, and says what it waits on.
    family.locator("a.child").click()
    page.locator("#run-parent a.parent").wait_for()
    assert page.url.endswith(f"/runs/{child.replace(':', '%3A')}") or page.url.endswith(child)
    assert page.locator("#run-parent").inner_text() == "Child of planner-run (its step 1)"
    assert page.locator("#run-attention").inner_text() == "awaiting approval"
    page.locator("#run-parent a.parent").click()
    page.locator("#run-children").wait_for()
    assert page.url.endswith("/runs/planner-run")
