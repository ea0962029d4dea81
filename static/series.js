/* The series page: a click on a run's point opens that run (its id is the point's
   customdata). Charts are drawn by app.js (TT.renderPlots); this only listens. */
(function () {
  "use strict";
  function hook() {
    document.querySelectorAll("[data-click-runs]").forEach(function (div) {
      if (div.dataset.clickHooked || !div.on) return;
      div.dataset.clickHooked = "1";
      div.on("plotly_click", function (ev) {
        var p = ev.points && ev.points[0];
        if (p && typeof p.customdata === "string" && p.customdata) {
          window.location.href = "/runs/" + encodeURIComponent(p.customdata);
        }
      });
    });
  }
  function wait() {
    hook();
    var pending = document.querySelectorAll("[data-click-runs]:not([data-click-hooked])");
    if (pending.length && document.body.dataset.plotsDrawn !== "1") window.setTimeout(wait, 50);
    else hook();
  }
  document.addEventListener("DOMContentLoaded", function () { window.setTimeout(wait, 0); });
})();
