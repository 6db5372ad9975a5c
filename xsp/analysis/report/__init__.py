"""How analyses read to a person: cell and header formatting (``present``), charts and span views
for the HTML page (``charts``, ``views``), and the HTML reports of a run and of a diff
(``html``, ``diff_html``)."""
