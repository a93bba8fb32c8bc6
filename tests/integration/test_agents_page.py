"""The dashboard's agents page in a real browser (headless Chromium, as
tests/integration/test_dashboard.py drives it), against a real ``harness
serve`` and a real worker that published the test agents when it started.
A second worker's rows, with another definition of one agent, are written
as that worker would publish them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.store import PublishedAgent, PublishedTool
from tests.integration.test_dashboard import Tab
from tests.web import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    VIEWPORT,
    Stack,
    dashboard_stack,
    require_chromium,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HOSTILE = "<img src=x onerror=alert(1)>"
OTHER = "sha256:" + "0c" * 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_chromium()
    with dashboard_stack(tmp_path_factory.mktemp("agents")) as s:
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
    page.set_default_timeout(20_000)
    t = Tab(page, stack)
    t.goto(f"/login?token={TOKEN}")
    yield t
    context.close()
    assert t.errors == [], t.errors
    assert t.dialogs == [], t.dialogs


def publish_as_another_worker(stack: Stack) -> None:
    now = time.time()
    carried = {"chain": ("effect", "idempotent"), HOSTILE: (HOSTILE, "read_only")}
    rows = [
        PublishedAgent("w9@elsewhere", agent, OTHER, (PublishedTool(*tool, False),), now, now)
        for agent, tool in carried.items()
    ]
    stack.store.publish_agents("w9@elsewhere", rows, forget_before=0.0)


def test_the_agents_page_lists_agents_tools_workers_and_a_mixed_release(
    tab: Tab, stack: Stack
) -> None:
    publish_as_another_worker(stack)
    listed = {a["name"]: a for a in stack.client.get("/api/agents").json()}
    assert listed["chain"]["mixed_release"] and not listed["approver"]["mixed_release"]
    tab.page.click("a[href='/agents']")  # from the runs page
    page = tab.page
    chain = page.locator('#agents-body tr[data-agent="chain"]')
    wait_for("the chain agent listed", lambda: chain.count() == 1)
    text = chain.inner_text()
    assert "mixed release: 2 definitions" in text
    assert "effect" in text and "idempotent" in text
    assert "w9@elsewhere" in text and "w1@" in text
    approver = page.locator('#agents-body tr[data-agent="approver"]').inner_text()
    assert "charge" in approver and "approval" in approver and "mixed" not in approver
    hostile = page.locator("#agents-body tr").filter(has_text=HOSTILE)
    assert hostile.count() == 1  # shown as text, never run
    assert "mixed release" in page.locator("#agents-note").inner_text()
    tab.shot("agents")


def test_the_agents_page_needs_the_login(stack: Stack) -> None:
    import httpx

    with httpx.Client(base_url=stack.base_url) as anonymous:
        assert anonymous.get("/api/agents").status_code == 401
        page = anonymous.get("/agents", headers={"Accept": "text/html"})
        assert page.status_code == 401 and "<form" in page.text
