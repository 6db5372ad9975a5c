"""The measurement as the analyses read it: its runs in DuckDB (``store``), values derived from
them by name (``derived``), the spans of the level runs matched to each other (``matching``) and
the untraced steps (``untraced``). Every other analysis package builds on this one."""
