// The run page: the run's header, the operator actions that apply to it now,
// its conversation (conversation.js), its step timeline and its history,
// refreshed every two seconds in place, and at once when its stream says
// it moved.
//
// The timeline is virtual: only the rows on screen are in the DOM, and steps
// are fetched in windows of BLOCK as they scroll into view, so a run of
// 20,000 steps opens as fast as one of ten. A window is fetched again when
// the run's version moves (a checkpoint changed some step). The history is
// read page by page in the background, then followed by asking for the
// events after the last one held.
"use strict";

(() => {
  const { h, fill, fitText, api, poll, setLive, when, duration, tokens, cost, exactCost, brief } = Harness;
  const { statusBadge, attentionBadge, ApiError, Unauthorized, VirtualList } = Harness;
  const BLOCK = 200;
  const OPERATOR_KEY = "harness.operator";
  const ROW = 26;
  const HISTORY_PAGE = 500;

  const runId = decodeURIComponent(location.pathname.replace(/^\/runs\//, "").replace(/\/$/, ""));
  const base = `/api/runs/${encodeURIComponent(runId)}`;
  document.title = `${runId} · harness`;
  fill(document.getElementById("crumb-run"), `/ ${runId}`);

  let run = null;
  const ended = (r) => ["completed", "failed", "cancelled", "diverged"].includes(r.status);

  // ---- header -------------------------------------------------------------

  function field(label, value, title) {
    return h("div", {}, h("dt", {}, label), h("dd", { title: title || String(value) }, value));
  }

  function renderHeader() {
    fill(document.getElementById("run-id"), run.run_id);
    fill(document.getElementById("run-status"), statusBadge(run.status));
    fill(
      document.getElementById("run-attention"),
      attentionBadge(run.attention, run.status, run.attention_detail)
    );
    fill(
      document.getElementById("run-pause"),
      run.pause_requested && run.status !== "paused" ? "pause requested: stops at the next step" : ""
    );
    fill(document.getElementById("run-goal"), run.goal);
    renderFamily();
    const now = Date.now() / 1000;
    const lease = run.lease_expires_at
      ? `${run.owner} (lease ${run.lease_expires_at > now ? "live" : "expired"})`
      : run.owner || "none";
    const budgets = [
      run.max_tokens ? `${run.max_tokens.toLocaleString()} tokens` : null,
      run.max_cost_usd ? cost(run.max_cost_usd) : null,
    ].filter(Boolean);
    fill(
      document.getElementById("run-fields"),
      field("Agent", run.agent),
      field("Cursor / steps", `${run.cursor} / ${run.step_count}`),
      field("Version", run.version),
      field("Owner", lease),
      field("Usage", tokens(run.usage) || "none"),
      field("Cost", cost(run.cost_usd), exactCost(run.cost_usd)),
      field("Created", when(run.created_at)),
      field("Updated", when(run.updated_at)),
      field("Budgets", budgets.length ? `raised to ${budgets.join(", ")}` : "the agent's defaults"),
      field("Sweeper re-sends", run.resends || 0),
      field("Next wake-up", run.wake_at && !ended(run) ? when(run.wake_at) : "none"),
      field("Blocked", run.blocked || "no")
    );
    // A structured answer (an agent with an output_type) is a JSON object.
    const answer = typeof run.result === "string" ? run.result : JSON.stringify(run.result);
    fill(document.getElementById("run-result"), run.result ? `Result: ${answer}` : "");
    // A paused run's reason (a budget spent, an operator's pause) is no error.
    const paused = run.status === "paused";
    fill(document.getElementById("run-paused"), paused && run.error ? `Paused: ${run.error}` : "");
    fill(document.getElementById("run-error"), run.error && !paused ? `Error: ${run.error}` : "");
  }

  // The runs this one is part of: the parent whose call started it, and the
  // children its calls started (harness.agent_tool), each a link to its page.
  function runLink(id, className) {
    return h("a", { href: `/runs/${encodeURIComponent(id)}`, className }, id);
  }

  function renderFamily() {
    const parts = [];
    if (run.parent) {
      parts.push(
        h("span", { id: "run-parent" }, "Child of ", runLink(run.parent.run_id, "parent"), ` (its step ${run.parent.step})`)
      );
    }
    const children = run.children || [];
    if (children.length) {
      const items = children.map((c) =>
        h("li", {}, runLink(c.run_id, "child"), " ", statusBadge(c.status), c.step === null ? "" : ` step ${c.step}`)
      );
      parts.push(h("div", { id: "run-children" }, h("span", {}, "Children:"), h("ul", {}, items)));
    }
    fill(document.getElementById("run-family"), parts);
  }

  // ---- operator actions ---------------------------------------------------

  const outcome = document.getElementById("outcome");
  let actionsKey = null;

  function say(text, ok) {
    outcome.className = `outcome ${ok ? "ok" : "error"}`;
    fill(outcome, text);
  }

  // Who decides: asked once, kept in this browser, sent as `by` with every
  // decision (the API records "api" when it is empty). A cancel takes no name.
  const operatorName = document.getElementById("operator-name");
  operatorName.value = localStorage.getItem(OPERATOR_KEY) || "";
  operatorName.addEventListener("input", () => {
    const name = operatorName.value.trim();
    if (name) localStorage.setItem(OPERATOR_KEY, name);
    else localStorage.removeItem(OPERATOR_KEY);
  });

  function signed(body) {
    const name = operatorName.value.trim();
    return name ? { ...body, by: name } : body;
  }

  /** POST an action; report its answer; refresh the page's data at once. */
  async function act(button, path, body, done) {
    const buttons = document.querySelectorAll("#actions button");
    buttons.forEach((b) => (b.disabled = true));
    try {
      const answer = await api(`${base}/${path}`, { method: "POST", body });
      // A repeat of a decision the run already had: nothing changed, and it says what.
      say(answer && answer.changed === false ? `Nothing changed: ${answer.message}.` : done, true);
      actionsKey = null; // the run changed: rebuild the actions for its new state
    } catch (err) {
      if (err instanceof Unauthorized) return;
      const code = err instanceof ApiError ? ` (${err.status})` : "";
      say(`${path} refused${code}: ${err.message}`, false);
      buttons.forEach((b) => (b.disabled = false));
    }
    poller.now();
  }

  function parseJson(text, what) {
    try {
      return { value: JSON.parse(text) };
    } catch (err) {
      say(`${what} is not valid JSON: ${err.message}`, false);
      return null;
    }
  }

  function approvalGroup(step) {
    // The whole of the arguments, one field a line: the amount being approved is never cut.
    const original = JSON.stringify(step.args, null, 2);
    const args = h("textarea", {
      id: "approve-args",
      title: "arguments to call it with (JSON; edit to call it with others)",
      spellcheck: "false",
      oninput: (e) => fitText(e.target),
    });
    args.value = original;
    fitText(args);
    const reason = h("input", { type: "text", id: "reject-reason", placeholder: "reason (required)" });
    return h(
      "div",
      { className: "group urgent", id: "approval" },
      h("span", { className: "title" }, `Step ${step.index}: ${step.tool} awaits approval`),
      h("label", { className: "field" }, "Arguments", args),
      h(
        "button",
        {
          type: "button",
          className: "primary",
          id: "approve",
          onclick: (e) => {
            const body = { step: step.index };
            if (args.value.trim() !== original) {
              const parsed = parseJson(args.value, "the arguments");
              if (!parsed) return;
              if (JSON.stringify(parsed.value) !== JSON.stringify(step.args)) body.args = parsed.value;
            }
            act(e.target, "approve", signed(body), `Step ${step.index} approved.`);
          },
        },
        "Approve"
      ),
      h("label", { className: "field" }, "Reject because", reason),
      h(
        "button",
        {
          type: "button",
          className: "danger",
          id: "reject",
          onclick: (e) => {
            if (!reason.value.trim()) return say("Say why the call is rejected.", false);
            const body = { step: step.index, reason: reason.value.trim() };
            act(e.target, "reject", signed(body), `Step ${step.index} rejected.`);
          },
        },
        "Reject"
      )
    );
  }

  function resolveGroup(step) {
    const result = h("textarea", { id: "resolve-result", placeholder: "result JSON, if it succeeded", spellcheck: "false" });
    const force = h("input", { type: "checkbox", id: "resolve-force" });
    const decide = (decision) => (e) => {
      const body = { decision, force: force.checked };
      if (decision === "succeeded" && result.value.trim()) {
        const parsed = parseJson(result.value, "the result");
        if (!parsed) return;
        body.result = parsed.value;
      }
      act(e.target, "resolve", body, `Step ${step.index} resolved: ${decision}.`);
    };
    return h(
      "div",
      { className: "group urgent", id: "resolve" },
      h("span", { className: "title" }, `Step ${step.index} (${step.tool || step.kind}) is in doubt`),
      h("button", { type: "button", id: "resolve-retry", onclick: decide("retry") }, "Retry"),
      h("label", { className: "field" }, "Result", result),
      h("button", { type: "button", id: "resolve-succeeded", onclick: decide("succeeded") }, "Succeeded"),
      h("button", { type: "button", className: "danger", id: "resolve-fail", onclick: decide("fail") }, "Fail"),
      h("label", { className: "field" }, "Force", force)
    );
  }

  function pauseGroup() {
    if (run.status === "paused") {
      const maxTokens = h("input", { type: "number", id: "resume-tokens", min: "1", placeholder: "tokens" });
      const maxCost = h("input", { type: "number", id: "resume-cost", min: "0", step: "any", placeholder: "USD" });
      return h(
        "div",
        { className: "group" },
        h("label", { className: "field" }, "Max tokens", maxTokens),
        h("label", { className: "field" }, "Max cost", maxCost),
        h(
          "button",
          {
            type: "button",
            className: "primary",
            id: "resume",
            onclick: (e) => {
              const body = {};
              if (maxTokens.value) body.max_tokens = Number(maxTokens.value);
              if (maxCost.value) body.max_cost_usd = Number(maxCost.value);
              act(e.target, "resume", signed(body), "Resumed.");
            },
          },
          "Resume"
        )
      );
    }
    if (run.pause_requested) {
      return h(
        "div",
        { className: "group" },
        h("button", { type: "button", id: "resume", onclick: (e) => act(e.target, "resume", signed({}), "Pause withdrawn.") }, "Withdraw pause")
      );
    }
    return h(
      "div",
      { className: "group" },
      h("button", { type: "button", id: "pause", onclick: (e) => act(e.target, "pause", signed({}), "Pause requested.") }, "Pause")
    );
  }

  function cancelGroup() {
    const reason = h("input", { type: "text", id: "cancel-reason", placeholder: "reason (optional)" });
    let armed = null;
    const button = h("button", { type: "button", className: "danger", id: "cancel" }, "Cancel run");
    // Two clicks, not a dialog: a cancel cannot be undone.
    button.addEventListener("click", () => {
      if (!armed) {
        button.textContent = "Confirm cancel";
        armed = setTimeout(() => {
          armed = null;
          button.textContent = "Cancel run";
        }, 5000);
        return;
      }
      clearTimeout(armed);
      const body = reason.value.trim() ? { reason: reason.value.trim() } : {};
      act(button, "cancel", body, "Cancelled.");
    });
    return h("div", { className: "group" }, h("label", { className: "field" }, "Cancel because", reason), button);
  }

  async function renderActions() {
    const key = [run.status, run.attention, run.pause_requested, run.cursor].join("|");
    if (key === actionsKey) return;
    actionsKey = key;
    const node = document.getElementById("actions");
    if (ended(run)) {
      fill(node, h("span", { className: "muted" }, `None: the run has ended (${run.status}).`));
      return;
    }
    const groups = [];
    if (run.attention === "awaiting_approval" || run.attention === "in_doubt") {
      const { steps } = await api(`${base}/steps?start=${run.cursor}&limit=1`);
      const step = steps[0];
      if (step && step.status === "awaiting_approval") groups.push(approvalGroup(step));
      if (step && step.status === "in_doubt") groups.push(resolveGroup(step));
    }
    groups.push(pauseGroup(), cancelGroup());
    fill(node, groups);
  }

  // ---- the step timeline --------------------------------------------------

  const blocks = new Map(); // block number -> {generation, steps}
  const loading = new Map(); // block number -> its fetch
  let generation = 0;
  let selected = null;

  function stepSummary(step) {
    // A deferred call: what it waits for (a callback, a signal, a sleep, a child run) and until when.
    if (step.waits_for) return `waits for ${step.waits_for}`;
    if (step.kind === "user") return `said: ${brief(step.args.text, 140)}`;
    if (step.kind === "tool") {
      const done = step.result === null || step.result === undefined ? "" : ` → ${brief(step.result, 80)}`;
      return `${brief(step.args, 100)}${done}`;
    }
    const result = step.result || {};
    if (typeof result.invalid === "string") return `invalid final answer: ${brief(result.invalid, 140)}`;
    if (result.final !== undefined && result.final !== null) return `final: ${brief(result.final, 140)}`;
    if (Array.isArray(result.tool_calls)) {
      return `asked for ${result.tool_calls.map((c) => (c && c.name) || "?").join(", ")}`;
    }
    // Its arguments are bookkeeping ({"turn": 1}), not something it did.
    return step.status === "running" ? "waiting for the model" : "";
  }

  function stepDuration(step) {
    if (!step.started_at) return "";
    if (step.finished_at) return duration(step.finished_at - step.started_at);
    // An abandoned step (left running in a run that ended) never finishes: no clock.
    return step.status === "running" && !step.abandoned ? `${duration(Date.now() / 1000 - step.started_at)}…` : "";
  }

  function stepUsage(step) {
    if (step.kind === "model") return [tokens(step.usage), cost(step.cost_usd)].filter(Boolean).join(" · ");
    if (step.approval) return `${step.approval.decision} by ${step.approval.by}`;
    return "";
  }

  function stepAt(i) {
    const block = blocks.get(Math.floor(i / BLOCK));
    return block ? block.steps[i % BLOCK] : undefined;
  }

  function renderStep(i) {
    const step = stepAt(i);
    if (!step) {
      return h("div", { className: "loading" }, h("span", { className: "num" }, String(i)), h("span", {}, "…"));
    }
    const classes = [];
    if (i === selected) classes.push("selected");
    if (run && i === run.cursor && !ended(run)) classes.push("cursor");
    const attempts = step.retries ? `${step.attempts} (${step.retries})` : String(step.attempts);
    return h(
      "div",
      { className: classes.join(" "), onclick: () => select(i), dataset: { status: step.status } },
      h("span", { className: "num" }, String(step.index)),
      h("span", {}, step.kind),
      h("span", { title: step.tool || "" }, step.tool || ""),
      h("span", {}, statusBadge(step.abandoned ? "abandoned" : step.status)),
      h("span", { className: "num" }, attempts),
      h("span", { className: "num" }, stepDuration(step)),
      h("span", {}, stepUsage(step)),
      step.error
        ? h("span", { className: "err", title: step.error }, step.error)
        : h("span", { className: "muted" }, stepSummary(step))
    );
  }

  function pre(title, value) {
    const text = value === null || value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value, null, 2);
    return h("div", {}, h("h3", {}, title), h("pre", {}, text || "—"));
  }

  function renderDetail() {
    const node = document.getElementById("step-detail");
    const step = selected === null ? undefined : stepAt(selected);
    if (!step) return fill(node);
    const times = `started ${when(step.started_at) || "—"}, finished ${when(step.finished_at) || "—"}`;
    // A deferred call: what it waits for, and the child run's page if a child answers it.
    const child = step.wait && step.wait.child;
    const waits = step.waits_for
      ? h(
          "div",
          { id: "step-waits" },
          h("h3", {}, "Waits for"),
          h("p", { className: "waits" }, step.waits_for),
          child ? h("p", {}, "Child run: ", runLink(child, "child")) : null
        )
      : null;
    fill(
      node,
      waits,
      pre(`Step ${step.index} arguments`, step.args),
      pre("Result", step.result),
      pre(step.error ? "Error" : step.approval ? "Approval" : "Times", step.error || step.approval || times)
    );
  }

  function select(i) {
    selected = i;
    timeline.render(true);
    renderDetail();
  }

  async function fetchBlock(b) {
    const asked = generation;
    try {
      const page = await api(`${base}/steps?start=${b * BLOCK}&limit=${BLOCK}`);
      blocks.set(b, { generation: asked, steps: page.steps });
      if (page.total !== undefined) timeline.setCount(page.total);
      timeline.render(true);
      if (selected !== null && Math.floor(selected / BLOCK) === b) renderDetail();
    } catch (err) {
      if (!(err instanceof Unauthorized)) console.error(err);
    } finally {
      loading.delete(b);
    }
  }

  function wantRange(first, last) {
    for (let b = Math.floor(first / BLOCK); b <= Math.floor(last / BLOCK); b++) {
      const block = blocks.get(b);
      if (loading.has(b) || (block && block.generation === generation)) continue;
      loading.set(b, fetchBlock(b));
    }
  }

  const timeline = new VirtualList(
    document.getElementById("steps"),
    document.getElementById("steps-head"),
    ROW,
    renderStep,
    wantRange
  );
  const followCursor = document.getElementById("follow-cursor");
  document.getElementById("to-cursor").addEventListener("click", () => run && timeline.scrollToIndex(run.cursor));

  // ---- the history --------------------------------------------------------

  const events = [];
  let historyDone = false; // read to the end (so far)
  let historyBusy = false;
  const followHistory = document.getElementById("follow-history");

  function renderEvent(i) {
    const e = events[i];
    return h(
      "div",
      { dataset: { to: e.to } },
      h("span", { className: "num" }, String(e.id)),
      h("span", { title: String(e.at) }, when(e.at)),
      h("span", { className: "num" }, String(e.version)),
      h("span", { className: "num" }, e.step_index === null ? "" : String(e.step_index)),
      h("span", {}, e.from ? `${e.from} → ` : "", h("b", {}, e.to)),
      h("span", { className: "mono", title: e.worker || "" }, e.worker || ""),
      h("span", { className: "muted", title: e.detail || "" }, e.detail || "")
    );
  }

  const historyList = new VirtualList(
    document.getElementById("events"),
    document.getElementById("history-head"),
    ROW,
    renderEvent,
    null,
    10
  );

  /** How many events, and which are on screen when not all are: rows
   * scrolled away must be known to be there, scrollbar or none. */
  function noteHistory() {
    const n = events.length;
    let note = `${n.toLocaleString()} event${n === 1 ? "" : "s"}`;
    const [first, last] = historyList.visible();
    if (n && (first > 0 || last < n - 1)) {
      note += `, ${(first + 1).toLocaleString()} to ${(last + 1).toLocaleString()} shown: scroll for the others`;
    }
    fill(document.getElementById("history-note"), historyDone ? note : `${note}, reading…`);
  }

  document.getElementById("events").addEventListener("scroll", noteHistory);

  async function readHistory() {
    if (historyBusy) return;
    historyBusy = true;
    try {
      for (;;) {
        const after = events.length ? `&after=${events[events.length - 1].id}` : "";
        const page = await api(`${base}/history?limit=${HISTORY_PAGE}${after}`);
        const follow = followHistory.checked;
        events.push(...page.events);
        historyList.setCount(events.length);
        if (follow && page.events.length) historyList.scrollToIndex(events.length - 1, "end");
        historyList.render(false);
        historyDone = page.next_after === null;
        noteHistory();
        if (historyDone) break;
      }
    } finally {
      historyBusy = false;
    }
  }

  // ---- refresh ------------------------------------------------------------

  // Its stream's events and a message sent refresh the page at once.
  const conversation = Conversation.attach(base, () => poller.now());

  async function refresh() {
    const previous = run;
    const askedAt = performance.now();
    run = await api(`${base}?steps=false`);
    renderHeader();
    if (!previous || previous.version !== run.version) {
      generation += 1; // some step changed: windows on screen are fetched again
      timeline.setCount(run.step_count);
      timeline.render(false);
      wantRange(...timeline.range());
      if (followCursor.checked && previous && previous.cursor !== run.cursor) timeline.scrollToIndex(run.cursor);
    }
    fill(document.getElementById("steps-note"), `${run.step_count.toLocaleString()} steps, cursor at ${run.cursor}`);
    // Once the timeline has its rows: a long run's timeline does not wait behind it.
    await Promise.all(loading.values());
    await conversation.update(run, askedAt);
    await renderActions();
    if (!historyBusy) readHistory().catch((err) => err instanceof Unauthorized || console.error(err));
  }

  const poller = poll(async () => {
    try {
      await refresh();
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      // Asking again will not make it exist: stop, and say so.
      poller.stop();
      fill(document.getElementById("run-id"), runId);
      fill(document.getElementById("run-error"), `No such run: ${runId}.`);
      fill(document.getElementById("actions"));
      setLive("off", "no such run");
    }
  }, 2000);
})();
