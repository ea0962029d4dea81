/* Launch forms (run, sweep): show only the chosen dataset type's own options. Without this
   script every type's group shows, labelled; the server reads only the chosen type's. */
(function () {
  "use strict";
  var select = document.getElementById("f-dataset");
  var groups = document.querySelectorAll("[data-dataset-options]");
  if (!select || !groups.length) return;
  function sync() {
    for (var i = 0; i < groups.length; i++) {
      groups[i].hidden = groups[i].getAttribute("data-dataset-options") !== select.value;
    }
  }
  select.addEventListener("change", sync);
  sync();
  var note = document.getElementById("dataset-options-note");
  if (note) note.hidden = true;
  document.body.setAttribute("data-dataset-options", "ready");
})();
