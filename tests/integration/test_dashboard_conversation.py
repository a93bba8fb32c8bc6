"""The run page's conversation in a real browser (headless Chromium, as
tests/integration/test_dashboard.py drives it), against a real ``harness
serve`` and a real worker: a run read as user and assistant turns with its
tool calls folded between them, the send box continuing a completed run and
saying in the API's words why a message was refused, and the answer shown as
it is written (the run's event stream), an attempt's discarded text gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.records import ReplayOrigin, RunStatus, Step, StepKind, StepStatus
from harness.streams import StoreSink, Tap
from tests.conversation_agents import IMPORTS
from tests.integration.test_dashboard import Tab
from tests.web import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    VIEWPORT,
    Stack,
    chain_steps,
    dashboard_stack,
    require_chromium,
    seed_run,
    wait_for,
)
from tests.writer_agents import FIRST, REST, gate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: A request body the API refuses with 413 above this (HARNESS_API_MAX_BODY).
MAX_BODY = 8192
WAIT = 20_000
#: How a fold's summary counts a tool's calls: "effect", this sign, then the count.
TIMES = "\N{MULTIPLICATION SIGN}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_chromium()
    home = tmp_path_factory.mktemp("conversation")
    imports = f"{IMPORTS},tests.writer_agents"
    with dashboard_stack(home, HARNESS_IMPORTS=imports, HARNESS_API_MAX_BODY=str(MAX_BODY)) as s:
        yield s


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def tab(browser: Any, stack: Stack) -> Iterator[Tab]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(WAIT)
    t = Tab(page, stack)
    t.goto(f"/login?token={TOKEN}")
    yield t
    context.close()
    assert t.errors == [], t.errors
    assert t.dialogs == [], t.dialogs


def turns(tab: Tab) -> list[tuple[str, str]]:
    """The conversation as (role, text) pairs, in order; a fold is ("work", its summary)."""
    return [
        (role, text.strip())
        for role, text in tab.page.locator(
            "#conversation > .turn, #conversation > details"
        ).evaluate_all(
            """nodes => nodes.map(n => n.tagName === "DETAILS"
                ? ["work", n.querySelector("summary").textContent]
                : [n.classList.contains("user") ? "user" : "assistant",
                   n.querySelector(".text").textContent])"""
        )
    ]


def send(stack: Stack, run_id: str, text: str) -> None:
    response = stack.client.post(f"/api/runs/{run_id}/messages", json={"text": text})
    assert response.status_code == 200, response.text


def test_a_run_continued_with_a_message_reads_as_a_conversation(tab: Tab, stack: Stack) -> None:
    # The desk looks the order up, refunds it and mails the customer, saying
    # what it does beside its calls, then answers.
    run_id = stack.start("desk", "order 7")
    stack.wait_status(run_id, "completed")
    tab.goto(f"/runs/{run_id}")
    page = tab.page
    work = ("work", "3 tool calls: find, effect, send_email")
    first = [("user", "order 7"), work, ("assistant", "order 7 refunded")]
    wait_for("the first answer", lambda: turns(tab) == first)
    # The fold opens on what the model said and did, each call with its result.
    fold = page.locator("#conversation details.work")
    assert not fold.evaluate("el => el.open")
    fold.locator("summary").click()
    calls = fold.locator(".call")
    wait_for("the calls in the fold", lambda: calls.count() == 3)
    assert calls.locator(".tool").all_inner_texts() == ["find", "effect", "send_email"]
    assert '"status":"delivered"' in calls.nth(0).inner_text()
    assert "sent to customer7@example.com" in calls.nth(2).inner_text()
    assert fold.locator(".said .words").all_inner_texts() == [
        "Let me look up order 7.",
        "Order 7 was delivered. Refunding 7.",
    ]

    # Another sender (the CLI, a script) continues it: the page follows,
    # and the fold the operator opened stays open.
    send(stack, run_id, "Thanks! And <b>the receipt</b>?")
    said = ("user", "Thanks! And <b>the receipt</b>?")
    wait_for("the conversation continued", lambda: turns(tab) == [*first, said, first[-1]])
    assert page.locator("#conversation b").count() == 0  # the user's text is text
    assert fold.evaluate("el => el.open")
    # The steps are all still there, below: the conversation is another view of them.
    steps = stack.wait_status(run_id, "completed")["step_count"]
    wait_for(
        "every step in the timeline",
        lambda: page.locator("#steps .vrow:not(.loading)").count() == steps,
    )
    tab.shot("conversation")


def test_the_send_box_continues_a_completed_run(tab: Tab, stack: Stack) -> None:
    run_id = stack.start("listener", "hello")
    stack.wait_status(run_id, "completed")
    tab.goto(f"/runs/{run_id}")
    page = tab.page
    wait_for(
        "the first answer",
        lambda: turns(tab) == [("user", "hello"), ("assistant", "turn 0 heard:")],
    )
    box = page.locator("#send-text")
    assert box.is_enabled() and page.locator("#send").is_enabled()
    for n, text in enumerate(("one", "two"), start=1):
        box.fill(text)
        page.click("#send")
        page.locator("#send-outcome.ok").wait_for()
        assert page.inner_text("#send-outcome") == "Sent: the run goes on with the message."
        assert box.input_value() == ""
        answer = ("assistant", f"turn {n} heard: {' | '.join(('one', 'two')[:n])}")
        wait_for(f"the answer to {text!r}", lambda a=answer: turns(tab)[-1] == a)
    assert turns(tab) == [
        ("user", "hello"),
        ("assistant", "turn 0 heard:"),
        ("user", "one"),
        ("assistant", "turn 1 heard: one"),
        ("user", "two"),
        ("assistant", "turn 2 heard: one | two"),
    ]
    page.locator("#run-status .st-completed").wait_for()
    # Sent once each, as the store says.
    steps = stack.client.get(f"/api/runs/{run_id}").json()["steps"]
    assert [s["args"]["text"] for s in steps if s["kind"] == "user"] == ["one", "two"]
    tab.shot("conversation-sent")

    # What the API refuses, it says why, and the text stays to be mended.
    for text, status, said in (
        ("   ", 422, "text: must be a message"),
        ("x" * (MAX_BODY + 1), 413, "larger than HARNESS_API_MAX_BODY"),
    ):
        box.fill(text)
        page.click("#send")
        outcome = page.locator("#send-outcome.error")
        outcome.wait_for()
        assert outcome.inner_text().startswith(f"Not sent ({status}): "), outcome.inner_text()
        assert said in outcome.inner_text(), outcome.inner_text()
        assert box.input_value() == text
    tab.errors = [e for e in tab.errors if "422" not in e and "413" not in e]


def test_the_send_box_says_what_a_refusal_says_and_is_off_for_an_ended_run(
    tab: Tab, stack: Stack
) -> None:
    page = tab.page
    # A replay follows its recording: the API refuses the message (409) in words.
    seed_run(stack.store, "a-replay", chain_steps("a-replay", 3), agent="chain",
             replay_of=ReplayOrigin("recorded"))  # fmt: skip
    tab.goto("/runs/a-replay")
    page.locator("#run-status .st-completed").wait_for()
    page.fill("#send-text", "go on")
    page.click("#send")
    outcome = page.locator("#send-outcome.error")
    outcome.wait_for()
    assert outcome.inner_text().startswith("Not sent (409): "), outcome.inner_text()
    assert "a replay follows its recording" in outcome.inner_text()
    tab.errors = [e for e in tab.errors if "409" not in e]

    # A failed or cancelled run takes no message: the box says so, and is off.
    for status in (RunStatus.FAILED, RunStatus.CANCELLED):
        run_id = f"ended-{status}"
        steps = [Step(run_id, 0, StepKind.MODEL, StepStatus.FAILED, attempts=1, args={"turn": 0},
                      error="the model is gone")]  # fmt: skip
        seed_run(stack.store, run_id, steps, status=status, error="the model is gone")
        tab.goto(f"/runs/{run_id}")
        page.locator(f"#run-status .st-{status}").wait_for()
        box = page.locator("#send-text")
        wait_for(
            "the box placeholder",
            lambda b=box: "takes no message" in (b.get_attribute("placeholder") or ""),
        )
        assert box.get_attribute("placeholder") == f"A {status} run takes no message."
        assert box.is_disabled() and page.locator("#send").is_disabled()
        said = [("user", "a seeded run"), ("assistant", "the model is gone")]
        wait_for("the conversation", lambda s=said: turns(tab) == s)  # drawn after the box


def writing(tab: Tab, step: int) -> Any:
    """The bubble of step ``step``'s answer being written."""
    return tab.page.locator(f'#conversation .turn.writing[data-step="{step}"]')


def text_of(locator: Any) -> str:
    """A bubble's text as written (inner_text would trim its spaces)."""
    return str(locator.locator(".text").text_content())


def test_the_answer_is_shown_as_it_is_written_then_as_recorded(tab: Tab, stack: Stack) -> None:
    page = tab.page
    ledger = stack.env["HARNESS_TEST_LEDGER"]
    run_id = stack.start("writer", "tell me a story")
    tab.goto(f"/runs/{run_id}")
    # Half the answer is on the page while the model still writes: nothing recorded yet.
    wait_for("the first half, live", lambda: text_of(writing(tab, 0)) == FIRST)
    step = stack.client.get(f"/api/runs/{run_id}/steps").json()["steps"][0]
    assert step["result"] is None and step["status"] != "done", step
    assert page.inner_text("#stream-state") == "live answer"
    gate(ledger, run_id).touch()
    # Then the recorded answer takes the place of what was written live.
    answer = page.locator('#conversation .turn.assistant[data-step="0"]:not(.writing)')
    answer.wait_for()
    assert text_of(answer) == FIRST + REST
    assert page.locator("#conversation .turn.writing").count() == 0
    # The stream ended with the run: the page closed it.
    page.locator("#run-status .st-completed").wait_for()
    wait_for("the stream closed", lambda: page.inner_text("#stream-state") == "")

    # A message sent from the page moves the run again: its stream is opened anew.
    gate(ledger, run_id).unlink()
    page.fill("#send-text", "another one")
    page.click("#send")
    page.locator("#send-outcome.ok").wait_for()
    wait_for("the next answer, live", lambda: text_of(writing(tab, 2)) == FIRST)
    tab.shot("conversation-writing")
    gate(ledger, run_id).touch()
    page.locator('#conversation .turn.assistant[data-step="2"]:not(.writing)').wait_for()
    assert turns(tab) == [
        ("user", "tell me a story"),
        ("assistant", FIRST + REST),
        ("user", "another one"),
        ("assistant", FIRST + REST),
    ]
    wait_for("the stream closed again", lambda: page.inner_text("#stream-state") == "")


def test_a_discarded_attempt_s_text_is_taken_away(tab: Tab, stack: Stack) -> None:
    # A model step under way, its stream written here as a worker's tap
    # writes it: an attempt's text, then the next attempt's, which begins
    # with a discard of the first (its worker died, its call is retried).
    run_id = "drafting"
    steps = [Step(run_id, 0, StepKind.MODEL, StepStatus.RUNNING, attempts=1, args={"turn": 0})]
    seed_run(stack.store, run_id, steps, status=RunStatus.RUNNING, goal="write it", cursor=0)
    created = stack.store.load(run_id).lineage
    sink = StoreSink(stack.store, ttl=3600)
    page = tab.page
    tab.goto(f"/runs/{run_id}")
    page.locator("#stream-state", has_text="live answer").wait_for()

    first = Tap(sink, run_id, created, 0, 1, interval=0)
    for piece in ("A first draft ", "that ", "dies."):
        first(piece)
    first.close()
    bubble = writing(tab, 0)
    wait_for("the first attempt's text", lambda: text_of(bubble) == "A first draft that dies.")
    assert "attempt" not in bubble.locator(".who").text_content()

    second = Tap(sink, run_id, created, 0, 2, interval=0)
    second("The second draft.")
    second.close()
    wait_for("the second attempt's text alone", lambda: text_of(bubble) == "The second draft.")
    assert "(attempt 2)" in bubble.locator(".who").text_content()
    assert "first draft" not in page.inner_text("#conversation")

    # A third attempt that has written nothing yet: what the second wrote is gone too.
    Tap(sink, run_id, created, 0, 3, interval=0).close()
    wait_for("no text left", lambda: bubble.count() == 0)
    assert "draft" not in page.inner_text("#conversation")
    assert turns(tab) == [("user", "write it")]


def test_a_long_run_opens_on_its_latest_turns_and_reads_earlier_ones_on_demand(
    tab: Tab, stack: Stack
) -> None:
    run_id = "long-talk"
    steps = chain_steps(run_id, 450)  # model and tool in turn: 225 calls, no answer
    seed_run(stack.store, run_id, steps, goal="talk long", agent="chain")
    page = tab.page
    tab.goto(f"/runs/{run_id}")
    earlier = page.locator("#conversation .earlier")
    earlier.wait_for()
    assert earlier.inner_text().startswith("250 earlier steps not shown.")
    assert page.inner_text("#conversation-note") == "steps 250 to 449 of 450"
    assert turns(tab) == [("work", f"100 tool calls: effect {TIMES}100")]
    page.click("#earlier")
    wait_for(
        "200 steps more", lambda: page.inner_text("#conversation-note") == "steps 50 to 449 of 450"
    )
    page.click("#earlier")
    wait_for("the goal", lambda: turns(tab)[0] == ("user", "talk long"))
    assert turns(tab) == [("user", "talk long"), ("work", f"225 tool calls: effect {TIMES}225")]
    assert earlier.count() == 0 and page.inner_text("#conversation-note") == ""
