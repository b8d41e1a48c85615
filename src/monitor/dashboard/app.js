// The tiercache dashboard: polls /api/snapshot once a second and draws it.
// No libraries: canvas 2D only. `window.tc` exposes what was drawn, for
// the browser test (tests/dashboard_browser.rs) and for curious people.
"use strict";

const POLL_MS = 1000;
const COLS = 64; // heat map: regions in rows of 64, volume start top left

const $ = (id) => document.getElementById(id);
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
// Text from the daemon (device names, failure reasons) put into HTML.
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

const tc = {
  snapshots: 0,
  failures: 0,
  last: null,
  // The volume the heat map and the curve show (a cache of several
  // origins: the picker).
  volume: 0,
  // Per region as last drawn: "empty", "cached" or "dirty".
  cells: [],
  selectVolume(v) {
    this.volume = v;
    $("heat-volume").value = String(v);
    if (this.last) {
      drawHeat(this.last);
      drawMrc(this.last);
    }
  },
  // The curve drawn now: its points and whose it is.
  mrcShown() { return this.last ? mrcShown(this.last) : null; },
  cellRect(i) {
    const c = $("c-heat");
    const rows = Math.ceil(this.cells.length / COLS) || 1;
    const w = c.width / COLS, h = c.height / rows;
    return { x: (i % COLS) * w, y: Math.floor(i / COLS) * h, w, h };
  },
  cellState(i) { return this.cells[i]; },
  // The colour drawn near a cell's top left corner, [r, g, b].
  cellPixel(i) {
    const r = this.cellRect(i);
    const d = $("c-heat").getContext("2d").getImageData(Math.floor(r.x + 2), Math.floor(r.y + 2), 1, 1).data;
    return [d[0], d[1], d[2]];
  },
  // A hash of every canvas, to see that they change.
  signature() {
    const out = {};
    for (const id of ["c-hit", "c-iops", "c-lat", "c-dirty", "c-heat", "c-mrc"]) {
      out[id] = hash($(id).toDataURL());
    }
    return out;
  },
};
window.tc = tc;

function hash(s) {
  let h = 5381;
  for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
  return h;
}

function fmtRatio(x) { return x == null ? "-" : (x * 100).toFixed(1) + "%"; }
function fmtNum(x) {
  if (x == null) return "-";
  if (x >= 1e6) return (x / 1e6).toFixed(1) + "M";
  if (x >= 1e4) return (x / 1e3).toFixed(0) + "k";
  if (x >= 1e3) return (x / 1e3).toFixed(1) + "k";
  return x.toFixed(0);
}
function fmtSecs(s) {
  if (s == null) return "-";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 2 : 1) + " ms";
  return s.toFixed(2) + " s";
}
function fmtBytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b.toFixed(0)) + " " + u[i];
}

// A line chart of `series` ({values, color}) over the samples' times.
// `log`: logarithmic y (latencies); `max`: fixed top (ratios).
function lineChart(canvas, times, series, opts) {
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 46, B = 16, T = 6;
  g.clearRect(0, 0, W, H);
  g.fillStyle = "#fff";
  g.fillRect(0, 0, W, H);
  const all = series.flatMap((s) => s.values.filter((v) => v != null && isFinite(v) && (!opts.log || v > 0)));
  let lo = opts.log ? Math.min(...all, 1e-5) : 0;
  let hi = opts.max != null ? opts.max : Math.max(...all, opts.minTop || 1);
  if (opts.log) { lo = Math.pow(10, Math.floor(Math.log10(lo))); hi = Math.pow(10, Math.ceil(Math.log10(Math.max(hi, lo * 10)))); }
  const y = (v) => {
    const f = opts.log ? (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) : (v - lo) / (hi - lo || 1);
    return H - B - f * (H - B - T);
  };
  const t0 = times.length ? times[0] : 0, t1 = times.length ? times[times.length - 1] : 1;
  const x = (t) => L + ((t - t0) / ((t1 - t0) || 1)) * (W - L - 4);
  g.strokeStyle = "#d0d7de"; g.fillStyle = "#656d76"; g.font = "10px sans-serif"; g.lineWidth = 1;
  const ticks = opts.log ? [] : [lo, (lo + hi) / 2, hi];
  if (opts.log) for (let v = lo; v <= hi * 1.001; v *= 10) ticks.push(v);
  for (const v of ticks) {
    g.beginPath(); g.moveTo(L, y(v)); g.lineTo(W, y(v)); g.stroke();
    g.fillText(opts.fmt(v), 2, y(v) + 3);
  }
  if (times.length > 1) g.fillText(Math.round(t1 - t0) + " s", W - 30, H - 3);
  for (const s of series) {
    g.strokeStyle = s.color; g.lineWidth = 1.5; g.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v == null || !isFinite(v) || (opts.log && v <= 0)) { pen = false; return; }
      const px = x(times[i]), py = y(Math.min(Math.max(v, lo), hi));
      if (pen) g.lineTo(px, py); else g.moveTo(px, py);
      pen = true;
    });
    g.stroke();
  }
}

function drawCharts(snap) {
  const h = snap.history;
  const t = h.map((s) => s.t_s);
  const col = (k) => h.map((s) => s[k]);
  lineChart($("c-hit"), t, [{ values: col("read_hit_ratio"), color: css("--read") }],
    { max: 1, fmt: (v) => (v * 100).toFixed(0) + "%" });
  lineChart($("c-iops"), t, [
    { values: col("read_iops"), color: css("--read") },
    { values: col("write_iops"), color: css("--write") },
    { values: h.map((s) => s.origin_read_iops + s.origin_write_iops), color: css("--origin") },
  ], { fmt: fmtNum, minTop: 10 });
  lineChart($("c-lat"), t, [
    { values: col("read_p50_s"), color: css("--read") },
    { values: col("read_p99_s"), color: css("--p99") },
    { values: col("write_p99_s"), color: css("--write") },
  ], { log: true, fmt: fmtSecs });
  // Writeback rate as a share of its own peak, beside the dirty share.
  const wb = col("writeback_bytes_per_s");
  const wbMax = Math.max(...wb, 1);
  lineChart($("c-dirty"), t, [
    { values: col("dirty_ratio"), color: css("--dirty") },
    { values: col("used_ratio"), color: css("--used") },
    { values: wb.map((v) => v / wbMax), color: css("--write") },
  ], { max: 1, fmt: (v) => (v * 100).toFixed(0) + "%" });
}

// The picked volume's map and size (volume 0 for a cache of one origin).
function pickedHeat(snap) {
  const heats = snap.heats || [snap.heat];
  const v = Math.min(tc.volume, heats.length - 1);
  const vol = (snap.status.volumes || [])[v];
  return { heat: heats[v], bytes: vol ? vol.bytes : snap.status.volume_bytes };
}

// The picker lists the volumes of a cache of several origins.
function fillPicker(snap) {
  const p = $("heat-volume");
  const vols = snap.status.volumes || [];
  p.hidden = vols.length < 2;
  const names = vols.map((v) => v.name).join("\n");
  if (p.dataset.names !== names) {
    p.dataset.names = names;
    p.innerHTML = vols.map((v, i) => `<option value="${i}">${esc(v.name)}</option>`).join("");
    p.value = String(Math.min(tc.volume, Math.max(0, vols.length - 1)));
  }
}

function drawHeat(snap) {
  fillPicker(snap);
  const { heat, bytes } = pickedHeat(snap);
  const c = $("c-heat"), g = c.getContext("2d");
  const n = heat.cached.length;
  const volumeBlocks = Math.ceil(bytes / heat.block_bytes);
  tc.cells = new Array(n);
  const rows = Math.ceil(n / COLS);
  const w = c.width / COLS, hh = c.height / rows;
  const maxHot = Math.max(...heat.hot, 1e-9);
  const empty = [229, 231, 235], cached = [37, 99, 235], dirty = [220, 38, 38];
  const mix = (a, b, f) => a.map((v, k) => Math.round(v + (b[k] - v) * f));
  g.clearRect(0, 0, c.width, c.height);
  for (let i = 0; i < n; i++) {
    const blocks = Math.max(1, Math.min(heat.region_blocks, volumeBlocks - i * heat.region_blocks));
    let rgb;
    if (heat.dirty[i] > 0) {
      tc.cells[i] = "dirty";
      rgb = mix(empty, dirty, 0.45 + 0.55 * Math.min(1, heat.dirty[i] / blocks));
    } else if (heat.cached[i] > 0) {
      tc.cells[i] = "cached";
      rgb = mix(empty, cached, 0.3 + 0.7 * Math.min(1, heat.cached[i] / blocks));
    } else {
      tc.cells[i] = "empty";
      rgb = empty;
    }
    const x = (i % COLS) * w, y = Math.floor(i / COLS) * hh;
    g.fillStyle = `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
    g.fillRect(x, y, w - 1, hh - 1);
    // Hot: a bar along the bottom, its length the log of the access rate.
    const hot = heat.hot[i];
    if (hot > 0.05) {
      const f = Math.log1p(hot) / Math.log1p(maxHot);
      g.fillStyle = css("--hot");
      g.fillRect(x, y + hh - 1 - Math.max(2, hh * 0.25), Math.max(1, (w - 1) * f), Math.max(2, hh * 0.25));
    }
  }
  const regionBytes = heat.region_blocks * heat.block_bytes;
  $("heat-note").textContent = `(${n} regions of ${fmtBytes(regionBytes)})`;
}

// The picked volume's own curve (a cache of several), else the cache's.
function mrcShown(snap) {
  const vols = snap.status.volumes || [];
  const vol = vols[Math.min(tc.volume, Math.max(0, vols.length - 1))];
  return vol && vol.mrc ? { m: vol.mrc, of: `volume ${vol.name}'s reads, ` } : { m: snap.mrc, of: "" };
}

function drawMrc(snap) {
  const c = $("c-mrc"), g = c.getContext("2d");
  const W = c.width, H = c.height, L = 40, B = 22, T = 8, R = 12;
  const shown = mrcShown(snap);
  const pts = shown.m.points;
  g.clearRect(0, 0, W, H);
  g.fillStyle = "#fff"; g.fillRect(0, 0, W, H);
  const x = (f) => L + ((Math.log2(f) + 3) / 6) * (W - L - R);
  const y = (r) => H - B - r * (H - B - T);
  g.strokeStyle = "#d0d7de"; g.fillStyle = "#656d76"; g.font = "10px sans-serif";
  for (const r of [0, 0.25, 0.5, 0.75, 1]) {
    g.beginPath(); g.moveTo(L, y(r)); g.lineTo(W - R, y(r)); g.stroke();
    g.fillText((r * 100).toFixed(0) + "%", 4, y(r) + 3);
  }
  for (const f of [0.125, 0.25, 0.5, 1, 2, 4, 8]) {
    g.fillText(f < 1 ? "1/" + Math.round(1 / f) + "x" : f + "x", x(f) - 8, H - 6);
  }
  g.strokeStyle = css("--origin"); g.setLineDash([4, 3]);
  g.beginPath(); g.moveTo(x(1), T); g.lineTo(x(1), H - B); g.stroke(); g.setLineDash([]);
  if (pts.length) {
    g.strokeStyle = css("--read"); g.lineWidth = 2; g.beginPath();
    pts.forEach((p, i) => (i ? g.lineTo(x(p.size_factor), y(p.hit_ratio)) : g.moveTo(x(p.size_factor), y(p.hit_ratio))));
    g.stroke(); g.lineWidth = 1;
    g.fillStyle = css("--read");
    for (const p of pts) {
      g.beginPath(); g.arc(x(p.size_factor), y(p.hit_ratio), 3, 0, 7); g.fill();
      g.fillText((p.hit_ratio * 100).toFixed(0) + "%", x(p.size_factor) - 8, y(p.hit_ratio) - 6);
    }
  } else {
    g.fillText("no requests yet", L + 10, T + 20);
  }
  const m = shown.m;
  $("mrc-note").textContent = `(${shown.of}${(m.sample_rate * 100).toFixed(2)}% of blocks sampled, ${m.tracked_blocks} tracked, ${fmtBytes(m.memory_bytes)})`;
}

function fillTables(snap) {
  const rows = snap.latency.filter((q) => q.count > 0).map((q) =>
    `<tr><td>${q.op} ${q.result}</td><td>${q.count}</td><td>${fmtSecs(q.p50_s)}</td><td>${fmtSecs(q.p90_s)}</td><td>${fmtSecs(q.p99_s)}</td></tr>`);
  $("t-lat").innerHTML = "<tr><th>request</th><th>count</th><th>p50</th><th>p90</th><th>p99</th></tr>" +
    (rows.join("") || "<tr><td>none yet</td></tr>");
  const st = snap.status.stats;
  $("t-counters").innerHTML = Object.keys(st).map((k) => `<tr><td>${k}</td><td>${st[k]}</td></tr>`).join("");
}

// A cache set's members (status.cache_members), or nothing for one device.
function fillDevices(snap) {
  const s = snap.status, ms = s.cache_members || [];
  $("s-devices").hidden = ms.length === 0;
  if (ms.length === 0) return;
  const risk = s.dirty_at_risk ? ` · ${fmtNum(s.dirty_at_risk)} dirty blocks on one copy` : "";
  $("set-state").textContent = `(${s.cache_set_state}${risk})`;
  const rows = ms.map((m) => {
    const rebuild = m.rebuild_total_bytes ? ` ${fmtRatio(m.rebuild_done_bytes / m.rebuild_total_bytes)} rebuilt` : "";
    const why = m.failure ? `: ${esc(m.failure)}` : "";
    const recent = m.checksum_errors_recent ? ` (${m.checksum_errors_recent} in 10 min)` : "";
    return `<tr class="${m.state}"><td>${m.index}</td><td>${esc(m.device)}</td><td>${m.state}${rebuild}${why}</td>` +
      `<td>${fmtNum(m.used_blocks)} / ${fmtNum(m.mirror_slots + m.own_slots)}</td><td>${fmtNum(m.dirty_blocks)}</td>` +
      `<td>${m.errors}</td><td>${m.bad_blocks || 0}${recent}</td></tr>`;
  });
  $("t-devices").innerHTML = "<tr><th>#</th><th>device</th><th>state</th><th>used blocks</th><th>dirty</th>" +
    "<th>errors</th><th>checksum errors</th></tr>" + rows.join("");
}

function fillCards(snap) {
  const s = snap.status, last = snap.history[snap.history.length - 1] || {};
  const st = s.stats;
  $("name").textContent = snap.name;
  $("summary").textContent = `${s.mode} · ${s.policy} · ${fmtBytes(s.volume_bytes)} volume · ` +
    `${fmtBytes(s.cache_blocks_total * s.block_bytes)} cache of ${fmtBytes(s.block_bytes)} blocks`;
  const total = st.read_hits + st.read_misses;
  $("v-hit").textContent = `${fmtRatio(last.read_hit_ratio)} now · ${fmtRatio(total ? st.read_hits / total : null)} all`;
  $("v-iops").textContent = `${fmtNum(last.read_iops)} / ${fmtNum(last.write_iops)}`;
  $("v-lat").textContent = `${fmtSecs(last.read_p50_s)} / ${fmtSecs(last.read_p99_s)}`;
  const tot = Math.max(1, s.cache_blocks_total);
  $("v-dirty").textContent = `${fmtRatio(s.cache_blocks_used / tot)} / ${fmtRatio(s.cache_blocks_dirty / tot)}`;
  $("v-wb").textContent = `${fmtBytes(last.writeback_bytes_per_s || 0)}/s · ${fmtBytes(s.cache_blocks_dirty * s.block_bytes)} dirty`;
}

function draw(snap) {
  fillCards(snap);
  fillDevices(snap);
  drawCharts(snap);
  drawHeat(snap);
  drawMrc(snap);
  fillTables(snap);
}

async function poll() {
  try {
    const r = await fetch("/api/snapshot", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const snap = await r.json();
    tc.last = snap;
    draw(snap);
    tc.snapshots++;
    $("conn").textContent = "live · updated " + new Date().toLocaleTimeString();
    $("conn").classList.remove("bad");
  } catch (e) {
    tc.failures++;
    $("conn").textContent = "disconnected (" + e.message + ")";
    $("conn").classList.add("bad");
  }
  setTimeout(poll, POLL_MS);
}

$("c-heat").addEventListener("mousemove", (ev) => {
  const snap = tc.last;
  if (!snap) return;
  const c = $("c-heat"), b = c.getBoundingClientRect();
  const h = pickedHeat(snap).heat;
  const rows = Math.ceil(h.cached.length / COLS);
  const col = Math.floor(((ev.clientX - b.left) / b.width) * COLS);
  const row = Math.floor(((ev.clientY - b.top) / b.height) * rows);
  const i = row * COLS + col;
  if (i < 0 || i >= h.cached.length) return;
  const from = i * h.region_blocks * h.block_bytes;
  $("heat-hover").textContent = `region ${i}: bytes ${fmtBytes(from)}..${fmtBytes(from + h.region_blocks * h.block_bytes)}, ` +
    `${h.cached[i]} of ${h.region_blocks} blocks cached, ${h.dirty[i]} dirty, ${h.hot[i].toFixed(1)} accesses/s`;
});

$("heat-volume").addEventListener("change", (ev) => tc.selectVolume(Number(ev.target.value)));

poll();
