// The deployments list (GET /v1/deployments), refreshed while any is DEPLOYING.
"use strict";
(function () {
  const { api, el, statusBadge, age, showError } = window.DLaaS;

  function shapes(tensors) {
    return tensors.map((t) => `${t.name} ${t.dtype}${JSON.stringify(t.shape)}`).join(", ");
  }

  async function load() {
    try {
      const { items } = await api("GET", "/v1/deployments");
      showError(null);
      document.querySelector("#deployments tbody").replaceChildren(...items.map((d) =>
        el("tr", { "data-id": d.id },
          el("td", {}, el("a", { href: `/ui/deployments/${encodeURIComponent(d.id)}` }, d.name)),
          el("td", {}, statusBadge(d.status)),
          el("td", {}, el("a", { href: `/ui/trainings/${encodeURIComponent(d.training_id)}` }, d.training_id)),
          el("td", {}, d.signature ? `${shapes(d.signature.inputs)} → ${shapes(d.signature.outputs)}` : ""),
          el("td", {}, age(d.created_at)))));
      document.getElementById("empty").hidden = items.length > 0;
      if (items.some((d) => d.status === "DEPLOYING")) setTimeout(load, 2000);
    } catch (e) {
      showError(e);
    }
  }
  load();
})();
