"""How analyses read to a person: cell and header formatting (``present``), and the charts and
span views of the HTML pages (``charts``, ``views``), which ``xsp.analysis.report`` and
``xsp.analysis.diff_report`` assemble."""
