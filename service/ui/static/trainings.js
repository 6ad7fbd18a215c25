// The trainings list: filter by status, page with the API's cursors, refresh itself while
// any training on the page is active.
"use strict";
(function () {
  const { api, el, statusBadge, age, duration, showError, TERMINAL } = window.DLaaS;
  const body = document.querySelector("#trainings tbody");
  const filter = document.getElementById("status-filter");
  const older = document.getElementById("older");
  const newer = document.getElementById("newer");
  const refreshState = document.getElementById("refresh-state");
  // Trainings per page: the page's own ?limit= (as the API's), else 20.
  const asked = Number(new URLSearchParams(window.location.search).get("limit"));
  const PAGE = Number.isInteger(asked) && asked >= 1 && asked <= 500 ? asked : 20;
  let cursors = [null]; // the cursor of each page seen, the current one last
  let timer = null;

  function row(t) {
    const link = el("a", { href: `/ui/trainings/${encodeURIComponent(t.id)}` }, t.name);
    return el("tr", { "data-id": t.id },
      el("td", {}, link),
      el("td", {}, `${t.framework.name} ${t.framework.version}`),
      el("td", {}, t.compute_configuration.nodes),
      el("td", {}, statusBadge(t.status)),
      el("td", {}, t.attempt),
      el("td", {}, age(t.created_at)),
      el("td", {}, duration(t.started_at, t.completed_at)));
  }

  async function load() {
    clearTimeout(timer);
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (filter.value) params.set("status", filter.value);
    const cursor = cursors[cursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    try {
      const page = await api("GET", `/v1/trainings?${params}`);
      showError(null);
      body.replaceChildren(...page.items.map(row));
      document.getElementById("empty").hidden = page.items.length > 0;
      older.disabled = !page.next_cursor;
      older.dataset.cursor = page.next_cursor || "";
      newer.disabled = cursors.length < 2;
      const active = page.items.some((t) => !TERMINAL.has(t.status));
      refreshState.textContent = active ? "refreshing while trainings are active" : "";
      if (active) timer = setTimeout(load, 2000);
    } catch (e) {
      showError(e);
      timer = setTimeout(load, 5000);
    }
  }

  filter.addEventListener("change", () => { cursors = [null]; load(); });
  older.addEventListener("click", () => { cursors.push(older.dataset.cursor); load(); });
  newer.addEventListener("click", () => { cursors.pop(); load(); });
  load();
})();
