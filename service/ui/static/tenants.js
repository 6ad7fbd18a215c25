// The admin's tenants page: list (GET /v1/tenants), create (the first key shown once),
// and each tenant's keys.
"use strict";
(function () {
  const { api, el, when, showError } = window.DLaaS;
  const { show, announce } = window.DLaaS.keys;

  async function load() {
    try {
      const { items } = await api("GET", "/v1/tenants");
      showError(null);
      document.querySelector("#tenants tbody").replaceChildren(...items.map((t) =>
        el("tr", { "data-tenant": t.name }, el("td", {}, t.name), el("td", {}, t.plan), el("td", {}, el("code", {}, t.id)),
          el("td", {}, when(t.created_at)),
          el("td", {}, el("button", {
            type: "button", "aria-label": `Keys of ${t.name}`,
            onclick: () => { document.getElementById("keys-section").hidden = false; show(t.id, t.name); },
          }, "Keys")))));
    } catch (e) {
      showError(e);
    }
  }

  document.getElementById("create-tenant").addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = document.getElementById("tenant-name").value.trim();
    const plan = document.getElementById("tenant-plan").value.trim();
    try {
      const created = await api("POST", "/v1/tenants", { name, plan });
      announce(`Tenant ${created.name} created. Its API key:`, created.api_key);
      event.target.reset();
      load();
    } catch (e) {
      showError(e);
    }
  });
  load();
})();
