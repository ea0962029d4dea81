/* The live panels of a running run (templates/_live_panels.html): its latency percentiles
   by window and the target's /metrics as time series, redrawn in place (Plotly.react) from
   /runs/{id}/live.json?series=1 every 2 s until the run ends. One poll at a time. Hidden
   until some panel has a point. */
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  function points(fig) {
    return fig.data.reduce(function (n, t) { return n + (t.x ? t.x.length : 0); }, 0);
  }
  function draw(box, panels) {
    var any = Object.keys(panels).some(function (k) { return points(panels[k]) > 0; });
    if (!any) return; // no data yet: the panels stay hidden
    box.hidden = false;
    box.querySelectorAll("[data-live-panel]").forEach(function (div) {
      var fig = panels[div.dataset.livePanel];
      if (!fig) return;
      window.Plotly.react(div, fig.data, fig.layout, { responsive: true, displaylogo: false });
      div.dataset.rendered = "1";
      div.dataset.points = String(points(fig));
    });
  }
  function follow(box) {
    if (!window.Plotly) { console.error("tokentrace: plotly.js is not loaded"); return; }
    var url = "/runs/" + encodeURIComponent(box.dataset.runId) + "/live.json?series=1";
    var polls = 0;
    function tick() {
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (s && s.panels) {
            draw(box, s.panels);
            box.dataset.polls = String(++polls);
            if (s.status !== "queued" && s.status !== "running") { box.dataset.ended = "1"; return; }
          }
          setTimeout(tick, PERIOD_MS);
        })
        .catch(function () { setTimeout(tick, PERIOD_MS * 2); }); // server away: later
    }
    tick();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live-panels");
    if (box) follow(box);
  });
})();
