// pymetaq dashboard: keeps the server-rendered numbers moving (polls /api/<page> every second)
// and draws each consumer group's lag chart.  Vanilla JS, no dependencies, no build step.
"use strict";
(function () {
  var PAGE = document.body.dataset.live;
  var PERIOD_MS = 1000;
  var WINDOW_S = 120;
  var COLORS = ["#1f6feb", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285", "#5c940d", "#862e9c"];
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  var history = {}; // group -> key -> [[t, lagBytes], ...]
  var reloadAfter = 0;

  function humanBytes(n) {
    var i = 0;
    while (Math.abs(n) >= 1024 && i < UNITS.length - 1) { n /= 1024; i++; }
    return i === 0 ? n.toLocaleString("en-US", {maximumFractionDigits: 0}) + " B"
      : n.toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}) + " " + UNITS[i];
  }
  function humanSeconds(s) {
    if (s === null || s === undefined) return "unknown";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }
  function fixed1(x) { return x.toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}); }
  function setCell(el, value, text) {
    if (!el) return;
    el.dataset.value = String(value);
    el.textContent = text;
  }
  function cssEscape(s) { return window.CSS && CSS.escape ? CSS.escape(s) : s.replace(/["\\]/g, "\\$&"); }
  function stamp() {
    var el = document.getElementById("updated");
    if (el) el.textContent = "updated " + new Date().toLocaleTimeString("en-GB");
  }
  function reloadSoon() {
    var now = Date.now();
    if (now > reloadAfter) { reloadAfter = now + 5000; location.reload(); }
  }

  // -- consumer groups ------------------------------------------------------------------------
  function updateGroups(groups) {
    var now = Date.now() / 1000;
    var shown = document.querySelectorAll("section.group");
    if (shown.length !== groups.length) { reloadSoon(); return; }
    groups.forEach(function (g) {
      var sec = document.querySelector('section.group[data-group="' + cssEscape(g.group) + '"]');
      if (!sec || sec.querySelectorAll("tbody tr[data-key]").length !== g.partitions.length) {
        reloadSoon(); return;
      }
      setCell(sec.querySelector(".group-lag"), g.lag_bytes, humanBytes(g.lag_bytes));
      var lagS = sec.querySelector(".group-lag-s");
      if (lagS) lagS.textContent = humanSeconds(g.lag_seconds);
      var series = history[g.group] = history[g.group] || {};
      g.partitions.forEach(function (p) {
        var key = p.topic + "/" + p.partition;
        var row = sec.querySelector('tr[data-key="' + cssEscape(key) + '"]');
        if (!row) { reloadSoon(); return; }
        setCell(row.querySelector(".fetch_offset"), p.fetch_offset, p.fetch_offset.toLocaleString("en-US"));
        setCell(row.querySelector(".max_offset"), p.max_offset, p.max_offset.toLocaleString("en-US"));
        setCell(row.querySelector(".lag_bytes"), p.lag_bytes, humanBytes(p.lag_bytes));
        setCell(row.querySelector(".lag_seconds"), p.lag_seconds === null ? -1 : p.lag_seconds, humanSeconds(p.lag_seconds));
        setCell(row.querySelector(".idle_seconds"), Math.round(p.idle_seconds * 1000) / 1000, humanSeconds(p.idle_seconds) + " ago");
        var points = series[key] = series[key] || [];
        points.push([now, p.lag_bytes]);
        while (points.length && points[0][0] < now - WINDOW_S) points.shift();
      });
      drawChart(sec.querySelector("canvas.lagchart"), series, now);
    });
  }

  function niceMax(v) {
    // a round top in the unit the axis shows (1, 2, 4, 5, 8, 10 ... KiB/MiB...): 4 even steps
    if (v <= 0) return 1024;
    var unit = 1;
    while (v / unit >= 1024 && unit < Math.pow(1024, 5)) unit *= 1024;
    var x = v / unit, exp = Math.pow(10, Math.floor(Math.log10(x)));
    var steps = [1, 2, 4, 8, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * exp >= x) return steps[i] * exp * unit;
    return 10 * exp * unit;
  }

  function drawChart(canvas, series, now) {
    if (!canvas) return;
    var ratio = window.devicePixelRatio || 1;
    var w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    var left = 70, right = 12, top = 26, bottom = 22;
    var keys = Object.keys(series).sort();
    var max = 0;
    keys.forEach(function (k) { series[k].forEach(function (p) { max = Math.max(max, p[1]); }); });
    max = niceMax(max);
    var x = function (t) { return left + (w - left - right) * (1 - (now - t) / WINDOW_S); };
    var y = function (v) { return top + (h - top - bottom) * (1 - v / max); };
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e1e6ec"; ctx.fillStyle = "#66727f"; ctx.lineWidth = 1;
    for (var i = 0; i <= 4; i++) {
      var v = max * i / 4, yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(humanBytes(v), left - 6, yy + 4);
    }
    ctx.textAlign = "center";
    [120, 90, 60, 30, 0].forEach(function (s) {
      ctx.fillText(s === 0 ? "now" : "-" + s + " s", x(now - s), h - 6);
    });
    keys.forEach(function (k, i) {
      var pts = series[k], color = COLORS[i % COLORS.length];
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
      pts.forEach(function (p, j) { if (j === 0) ctx.moveTo(x(p[0]), y(p[1])); else ctx.lineTo(x(p[0]), y(p[1])); });
      ctx.stroke();
      if (pts.length) { ctx.fillStyle = color; ctx.beginPath(); ctx.arc(x(pts[pts.length - 1][0]), y(pts[pts.length - 1][1]), 3, 0, 7); ctx.fill(); }
      ctx.fillStyle = color; ctx.fillRect(left + 4 + i * 120, 8, 10, 10);
      ctx.fillStyle = "#3b4856"; ctx.textAlign = "left"; ctx.fillText(k, left + 18 + i * 120, 17);
    });
  }

  // -- overview and topics ---------------------------------------------------------------------
  function updateOverview(ov) {
    var values = {
      "rates.messages": [ov.rates.messages, fixed1(ov.rates.messages)],
      "rates.put": [ov.rates.put, fixed1(ov.rates.put)],
      "rates.get": [ov.rates.get, fixed1(ov.rates.get)],
      "connections": [ov.connections, ov.connections.toLocaleString("en-US") + " / " + ov.max_connections.toLocaleString("en-US")],
      "longpoll_waiters": [ov.longpoll_waiters, ov.longpoll_waiters.toLocaleString("en-US")],
      "partitions": [ov.partitions, ov.topics + " / " + ov.partitions]
    };
    Object.keys(values).forEach(function (k) {
      setCell(document.querySelector('.tile .value[data-key="' + k + '"]'), values[k][0], values[k][1]);
    });
    var up = document.getElementById("uptime");
    if (up) up.textContent = humanSeconds(ov.uptime_s);
  }

  function rateCells(row, first, msgs, inB, outB) {
    var cells = row.querySelectorAll("td");
    setCell(cells[first], msgs, fixed1(msgs) + "/s");
    setCell(cells[first + 1], inB / 1024, fixed1(inB / 1024) + " KiB/s");
    setCell(cells[first + 2], outB / 1024, fixed1(outB / 1024) + " KiB/s");
  }

  function updateTopics(topics) {
    topics.forEach(function (t) {
      var row = document.querySelector('table.topics tr[data-topic="' + cssEscape(t.topic) + '"]');
      if (row) {
        var cells = row.querySelectorAll("td");
        setCell(cells[2], t.messages, t.messages.toLocaleString("en-US"));
        setCell(cells[3], t.size, humanBytes(t.size));
        rateCells(row, 4, t.msgs_per_s, t.in_bytes_per_s, t.out_bytes_per_s);
      }
      if (document.title.indexOf("Topic " + t.topic + " ") === 0) {
        t.partitions.forEach(function (p) {
          var prow = document.querySelector('table.partitions tr[data-partition="' + p.partition + '"]');
          if (!prow) return;
          var cells = prow.querySelectorAll("td");
          setCell(cells[1], p.min_offset, p.min_offset.toLocaleString("en-US"));
          setCell(cells[2], p.max_offset, p.max_offset.toLocaleString("en-US"));
          setCell(cells[3], p.messages, p.messages.toLocaleString("en-US"));
          setCell(cells[4], p.max_offset - p.min_offset, humanBytes(p.max_offset - p.min_offset));
          rateCells(prow, 5, p.msgs_per_s, p.in_bytes_per_s, p.out_bytes_per_s);
        });
      }
    });
  }

  var UPDATE = {groups: updateGroups, overview: updateOverview, topics: updateTopics};

  function poll() {
    fetch("/api/" + PAGE, {cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (data) { UPDATE[PAGE](data); stamp(); })
      .catch(function () { var el = document.getElementById("updated"); if (el) el.textContent = "broker not answering"; })
      .finally(function () { setTimeout(poll, PERIOD_MS); });
  }
  if (UPDATE[PAGE]) poll();
})();
