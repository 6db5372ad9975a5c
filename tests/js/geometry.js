// Appended to a copy of an xsp HTML report by tests/test_views_browser.py: once plotly has drawn,
// write what the page shows (each flame box's id, value and pixel extent; the timeline's rows)
// into a pre element with id xsp-geometry, which the test reads from the DOM that Chromium dumps.
window.addEventListener('load', () => setTimeout(() => {
  const out = {flame: [], timelineRows: []};
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const type = gd.data && gd.data[0] && gd.data[0].type;
    if (type === 'icicle') {
      for (const slice of gd.querySelectorAll('g.slice')) {
        const d = slice.__data__;
        const box = slice.querySelector('path').getBBox();
        out.flame.push({
          id: d.data.data.id,
          parent: d.parent ? d.parent.data.data.id : null,
          value: d.value,
          x0: d.x0, x1: d.x1, width: box.width, height: box.height,
        });
      }
    } else if (gd.layout && gd.layout.title && String(gd.layout.title.text).startsWith('Timeline')) {
      out.timelineRows = [...gd.querySelectorAll('.ytick text')].map(t => t.textContent);
      out.timelineTraces = gd.data.map(t => ({name: t.name, bars: t.x.length}));
    }
  }
  const pre = document.createElement('pre');
  pre.id = 'xsp-geometry';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500));
