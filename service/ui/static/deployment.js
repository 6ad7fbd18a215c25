// One deployment: its status (polled while DEPLOYING), its signature's inputs and outputs,
// and a "try it" form that POSTs a request body to its predictions and shows the answer
// and the latency.
"use strict";
(function () {
  const { api, el, statusBadge, when, showError, confirmAction } = window.DLaaS;
  const root = document.getElementById("deployment");
  const id = root.dataset.deploymentId;
  const base = `/v1/deployments/${encodeURIComponent(id)}`;
  const body = document.getElementById("try-body");
  let deployment = null;

  // A request body that fits the signature: one instance of zeros per input.
  function example(signature) {
    const zeros = (t) => {
      const dims = (t.shape || []).slice(1).map((d) => (d === null ? 1 : d));
      const value = t.dtype === "string" ? "" : t.dtype === "bool" ? false : 0;
      const fill = (rest) => (rest.length ? Array.from({ length: rest[0] }, () => fill(rest.slice(1))) : value);
      return fill(dims);
    };
    if (signature.inputs.length === 1) return { instances: [zeros(signature.inputs[0])] };
    return { instances: [Object.fromEntries(signature.inputs.map((t) => [t.name, zeros(t)]))] };
  }

  function render(d) {
    deployment = d;
    document.title = `${d.name} · DLaaS`;
    document.getElementById("name").textContent = d.name;
    document.getElementById("status").replaceChildren(statusBadge(d.status));
    document.getElementById("status-message").textContent = d.status_message || "";
    document.getElementById("facts").replaceChildren(
      el("dt", {}, "Id"), el("dd", {}, d.id),
      el("dt", {}, "Training"), el("dd", {}, el("a", { href: `/ui/trainings/${encodeURIComponent(d.training_id)}` }, d.training_id)),
      el("dt", {}, "Predictions"), el("dd", {}, el("code", {}, `POST ${d.predictions_url}`)),
      el("dt", {}, "Ready since"), el("dd", {}, when(d.ready_at) || "not ready"));
    const rows = [];
    if (d.signature) {
      for (const [direction, tensors] of [["input", d.signature.inputs], ["output", d.signature.outputs]]) {
        for (const t of tensors) {
          rows.push(el("tr", {}, el("td", {}, direction), el("td", {}, t.name), el("td", {}, t.dtype),
            el("td", {}, t.shape === null ? "unknown rank" : `[${t.shape.map((s) => (s === null ? "any" : s)).join(", ")}]`)));
        }
      }
      if (!body.value) body.value = JSON.stringify(example(d.signature));
    }
    document.querySelector("#signature tbody").replaceChildren(...rows);
    document.getElementById("try-send").disabled = d.status !== "READY";
  }

  async function poll() {
    try {
      const d = await api("GET", base);
      showError(null);
      render(d);
      if (d.status === "DEPLOYING") setTimeout(poll, 1000);
    } catch (e) {
      showError(e);
      if (e.status === 404) {
        document.getElementById("name").textContent = "Deployment not found";
        for (const s of root.querySelectorAll("section")) s.hidden = true;
      }
    }
  }

  document.getElementById("try-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const answer = document.getElementById("try-answer");
    const latency = document.getElementById("try-latency");
    let payload;
    try {
      payload = JSON.parse(body.value);
    } catch (e) {
      answer.textContent = "";
      latency.textContent = `The request body is not JSON: ${e.message}`;
      return;
    }
    const started = performance.now();
    try {
      const result = await api("POST", deployment.predictions_url, payload);
      latency.textContent = `Answered in ${(performance.now() - started).toFixed(1)} ms`;
      answer.textContent = JSON.stringify(result, null, 2);
    } catch (e) {
      latency.textContent = `Refused in ${(performance.now() - started).toFixed(1)} ms (HTTP ${e.status})`;
      answer.textContent = JSON.stringify(e.problem, null, 2);
    }
  });

  document.getElementById("delete").addEventListener("click", async () => {
    if (!deployment || !confirmAction(`Delete deployment ${deployment.name}? Its predictions stop.`)) return;
    try { await api("DELETE", base); window.location.assign("/ui/deployments"); } catch (e) { showError(e); }
  });
  poll();
})();
