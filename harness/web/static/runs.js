// The runs page: counts by status (each one a filter), the filters, one page
// of runs newest first (pages follow the API's keyset cursor), refreshed
// every two seconds in place. Filters live in the address, so a filtered
// view can be reloaded or shared.
"use strict";

(() => {
  const { h, fill, api, poll, when, cost, exactCost, brief, statusBadge, attentionBadge } = Harness;
  const STATUSES = ["pending", "running", "waiting", "paused", "completed", "failed", "cancelled", "diverged"];
  // Runs per page: 50, or the address's `limit` (1 to 1000, as the API allows).
  const asked = Number(new URLSearchParams(location.search).get("limit"));
  const PAGE = Number.isInteger(asked) && asked >= 1 && asked <= 1000 ? asked : 50;

  const form = document.getElementById("filters");
  const body = document.getElementById("runs-body");
  // Cursors of the pages seen so far: pages[0] is the first (null), and the
  // "Newer" button steps back through them.
  let pages = [null];
  let page = 0;
  let nextCursor = null;

  function filtersFromAddress() {
    const q = new URLSearchParams(location.search);
    return {
      status: q.get("status") || "",
      agent: q.get("agent") || "",
      created_after: q.get("created_after") || "",
      created_before: q.get("created_before") || "",
    };
  }

  let filters = filtersFromAddress();

  const pad = (n) => String(n).padStart(2, "0");
  function toLocalInput(epoch) {
    if (!epoch) return "";
    const d = new Date(Number(epoch) * 1000);
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
      `T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
    );
  }
  function fromLocalInput(value) {
    if (!value) return "";
    const ms = new Date(value).getTime();
    return isFinite(ms) ? String(ms / 1000) : "";
  }

  function showFilters() {
    form.status.value = filters.status;
    form.agent.value = filters.agent;
    form.after.value = toLocalInput(filters.created_after);
    form.before.value = toLocalInput(filters.created_before);
  }

  function applyFilters(next) {
    filters = next;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    if (PAGE !== 50) q.set("limit", String(PAGE));
    const query = q.toString();
    history.replaceState(null, "", query ? `/?${query}` : "/");
    pages = [null];
    page = 0;
    showFilters();
    poller.now();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    applyFilters({
      status: form.status.value,
      agent: form.agent.value.trim(),
      created_after: fromLocalInput(form.after.value),
      created_before: fromLocalInput(form.before.value),
    });
  });
  document.getElementById("f-clear").addEventListener("click", () =>
    applyFilters({ status: "", agent: "", created_after: "", created_before: "" })
  );
  document.getElementById("first").addEventListener("click", () => {
    page = 0;
    poller.now();
  });
  document.getElementById("prev").addEventListener("click", () => {
    page = Math.max(0, page - 1);
    poller.now();
  });
  document.getElementById("next").addEventListener("click", () => {
    if (!nextCursor) return;
    pages[page + 1] = nextCursor;
    page += 1;
    poller.now();
  });

  function renderCounts(stats) {
    const byStatus = stats.runs_by_status || {};
    const names = [...STATUSES, ...Object.keys(byStatus).filter((s) => !STATUSES.includes(s))];
    const total = names.reduce((sum, s) => sum + (byStatus[s] || 0), 0);
    fill(document.getElementById("total"), `${total.toLocaleString()} runs`);
    fill(
      document.getElementById("counts"),
      names.map((status) =>
        h(
          "button",
          {
            type: "button",
            className: `count st-${status}${filters.status === status ? " active" : ""}`,
            title: filters.status === status ? "clear this filter" : `show only ${status} runs`,
            dataset: { status },
            onclick: () => applyFilters({ ...filters, status: filters.status === status ? "" : status }),
          },
          h("span", { className: "n" }, (byStatus[status] || 0).toLocaleString()),
          h("span", { className: "label" }, status)
        )
      )
    );
    const stuck = stats.running_steps_older_than_alert || 0;
    const alertAfter = stats.running_alert_seconds;
    fill(
      document.getElementById("alerts"),
      h(
        "span",
        { className: stuck ? "hot" : "muted", id: "stuck-count" },
        `${stuck} step${stuck === 1 ? "" : "s"} RUNNING longer than ${alertAfter}s (stuck)`
      ),
      h("span", { className: "muted" }, `${byStatus.waiting || 0} waiting for an operator`),
      h("span", { className: "muted" }, `${stats.in_doubt_steps || 0} steps ever found in doubt`),
      h("span", { className: "muted" }, `${stats.sweeper_redispatches || 0} sweeper re-dispatches`)
    );
  }

  function runRow(run) {
    const link = `/runs/${encodeURIComponent(run.run_id)}`;
    return h(
      "tr",
      { className: run.attention ? "attention" : null, dataset: { runId: run.run_id } },
      h("td", { className: "mono", title: run.run_id }, h("a", { href: link }, run.run_id)),
      h("td", { title: run.agent }, run.agent),
      h("td", { className: "goal-cell", title: brief(run.goal, 2000) }, brief(run.goal, 300)),
      h("td", {}, statusBadge(run.status)),
      h(
        "td",
        { title: run.blocked || run.error || "" },
        attentionBadge(run.attention, run.status, run.attention_detail)
      ),
      h("td", { className: "num", title: `cursor at step ${run.cursor}` }, run.step_count.toLocaleString()),
      h("td", { title: `updated ${when(run.updated_at)}` }, when(run.created_at)),
      h("td", { className: "num", title: exactCost(run.cost_usd) }, cost(run.cost_usd))
    );
  }

  async function refresh() {
    const q = new URLSearchParams({ limit: String(PAGE) });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    if (pages[page]) q.set("cursor", pages[page]);
    const [stats, listing] = await Promise.all([api("/api/stats"), api(`/api/runs?${q}`)]);
    renderCounts(stats);
    nextCursor = listing.next_cursor;
    const runs = listing.runs;
    if (runs.length) fill(body, runs.map(runRow));
    else fill(body, h("tr", {}, h("td", { colspan: "8", className: "empty" }, "No runs match.")));
    const attention = runs.filter((r) => r.attention).length;
    fill(
      document.getElementById("page-note"),
      attention ? `${attention} on this page need attention` : ""
    );
    fill(document.getElementById("page-no"), `page ${page + 1}`);
    document.getElementById("prev").disabled = page === 0;
    document.getElementById("first").disabled = page === 0;
    document.getElementById("next").disabled = !nextCursor;
  }

  showFilters();
  const poller = poll(refresh, 2000);
})();
