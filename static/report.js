/* tokentrace single-file report: draws every chart of the page with the plotly.js inlined
   above it (no network, no dashboard). Each chart's figure is JSON in the
   <script type="application/json"> named by its div's data-figure. When done,
   body[data-plots-drawn] is "1"; body[data-first-chart-ms] says when the first was drawn. */
(function () {
  "use strict";
  function draw() {
    var divs = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));
    var i = 0;
    function step() {
      var t0 = performance.now();
      while (i < divs.length) {
        var div = divs[i++];
        var src = document.getElementById(div.dataset.figure);
        if (!src) { console.error("tokentrace report: no figure data #" + div.dataset.figure); continue; }
        var fig = JSON.parse(src.textContent);
        window.Plotly.newPlot(div, fig.data, fig.layout, { responsive: true, displaylogo: false });
        div.dataset.rendered = "1";
        if (!document.body.dataset.firstChartMs) {
          document.body.dataset.firstChartMs = String(Math.round(performance.now()));
        }
        if (performance.now() - t0 > 30) break; // a frame's worth, then let the page paint
      }
      if (i < divs.length) window.requestAnimationFrame(step);
      else document.body.dataset.plotsDrawn = "1";
    }
    if (!window.Plotly) { console.error("tokentrace report: plotly.js is missing"); return; }
    step();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
