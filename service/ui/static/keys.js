// A tenant's API keys (GET/POST/DELETE /v1/tenants/{id}/keys): list, issue another (the
// new key shown once), revoke. Rotation is issue, switch, revoke.
"use strict";
window.DLaaS.keys = (function () {
  const { api, el, when, showError, confirmAction } = window.DLaaS;

  function announce(label, key) {
    document.getElementById("new-key-label").textContent = label;
    document.getElementById("new-key-value").textContent = key;
    document.getElementById("new-key").hidden = false;
  }

  async function show(tenantId, tenantName) {
    const box = document.getElementById("keys");
    box.dataset.tenantId = tenantId;
    const path = `/v1/tenants/${encodeURIComponent(tenantId)}/keys`;
    try {
      const { items } = await api("GET", path);
      showError(null);
      const rows = items.map((k) => el("tr", { "data-key-id": k.id },
        el("td", {}, el("code", {}, `${k.prefix}…`)), el("td", {}, when(k.created)),
        el("td", {}, k.last_used ? when(k.last_used) : "never"),
        el("td", {}, k.revoked ? `revoked ${when(k.revoked)}` : "valid"),
        el("td", {}, k.revoked ? "" : el("button", {
          type: "button", class: "danger", "aria-label": `Revoke key ${k.prefix}`,
          onclick: async () => {
            if (!confirmAction(`Revoke key ${k.prefix}…? Requests with it are refused within a second.`)) return;
            try { await api("DELETE", `${path}/${encodeURIComponent(k.id)}`); show(tenantId, tenantName); } catch (e) { showError(e); }
          },
        }, "Revoke"))));
      box.replaceChildren(
        el("table", { class: "list" },
          el("caption", {}, tenantName ? `Keys of ${tenantName}` : "Your keys"),
          el("thead", {}, el("tr", {}, ...["Key", "Created", "Last used", "State", ""].map((h) => el("th", { scope: "col" }, h)))),
          el("tbody", {}, ...rows)),
        el("button", {
          type: "button", id: "issue-key",
          onclick: async () => {
            try {
              const created = await api("POST", path);
              announce(`New key ${created.prefix}… for ${tenantName || "you"}:`, created.api_key);
              show(tenantId, tenantName);
            } catch (e) { showError(e); }
          },
        }, "Issue a new key"));
    } catch (e) {
      showError(e);
    }
  }
  return { show, announce };
})();
