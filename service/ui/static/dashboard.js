// What every page of the dashboard shares: calls to the public /v1 API (the session cookie
// authenticates them; state-changing ones send the CSRF header), problem+json errors, and
// small formatting functions.
"use strict";

window.DLaaS = (function () {
  const CSRF_HEADER = "X-DLaaS-CSRF";
  const TERMINAL = new Set(["COMPLETED", "FAILED", "HALTED"]);

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem || {};
      this.errors = (problem && problem.errors) || [];
    }
  }

  async function problemOf(response) {
    const type = response.headers.get("content-type") || "";
    if (type.includes("json")) {
      try { return await response.json(); } catch (e) { /* fall through */ }
    }
    return { detail: (await response.text()) || response.statusText };
  }

  // One call to the API. `body`: an object (sent as JSON) or FormData.
  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", headers: {} };
    if (method !== "GET" && method !== "HEAD") init.headers[CSRF_HEADER] = "1";
    if (body instanceof FormData) {
      init.body = body;
    } else if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      window.location.assign("/ui/sign-in");
      throw new ApiError(401, await problemOf(response));
    }
    if (!response.ok) throw new ApiError(response.status, await problemOf(response));
    if (response.status === 204) return null;
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : response.text();
  }

  // An element: el("td", {class: "x"}, "text", child...).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function statusBadge(status) {
    return el("span", { class: `badge s-${String(status).toLowerCase()}` }, status);
  }

  function seconds(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  function age(iso) { return seconds((Date.now() - Date.parse(iso)) / 1000); }

  function duration(startIso, endIso) {
    if (!startIso) return "";
    const end = endIso ? Date.parse(endIso) : Date.now();
    return seconds((end - Date.parse(startIso)) / 1000);
  }

  function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }

  function bytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  }

  function showError(error, id) {
    const box = document.getElementById(id || "error");
    if (!box) return;
    if (!error) { box.hidden = true; box.textContent = ""; return; }
    box.textContent = error.message || String(error);
    box.hidden = false;
  }

  // A confirmation the keyboard can answer (the browser's own dialog).
  function confirmAction(message) { return window.confirm(message); }

  return {
    ApiError, api, el, statusBadge, age, duration, when, bytes, showError, confirmAction,
    TERMINAL, CSRF_HEADER,
  };
})();
