// sluice report: draws the charts of the report's inlined data with uPlot (inlined above).
// Text from the data only ever goes in through textContent; nothing is fetched.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var charts = [];
  document.body.dataset.charts = "0";
  if (!data.time) {
    return;
  }
  var palette = data.palette;
  var xs = data.time.t;
  var series = data.series;
  var labels = data.deployments.map(function (d) { return d.label; });
  var HEIGHT = 230;

  function colorOf(label) {
    var i = labels.indexOf(label);
    return i < 0 ? "#6b7280" : palette[i % palette.length];
  }

  function alpha(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  function fmt(v, digits) {
    if (v == null) return "-";
    var a = Math.abs(v);
    if (a >= 1e6) return Number((v / 1e6).toPrecision(3)) + "M";
    if (a >= 1e4) return Number((v / 1e3).toPrecision(3)) + "k";
    if (a >= 1000) return Math.round(v).toLocaleString();
    return Number(v.toPrecision(digits || 3)).toString();
  }

  function money(v, digits) {
    return "$" + v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }
  // One amount as the tables write it (4 decimals below $100, 2 from there).
  function usd(v) { return v == null ? "-" : money(v, Math.abs(v) < 100 ? 4 : 2); }
  // An axis's amounts all with the same decimals: as few as its ticks need (2 at least).
  function usdTicks(splits) {
    var digits = 2;
    splits.forEach(function (v) {
      while (v != null && digits < 6 && Math.abs(v - Number(v.toFixed(digits))) > Math.abs(v) * 1e-9 + 1e-12) digits++;
    });
    return splits.map(function (v) { return v == null ? "" : money(v, digits); });
  }
  function secs(v) {
    if (v == null) return "-";
    if (v < 0.01) return (v * 1000).toPrecision(2) + " ms";
    return v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s";
  }
  // A tick's time: as many digits as it has (0.15 -> "150 ms", 2 -> "2 s").
  function tickSecs(v) {
    return v < 1 ? Number((v * 1000).toPrecision(3)) + " ms" : Number(v.toPrecision(3)) + " s";
  }

  // Cooldowns as bands behind the series, and the start of each run after the first.
  function timeMarks() {
    return {
      hooks: {
        drawClear: [function (u) {
          var ctx = u.ctx, box = u.bbox;
          ctx.save();
          data.cooldowns.forEach(function (c) {
            var x0 = u.valToPos(c.start, "x", true), x1 = u.valToPos(c.end, "x", true);
            if (x1 < box.left || x0 > box.left + box.width) return;
            x0 = Math.max(x0, box.left);
            x1 = Math.min(x1, box.left + box.width);
            ctx.fillStyle = alpha(colorOf(c.deployment), 0.13);
            ctx.fillRect(x0, box.top, Math.max(1, x1 - x0), box.height);
          });
          if (data.runs.length > 1) {
            ctx.strokeStyle = "#6b7280";
            ctx.setLineDash([2, 3]);
            data.runs.slice(1).forEach(function (r) {
              var x = u.valToPos(r.start, "x", true);
              if (x < box.left || x > box.left + box.width) return;
              ctx.beginPath();
              ctx.moveTo(x, box.top);
              ctx.lineTo(x, box.top + box.height);
              ctx.stroke();
            });
          }
          ctx.restore();
        }],
      },
    };
  }

  function line(label, values, color, extra) {
    var s = { label: label, stroke: color, width: 1.5, points: { show: false }, spanGaps: false };
    for (var k in extra || {}) s[k] = extra[k];
    return { spec: s, values: values };
  }

  // An axis as wide as its longest label (uPlot's own measure: its font, its tick and gap),
  // and never narrower than the half of the time axis's first date that reaches left of it.
  function fitted(u, values, axisIdx, cycle) {
    var axis = u.axes[axisIdx];
    if (cycle > 1) return axis._size; // settled: labels and size depend on each other
    var longest = (values || []).reduce(function (a, v) { return v != null && String(v).length > a.length ? String(v) : a; }, "");
    var size = axis.ticks.size + axis.gap;
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
    }
    return Math.max(56, Math.ceil(size) + 2);
  }

  // Every chart's y axis starts at 0 and ends a little above what is drawn: its data, and
  // the limits near enough to be drawn (see near()); nothing else sets the scale.
  function fromZero(u, lo, hi) {
    return [0, hi > 0 ? hi * 1.08 : 1];
  }
  // Counts (429s, answers in a bin): whole-number steps, and room for a few of them.
  function countsFromZero(u, lo, hi) {
    return [0, Math.max(3, hi * 1.08)];
  }

  function chart(id, lines, options) {
    var el = document.getElementById(id);
    if (!el || !lines.length) return;
    options = options || {};
    var isTime = options.x === undefined;
    var yLabels = options.yLabels || function (splits) { return splits.map(function (v) { return fmt(v); }); };
    var opts = {
      width: Math.max(320, Math.floor(el.getBoundingClientRect().width) - 8),
      height: HEIGHT,
      scales: { x: isTime ? { time: true } : { time: false, distr: options.logX ? 3 : 1, range: options.xRange }, y: { range: options.counts ? countsFromZero : fromZero } },
      series: [options.xSeries || {}].concat(lines.map(function (l) { return l.spec; })),
      axes: [options.xAxis || {}, { size: fitted, incrs: options.counts ? COUNTS : undefined, values: function (u, splits) { return yLabels(splits); } }],
      plugins: isTime ? [timeMarks()] : [],
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [function () { el.dataset.drawn = "1"; }] },
    };
    var u = new uPlot(opts, [options.x || xs].concat(lines.map(function (l) { return l.values; })), el);
    el.dataset.series = String(lines.length);
    charts.push({ el: el, u: u });
  }

  // Steps of an axis of counts: whole numbers only.
  var COUNTS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];

  function constant(value) { return xs.map(function () { return value; }); }

  // A limit is drawn where the data comes near it: at least NEAR of it in some bucket. One
  // far above would set the scale and flatten the data against the axis; it is named instead.
  var NEAR = 0.5;
  function near(values, limits) {
    for (var i = 0; i < values.length; i++) {
      var limit = Array.isArray(limits) ? limits[i] : limits;
      if (limit != null && values[i] != null && values[i] >= NEAR * limit) return true;
    }
    return false;
  }
  function highest(values) {
    return values.reduce(function (a, v) { return v != null && v > a ? v : a; }, 0);
  }
  function offScale(id, names) {
    var el = document.getElementById(id);
    if (!el || !names.length) return;
    var note = document.createElement("p");
    note.className = "off-scale";
    note.textContent = "Not drawn, the data stayed below half of it: " + names.join("; ");
    el.appendChild(note);
  }

  // requests and tokens per deployment, each against its limit
  // own keys only: a deployment named "toString" or "constructor" is a name, not a built-in
  function own(object, key) { return Object.prototype.hasOwnProperty.call(object, key) ? object[key] : undefined; }

  function perDeployment(id, values, limits, unit) {
    var out = [], far = [];
    labels.forEach(function (label) {
      var value = own(values, label), limit = own(limits, label);
      if (value) out.push(line(label, value, colorOf(label)));
      if (!limit || !limit.some(function (v) { return v != null; })) return;
      if (value && near(value, limit)) out.push(line(label + " limit", limit, colorOf(label), { dash: [6, 4], width: 1 }));
      else far.push(label + " limit " + fmt(highest(limit)) + unit);
    });
    chart(id, out);
    offScale(id, far);
  }
  perDeployment("chart-requests", series.requests_per_s, series.limit_requests_per_s, "/s");
  perDeployment("chart-tokens", series.tokens_per_min, series.limit_tokens_per_min, "/min");

  var inflight = [
    line("average", series.in_flight_avg, "#2563eb", { fill: alpha("#2563eb", 0.15) }),
    line("peak", series.in_flight_peak, "#1e3a8a", { width: 1 }),
  ];
  var concurrency = data.concurrency, drawn = concurrency && near(series.in_flight_peak, concurrency);
  if (drawn) inflight.push(line("concurrency", constant(concurrency), "#dc2626", { dash: [6, 4], width: 1 }));
  chart("chart-inflight", inflight);
  if (concurrency && !drawn) offScale("chart-inflight", ["concurrency " + fmt(concurrency) + " (peak " + fmt(highest(series.in_flight_peak)) + ")"]);

  // A bucket with no neighbour draws no line: its point is drawn instead (a slow job's
  // answers, seconds apart, are all such points).
  function isolated(u, seriesIdx) {
    var v = u.data[seriesIdx], out = [];
    for (var i = 0; i < v.length; i++) {
      if (v[i] != null && (i === 0 || v[i - 1] == null) && (i + 1 === v.length || v[i + 1] == null)) out.push(i);
    }
    return out.length ? out : null;
  }
  function withDots(extra) {
    var out = { points: { show: false, size: 5, width: 2, filter: isolated } };
    for (var k in extra || {}) out[k] = extra[k];
    return out;
  }

  var latency = [
    line("p50", series.latency_p50, "#16a34a", withDots({ value: function (u, v) { return secs(v); } })),
    line("p90", series.latency_p90, "#ca8a04", withDots({ value: function (u, v) { return secs(v); } })),
    line("p99", series.latency_p99, "#dc2626", withDots({ value: function (u, v) { return secs(v); } })),
  ];
  if (series.ttft_p50) {
    latency.push(line("first token p50", series.ttft_p50, "#9333ea", withDots({ dash: [4, 3] })));
    latency.push(line("first token p90", series.ttft_p90, "#db2777", withDots({ dash: [4, 3] })));
  }
  chart("chart-latency", latency);

  var stepped = uPlot.paths.stepped({ align: 1 });
  var outcomes = [
    line("429s", series.rate_limited, "#ea580c", { paths: stepped }),
    line("retries", series.retries, "#2563eb", { paths: stepped }),
  ];
  var kinds = Object.keys(series.failed);
  var failColors = ["#dc2626", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563"];
  kinds.forEach(function (kind, i) {
    outcomes.push(line(kind, series.failed[kind], failColors[i % failColors.length], { paths: stepped }));
  });
  chart("chart-outcomes", outcomes, { counts: true });

  var spent = series.cost_cumulative_usd, budget = data.job.budget_usd;
  var cost = [line("spent", spent, "#16a34a", { fill: alpha("#16a34a", 0.12), value: function (u, v) { return usd(v); } })];
  var budgetNear = budget != null && near(spent, budget);
  if (budgetNear) cost.push(line("budget", constant(budget), "#dc2626", { dash: [6, 4], width: 1, value: function (u, v) { return usd(v); } }));
  chart("chart-cost", cost, { yLabels: usdTicks });
  if (budget != null && !budgetNear) offScale("chart-cost", ["the budget, " + usd(budget) + " (spent " + usd(highest(spent)) + ")"]);

  // Ticks of a log axis at round values: the roundest first (powers of ten, then 2 and 5,
  // then every digit, then halves), each where it does not crowd those already chosen; a
  // latency spread over less than one decade still gets several.
  var LADDERS = [[1], [2, 5], [3, 4, 6, 7, 8, 9], [1.5, 2.5, 3.5, 4.5], [1.2, 1.4, 1.6, 1.8]];
  function logTicks(u, lo, hi) {
    var gap = 64, chosen = [];
    LADDERS.forEach(function (ladder) {
      for (var d = Math.floor(Math.log10(lo)); d <= Math.ceil(Math.log10(hi)); d++) {
        ladder.forEach(function (m) {
          var v = Number((m * Math.pow(10, d)).toPrecision(3)), x = u.valToPos(v, "x");
          if (v < lo || v > hi) return;
          if (chosen.every(function (c) { return Math.abs(u.valToPos(c, "x") - x) >= gap; })) chosen.push(v);
        });
      }
    });
    chosen.sort(function (a, b) { return a - b; });
    // a range too narrow for any round value (every answer took about as long): its ends and middle
    return chosen.length >= 3 ? chosen : [lo, Math.sqrt(lo * hi), hi];
  }

  function histogram(id, hist, color) {
    if (!hist || !hist.counts.length) return;
    var centers = hist.counts.map(function (_, i) { return Math.sqrt(hist.edges[i] * hist.edges[i + 1]); });
    chart(id, [line("answers", hist.counts, color, { fill: alpha(color, 0.5), paths: uPlot.paths.bars({ size: [0.92, 60] }) })], {
      x: centers,
      logX: true,
      counts: true,
      xSeries: { label: "seconds", value: function (u, v) { return secs(v); } },
      xRange: function () { return [hist.edges[0], hist.edges[hist.edges.length - 1]]; },
      xAxis: {
        splits: function (u, axisIdx, lo, hi) { return logTicks(u, lo, hi); },
        filter: function (u, splits) { return splits; },
        values: function (u, splits) { return splits.map(function (v) { return v == null ? "" : tickSecs(v); }); },
      },
    });
  }
  histogram("chart-histogram", data.latency && data.latency.histogram, "#2563eb");
  histogram("chart-ttft", data.ttft && data.ttft.histogram, "#9333ea");

  document.body.dataset.charts = String(charts.length);
  window.sluiceCharts = charts; // for tests: each chart's element and uPlot
  window.addEventListener("resize", function () {
    charts.forEach(function (c) {
      c.u.setSize({ width: Math.max(320, Math.floor(c.el.getBoundingClientRect().width) - 8), height: HEIGHT });
    });
  });
})();
