// verimail dashboard: live job progress, copy buttons and confirmations.
// Plain script, no build step. Pages work without it: unfinished jobs then refresh
// themselves every few seconds (<noscript> meta refresh) and forms submit unconfirmed.
"use strict";
(function () {
  const POLL_MS = 1000;
  const MAX_POLL_MS = 10000;

  function show(value, field) {
    if (typeof value === "number" && field !== "percent_complete") {
      return value.toLocaleString("en");
    }
    return String(value);
  }

  function update(box, job) {
    const scope = box.closest("[data-job]") || box;
    scope.querySelectorAll("[data-field]").forEach(function (el) {
      const field = el.dataset.field;
      if (job[field] !== undefined && job[field] !== null) {
        el.textContent = show(job[field], field);
        if (el.hasAttribute("data-status-class")) el.className = "status status-" + job.status;
      }
    });
    // (the counts by status group, as the server groups them: schemas/status_groups.py)
    const groups = job.status_groups || {};
    scope.querySelectorAll("[data-group]").forEach(function (el) {
      const count = groups[el.dataset.group];
      if (count !== undefined) el.textContent = show(count, "count");
    });
    const bar = box.querySelector("progress");
    if (bar) bar.value = job.percent_complete;
    box.dataset.status = job.status;
    // (status_label: the words for the status, sent by the progress endpoint)
  }

  // Poll one job until it finishes, then reload so the page shows its results.
  function poll(box, delay) {
    window.setTimeout(async function () {
      let next = POLL_MS;
      try {
        const response = await fetch(box.dataset.progressUrl, {
          headers: { Accept: "application/json" },
          credentials: "same-origin",
          cache: "no-store",
        });
        const type = response.headers.get("content-type") || "";
        if (!response.ok || !type.includes("application/json")) return; // signed out, gone
        const job = await response.json();
        update(box, job);
        if (job.finished) {
          window.location.reload();
          return;
        }
      } catch (err) {
        next = Math.min(delay * 2, MAX_POLL_MS); // network hiccup: back off, keep trying
      }
      poll(box, next);
    }, delay);
  }

  function copyButtons() {
    document.querySelectorAll("button[data-copy]").forEach(function (button) {
      button.addEventListener("click", async function () {
        const input = document.getElementById(button.dataset.copy);
        if (!input) return;
        input.select();
        try {
          await navigator.clipboard.writeText(input.value);
          button.textContent = "Copied";
        } catch (err) {
          button.textContent = "Press Ctrl+C";
        }
      });
    });
  }

  function confirmations() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-progress-url]").forEach(function (box) {
      poll(box, POLL_MS);
    });
    copyButtons();
    confirmations();
  });
})();
