// Submit a training: the fields make the manifest (JSON), sent with the code archive as
// POST /v1/trainings; the upload's progress is shown, and each validation message of the
// API's problem+json is put next to the field its JSON pointer names.
"use strict";
(function () {
  const { el, CSRF_HEADER } = window.DLaaS;
  const form = document.getElementById("submit-form");
  const preview = document.getElementById("manifest-preview");
  const progress = document.getElementById("upload-progress");
  const percent = document.getElementById("upload-percent");
  const general = document.getElementById("form-errors");
  const button = document.getElementById("submit-button");
  const done = document.getElementById("submitted");
  const value = (id) => document.getElementById(id).value.trim();

  function manifest() {
    const doc = {
      name: value("m-name"),
      framework: { name: value("m-framework"), version: value("m-version"), command: value("m-command") },
      compute_configuration: { name: value("m-compute"), nodes: Number(value("m-nodes")) },
    };
    const extra = JSON.parse(value("m-extra") || "{}"); // a SyntaxError is shown by the caller
    if (extra === null || typeof extra !== "object" || Array.isArray(extra)) {
      throw new SyntaxError("it must be a JSON object: {\"field\": value, ...}");
    }
    Object.assign(doc, extra);
    if (value("m-ps") !== "") doc.framework.parameter_servers = Number(value("m-ps"));
    if (value("m-description")) doc.description = value("m-description");
    if (value("m-max-runtime")) doc.max_runtime = Number(value("m-max-runtime"));
    const metrics = value("m-metrics").split("\n").map((l) => l.trim()).filter(Boolean);
    if (metrics.length) {
      doc.evaluation_metrics = metrics.map((line) => {
        const at = line.indexOf(":");
        return at < 0 ? { name: line, regex: "" }
          : { name: line.slice(0, at).trim(), regex: line.slice(at + 1).trim() };
      });
    }
    return doc;
  }

  function showPreview() {
    try {
      preview.textContent = JSON.stringify(manifest(), null, 2);
    } catch (e) {
      preview.textContent = `(the other manifest fields are not valid JSON: ${e.message})`;
    }
  }

  function clearErrors() {
    for (const node of form.querySelectorAll(".field-error")) node.remove();
    for (const node of form.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
      node.removeAttribute("aria-describedby");
    }
    general.hidden = true;
    general.replaceChildren();
  }

  // The form field a JSON pointer names: the longest data-field that is a prefix of it.
  function fieldFor(pointer) {
    let best = null;
    for (const field of form.querySelectorAll(".field[data-field]")) {
      const name = field.dataset.field;
      // "" (the other fields' box) takes any pointer no longer name takes.
      if ((pointer === name || pointer.startsWith(name + "/"))
          && (!best || name.length > best.dataset.field.length)) best = field;
    }
    return best;
  }

  function showErrors(problem) {
    clearErrors();
    const errors = problem.errors && problem.errors.length ? problem.errors
      : [{ field: "", message: problem.detail || problem.title || "the submission was refused" }];
    const loose = [];
    errors.forEach((error, i) => {
      // A refusal that names no field (a quota, a size) is the form's, not a field's.
      const field = error.field ? fieldFor(error.field) : null;
      if (!field) { loose.push(error); return; }
      const id = `error-${i}`;
      const control = field.querySelector("input, textarea, select");
      control.setAttribute("aria-invalid", "true");
      control.setAttribute("aria-describedby", id);
      field.append(el("p", { class: "field-error", id, role: "alert" }, error.field !== "/" ? `${error.field}: ${error.message}` : error.message));
    });
    if (loose.length) {
      general.append(el("p", {}, problem.detail || "The submission was refused:"),
        el("ul", {}, ...loose.map((e) => el("li", {}, e.field ? `${e.field}: ${e.message}` : e.message))));
      general.hidden = false;
    }
    const first = form.querySelector("[aria-invalid]");
    if (first) first.focus();
  }

  form.addEventListener("input", showPreview);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearErrors();
    done.hidden = true;
    const file = document.getElementById("m-code").files[0];
    if (!file) {
      showErrors({ errors: [{ field: "model_definition", message: "choose the code archive" }] });
      return;
    }
    let doc;
    try {
      doc = manifest();
    } catch (e) {
      showErrors({ errors: [{ field: "/", message: `not valid JSON: ${e.message}` }] });
      return;
    }
    const data = new FormData();
    data.append("manifest", new Blob([JSON.stringify(doc)], { type: "application/json" }), "manifest.json");
    data.append("model_definition", file, file.name);
    // XMLHttpRequest, not fetch: only it reports an upload's progress.
    const request = new XMLHttpRequest();
    request.open("POST", "/v1/trainings");
    request.setRequestHeader(CSRF_HEADER, "1");
    request.upload.addEventListener("progress", (e) => {
      if (!e.lengthComputable) return;
      const p = Math.round((100 * e.loaded) / e.total);
      progress.value = p;
      progress.textContent = `${p}%`;
      percent.textContent = `${p}%`;
    });
    request.addEventListener("load", () => {
      button.disabled = false;
      let answer = {};
      try { answer = JSON.parse(request.responseText); } catch (e) { answer = { detail: request.responseText }; }
      if (request.status === 201) {
        progress.value = 100;
        percent.textContent = "100%";
        const link = el("a", { href: `/ui/trainings/${encodeURIComponent(answer.id)}`, id: "submitted-link" },
          `Open training ${answer.name}`);
        done.replaceChildren(`Submitted: ${answer.name} is ${answer.status}. `, link);
        done.hidden = false;
        link.focus();
      } else if (request.status === 401) {
        window.location.assign("/ui/sign-in");
      } else {
        showErrors(answer);
      }
    });
    request.addEventListener("error", () => {
      button.disabled = false;
      showErrors({ detail: "the upload failed: the platform could not be reached" });
    });
    button.disabled = true;
    progress.value = 0;
    percent.textContent = "0%";
    request.send(data);
  });
  showPreview();
})();
