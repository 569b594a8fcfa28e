// graphllm's report page: reads the JSON that graphllm embedded and draws it. No network: the
// data, the pictures (inline SVG) and Chart.js are all in this file.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const $ = (id) => document.getElementById(id);
  const charts = {};
  window.graphllmReport = { data: data, charts: charts, show: null };
  if (window.Chart) Chart.defaults.animation = false; // a still picture, at once

  function unit(x, units, sep) {
    if (x === null || x === undefined) return "";
    for (const [u, d] of units) if (Math.abs(x) >= d) return (x / d).toFixed(2) + sep + u;
    return String(Math.round(x * 1000) / 1000) + (sep ? sep + units[units.length - 1][2] : "");
  }
  const N = [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]];
  const B = [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["KB", 1e3, "B"]];
  const fmtN = (x) => unit(x, N, "");
  const fmtB = (x) => (x === null || x === undefined ? "" : Math.abs(x) >= 1e3 ? unit(x, B, " ") : x + " B");
  const fmtT = (s) => (s === null || s === undefined ? "" : s < 1e-3 ? (s * 1e6).toFixed(2) + " µs" : s < 1 ? (s * 1e3).toFixed(3) + " ms" : s.toFixed(3) + " s");
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

  // -- summary, layer pattern, MLA --------------------------------------------------------------
  $("summary-table").innerHTML = data.summary.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join("");
  const kinds = Object.keys(data.kinds);
  if (kinds.length > 1) {
    $("pattern").hidden = false;
    $("pattern-strip").innerHTML = data.layers.map((k, i) =>
      `<span style="background:${PALETTE[k % PALETTE.length]}" title="layer ${i}: ${esc(data.kinds[k].label)}"></span>`).join("");
    $("pattern-legend").innerHTML = kinds.map((k) =>
      `<span class="sw" style="background:${PALETTE[k % PALETTE.length]}"></span>${esc(data.kinds[k].label)} × ${data.kinds[k].count}`).join("");
  }
  if (data.mla) {
    $("mla").hidden = false;
    const kv = data.mla.kv_cache_per_token, f = data.mla.forms;
    const rows = [
      ["KV cache per token, MLA", `${fmtB(kv.mla_bytes)} (${kv.mla_values.toLocaleString("en")} values: latent + RoPE key, all layers)`],
      ["KV cache per token, standard MHA", `${fmtB(kv.mha_bytes)} (${kv.mha_values.toLocaleString("en")} values)`],
      ["MLA's cache is smaller by", `${kv.ratio.toFixed(1)}×`],
    ];
    for (const form of ["naive", "absorbed"]) rows.push([`${form} form, this workload`, `FLOPs ${fmtN(f[form].flops)}, bytes ${fmtB(f[form].bytes)}, attention FLOPs ${fmtN(f[form].attention_flops)}`]);
    $("mla-table").innerHTML = rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join("");
  }

  // -- diagrams -----------------------------------------------------------------------------------
  const byId = {};
  for (const d of data.diagrams) byId[d.id] = d;
  const tabs = $("diagram-tabs"), view = $("diagram-view");
  for (const d of data.diagrams) {
    const b = document.createElement("button");
    b.textContent = d.title; b.dataset.view = d.id;
    b.addEventListener("click", () => show(d.id));
    tabs.appendChild(b);
  }
  function show(id) {
    const d = byId[id];
    if (!d) return;
    view.innerHTML = d.svg;
    view.dataset.view = id;
    for (const b of tabs.children) b.classList.toggle("on", b.dataset.view === id);
    for (const g of view.querySelectorAll("g.node")) {
      const t = g.querySelector("title");
      const target = t && d.links[t.textContent];
      if (!target) continue;
      g.classList.add("link");
      g.addEventListener("click", () => show(target));
    }
  }
  window.graphllmReport.show = show;
  if (data.diagrams.length) show(data.diagrams[0].id);

  // -- the op table -------------------------------------------------------------------------------
  const cols = data.ops.columns, rows = data.ops.rows;
  const numeric = new Set(["layers", "flops", "bytes", "intensity", "seconds"]);
  const shown = { flops: fmtN, bytes: fmtB, seconds: fmtT, intensity: (x) => (x === null ? "" : x.toFixed(2)), mixing: (x) => (x ? "mixes" : ""), layers: (x) => "× " + x };
  const heads = { seconds: "time", shape: "shape", mixing: "mixing" };
  const thead = $("op-table").tHead, tbody = $("op-table").tBodies[0];
  thead.innerHTML = "<tr>" + cols.map((c, i) => `<th data-col="${i}" class="${numeric.has(c) ? "num" : ""}">${heads[c] || c}</th>`).join("") + "</tr>";
  let order = rows.map((_, i) => i), sortCol = -1, sortDir = 1, query = "";
  const search = [cols.indexOf("name"), cols.indexOf("op"), cols.indexOf("scope")];
  function draw() {
    const q = query.toLowerCase();
    const keep = order.filter((i) => !q || search.some((c) => String(rows[i][c]).toLowerCase().includes(q)));
    tbody.innerHTML = keep.map((i) => {
      const r = rows[i];
      return `<tr class="${r[cols.indexOf("mixing")] ? "mix" : ""}">` + r.map((v, c) =>
        `<td class="${numeric.has(cols[c]) ? "num" : ""}">${esc(shown[cols[c]] ? shown[cols[c]](v) : v)}</td>`).join("") + "</tr>";
    }).join("");
    $("op-count").textContent = `${keep.length} of ${rows.length} rows`;
  }
  function sortBy(c) {
    sortDir = sortCol === c ? -sortDir : numeric.has(cols[c]) ? -1 : 1; // numbers: largest first
    sortCol = c;
    const key = (i) => rows[i][c];
    order = rows.map((_, i) => i).sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === y) return a - b;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    for (const th of thead.rows[0].cells) th.classList.remove("asc", "desc");
    thead.rows[0].cells[c].classList.add(sortDir > 0 ? "asc" : "desc");
    draw();
  }
  thead.addEventListener("click", (e) => { const th = e.target.closest("th"); if (th) sortBy(Number(th.dataset.col)); });
  $("op-search").addEventListener("input", (e) => { query = e.target.value; draw(); });
  draw();

  // -- charts -------------------------------------------------------------------------------------
  function shares(table, metrics) {
    const names = Object.keys(table);
    const sets = metrics.filter((m) => names.some((n) => table[n][m])).map((m, j) => {
      const total = names.reduce((s, n) => s + (table[n][m] || 0), 0) || 1;
      return { label: { flops: "FLOPs", bytes: "bytes", seconds: "time" }[m], backgroundColor: PALETTE[j], data: names.map((n) => (100 * (table[n][m] || 0)) / total) };
    });
    return { labels: names, datasets: sets };
  }
  // log axes: a label at each power of ten only (Chart.js labels 1, 2, 5 of every decade)
  const decades = { callback: (v) => (Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-9 ? Number(v).toExponential(0) : "") };
  const logAxis = (text, extra) => Object.assign({ type: "logarithmic", ticks: decades, title: { display: true, text: text } }, extra || {});
  const pct = { x: { title: { display: true, text: "% of the model's total" } } };
  // a bar per category, each with its own label: Chart.js skips labels it finds crowded
  // (ticks.autoSkip), which named the largest bars after their neighbours; the chart is as tall
  // as its labels need instead (its box's height: the canvas follows it)
  function shareBars(id, table, metrics) {
    const d = shares(table, metrics), canvas = $(id);
    canvas.parentNode.style.height = `${Math.max(160, d.labels.length * (6 + 6 * d.datasets.length) + 70)}px`;
    const scales = { x: pct.x, y: { ticks: { autoSkip: false } } };
    return new Chart(canvas, { type: "bar", data: d, options: { indexAxis: "y", maintainAspectRatio: false, scales: scales } });
  }
  if (window.Chart) {
    charts.scope = shareBars("chart-scope", data.breakdown.by_scope, ["flops", "bytes", "seconds"]);
    charts.op = shareBars("chart-op", data.breakdown.by_op, ["flops", "seconds"]);
    const sw = data.sweep, timed = sw.some((r) => r.seconds !== null);
    const sets = [
      { label: "FLOPs", data: sw.map((r) => ({ x: r.seq_len, y: r.flops })), borderColor: PALETTE[0], backgroundColor: PALETTE[0], yAxisID: "y" },
      { label: "bytes moved", data: sw.map((r) => ({ x: r.seq_len, y: r.bytes })), borderColor: PALETTE[1], backgroundColor: PALETTE[1], yAxisID: "y" },
    ];
    if (timed) sets.push({ label: "predicted time (s)", data: sw.map((r) => ({ x: r.seq_len, y: r.seconds })), borderColor: PALETTE[3], backgroundColor: PALETTE[3], borderDash: [5, 4], yAxisID: "y1" });
    const sweepScales = { x: { type: "logarithmic", title: { display: true, text: "new tokens T" } }, y: logAxis("FLOPs / bytes") };
    if (timed) sweepScales.y1 = logAxis("seconds", { position: "right", grid: { drawOnChartArea: false } });
    charts.sweep = new Chart($("chart-sweep"), { type: "line", data: { datasets: sets }, options: { scales: sweepScales } });
    const ok = data.op_kinds, pts = ok.points;
    $("roofline-caption").textContent = `roofline: op kinds at T=${ok.seq_len}` + (ok.roof ? ` on ${ok.roof.name}` : "");
    const rsets = [{ type: "scatter", label: "op kinds", data: pts.map((p) => ({ x: p.intensity, y: p.attained, op: p.op })), backgroundColor: PALETTE[0] }];
    if (ok.roof) {
      const ridge = ok.roof.peak / ok.roof.bandwidth, xs = [1e-2, ridge, 1e5];
      rsets.push({ type: "line", label: `${ok.roof.name} roofline`, data: xs.map((x) => ({ x: x, y: Math.min(ok.roof.peak, x * ok.roof.bandwidth) })), borderColor: "#000", pointRadius: 0 });
    }
    // each point named beside it, as trace --plot annotates them
    const names = { id: "opNames", afterDatasetsDraw(chart) {
      const g = chart.ctx, meta = chart.getDatasetMeta(0);
      g.save(); g.font = "10px sans-serif"; g.fillStyle = "#333";
      meta.data.forEach((pt, i) => g.fillText(pts[i].op, pt.x + 5, pt.y - 4));
      g.restore();
    } };
    charts.roofline = new Chart($("chart-roofline"), {
      type: "scatter", data: { datasets: rsets }, plugins: [names],
      options: {
        scales: { x: logAxis("arithmetic intensity (FLOP/byte)"), y: logAxis("attained FLOP/s") },
        plugins: { tooltip: { callbacks: { label: (c) => (c.raw.op ? `${c.raw.op}: ${c.raw.x.toFixed(2)} FLOP/B, ${fmtN(c.raw.y)}FLOP/s` : "") } } },
      },
    });
  }

  // -- devices ------------------------------------------------------------------------------------
  const p = data.partition;
  if (p) {
    $("partition").hidden = false; $("nav-partition").hidden = false;
    const mesh = Object.entries(p.mesh).filter(([, v]) => v > 1).map(([k, v]) => `${k}=${v}`).join(" × ");
    $("partition-head").textContent = `${p.devices} devices (${mesh || "one device"}): ${p.strategy}` + (p.pipeline.stages > 1 ? `; pipeline ${p.pipeline.schedule}, ${p.pipeline.microbatches} microbatches, bubble ${(100 * p.pipeline.bubble).toFixed(1)}%` : "") + (p.notes.length ? "; " + p.notes.join("; ") : "");
    const srows = [
      ["layers", (s) => (s.layers ? `${s.layers[0]}-${s.layers[1]}` : "")],
      ["params", (s) => fmtN(s.params)],
      ["weights", (s) => fmtB(s.weight_bytes)],
      ["KV cache", (s) => fmtB(s.kv_cache_bytes)],
      ...(p.stages.some((s) => s.state_bytes) ? [["conv and recurrent state", (s) => fmtB(s.state_bytes)]] : []),
      ["activations (peak)", (s) => fmtB(s.activation_bytes)],
      ["memory", (s) => fmtB(s.memory_bytes) + (s.fits === null ? "" : s.fits ? " fits" : " too big")],
      ["FLOPs", (s) => fmtN(s.flops)],
      ["bytes moved", (s) => fmtB(s.bytes)],
      ["bytes sent", (s) => fmtB(Object.values(s.comm_bytes).reduce((a, b) => a + b, 0))],
      ["compute time", (s) => fmtT(s.compute_seconds)],
      ["communication time", (s) => fmtT(s.comm_seconds)],
      ["time (no overlap)", (s) => fmtT(s.seconds)],
    ];
    $("stage-table").innerHTML = "<tr><th>per device</th>" + p.stages.map((s) => `<th>stage ${s.stage}</th>`).join("") + "</tr>" +
      srows.map(([k, f]) => `<tr><td>${k}</td>` + p.stages.map((s) => `<td class="num">${esc(f(s))}</td>`).join("") + "</tr>").join("");
    const groups = new Map();
    for (const c of p.collectives) {
      const key = c.kind + "|" + c.mesh_axis;
      const g = groups.get(key) || { kind: c.kind, axis: c.mesh_axis, group: c.group_size, n: 0, lo: Infinity, hi: 0, wire: 0, t: 0 };
      g.n += c.count; g.lo = Math.min(g.lo, c.bytes); g.hi = Math.max(g.hi, c.bytes);
      g.wire += c.count * c.wire_bytes_per_device; g.t += c.count * (c.seconds || 0);
      groups.set(key, g);
    }
    $("collective-table").innerHTML = "<tr><th>collective</th><th>axis</th><th>group</th><th>count</th><th>payload</th><th>sent/device</th><th>time</th></tr>" +
      [...groups.values()].map((g) => `<tr><td>${esc(g.kind)}</td><td>${esc(g.axis)}</td><td class="num">${g.group}</td><td class="num">${g.n}</td><td class="num">${g.lo === g.hi ? fmtB(g.lo) : fmtB(g.lo) + " - " + fmtB(g.hi)}</td><td class="num">${fmtB(g.wire)}</td><td class="num">${fmtT(g.t)}</td></tr>`).join("");
    if (p.trace_gz) timeline(p.trace_gz);
  }

  async function timeline(b64) {
    $("timeline-box").hidden = false;
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
    $("trace-download").href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    const trace = JSON.parse(text), names = {}, lanes = new Map();
    let end = 0;
    for (const e of trace.traceEvents) {
      if (e.ph === "M" && e.name === "process_name") names[e.pid] = e.args.name;
      if (e.ph !== "X") continue;
      const key = e.pid * 16 + e.tid;
      if (!lanes.has(key)) lanes.set(key, { pid: e.pid, tid: e.tid, events: [] });
      lanes.get(key).events.push(e);
      end = Math.max(end, e.ts + e.dur);
    }
    const order = [...lanes.keys()].sort((a, b) => a - b), c = $("timeline");
    const H = 14, left = 190, W = c.width - left - 10;
    c.height = order.length * H + 30;
    const g = c.getContext("2d");
    g.font = "11px sans-serif"; g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    order.forEach((key, row) => {
      const lane = lanes.get(key), y = row * H + 4;
      g.fillStyle = "#333";
      g.fillText(`${names[lane.pid] || "device " + lane.pid}${lane.tid ? " comm" : ""}`.slice(0, 30), 4, y + 10);
      for (const e of lane.events) {
        g.fillStyle = e.cat === "communication" ? "#59a14f" : e.args && e.args.pass === "backward" ? "#f28e2b" : "#4e79a7";
        g.fillRect(left + (e.ts / end) * W, y, Math.max(0.5, (e.dur / end) * W), H - 3);
      }
    });
    g.fillStyle = "#333";
    g.fillText(`0 … ${fmtT(end / 1e6)}  (blue: compute, orange: backward, green: communication)`, left, order.length * H + 22);
    c.dataset.events = String(order.reduce((s, k) => s + lanes.get(k).events.length, 0));
  }
})();
