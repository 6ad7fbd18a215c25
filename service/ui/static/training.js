// One training: its state (polled from GET /v1/trainings/{id} while it is active), the
// timeline of its status_history, its learners, its live logs (a followed stream of
// GET .../logs?follow=true), its metrics as line charts (GET .../metrics, one line per
// learner), its results, and the stop, delete and deploy actions.
"use strict";
(function () {
  const { api, el, statusBadge, when, duration, bytes, showError, confirmAction, TERMINAL } = window.DLaaS;
  const root = document.getElementById("training");
  const id = root.dataset.trainingId;
  const base = `/v1/trainings/${encodeURIComponent(id)}`;
  let training = null;
  let results = [];
  let gone = false; // the training is not (or no longer) the caller's

  // ---- state, timeline, learners ------------------------------------------------------
  function fact(name, value) { return [el("dt", {}, name), el("dd", {}, value)]; }

  function render(t) {
    document.title = `${t.name} · DLaaS`;
    document.getElementById("name").textContent = t.name;
    document.getElementById("status").replaceChildren(statusBadge(t.status));
    document.getElementById("facts").replaceChildren(
      ...fact("Id", t.id),
      ...fact("Framework", `${t.framework.name} ${t.framework.version}`),
      ...fact("Compute", `${t.compute_configuration.name} × ${t.compute_configuration.nodes}`),
      ...fact("Attempt", t.attempt),
      ...fact("Created", when(t.created_at)),
      ...fact("Duration", duration(t.started_at, t.completed_at) || "not started"),
      ...(t.status_message ? fact("Message", t.status_message) : []),
      // What this machine could not enforce as asked: said once, here.
      ...(t.limits_note ? fact("Limits", t.limits_note) : []));
    // A message is shown where it changes, not again on every later state.
    document.getElementById("timeline").replaceChildren(...t.status_history.map((e, i) => {
      const repeated = i > 0 && e.message === t.status_history[i - 1].message;
      return el("li", {}, el("time", { datetime: e.at }, when(e.at)), " ", statusBadge(e.status),
        e.attempt > 1 ? ` attempt ${e.attempt}` : "", e.message && !repeated ? ` ${e.message}` : "");
    }));
    document.querySelector("#learners tbody").replaceChildren(...t.learners.map((l) =>
      el("tr", { "data-learner": l.learner_id }, el("td", {}, `learner ${l.learner_id}`),
        el("td", {}, statusBadge(l.status), l.status_message ? `: ${l.status_message}` : ""),
        el("td", {}, l.exit_code === null ? "" : l.exit_code))));
    const select = document.getElementById("log-learner");
    if (select.options.length === 1) {
      for (const l of t.learners) select.append(el("option", { value: l.learner_id }, `learner ${l.learner_id}`));
    }
    const ended = TERMINAL.has(t.status);
    document.getElementById("actions").hidden = false;
    document.getElementById("stop").hidden = ended || t.stop_requested;
    updateDeploy();
  }

  async function poll() {
    try {
      const t = await api("GET", base);
      const wasActive = training === null || !TERMINAL.has(training.status);
      training = t;
      showError(null);
      render(t);
      if (!TERMINAL.has(t.status)) {
        setTimeout(poll, 1500);
      } else if (wasActive) {
        loadMetrics();
        loadResults();
      }
    } catch (e) {
      if (e.status === 404) {
        gone = true;
        document.getElementById("name").textContent = "Training not found";
        showError(e);
        for (const s of root.querySelectorAll("section")) s.hidden = true;
        stopLogs();
        return;
      }
      showError(e);
      setTimeout(poll, 5000);
    }
  }

  // ---- logs ---------------------------------------------------------------------------
  const logBox = document.getElementById("log");
  const search = document.getElementById("log-search");
  const follow = document.getElementById("log-follow");
  const pause = document.getElementById("log-pause");
  const logState = document.getElementById("log-state");
  const MAX_LINES = 20000;
  let lines = [];
  let paused = false;
  let controller = null;

  function renderLog() {
    if (paused) return;
    const needle = search.value.toLowerCase();
    const shown = needle ? lines.filter((l) => l.toLowerCase().includes(needle)) : lines;
    logBox.textContent = shown.join("\n");
    if (follow.checked) logBox.scrollTop = logBox.scrollHeight;
  }

  function stopLogs() { if (controller) controller.abort(); controller = null; }

  async function streamLogs() {
    stopLogs();
    const mine = (controller = new AbortController());
    lines = [];
    renderLog();
    const learner = document.getElementById("log-learner").value;
    const params = new URLSearchParams({ follow: "true" });
    if (learner) params.set("learner", learner);
    logState.textContent = "following";
    try {
      const response = await fetch(`${base}/logs?${params}`, { credentials: "same-origin", signal: mine.signal });
      if (!response.ok) {
        const retry = Number(response.headers.get("retry-after") || 0);
        logState.textContent = `logs unavailable (HTTP ${response.status})`;
        if (response.status === 429) setTimeout(() => { if (controller === mine) streamLogs(); }, retry * 1000 || 5000);
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let partial = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        partial += decoder.decode(value, { stream: true });
        const parts = partial.split("\n");
        partial = parts.pop();
        if (parts.length) {
          lines.push(...parts);
          if (lines.length > MAX_LINES) lines = lines.slice(-MAX_LINES);
          renderLog();
        }
      }
      if (partial) { lines.push(partial); renderLog(); }
      if (controller === mine) logState.textContent = "end of log: the training ended";
    } catch (e) {
      if (e.name !== "AbortError") logState.textContent = `log stream broke: ${e.message}`;
    }
  }

  search.addEventListener("input", renderLog);
  follow.addEventListener("change", renderLog);
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume" : "Pause";
    logState.textContent = paused ? "paused: new lines are kept, not shown" : "following";
    renderLog();
  });
  document.getElementById("log-learner").addEventListener("change", streamLogs);

  // ---- metrics ------------------------------------------------------------------------
  const metricsBox = document.getElementById("metrics");
  const xChoice = document.getElementById("metric-x");
  const charts = {};
  let metrics = {};
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

  function xOf(point, index) {
    if (xChoice.value === "time") return Date.parse(point.timestamp) / 1000;
    return point.step === null || point.step === undefined ? index : point.step;
  }

  // uPlot's columns: the union of every learner's x values, and one column per learner
  // with null where that learner has no point.
  function columns(points) {
    const learners = [...new Set(points.map((p) => p.learner))].sort((a, b) => a - b);
    const byLearner = new Map(learners.map((l) => [l, new Map()]));
    const seen = new Map(learners.map((l) => [l, 0]));
    for (const p of points) {
      const i = seen.get(p.learner);
      seen.set(p.learner, i + 1);
      byLearner.get(p.learner).set(xOf(p, i), p.value);
    }
    const xs = [...new Set([].concat(...[...byLearner.values()].map((m) => [...m.keys()])))].sort((a, b) => a - b);
    return { learners, data: [xs, ...learners.map((l) => xs.map((x) => (byLearner.get(l).has(x) ? byLearner.get(l).get(x) : null)))] };
  }

  function table(name, points) {
    return el("table", { class: "list metric-data", "data-metric": name },
      el("caption", {}, `${name}: every point`),
      el("thead", {}, el("tr", {}, ...["Learner", "Step", "Time", "Value"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...points.map((p) => el("tr", { "data-learner": p.learner, "data-step": p.step ?? "", "data-timestamp": p.timestamp, "data-value": p.value },
        el("td", {}, p.learner), el("td", {}, p.step ?? ""), el("td", {}, p.timestamp), el("td", {}, p.value)))));
  }

  function drawMetric(name, points) {
    const { learners, data } = columns(points);
    const key = `${name}|${xChoice.value}|${learners.join(",")}`;
    let entry = charts[name];
    if (!entry || entry.key !== key) {
      if (entry) { entry.plot.destroy(); entry.box.remove(); }
      const box = el("figure", { class: "metric", "data-metric": name, "data-learners": learners.length },
        el("figcaption", {}, `${name} against ${xChoice.value}`));
      const chart = el("div", { class: "chart", role: "img", "aria-label": `${name} against ${xChoice.value}, one line per learner` });
      const details = el("details", {}, el("summary", {}, `${name}: data`));
      box.append(chart, details);
      metricsBox.append(box);
      const time = xChoice.value === "time";
      const plot = new uPlot({
        width: Math.min(900, metricsBox.clientWidth || 900),
        height: 260,
        scales: { x: { time } },
        axes: [{ label: xChoice.value }, { label: name }],
        series: [{ label: xChoice.value }, ...learners.map((l, i) => ({
          // Dashed every other line: learners that log the same values stay visible.
          label: `learner ${l}`, stroke: COLOURS[i % COLOURS.length], width: 2, dash: i % 2 ? [8, 5] : undefined,
          spanGaps: true, points: { show: true },
        }))],
      }, data, chart);
      entry = charts[name] = { key, plot, box, details };
    } else {
      entry.plot.setData(data);
    }
    entry.details.replaceChildren(el("summary", {}, `${name}: data`), table(name, points));
  }

  function drawMetrics() {
    const names = Object.keys(metrics).filter((n) => metrics[n].length);
    document.getElementById("metrics-empty").hidden = names.length > 0;
    for (const name of names) drawMetric(name, metrics[name]);
  }

  async function loadMetrics() {
    if (gone) return;
    try {
      metrics = await api("GET", `${base}/metrics`);
      drawMetrics();
    } catch (e) {
      document.getElementById("metrics-empty").textContent = `Metrics unavailable: ${e.message}`;
    }
  }

  async function metricsLoop() {
    await loadMetrics();
    if (!gone && (training === null || !TERMINAL.has(training.status))) setTimeout(metricsLoop, 2000);
  }
  xChoice.addEventListener("change", drawMetrics);

  // ---- results and actions ------------------------------------------------------------
  async function loadResults() {
    if (gone) return;
    // The listing comes in pages of up to 1,000 files (next_cursor); the page shows the
    // first ten of them at most (every file is in results.tar.gz).
    try {
      results = [];
      let cursor = null;
      for (let page = 0; page < 10; page++) {
        const query = cursor === null ? "" : `?cursor=${encodeURIComponent(cursor)}`;
        const listed = await api("GET", `${base}/results${query}`);
        results.push(...(listed.files || []));
        cursor = listed.next_cursor || null;
        if (cursor === null) break;
      }
    } catch (e) {
      results = [];
    }
    document.querySelector("#results tbody").replaceChildren(...results.map((f) =>
      el("tr", {}, el("td", {}, el("a", { href: `${base}/results/${f.path.split("/").map(encodeURIComponent).join("/")}`, download: f.path.split("/").pop() }, f.path)),
        el("td", {}, bytes(f.size)), el("td", {}, when(f.last_modified)))));
    updateDeploy();
  }

  function updateDeploy() {
    const deployable = training && training.status === "COMPLETED"
      && results.some((f) => f.path === "saved_model.pb" || f.path.endsWith("/saved_model.pb"));
    document.getElementById("deploy").hidden = !deployable;
  }

  document.getElementById("stop").addEventListener("click", async () => {
    if (!confirmAction(`Stop training ${training.name}? Its learners are stopped.`)) return;
    try { render(await api("POST", `${base}/stop`)); poll(); } catch (e) { showError(e); }
  });
  document.getElementById("delete").addEventListener("click", async () => {
    if (!confirmAction(`Delete training ${training.name} and everything stored for it?`)) return;
    try { stopLogs(); await api("DELETE", base); window.location.assign("/ui/trainings"); } catch (e) { showError(e); }
  });
  document.getElementById("deploy").addEventListener("click", async () => {
    try {
      const d = await api("POST", "/v1/deployments", { training_id: id });
      window.location.assign(`/ui/deployments/${encodeURIComponent(d.id)}`);
    } catch (e) { showError(e); }
  });

  poll();
  streamLogs();
  metricsLoop();
  loadResults();
})();
