// The run page's live log and loss curve: poll the dashboard's own
// /live endpoint, append new lines, redraw the chart when points arrive.
// Plain JS, no dependencies, loaded from 'self' (the page's CSP allows no
// inline script).
"use strict";
(function () {
  var log = document.getElementById("log");
  if (!log || log.dataset.live !== "yes") { return; }
  var run = log.dataset.run;
  var after = log.dataset.after || "0";
  var pointsEl = document.getElementById("points");
  var chart = document.getElementById("chart");
  var note = document.getElementById("chart-note");
  var stateEl = document.getElementById("state");
  var reasonEl = document.getElementById("reason");
  var status = document.getElementById("live-status");
  var points = parseInt(pointsEl ? pointsEl.textContent : "0", 10) || 0;
  var delay = 1000;
  log.scrollTop = log.scrollHeight;
  function atBottom() { return log.scrollHeight - log.scrollTop - log.clientHeight < 40; }
  function poll() {
    fetch("/ui/runs/" + encodeURIComponent(run) + "/live?after=" + encodeURIComponent(after), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (a) {
        var stick = atBottom();
        a.lines.forEach(function (l) {
          var span = document.createElement("span");
          span.textContent = l + "\n";
          log.appendChild(span);
        });
        if (stick) { log.scrollTop = log.scrollHeight; }
        after = String(a.after);
        log.dataset.after = after;
        if (a.points > 0) {
          points += a.points;
          if (pointsEl) { pointsEl.textContent = String(points); }
          if (chart) { chart.src = "/ui/runs/" + encodeURIComponent(run) + "/chart.svg?n=" + points; chart.hidden = false; }
          // The chart says itself what it cannot draw from now on.
          if (note) { note.hidden = true; }
        }
        if (stateEl) { stateEl.textContent = a.state; stateEl.className = "state " + a.state; }
        if (reasonEl) { reasonEl.textContent = a.reason; }
        status.textContent = a.done ? "run over; log complete" : "live: updated " + new Date().toLocaleTimeString();
        delay = 1000;
        if (!a.done) { setTimeout(poll, a.lines.length >= 500 ? 0 : delay); }
        else {
          var c = document.getElementById("cancel-form");
          if (c) { c.remove(); }
        }
      })
      .catch(function (e) {
        status.textContent = "live updates paused (" + e.message + "); retrying";
        delay = Math.min(delay * 2, 15000);
        setTimeout(poll, delay);
      });
  }
  setTimeout(poll, 500);
})();
