// Shared by the runs page and the run page.
//
// Everything a run carries (goal, tool arguments, results, errors, ids) is
// user-supplied, so the DOM is built only with createElement and text nodes:
// `h()` turns strings into text, never markup, and nothing here assigns
// innerHTML. Requests go to the same origin: the login cookie travels with
// them, and every POST carries X-Harness-Request, the server's CSRF guard.
"use strict";

const Harness = (() => {
  /** An element with properties (className, href, title, on*, dataset) and
   * children (nodes, or strings shown as text; null and false are skipped). */
  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "className" || key === "textContent" || key === "value") node[key] = value;
      else node.setAttribute(key, String(value));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  /** Replace a node's children. */
  function fill(node, ...children) {
    node.replaceChildren();
    append(node, children);
    return node;
  }

  /** Size a textarea to its text (within bounds), so none of it is hidden. */
  function fitText(area) {
    const lines = area.value.split("\n");
    area.rows = Math.min(20, Math.max(2, lines.length));
    area.cols = Math.min(80, Math.max(30, ...lines.map((l) => l.length + 2)));
  }

  class Unauthorized extends Error {}

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  function detailOf(body, fallback) {
    if (!body || body.detail === undefined) return fallback;
    if (typeof body.detail === "string") return body.detail;
    if (Array.isArray(body.detail)) {
      // A validation error: say which field and why.
      return body.detail
        .map((d) => (d && d.msg ? `${(d.loc || []).slice(1).join(".")}: ${d.msg}` : JSON.stringify(d)))
        .join("; ");
    }
    return JSON.stringify(body.detail);
  }

  let loggedOut = false;

  /** A 401 stops every poller and offers the login form, once. */
  function showLoggedOut() {
    if (loggedOut) return;
    loggedOut = true;
    const banner = h(
      "div",
      { className: "banner error", id: "logged-out", role: "alert" },
      "Not logged in, or the session has ended: ",
      h("a", { href: "/login" }, "log in again"),
      "."
    );
    document.body.prepend(banner);
    setLive("off", "not logged in");
  }

  /** Call the API; resolves to the JSON body. Throws Unauthorized or ApiError.
   * `headers`: more of them (a sender's Idempotency-Key). */
  async function api(path, { method = "GET", body, headers: more } = {}) {
    const headers = { Accept: "application/json", ...more };
    const init = { method, headers, credentials: "same-origin", cache: "no-store" };
    if (method !== "GET") {
      headers["X-Harness-Request"] = "1";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body === undefined ? {} : body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      showLoggedOut();
      throw new Unauthorized("not logged in");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, detailOf(data, response.statusText));
    return data;
  }

  function setLive(state, text) {
    const node = document.getElementById("live");
    if (!node) return;
    node.className = `live ${state}`;
    node.textContent = text;
  }

  /** Run `task` now and every `ms` after it settles (no overlapping requests),
   * until a 401 or `poller.stop()`. `poller.now()` refreshes at once, after an
   * operator action. */
  function poll(task, ms) {
    let timer = null;
    let running = false;
    let again = false;
    let stopped = false;
    async function tick() {
      clearTimeout(timer);
      if (stopped) return;
      if (running) {
        again = true;
        return;
      }
      running = true;
      try {
        await task();
        if (!stopped) setLive("", `live, updated ${clock(Date.now() / 1000)}`);
      } catch (err) {
        if (err instanceof Unauthorized) return;
        setLive("stale", `update failed (${err.message}); retrying`);
        console.error(err);
      } finally {
        running = false;
      }
      if (loggedOut || stopped) return;
      if (again) {
        again = false;
        tick();
      } else {
        timer = setTimeout(tick, ms);
      }
    }
    function stop() {
      stopped = true;
      clearTimeout(timer);
    }
    tick();
    return { now: tick, stop };
  }

  const pad = (n) => String(n).padStart(2, "0");

  /** Epoch seconds as local time with its zone: "YYYY-MM-DD HH:MM:SS UTC+01:00". */
  function when(epoch) {
    if (epoch === null || epoch === undefined) return "";
    const d = new Date(epoch * 1000);
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone(d)}`
    );
  }

  /** The zone of a local time: "UTC", or its offset, "UTC+05:30". */
  function zone(d) {
    const offset = -d.getTimezoneOffset();
    if (offset === 0) return "UTC";
    const sign = offset > 0 ? "+" : "-";
    const minutes = Math.abs(offset);
    return `UTC${sign}${pad(Math.floor(minutes / 60))}:${pad(minutes % 60)}`;
  }

  function clock(epoch) {
    const d = new Date(epoch * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  /** A duration in seconds, short: 850ms, 4.2s, 3m05s, 2h10m. */
  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    if (seconds < 1) return `${Math.max(0, Math.round(seconds * 1000))}ms`;
    if (seconds < 60) return `${seconds.toFixed(1)}s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m${pad(Math.floor(seconds % 60))}s`;
    return `${Math.floor(seconds / 3600)}h${pad(Math.floor((seconds % 3600) / 60))}m`;
  }

  function tokens(usage) {
    if (!usage) return "";
    const i = usage.input_tokens || 0;
    const o = usage.output_tokens || 0;
    return i || o ? `${i.toLocaleString()} in / ${o.toLocaleString()} out` : "";
  }

  /** US dollars, short but never cut to nothing: $1.2346, $0.0123, and
   * below a cent two significant digits written out ($0.000042). */
  function cost(usd) {
    if (usd === null || usd === undefined) return "";
    if (usd === 0) return "$0";
    if (usd >= 0.01) return `$${usd.toFixed(4)}`;
    const places = Math.min(20, 1 - Math.floor(Math.log10(usd)));
    return `$${usd.toFixed(places).replace(/0+$/, "")}`;
  }

  /** The exact amount, for a title: what `cost` rounded. */
  function exactCost(usd) {
    return usd === null || usd === undefined ? "" : `$${usd}`;
  }

  /** JSON on one line, cut to `max` characters (for a row; the detail pane has it whole). */
  function brief(value, max = 160) {
    if (value === null || value === undefined) return "";
    const text = typeof value === "string" ? value : JSON.stringify(value);
    return text.length > max ? `${text.slice(0, max - 1)}…` : text;
  }

  function statusBadge(status) {
    return h("span", { className: `badge st-${status}` }, String(status).replace("_", " "));
  }

  const ATTENTION = {
    stuck: "stuck",
    in_doubt: "in doubt",
    awaiting_approval: "awaiting approval",
    child_waiting: "child waiting",
    paused: "paused",
    blocked: "blocked",
    unswept: "not swept",
  };

  /** Why a run needs an operator, unless its status says it already (a
   * paused run is not badged "paused" twice); ``detail`` is its sentence. */
  function attentionBadge(attention, status, detail) {
    if (!attention || attention === status) return null;
    return h(
      "span",
      { className: `attn attn-${attention}`, title: detail || "needs an operator" },
      ATTENTION[attention] || attention
    );
  }

  /**
   * A list that keeps only the rows on screen (plus a margin) in the DOM, so
   * a run of any length opens as fast as a short one. Rows have one fixed
   * height; `renderRow(i)` builds row i (placeholders for data not loaded
   * yet), and `onRange(first, last)` hears which rows are wanted, to fetch them.
   */
  class VirtualList {
    constructor(viewport, head, rowHeight, renderRow, onRange, maxRows = 15) {
      this.viewport = viewport;
      this.maxRows = maxRows;
      this.head = head;
      this.rowHeight = rowHeight;
      this.renderRow = renderRow;
      this.onRange = onRange || (() => {});
      this.count = 0;
      this.rows = new Map();
      this.spacer = h("div", { className: "spacer" });
      viewport.replaceChildren(this.spacer);
      this.scheduled = false;
      viewport.addEventListener("scroll", () => this.schedule());
      window.addEventListener("resize", () => this.schedule());
    }

    setCount(count) {
      if (count === this.count) return;
      this.count = count;
      this.spacer.style.height = `${count * this.rowHeight}px`;
      // As tall as its rows, up to maxRows: a short run takes little room.
      this.viewport.style.height = `${Math.max(1, Math.min(count, this.maxRows)) * this.rowHeight + 2}px`;
      this.schedule();
    }

    schedule() {
      if (this.scheduled) return;
      this.scheduled = true;
      requestAnimationFrame(() => {
        this.scheduled = false;
        this.render(false);
      });
    }

    range() {
      const overscan = 10;
      const top = this.viewport.scrollTop;
      const first = Math.max(0, Math.floor(top / this.rowHeight) - overscan);
      const visible = Math.ceil(this.viewport.clientHeight / this.rowHeight);
      const last = Math.min(this.count - 1, first + visible + 2 * overscan);
      return [first, last];
    }

    /** Draw the rows in range; `all` redraws those already drawn (new data). */
    render(all = true) {
      // The header lines up with the rows above the scrollbar.
      if (this.head) {
        const gutter = this.viewport.offsetWidth - this.viewport.clientWidth;
        this.head.style.paddingRight = `${8 + gutter}px`;
      }
      const [first, last] = this.range();
      for (const [i, row] of this.rows) {
        if (i < first || i > last) {
          row.remove();
          this.rows.delete(i);
        }
      }
      for (let i = first; i <= last; i++) {
        const old = this.rows.get(i);
        if (old && !all && !old.classList.contains("loading")) continue;
        const row = this.renderRow(i);
        row.classList.add("vrow");
        row.dataset.index = String(i);
        row.style.top = `${i * this.rowHeight}px`;
        if (old) old.replaceWith(row);
        else this.spacer.append(row);
        this.rows.set(i, row);
      }
      if (last >= first) this.onRange(first, last);
    }

    scrollToIndex(i, align = "start") {
      const top = i * this.rowHeight;
      const height = this.viewport.clientHeight;
      this.viewport.scrollTop = align === "end" ? top - height + this.rowHeight : top;
      this.render(false);
    }

    /** The first and last rows wholly or partly on screen (0-based). */
    visible() {
      const v = this.viewport;
      const first = Math.floor(v.scrollTop / this.rowHeight);
      const last = Math.ceil((v.scrollTop + v.clientHeight) / this.rowHeight) - 1;
      return [Math.min(first, this.count - 1), Math.min(last, this.count - 1)];
    }

    atEnd() {
      const v = this.viewport;
      return v.scrollTop + v.clientHeight >= v.scrollHeight - this.rowHeight;
    }
  }

  return {
    h,
    fill,
    fitText,
    api,
    poll,
    setLive,
    ApiError,
    Unauthorized,
    when,
    clock,
    duration,
    tokens,
    cost,
    exactCost,
    brief,
    statusBadge,
    attentionBadge,
    VirtualList,
  };
})();
