// Appended to a copy of an xsp HTML report by tests/test_report_browser.py: which tables are
// wider than their box (cut off, to be scrolled sideways), written into a pre element (id
// xsp-widths) once the page has loaded.
window.addEventListener("load", () => {
  // sections off screen are not laid out (content-visibility: auto): lay them all out
  document.querySelectorAll("section").forEach((s) => { s.style.contentVisibility = "visible"; });
  const out = [];
  for (const box of document.querySelectorAll("div.table")) {
    const heading = box.previousElementSibling;
    let title = box.closest("section, div#answer") ? "answer" : "";
    for (let at = box.previousElementSibling; at && !title; at = at.previousElementSibling) {
      if (/^H[23]$/.test(at.tagName)) title = at.textContent;
    }
    out.push({title: title || (heading && heading.textContent) || "", width: box.clientWidth,
              content: box.scrollWidth});
  }
  const pre = document.createElement("pre");
  pre.id = "xsp-widths";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
