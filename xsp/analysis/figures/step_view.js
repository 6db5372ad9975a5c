// The report's flame view and timeline of the replayed step (xsp/analysis/figures/views.py makes
// the data): boxes on a canvas, drawn again on each zoom, so thousands of spans cost the page's
// load a few milliseconds and no DOM nodes. Click a box to zoom to it, double-click (or "reset")
// to see the whole step, drag to pan, Ctrl/⌘ + wheel to zoom around the pointer.
(function () {
  "use strict";
  const ROW = 16;
  const FONT = "11px sans-serif";
  const CHAR_PX = 6.2; // the font's average character width: labels are cut without measuring
  const ms = (ns) => (ns / 1e6).toFixed(3) + " ms";
  const esc = (text) => String(text).replace(/[&<>]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;"})[c]);

  // Boxes (x0, x1 in the domain's units, row) on a canvas, with zoom, pan, hover and click.
  class Rows {
    constructor(host, gutter) {
      this.host = host;
      this.gutter = gutter;
      this.canvas = document.createElement("canvas");
      this.canvas.style.display = "block";
      this.canvas.style.cursor = "pointer";
      this.tip = document.createElement("div");
      this.tip.className = "xsp-tip";
      host.append(this.canvas, this.tip);
      this.decorate = () => {};
      this.listen();
      window.addEventListener("resize", () => this.draw());
    }
    // x0, x1, row: arrays over the shown boxes; colour(i), label(i), hover(i) per shown box
    set(boxes) {
      Object.assign(this, boxes);
      this.rows = 1 + this.row.reduce((a, b) => Math.max(a, b), 0);
      this.byRow = Array.from({length: this.rows}, () => []);
      this.row.forEach((r, i) => this.byRow[r].push(i));
      this.byRow.forEach((list) => list.sort((a, b) => this.x0[a] - this.x0[b]));
      this.full = [0, this.x1.reduce((a, b) => Math.max(a, b), 1)];
      this.lo = this.full[0];
      this.hi = this.full[1];
      this.draw();
    }
    width() { return Math.max(this.host.clientWidth - this.gutter, 100); }
    px(x) { return this.gutter + (x - this.lo) / (this.hi - this.lo) * this.width(); }
    at(clientX, clientY) {
      const box = this.canvas.getBoundingClientRect();
      const r = Math.floor((clientY - box.top) / ROW);
      if (r < 0 || r >= this.rows) return -1;
      const x = this.lo + (clientX - box.left - this.gutter) / this.width() * (this.hi - this.lo);
      const slack = (this.hi - this.lo) / this.width(); // a box drawn 1 px wide is found
      const list = this.byRow[r];
      let low = 0, high = list.length - 1, found = -1;
      while (low <= high) { // the last box that starts at or before x
        const mid = (low + high) >> 1;
        if (this.x0[list[mid]] <= x + slack) { found = mid; low = mid + 1; } else high = mid - 1;
      }
      for (let k = found; k >= 0 && k > found - 3; k--) {
        const i = list[k];
        if (this.x1[i] + slack >= x) return i;
      }
      return -1;
    }
    zoom(lo, hi) {
      const span = Math.max(hi - lo, (this.full[1] - this.full[0]) / 1e6);
      this.lo = Math.max(this.full[0], lo);
      this.hi = Math.min(this.full[1], this.lo + span);
      this.draw();
    }
    draw() {
      const dpr = window.devicePixelRatio || 1;
      const w = this.gutter + this.width();
      const h = this.rows * ROW;
      this.canvas.width = w * dpr;
      this.canvas.height = h * dpr;
      this.canvas.style.width = w + "px";
      this.canvas.style.height = h + "px";
      const ctx = this.canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.font = FONT;
      ctx.textBaseline = "middle";
      let drawn = 0, labels = 0;
      for (let i = 0; i < this.x0.length; i++) {
        const a = this.px(this.x0[i]), b = this.px(this.x1[i]);
        if (b < this.gutter || a > w) continue;
        const left = Math.max(a, this.gutter), right = Math.min(b, w);
        const width = Math.max(right - left, 1);
        const y = this.row[i] * ROW;
        ctx.fillStyle = this.colour(i);
        ctx.fillRect(left, y + 1, width, ROW - 2);
        drawn++;
        const room = Math.floor((width - 6) / CHAR_PX);
        if (room >= 3) {
          let text = this.label(i);
          if (text.length > room) text = text.slice(0, room - 1) + "…";
          ctx.fillStyle = "#fff";
          ctx.fillText(text, left + 3, y + ROW / 2);
          labels++;
        }
      }
      this.decorate(ctx);
      this.drawn = {boxes: drawn, labels: labels};
    }
    listen() {
      let drag = null;
      this.canvas.addEventListener("mousedown", (e) => { drag = {x: e.clientX, lo: this.lo, hi: this.hi, moved: false}; });
      window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
      this.canvas.addEventListener("mousemove", (e) => {
        if (drag && e.buttons) {
          const shift = (drag.x - e.clientX) / this.width() * (drag.hi - drag.lo);
          if (Math.abs(drag.x - e.clientX) > 3) drag.moved = true;
          const span = drag.hi - drag.lo;
          const lo = Math.min(Math.max(this.full[0], drag.lo + shift), this.full[1] - span);
          this.lo = lo; this.hi = lo + span; this.draw();
          return;
        }
        this.hover(this.at(e.clientX, e.clientY), e);
      });
      this.canvas.addEventListener("mouseleave", () => this.hover(-1));
      this.canvas.addEventListener("click", (e) => {
        if (drag && drag.moved) return;
        const i = this.at(e.clientX, e.clientY);
        if (i >= 0) this.zoom(this.x0[i], this.x1[i]);
      });
      this.canvas.addEventListener("dblclick", () => this.zoom(this.full[0], this.full[1]));
      this.canvas.addEventListener("wheel", (e) => {
        if (!(e.ctrlKey || e.metaKey)) return; // the page scrolls as usual
        e.preventDefault();
        const box = this.canvas.getBoundingClientRect();
        const at = this.lo + (e.clientX - box.left - this.gutter) / this.width() * (this.hi - this.lo);
        const f = Math.exp(e.deltaY * 0.002);
        this.zoom(at - (at - this.lo) * f, at + (this.hi - at) * f);
      }, {passive: false});
    }
    show(html, e) {
      if (!html) { this.tip.style.display = "none"; return; }
      this.tip.innerHTML = html;
      this.tip.style.display = "block";
      const box = this.host.getBoundingClientRect();
      const x = e ? e.clientX - box.left + 12 : 0, y = e ? e.clientY - box.top + 12 : 0;
      this.tip.style.left = Math.min(x, this.host.clientWidth - 420) + "px";
      this.tip.style.top = y + "px";
    }
  }

  function depths(parent) {
    const depth = new Int32Array(parent.length);
    for (let i = 0; i < parent.length; i++) depth[i] = parent[i] >= 0 ? depth[parent[i]] + 1 : 0;
    return depth;
  }

  // What a box's tooltip says: its name, time, level, GPU time and, for a layer, its GPU time
  // forward and backward and its time on the critical path.
  function describe(data, i, extra) {
    const lines = [`<b>${esc(data.names[data.n[i]])}</b>`];
    const level = data.levels[data.l[i]];
    lines.push(`${ms(data.d[i])} · ${level}` + (extra || ""));
    if (data.m[i] >= 0) lines.push(`layer: ${esc(data.paths[data.m[i]])}`);
    if (level !== "gpu" && data.g[i] > 0) lines.push(`GPU time of the kernels launched below: ${ms(data.g[i])}`);
    if (data.lg[i] >= 0) lines.push(`layer GPU time (forward + backward): ${ms(data.lg[i])}`);
    if (data.c[i] >= 0) lines.push(`layer time on the critical path: ${ms(data.c[i])} (${(100 * data.c[i] / data.step_ns).toFixed(1)}% of the step)`);
    return lines.join("<br>");
  }

  function flame(host, data) {
    const view = new Rows(host.querySelector(".xsp-canvas"), 0);
    const depth = depths(data.p.map((p) => (p === -2 ? -1 : p)));
    const inFlame = [];
    for (let i = 0; i < data.p.length; i++) if (data.p[i] !== -2) inFlame.push(i);
    const state = {mode: data.mode, view: view, shown: []};
    const render = (mode) => {
      state.mode = mode;
      let shown;
      const x0 = [], x1 = [];
      if (mode === "gpu") { // packed by the GPU time below each box, activities as leaves
        shown = inFlame.filter((i) => data.g[i] > 0);
        const cursor = new Map();
        for (const i of shown) {
          const p = data.p[i];
          const start = p >= 0 ? cursor.get(p) : 0;
          x0.push(start); x1.push(start + data.g[i]);
          if (p >= 0) cursor.set(p, start + data.g[i]);
          cursor.set(i, start);
        }
      } else { // where the replay put each host span
        shown = inFlame.filter((i) => data.levels[data.l[i]] !== "gpu");
        for (const i of shown) { x0.push(data.s[i]); x1.push(data.s[i] + data.d[i]); }
      }
      state.shown = shown;
      view.set({
        x0: x0, x1: x1, row: shown.map((i) => depth[i]),
        colour: (k) => data.colours[data.l[shown[k]]],
        label: (k) => data.names[data.n[shown[k]]],
        hover: (k, e) => view.show(k < 0 ? "" : describe(data, shown[k]), e),
      });
      host.querySelectorAll("button[data-mode]").forEach((b) => b.classList.toggle("on", b.dataset.mode === mode));
    };
    host.querySelectorAll("button[data-mode]").forEach((b) => b.addEventListener("click", () => render(b.dataset.mode)));
    host.querySelector("button.reset").addEventListener("click", () => view.zoom(view.full[0], view.full[1]));
    render(data.mode);
    return state;
  }

  function timeline(host, data) {
    const view = new Rows(host.querySelector(".xsp-canvas"), 150);
    const shown = [];
    for (let i = 0; i < data.r.length; i++) if (data.r[i] >= 0) shown.push(i);
    const at = new Map(shown.map((i, k) => [i, k]));
    const gpu = data.levels.indexOf("gpu");
    // each activity's launch, and every activity launched below a span (its launch calls, ops
    // and layers), to highlight on hover
    const launch = shown.map((i) => (data.l[i] === gpu && at.has(data.u[i]) ? at.get(data.u[i]) : -1));
    const below = new Map();
    shown.forEach((i, k) => {
      if (data.l[i] !== gpu) return;
      for (let up = data.u[i]; up >= 0; up = data.u[up]) {
        if (!below.has(up)) below.set(up, []);
        below.get(up).push(k);
      }
    });
    const state = {view: view, shown: shown, launch: launch, focus: -1, arrows: false};
    const arrow = (ctx, k, kernel) => { // from the launch call's end to the activity's start
      const a = view.px(view.x1[k]), ay = view.row[k] * ROW + ROW / 2;
      const b = view.px(view.x0[kernel]), by = view.row[kernel] * ROW + ROW / 2;
      ctx.beginPath(); ctx.moveTo(a, ay); ctx.lineTo(b, by); ctx.stroke();
      const angle = Math.atan2(by - ay, b - a);
      ctx.beginPath(); ctx.moveTo(b, by);
      ctx.lineTo(b - 7 * Math.cos(angle - 0.4), by - 7 * Math.sin(angle - 0.4));
      ctx.lineTo(b - 7 * Math.cos(angle + 0.4), by - 7 * Math.sin(angle + 0.4));
      ctx.closePath(); ctx.fill();
    };
    view.decorate = (ctx) => {
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, view.gutter, view.rows * ROW);
      ctx.fillStyle = "#212529"; ctx.strokeStyle = "#ced4da";
      for (const [name, first] of data.lanes) {
        ctx.fillText(name, 4, first * ROW + ROW / 2);
        ctx.beginPath(); ctx.moveTo(0, first * ROW); ctx.lineTo(view.gutter + view.width(), first * ROW); ctx.stroke();
      }
      ctx.strokeStyle = "#212529"; ctx.fillStyle = "#212529"; ctx.lineWidth = 1;
      let links = 0;
      if (state.arrows) {
        const w = view.gutter + view.width();
        launch.forEach((k, kernel) => {
          if (k < 0 || view.px(view.x1[kernel]) < view.gutter || view.px(view.x0[k]) > w) return;
          arrow(ctx, k, kernel); links++;
        });
      }
      const f = state.focus;
      if (f >= 0) {
        const kernels = data.l[shown[f]] === gpu ? [f] : below.get(shown[f]) || [];
        ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
        for (const k of [f, ...kernels, ...kernels.map((x) => launch[x]).filter((x) => x >= 0)]) {
          const a = view.px(view.x0[k]);
          ctx.strokeRect(a, view.row[k] * ROW + 1, Math.max(view.px(view.x1[k]) - a, 2), ROW - 2);
        }
        ctx.lineWidth = 1;
        for (const kernel of kernels.slice(0, 200)) if (launch[kernel] >= 0) { arrow(ctx, launch[kernel], kernel); links++; }
      }
      state.links = links;
    };
    view.set({
      x0: shown.map((i) => data.s[i]), x1: shown.map((i) => data.s[i] + data.d[i]), row: shown.map((i) => data.r[i]),
      colour: (k) => data.colours[data.l[shown[k]]],
      label: (k) => data.names[data.n[shown[k]]],
      hover: (k, e) => {
        if (state.focus !== k) { state.focus = k; view.draw(); }
        if (k < 0) { view.show(""); return; }
        const i = shown[k];
        const started = ` · starts at ${ms(data.s[i])}`;
        const link = launch[k] >= 0 ? `<br>launched by ${esc(data.names[data.n[shown[launch[k]]]])} (outlined)` : "";
        const n = (below.get(i) || []).length;
        view.show(describe(data, i, started) + link + (n ? `<br>${n} GPU activities launched below (outlined)` : ""), e);
      },
    });
    host.querySelector("button.reset").addEventListener("click", () => view.zoom(view.full[0], view.full[1]));
    host.querySelector("input.arrows").addEventListener("change", (e) => { state.arrows = e.target.checked; view.draw(); });
    return state;
  }

  const data = JSON.parse(document.getElementById("xsp-step-data").textContent);
  window.xspStepView = {data: data, views: {}};
  const start = (name, make) => {
    const host = document.getElementById("xsp-" + name);
    if (!host) return;
    const run = () => { window.xspStepView.views[name] = make(host, data); };
    if (!("IntersectionObserver" in window)) { run(); return; }
    const seen = new IntersectionObserver((entries) => {
      if (!entries.some((e) => e.isIntersecting)) return;
      seen.disconnect(); run();
    }, {rootMargin: "800px 0px"});
    seen.observe(host);
  };
  start("flame", flame);
  start("timeline", timeline);
})();
