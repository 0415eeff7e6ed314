// idem console: small progressive enhancements; every page works without
// them. Loaded from the console itself (Content-Security-Policy:
// script-src 'self').
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // Refresh the rates chart every 10 seconds (the buckets' width).
  const chart = document.getElementById("rates");
  if (chart) {
    setInterval(() => { chart.src = "/rates.svg?t=" + Date.now(); }, 10000);
  }
  // "/" focuses the key search, as in many consoles.
  const key = document.getElementById("search-key");
  document.addEventListener("keydown", (e) => {
    if (key && e.key === "/" && document.activeElement.tagName !== "INPUT") {
      e.preventDefault();
      key.focus();
    }
  });
  // A confirmed action is sent once, even when its button is clicked twice.
  for (const form of document.querySelectorAll("form.confirm")) {
    form.addEventListener("submit", () => {
      for (const b of form.querySelectorAll("button")) b.disabled = true;
    });
  }
});
