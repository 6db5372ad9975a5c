// Appended to a copy of an xsp HTML report by tests/test_views_browser.py: once the flame view
// and the timeline have drawn, write what they show into a pre element with id xsp-geometry:
// each flame box (in both widths) with its pixel extent, the tooltips a person reads when the
// pointer rests on named boxes, the timeline's bars, lanes, labels and launch links, and
// whether the first analysis chart draws once scrolled to.
(function () {
  const hover = (view, k) => { // the pointer at the middle of shown box k: the tooltip's text
    const rect = view.canvas.getBoundingClientRect();
    const x = (view.px(view.x0[k]) + view.px(view.x1[k])) / 2;
    const y = view.row[k] * 16 + 8;
    view.canvas.dispatchEvent(new MouseEvent("mousemove", {clientX: rect.left + x, clientY: rect.top + y}));
    const text = view.tip.style.display === "block" ? view.tip.innerText : "";
    view.canvas.dispatchEvent(new MouseEvent("mouseleave"));
    return text;
  };
  const boxes = (state) => state.shown.map((i, k) => ({
    i: i, level: state.view.levels ? "" : window.xspStepView.data.levels[window.xspStepView.data.l[i]],
    x0: state.view.px(state.view.x0[k]), x1: state.view.px(state.view.x1[k]),
    value: state.view.x1[k] - state.view.x0[k], row: state.view.row[k],
  }));
  const report = () => {
    const data = window.xspStepView.data;
    const views = window.xspStepView.views;
    const flame = views.flame;
    const out = {mode: flame.mode, tips: {}};
    const named = (name) => flame.shown.findIndex((i) => data.names[data.n[i]] === name);
    out.gpuBoxes = boxes(flame);
    for (const name of ["ResNet", "layer1", "layer4"]) out.tips[name] = hover(flame.view, named(name));
    document.querySelector('#xsp-flame button[data-mode="host"]').click();
    out.hostBoxes = boxes(flame);
    out.hostTip = hover(flame.view, named("layer1"));
    const timeline = views.timeline;
    out.bars = timeline.shown.map((i) => ({i: i, name: data.names[data.n[i]], row: data.r[i]}));
    out.lanes = data.lanes;
    out.timelineDrawn = timeline.view.drawn;
    const kernel = timeline.launch.findIndex((k) => k >= 0);
    out.kernelTip = hover(timeline.view, kernel);
    timeline.focus = -1;
    timeline.view.canvas.dispatchEvent(new MouseEvent("mousemove", {clientX: -1e6, clientY: -1e6}));
    const rect = timeline.view.canvas.getBoundingClientRect();
    const x = (timeline.view.px(timeline.view.x0[kernel]) + timeline.view.px(timeline.view.x1[kernel])) / 2;
    timeline.view.canvas.dispatchEvent(new MouseEvent("mousemove",
      {clientX: rect.left + x, clientY: rect.top + timeline.view.row[kernel] * 16 + 8}));
    out.kernelLinks = timeline.links;
    out.kernel = timeline.shown[kernel];
    out.kernelLaunch = timeline.shown[timeline.launch[kernel]];
    // the analyses' charts: plotly unpacked and run once the first comes near the window
    const chart = document.querySelector(".plotly-graph-div");
    out.plotlyBeforeScroll = typeof window.Plotly !== "undefined";
    chart.scrollIntoView();
    const drawn = () => {
      if (!chart.querySelector(".main-svg")) { setTimeout(drawn, 50); return; }
      out.chartDrawn = true;
      const pre = document.createElement("pre");
      pre.id = "xsp-geometry";
      pre.textContent = JSON.stringify(out);
      document.body.appendChild(pre);
    };
    drawn();
  };
  window.addEventListener("load", () => {
    document.getElementById("xsp-timeline").scrollIntoView();
    const wait = () => {
      const views = window.xspStepView && window.xspStepView.views;
      if (views && views.flame && views.timeline) report(); else setTimeout(wait, 50);
    };
    wait();
  });
})();
