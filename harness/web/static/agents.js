// The agents page: the agents live workers carry (GET /api/agents), their
// tools and the workers carrying them, refreshed every five seconds. Names
// come from the workers' code: shown as text (h() never parses markup).
"use strict";

(() => {
  const { h, fill, api, poll, when } = Harness;
  const body = document.getElementById("agents-body");

  /** "sha256:<hex>" as the CLI shows it: 12 hex digits. */
  const short = (digest) => String(digest).replace(/^sha256:/, "").slice(0, 12);

  function ago(epoch) {
    const seconds = Math.max(0, Date.now() / 1000 - epoch);
    return seconds < 60 ? `${Math.round(seconds)}s ago` : `${Math.round(seconds / 60)}m ago`;
  }

  function toolItem(tool) {
    return h(
      "li",
      { dataset: { tool: tool.name } },
      h("span", { className: "mono" }, tool.name),
      " ",
      h("span", { className: "tool-effect" }, tool.effect),
      tool.requires_approval ? h("span", { className: "attn approval" }, "approval") : null
    );
  }

  function workerItem(worker, mixed) {
    return h(
      "li",
      { dataset: { worker: worker.name }, title: `last seen ${when(worker.last_seen)}` },
      h("span", { className: "mono" }, worker.name),
      mixed ? h("span", { className: "mono muted" }, ` ${short(worker.definition_hash)}`) : null,
      h("span", { className: "muted" }, ` seen ${ago(worker.last_seen)}`)
    );
  }

  function agentRow(agent) {
    const definitions = new Set(agent.workers.map((w) => w.definition_hash)).size;
    return h(
      "tr",
      { className: agent.mixed_release ? "mixed" : null, dataset: { agent: agent.name } },
      h("td", { className: "mono" }, agent.name),
      h(
        "td",
        { title: agent.definition_hash },
        h("span", { className: "mono" }, short(agent.definition_hash)),
        agent.mixed_release
          ? h("div", {}, h("span", { className: "attn mixed-badge" }, `mixed release: ${definitions} definitions`))
          : null
      ),
      h("td", {}, agent.tools.length ? h("ul", {}, agent.tools.map(toolItem)) : h("span", { className: "muted" }, "no tools")),
      h("td", {}, h("ul", {}, agent.workers.map((w) => workerItem(w, agent.mixed_release))))
    );
  }

  async function refresh() {
    const agents = await api("/api/agents");
    if (agents.length) fill(body, agents.map(agentRow));
    else
      fill(
        body,
        h(
          "tr",
          {},
          h(
            "td",
            { colspan: "4", className: "empty" },
            "No live worker has published an agent: workers publish theirs when they start."
          )
        )
      );
    const workers = new Set(agents.flatMap((a) => a.workers.map((w) => w.name))).size;
    const mixed = agents.filter((a) => a.mixed_release).length;
    fill(
      document.getElementById("agents-note"),
      `${agents.length} agent${agents.length === 1 ? "" : "s"} on ${workers} worker${workers === 1 ? "" : "s"}` +
        (mixed ? `, ${mixed} in a mixed release` : "")
    );
  }

  poll(refresh, 5000);
})();
