// Where the first screen's parts lie on the page (CSS pixels from the page's top), written into
// a pre element (id xsp-first) once the page has loaded, for tests/test_report_browser.py.
window.addEventListener("load", () => {
  const at = {};
  const parts = {
    answer: "#answer",
    verdict: "#verdict",
    causes: "#causes",
    causes_table: "#causes + .checks ~ table, #causes ~ table",
    suggestions: "#top-suggestions",
    top_suggestion: "#top-suggestions + ol > li, #top-suggestions + p",
    layers: "#top-layers",
    warnings: "#warnings",
    flame: "h2",
  };
  for (const [name, selector] of Object.entries(parts)) {
    const element = document.querySelector(selector);
    if (element) {
      const box = element.getBoundingClientRect();
      at[name] = { top: box.top + window.scrollY, bottom: box.bottom + window.scrollY,
                   text: element.textContent.slice(0, 1000) };
    }
  }
  const out = document.createElement("pre");
  out.id = "xsp-first";
  out.textContent = JSON.stringify(at);
  document.body.appendChild(out);
});
