// The run page's conversation: the run read as a chat. The goal and each
// `user` step are the user's turns, each model step's final answer an
// assistant turn, and what the model did on the way (its tool calls and
// their results, what it said beside them, an invalid answer sent back) is
// folded between them. Below it, a box to send the run the user's next
// message; above its last turn, the answer as the model writes it, read from
// the run's event stream (GET /api/runs/{id}/events, Server-Sent Events).
//
// The steps are read from the API, never from the stream: the stream only
// says that something changed (`step`), and carries the text of answers not
// recorded yet (`token`, `discard`). A long run opens with its latest TAIL
// steps; earlier ones are read on demand. When the run's version moves, only
// the steps from the first one that may still change are read again: a done
// or failed step never changes.
"use strict";

const Conversation = (() => {
  const { h, fill, api, statusBadge, ApiError, Unauthorized } = Harness;
  const PAGE = 1000; // the steps API's largest window
  const TAIL = 200; // steps a page opens with, and each "show earlier" adds
  const SETTLED = ["done", "failed"];
  const REFUSES = ["failed", "cancelled", "diverged"]; // a message is refused (409)
  const ENDED = ["completed", ...REFUSES];

  const json = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));
  /** A call's arguments or result: on one line when short, else one field a line. */
  function compact(value) {
    const line = typeof value === "string" ? value : JSON.stringify(value);
    return line.length <= 100 ? line : json(value);
  }

  /** A sender's id for one message (the API's Idempotency-Key): a retry of a
   * send whose answer was lost is received once. getRandomValues, not
   * randomUUID: the dashboard may be served over plain HTTP. */
  function senderId() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return `dashboard-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
  }

  /**
   * The conversation of the run at `base` (its API path). `changed()` asks the
   * page to refresh at once (the run moved: a step event, a message sent);
   * the page then calls `update(run, askedAt)` with the run it read, and
   * `askedAt`, the performance.now() at which it asked.
   */
  function attach(base, changed) {
    const node = document.getElementById("conversation");
    const note = document.getElementById("conversation-note");
    const live = document.getElementById("stream-state");
    let run = null;
    let from = null; // the index of the first step held
    let steps = []; // steps from `from`, in index order
    let version = null; // the run's version the steps were read at
    const open = new Set(); // folds the operator opened, by their first step
    const writing = new Map(); // step -> {attempt, text}: answers not recorded yet
    const bubbles = new Map(); // step -> the text node of its writing bubble

    // ---- the steps ----------------------------------------------------

    async function load() {
      if (from === null) from = Math.max(0, run.step_count - TAIL);
      const at = from;
      const unsettled = steps.findIndex((s) => !SETTLED.includes(s.status));
      let start = from + (unsettled === -1 ? steps.length : unsettled);
      const read = [];
      while (start !== null) {
        const page = await api(`${base}/steps?start=${start}&limit=${PAGE}`);
        read.push(...page.steps);
        start = page.next_start;
      }
      if (from !== at) return; // "show earlier" was clicked meanwhile: read again from there
      const kept = read.length ? steps.slice(0, read[0].index - from) : steps;
      steps = kept.concat(read);
      version = run.version;
    }

    function earlier() {
      from = Math.max(0, from - TAIL);
      steps = [];
      version = null; // read again from the new start at the next refresh
      changed();
    }

    // ---- turns ---------------------------------------------------------

    /** The conversation as items: user and assistant turns, a fold of the
     * work between them, and where an answer is being written. */
    function turns() {
      const items = from === 0 ? [{ kind: "user", text: run.goal, goal: true }] : [{ kind: "earlier" }];
      let work = null;
      const flush = () => {
        if (work) items.push(work);
        work = null;
      };
      const fold = (step) => (work = work || { kind: "work", key: step.index, steps: [] }).steps.push(step);
      for (const step of steps) {
        const result = step.result && typeof step.result === "object" ? step.result : {};
        if (step.kind === "user") {
          flush();
          items.push({ kind: "user", text: step.args.text, step: step.index });
        } else if (step.kind === "tool") {
          fold(step);
        } else if (result.final !== undefined && result.final !== null && result.invalid === undefined) {
          flush();
          items.push({ kind: "answer", step });
        } else if (step.status === "failed") {
          flush();
          items.push({ kind: "failed", step });
        } else if (SETTLED.includes(step.status)) {
          fold(step); // tool calls asked for, an invalid answer
        } else if (writing.has(step.index)) {
          flush();
          items.push({ kind: "writing", step: step.index });
        }
      }
      flush();
      // Tokens of a step this page has not read yet: the latest turn.
      const held = from + steps.length;
      for (const index of [...writing.keys()].sort((a, b) => a - b)) {
        if (index >= held) items.push({ kind: "writing", step: index });
      }
      return items;
    }

    function bubble(role, label, ...body) {
      return h("div", { className: `turn ${role}` }, h("div", { className: "who" }, label), ...body);
    }

    function renderItem(item) {
      switch (item.kind) {
        case "earlier":
          return h(
            "div",
            { className: "earlier" },
            `${from.toLocaleString()} earlier steps not shown. `,
            h("button", { type: "button", id: "earlier", onclick: earlier }, "Show earlier")
          );
        case "user": {
          const node = bubble("user", item.goal ? "user · goal" : "user", h("div", { className: "text" }, item.text));
          if (!item.goal) node.dataset.step = String(item.step);
          return node;
        }
        case "answer":
          return answer(item.step);
        case "failed":
          return bubble("assistant failed", `model · step ${item.step.index}`, h("div", { className: "text" }, item.step.error || "failed"));
        case "writing":
          return writingBubble(item.step);
        default:
          return workFold(item);
      }
    }

    function answer(step) {
      const final = step.result.final;
      const structured = typeof final !== "string";
      const text = structured ? h("pre", { className: "text" }, json(final)) : h("div", { className: "text" }, final);
      const node = bubble("assistant", `assistant${structured ? " · structured answer" : ""}`, text);
      node.dataset.step = String(step.index);
      return node;
    }

    function writingBubble(index) {
      const entry = writing.get(index);
      const text = document.createTextNode(entry ? entry.text : "");
      bubbles.set(index, text);
      const label = `assistant · writing${entry && entry.attempt > 1 ? ` (attempt ${entry.attempt})` : ""}`;
      const node = bubble("assistant writing", label, h("div", { className: "text" }, text, h("span", { className: "caret" })));
      node.dataset.step = String(index);
      return node;
    }

    /** What the model did between two turns, folded: its calls, their results. */
    function workFold(item) {
      const calls = item.steps.filter((s) => s.kind === "tool");
      const names = new Map();
      for (const c of calls) names.set(c.tool, (names.get(c.tool) || 0) + 1);
      const parts = [];
      if (calls.length) {
        const listed = [...names].map(([name, n]) => (n > 1 ? `${name} ×${n}` : name)).join(", ");
        parts.push(`${calls.length} tool call${calls.length === 1 ? "" : "s"}: ${listed}`);
      }
      const count = (status, said) => {
        const n = calls.filter((c) => c.status === status).length;
        if (n) parts.push(`${n} ${said}`);
      };
      count("failed", "failed");
      count("awaiting_approval", "awaiting approval");
      count("in_doubt", "in doubt");
      count("deferred", "waiting");
      const invalid = item.steps.filter((s) => s.kind === "model" && s.result && s.result.invalid !== undefined);
      if (invalid.length) parts.push(`${invalid.length} invalid answer${invalid.length === 1 ? "" : "s"}`);
      if (!parts.length) parts.push("the model's notes");
      const details = h("details", { className: "work", dataset: { step: String(item.key) } }, h("summary", {}, parts.join(" · ")));
      // Filled when opened: a long run's folds cost nothing until read.
      const fillBody = () => {
        if (details.open && details.childElementCount === 1) details.append(...item.steps.map(workStep));
      };
      details.addEventListener("toggle", () => {
        if (details.open) open.add(item.key);
        else open.delete(item.key);
        fillBody();
      });
      if (open.has(item.key)) {
        details.open = true;
        fillBody();
      }
      return details;
    }

    function workStep(step) {
      if (step.kind === "model") {
        const result = step.result || {};
        const said = [];
        if (result.text) said.push(h("div", { className: "said" }, h("span", { className: "who" }, "assistant"), h("span", { className: "words" }, result.text)));
        if (result.invalid !== undefined) {
          said.push(h("div", { className: "said err" }, `Invalid final answer, sent back to the model: ${result.invalid}`));
        }
        return h("div", { className: "step", dataset: { step: String(step.index) } }, said);
      }
      const child = step.wait && step.wait.child;
      const outcome = step.error
        ? h("pre", { className: "err" }, step.error)
        : step.result === null || step.result === undefined
          ? null
          : h("pre", { className: "result" }, compact(step.result));
      return h(
        "div",
        { className: "call", dataset: { step: String(step.index) } },
        h(
          "div",
          { className: "callhead" },
          h("span", { className: "tool" }, step.tool || "?"),
          statusBadge(step.status),
          step.approval ? h("span", { className: "muted" }, `${step.approval.decision} by ${step.approval.by}`) : null,
          step.waits_for ? h("span", { className: "muted" }, `waits for ${step.waits_for}`) : null,
          child ? h("a", { href: `/runs/${encodeURIComponent(child)}` }, child) : null
        ),
        h("pre", { className: "args" }, compact(step.args)),
        outcome
      );
    }

    function render() {
      // Follow the newest turn, unless the operator scrolled up to read.
      const atEnd = node.scrollTop + node.clientHeight >= node.scrollHeight - 24;
      bubbles.clear();
      fill(node, turns().map(renderItem));
      if (atEnd) node.scrollTop = node.scrollHeight;
      const shown = steps.length ? `steps ${from} to ${from + steps.length - 1}` : "no steps yet";
      fill(note, from ? `${shown} of ${run.step_count.toLocaleString()}` : "");
    }

    // ---- the live answer ----------------------------------------------

    let source = null;
    let endedAt = -Infinity; // when the stream said the run ended (performance.now())
    let pending = null;

    /** A refresh soon, once for a burst of step events. */
    function soon() {
      if (pending === null) pending = setTimeout(() => ((pending = null), changed()), 150);
    }

    function recorded(index) {
      const step = index >= from ? steps[index - from] : undefined;
      return step !== undefined && step.kind === "model" && SETTLED.includes(step.status);
    }

    function token({ step, attempt, text }) {
      // Its answer is shown as recorded already, or it is earlier than the turns shown.
      if (step < from || recorded(step)) return;
      const entry = writing.get(step);
      if (entry && entry.attempt > attempt) return; // a late piece of an attempt given up
      const more = entry && entry.attempt === attempt;
      if (more) entry.text += text;
      else writing.set(step, { attempt, text });
      const shown = bubbles.get(step);
      if (more && shown) {
        shown.data = entry.text;
        if (node.scrollTop + node.clientHeight >= node.scrollHeight - 48) node.scrollTop = node.scrollHeight;
      } else {
        render(); // a new bubble, or a new attempt's label
      }
    }

    function discard({ step, attempt }) {
      const entry = writing.get(step);
      if (!entry || entry.attempt !== attempt) return;
      writing.delete(step);
      render();
    }

    function setStream(state) {
      live.className = `stream ${state}`;
      fill(live, { open: "live answer", connecting: "connecting…", closed: "" }[state]);
    }

    // The id of the last event read: a stream opened again (after a send)
    // starts after it, not from the run's creation.
    let lastId = "";

    function openStream() {
      const after = lastId ? `?after=${encodeURIComponent(lastId)}` : "";
      const es = new EventSource(`${base}/events${after}`);
      source = es;
      setStream("connecting");
      const on = (name, handle) =>
        es.addEventListener(name, (e) => {
          if (source !== es) return;
          if (e.lastEventId) lastId = e.lastEventId;
          handle(JSON.parse(e.data));
        });
      on("token", token);
      on("discard", discard);
      on("step", soon);
      on("end", () => {
        closeStream();
        endedAt = performance.now();
        changed();
      });
      es.onopen = () => source === es && setStream("open");
      // The browser reconnects by itself (with Last-Event-ID) after a drop;
      // a refusal (a 401, a 404) closes it, and the next refresh may open another.
      es.onerror = () => {
        if (source !== es) return;
        if (es.readyState === EventSource.CLOSED) closeStream();
        else setStream("connecting");
      };
    }

    function closeStream() {
      if (source) source.close();
      source = null;
      setStream("closed");
    }

    /** A moving run's stream is open; an ended run's is not. A run read
     * before the stream said it ended may not know it yet: it is no reason
     * to open another. */
    function follow(askedAt) {
      const moving = !ENDED.includes(run.status);
      if (moving && !source && askedAt > endedAt) openStream();
      if (!moving && source) closeStream();
      if (!moving && writing.size) {
        writing.clear(); // an ended run writes nothing more
        render();
      }
    }

    // ---- the send box -------------------------------------------------

    const box = document.getElementById("send-text");
    const button = document.getElementById("send");
    const outcome = document.getElementById("send-outcome");
    let sender = null; // {text, id}: the message being sent, and its id

    function say(text, ok) {
      outcome.className = text ? `outcome ${ok ? "ok" : "error"}` : "outcome";
      fill(outcome, text);
    }

    async function send() {
      const text = box.value; // checked by the API, which says what is wrong with it
      if (!sender || sender.text !== text) sender = { text, id: senderId() };
      button.disabled = true;
      try {
        const answer = await api(`${base}/messages`, {
          method: "POST",
          body: { text },
          headers: { "Idempotency-Key": sender.id },
        });
        sender = null;
        box.value = "";
        say(`Sent: ${answer.said}.`, true);
      } catch (err) {
        if (err instanceof Unauthorized) return;
        const code = err instanceof ApiError ? ` (${err.status})` : "";
        say(`Not sent${code}: ${err.message}`, false);
      } finally {
        renderBox();
      }
      changed();
    }

    button.addEventListener("click", send);
    box.addEventListener("input", () => say("", true)); // its answer was to another message
    box.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        if (!button.disabled) send();
      }
    });

    function renderBox() {
      const refused = run && REFUSES.includes(run.status);
      box.disabled = button.disabled = !run || refused;
      box.placeholder = refused
        ? `A ${run.status} run takes no message.`
        : "The user's next message (Ctrl+Enter sends)";
    }

    // ---- the page's refresh --------------------------------------------

    async function update(next, askedAt) {
      const previous = run;
      run = next;
      if (!previous || previous.status !== run.status) renderBox();
      if (run.version !== version) {
        await load();
        // A recorded answer replaces the text that was written live.
        for (const index of [...writing.keys()]) if (recorded(index)) writing.delete(index);
        if (version === run.version) render(); // else read again, from further back, at once
      }
      follow(askedAt);
    }

    return { update };
  }

  return { attach };
})();
