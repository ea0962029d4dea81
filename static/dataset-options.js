/* Launch forms (run, sweep): show only the chosen dataset type's and endpoint's own options.
   Without this script every group shows, labelled; the server reads only the chosen ones. */
(function () {
  "use strict";
  function follow(selectId, attr) {
    var select = document.getElementById(selectId);
    var groups = document.querySelectorAll("[" + attr + "]");
    if (!select || !groups.length) return false;
    function sync() {
      for (var i = 0; i < groups.length; i++) {
        groups[i].hidden = groups[i].getAttribute(attr) !== select.value;
      }
    }
    select.addEventListener("change", sync);
    sync();
    return true;
  }
  follow("f-endpoint", "data-endpoint-options");
  if (!follow("f-dataset", "data-dataset-options")) return;
  var note = document.getElementById("dataset-options-note");
  if (note) note.hidden = true;
  document.body.setAttribute("data-dataset-options", "ready");
})();
