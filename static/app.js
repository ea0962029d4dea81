/* tokentrace dashboard behaviour: plots, sortable/filterable tables, compare selection,
   live job progress (SSE with a polling fallback). No dependencies besides plotly.js. */
(function () {
  "use strict";
  var TT = {};
  var TERMINAL = { succeeded: 1, failed: 1, cancelled: 1, deleted: 1 };
  var STATE_TEXT = { leased: "starting" }; // as app/web/views.py job_state_text says it

  // ---------------------------------------------------------------- plots
  TT.renderPlot = function (div) {
    if (div.dataset.rendered) return;
    if (!window.Plotly) { console.error("tokentrace: plotly.js is not loaded"); return; }
    if (div.offsetParent === null) return; // hidden tab: rendered when shown
    var src = document.getElementById(div.dataset.figure);
    if (!src) { console.error("tokentrace: no figure data #" + div.dataset.figure); return; }
    var fig = JSON.parse(src.textContent);
    div.dataset.rendered = "1";
    window.Plotly.newPlot(div, fig.data, fig.layout, { responsive: true, displaylogo: false });
    if (div.dataset.runId) {
      div.on("plotly_click", function (ev) {
        var p = ev.points && ev.points[0];
        if (p && p.customdata !== undefined && p.customdata !== null) {
          window.location.href = "/runs/" + encodeURIComponent(div.dataset.runId) + "/requests/" + p.customdata;
        }
      });
    }
  };
  // Draw the page's charts in document order, a frame's worth (~30 ms) at a time: the first
  // chart paints before the rest are drawn. body[data-plots-drawn] turns "1" when all are.
  TT.renderPlots = function () {
    var divs = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));
    var i = 0;
    document.body.dataset.plotsDrawn = "0";
    function step() {
      var t0 = performance.now();
      while (i < divs.length) {
        TT.renderPlot(divs[i++]);
        if (performance.now() - t0 > 30) break;
      }
      if (i < divs.length) window.requestAnimationFrame(step);
      else document.body.dataset.plotsDrawn = "1";
    }
    step();
  };

  // ---------------------------------------------------------------- tables
  function cellValue(td, numeric) {
    var raw = td.dataset.value !== undefined ? td.dataset.value : td.textContent.trim();
    if (!numeric) return raw.toLowerCase();
    var v = parseFloat(raw);
    return isNaN(v) ? null : v;
  }
  // Each sortable header holds a <button> (templates/runs.html): focusable, Enter and Space
  // press it; the sorted column says so with aria-sort (the others have none).
  function makeSortable(table) {
    var heads = table.querySelectorAll("th[data-sort]");
    heads.forEach(function (th) {
      var btn = th.querySelector("button.sort");
      if (!btn) return;
      btn.addEventListener("click", function () {
        var col = Array.prototype.indexOf.call(th.parentNode.children, th);
        var numeric = th.dataset.sort === "num";
        var asc = !th.classList.contains("asc");
        heads.forEach(function (h) { h.classList.remove("asc", "desc"); h.removeAttribute("aria-sort"); });
        th.classList.add(asc ? "asc" : "desc");
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows).filter(function (r) { return r.cells.length > col; });
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[col], numeric), y = cellValue(b.cells[col], numeric);
          if (x === y) return 0;
          if (x === null) return 1; // missing values last either way
          if (y === null) return -1;
          return (x < y ? -1 : 1) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }
  function quickFilter(input, table) {
    input.addEventListener("input", function () {
      var q = input.value.trim().toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        r.hidden = q !== "" && r.textContent.toLowerCase().indexOf(q) < 0;
      });
    });
  }
  function compareSelection(form) {
    var btn = document.getElementById("compare-btn");
    var count = document.getElementById("compare-count");
    var withBaseline = form.dataset.baselines === "1"; // one run vs a saved baseline
    function update() {
      var n = form.querySelectorAll("input.pick:checked").length;
      var base = form.querySelector("input.base-pick:checked");
      btn.disabled = n < (withBaseline ? 1 : 2);
      count.textContent = n ? n + " selected" : "select two or more runs" +
        (withBaseline ? ", or one to compare with a saved baseline" : "");
      if (n === 1 && withBaseline) {
        count.textContent += ": the next page picks the saved baseline";
      } else if (base) {
        var row = base.closest("tr");
        var link = row && row.querySelector("td a");
        count.textContent += ", baseline: " + (link ? link.textContent : base.value);
      } else if (n) {
        count.textContent += " (baseline: the oldest; pick one with the radio button)";
      }
    }
    form.addEventListener("change", function (ev) {
      var t = ev.target;
      if (t && t.classList && t.classList.contains("base-pick") && t.checked) {
        var pick = t.closest("tr").querySelector("input.pick");
        if (pick) pick.checked = true; // the baseline is one of the compared runs
      }
      update();
    });
    update();
  }

  // ---------------------------------------------------------------- progress
  function showProgress(el, snap) {
    var p = snap.progress || {};
    var planned = p.planned || 0, done = p.done || 0;
    var pct = planned ? Math.min(100, (100 * done) / planned) : 0;
    el.querySelector(".bar").style.width = pct.toFixed(1) + "%";
    var text = (STATE_TEXT[snap.state] || snap.state || "") + (planned ? ": " + done + "/" + planned : "");
    if (p.errors) text += ", " + p.errors + " errors";
    if (p.tokens_per_s) text += ", " + Math.round(p.tokens_per_s) + " tok/s";
    el.querySelector(".label").textContent = text;
    // one source of state: the status card follows the same snapshot as the bar
    var card = el.dataset.statusCard && document.getElementById(el.dataset.statusCard);
    if (card && snap.state) {
      card.querySelector(".value").textContent = STATE_TEXT[snap.state] || snap.state;
    }
  }
  function poll(el, onEnd) {
    var runId = el.dataset.runId;
    var timer = setInterval(function () {
      fetch("/runs/" + encodeURIComponent(runId) + "/progress.json", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (!s) return;
          if (s.state) showProgress(el, s);
          if (!s.state || TERMINAL[s.state]) { clearInterval(timer); onEnd(); }
        })
        .catch(function () {});
    }, 2000);
  }
  TT.followJob = function (el, onEnd) {
    var jobId = el.dataset.jobId;
    if (!window.EventSource) { poll(el, onEnd); return; }
    var es = new EventSource("/api/v1/jobs/" + encodeURIComponent(jobId) + "/progress/stream");
    var ended = false;
    es.addEventListener("progress", function (ev) {
      try { showProgress(el, JSON.parse(ev.data)); } catch (e) { /* ignore a bad frame */ }
    });
    es.addEventListener("end", function () { ended = true; es.close(); onEnd(); });
    es.onerror = function () {
      if (ended) return;
      es.close();
      poll(el, onEnd); // e.g. reads need a token the browser cannot send to the API
    };
  };

  // ---------------------------------------------------------------- pages
  TT.runPage = function (runId) {
    document.querySelectorAll("[data-figure='fig-timeline']").forEach(function (d) { d.dataset.runId = runId; });
    TT.renderPlots();
    var tabs = document.getElementById("dist-tabs");
    if (tabs) {
      tabs.addEventListener("click", function (ev) {
        var key = ev.target && ev.target.dataset && ev.target.dataset.dist;
        if (!key) return;
        tabs.querySelectorAll("button").forEach(function (b) { b.classList.toggle("on", b.dataset.dist === key); });
        document.querySelectorAll("[data-dist-panel]").forEach(function (p) { p.hidden = p.dataset.distPanel !== key; });
        TT.renderPlots();
      });
    }
    document.querySelectorAll(".live .progress[data-job-id]").forEach(function (el) {
      TT.followJob(el, function () { window.location.reload(); });
    });
  };

  document.addEventListener("DOMContentLoaded", function () {
    // page set-up named by markup, not inline script (the CSP allows no inline script)
    var init = document.querySelector("[data-tt-page]");
    if (init && init.dataset.ttPage === "run") TT.runPage(init.dataset.runId);
    else TT.renderPlots(); // every page: figures come from <script type="application/json">
    var table = document.getElementById("runs-table");
    if (table) {
      makeSortable(table);
      var q = document.getElementById("quick-filter");
      if (q) quickFilter(q, table);
      var form = document.getElementById("compare-form");
      if (form) compareSelection(form);
      var live = document.querySelectorAll("#runs-table .progress[data-job-id]");
      // polling, not one EventSource per row: browsers allow ~6 connections per host
      live.forEach(function (el) {
        poll(el, function () { window.location.reload(); });
      });
    }
  });
  window.TT = TT;
})();

// --- times & finish (issue 17) ---
// Server-rendered <time datetime="…Z" title="… UTC">… UTC</time> (app/web/context.py
// fmt_dt) shown in the viewer's local time with the zone's name; the title keeps UTC.
(function () {
  "use strict";
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function zoneName(d) {
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d);
      for (var i = 0; i < parts.length; i++) if (parts[i].type === "timeZoneName") return parts[i].value;
    } catch (e) { /* no Intl: the offset below */ }
    var off = -d.getTimezoneOffset(), sign = off < 0 ? "-" : "+";
    off = Math.abs(off);
    return "UTC" + sign + pad(Math.floor(off / 60)) + ":" + pad(off % 60);
  }
  function localText(d) {
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + zoneName(d);
  }
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.local) return;
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) return;
      el.textContent = localText(d);
      el.dataset.local = "1";
    });
  }
  window.TT = window.TT || {};
  window.TT.localTimes = localTimes;
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
})();

// --- run actions, live run, tables (issue 17) ---
// The live run panel (templates/run.html #live-figures): polls /runs/{id}/live.json (the
// requests stored so far; app/web/live.py) and fills the percentile and throughput cells.
(function () {
  "use strict";
  function fmtMs(v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    return v.toFixed(2); // ms: 2 decimals everywhere (app/analysis/metric_defs)
  }
  function fmtRate(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    return v.toFixed(digits);
  }
  function setText(id, text) {
    var el = document.getElementById(id);
    if (el) el.textContent = text;
  }
  function showLive(s) {
    // the live table's rows name their metrics (app/web/runs_live.py: the registry's)
    document.querySelectorAll("#live-table tr[data-metric]").forEach(function (row) {
      var key = row.getAttribute("data-metric");
      ["p50", "p90", "p99"].forEach(function (p) {
        setText("live-" + key + "-" + p, fmtMs(s[key] ? s[key][p] : null));
      });
    });
    setText("live-stored", String(s.stored));
    setText("live-failed", String(s.failed));
    setText("live-req-s", fmtRate(s.req_per_s, 2));
    setText("live-tok-s", fmtRate(s.output_tok_per_s, 1));
    showLiveHeader(s);
  }
  // The panel's heading, progress bar, status card and the page header's start time and
  // request count, all from the same snapshot (live.json's progress: app/web/runs_live.py)
  function showLiveHeader(s) {
    var p = s.progress || {};
    if (p.heading) setText("live-heading", p.heading);
    var bar = document.getElementById("live-progress");
    if (bar && p.text) {
      bar.querySelector(".bar").style.width = (p.percent || 0).toFixed(1) + "%";
      bar.querySelector(".label").textContent = p.text;
      var card = bar.dataset.statusCard && document.getElementById(bar.dataset.statusCard);
      if (card && p.state_text) card.querySelector(".value").textContent = p.state_text;
    }
    setText("run-requests", String(s.stored));
    var started = document.getElementById("run-started");
    if (started && s.started_at && !started.querySelector("time")) {
      var t = document.createElement("time");
      t.setAttribute("datetime", s.started_at);
      t.textContent = s.started_at;
      started.textContent = "";
      started.appendChild(t);
      if (window.TT && window.TT.localTimes) window.TT.localTimes(started);
    }
  }
  function followLive(panel) {
    var url = "/runs/" + encodeURIComponent(panel.dataset.runId) + "/live.json";
    // one poll at a time: the next starts 1.5 s after the last answer (a big run's answer
    // can take a while; polls never pile up)
    function tick() {
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (s) {
            showLive(s);
            panel.dataset.updated = String(Date.now());
            if (s.progress && s.progress.ended) { window.location.reload(); return; } // ended
          }
          setTimeout(tick, 1500);
        })
        .catch(function () { setTimeout(tick, 5000); }); // server away: try again later
    }
    tick();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var panel = document.getElementById("live-figures");
    if (panel) followLive(panel);
  });
})();

// --- sweeps & probes & workers (issue 17) ---
// The sweep page follows its sweep: it polls /sweeps/{id}/progress.json, updates the status
// line, and reloads (server-rendered steps table and charts) when a step was added or ended
// or the sweep's status changed. The workers page's heartbeat ages tick between reloads.
(function () {
  "use strict";
  var SWEEP_POLL_MS = 1000;

  function followSweep(box) {
    var id = box.dataset.sweepId;
    var seen = { status: box.dataset.status, steps: box.dataset.steps, finished: box.dataset.finished };
    var text = document.getElementById("sweep-live-text");
    var timer = setInterval(function () {
      fetch("/sweeps/" + encodeURIComponent(id) + "/progress.json", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (live) {
          if (!live) return;
          if (text) text.textContent = live.text;
          if (String(live.status) !== seen.status || String(live.steps) !== seen.steps ||
              String(live.finished_steps) !== seen.finished) {
            clearInterval(timer);
            window.location.reload();
          } else if (!live.active) {
            clearInterval(timer);
          }
        })
        .catch(function () { /* the next tick tries again */ });
    }, SWEEP_POLL_MS);
  }

  function tickAges() {
    var cells = document.querySelectorAll("[data-age-s]");
    if (!cells.length) return;
    var t0 = Date.now();
    setInterval(function () {
      var extra = Math.floor((Date.now() - t0) / 1000);
      cells.forEach(function (el) {
        el.textContent = (parseInt(el.dataset.ageS, 10) + extra) + " s ago";
      });
    }, 1000);
  }

  function followProbe(el) {
    var id = el.dataset.probeId;
    var timer = setInterval(function () {
      fetch("/probes/" + encodeURIComponent(id) + "/status.json", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (p) {
          if (p && p.status !== el.dataset.status) { clearInterval(timer); window.location.reload(); }
        })
        .catch(function () { /* the next tick tries again */ });
    }, SWEEP_POLL_MS * 2);
  }

  // the probe form shows the chosen kind's parameters only (the others are ignored anyway)
  var PROBE_GROUPS = { ceilings: "Ceilings parameters", linear: "Linear parameters",
    batch_scaling: "Batch scaling parameters" };
  function probeKinds(form) {
    var kind = form.querySelector("#f-kind");
    if (!kind) return;
    function show() {
      Object.keys(PROBE_GROUPS).forEach(function (k) {
        form.querySelectorAll("fieldset[data-group='" + PROBE_GROUPS[k] + "']").forEach(function (fs) {
          fs.hidden = k !== kind.value;
        });
      });
    }
    kind.addEventListener("change", show);
    show();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var probeForm = document.getElementById("probe-form");
    if (probeForm) probeKinds(probeForm);
    var box = document.getElementById("sweep-live");
    if (box && box.dataset.active === "1") followSweep(box);
    var probe = document.getElementById("probe-live");
    if (probe) followProbe(probe);
    tickAges();
  });
})();

// --- keyboard and large tables (issue 24) ---
// A table wider than its .scroll box scrolls inside the box, never past the page: the box
// then takes keyboard focus (arrow keys scroll it), is named for screen readers after its
// section's heading, and shows an edge shadow (style.css .scroll.overflowing).
(function () {
  "use strict";
  function heading(box) {
    var section = box.closest("section");
    var h = (section && section.querySelector("h2, h1")) || document.querySelector("main h1");
    return h ? h.textContent.replace(/\s+/g, " ").trim() : "table";
  }
  function mark(box) {
    var over = box.scrollWidth > box.clientWidth + 1;
    box.classList.toggle("overflowing", over);
    if (over) {
      box.tabIndex = 0;
      box.setAttribute("role", "region");
      box.setAttribute("aria-label", heading(box) + " (scrolls sideways)");
    } else if (box.getAttribute("role") === "region") {
      box.removeAttribute("tabindex");
      box.removeAttribute("role");
      box.removeAttribute("aria-label");
    }
  }
  function markAll() { document.querySelectorAll(".scroll").forEach(mark); }
  document.addEventListener("DOMContentLoaded", function () {
    markAll();
    var pending = null;
    window.addEventListener("resize", function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(markAll, 100);
    });
  });
  window.TT = window.TT || {};
  window.TT.markScrollBoxes = markAll;
})();
