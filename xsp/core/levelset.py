"""A level set ("M", "MF", "MFLG", "MH"): which levels one run records, parsed once.

``LevelSet`` is a ``str`` whose text is the canonical level set (upper case, stack order), so
that it names the run's directory, goes into ``run.json``, the manifest and the resource
attribute ``xsp.levels`` unchanged, and equals the plain text that stored runs carry. Building
one validates it (``LevelSet("mf") == "MF"``; ``LevelSet("MX")`` raises ValueError naming the
bad value), and its properties answer what the code asks of a level set: does it record level
F, L, G, the hardware counters?
"""

from __future__ import annotations

from collections.abc import Iterable

from xsp.core.levels import LEVEL_BY_LETTER, LEVEL_ORDER, LEVELS, ROOT, alone_level_set, level

__all__ = ["LevelSet", "continuous_counters", "level_sets", "parse_level_sets"]

#: The levels that run only in a level set of their own with the root (H, as MH).
_ALONE = tuple((info, info.alone) for info in LEVELS if info.alone is not None)


def _canonical(text: str) -> str:
    """Normalise one level set ("mf" -> "MF"); raise ValueError naming the bad value.

    A level set is a subset of MFLG in stack order that includes M, because the model span is
    every trace's root: M, MF, MFL, MFLG, or MLG (GPU work without the framework level). A
    level that runs alone (the hardware-counter level H) has a level set of its own, MH
    (``xsp.core.levels.RunsAlone``).
    """
    letters = text.strip().upper()
    for info, alone in _ALONE:
        if info.letter in letters:
            only = alone_level_set(info)
            if "".join(sorted(letters)) != "".join(sorted(only)):
                raise ValueError(
                    f"bad level set {text!r}: the {alone.title} level {info.letter} runs "
                    f"alone with {ROOT.letter}, as {only} ({alone.why})"
                )
            return only
    if not letters or any(ch not in LEVEL_BY_LETTER for ch in letters):
        others = " or ".join(f"{alone_level_set(info)} for {alone.gives}" for info, alone in _ALONE)
        raise ValueError(
            f"bad level set {text!r}: use letters from {LEVEL_ORDER!r}, e.g. M or MF (or {others})"
        )
    if len(set(letters)) != len(letters):
        raise ValueError(f"bad level set {text!r}: a level letter repeats")
    ordered = "".join(ch for ch in LEVEL_ORDER if ch in letters)
    if not ordered.startswith(ROOT.letter):
        raise ValueError(f"bad level set {text!r}: every level set includes M (the model span)")
    return ordered


class LevelSet(str):
    """One validated level set; its text is the canonical one ("MF")."""

    __slots__ = ()

    def __new__(cls, text: str) -> LevelSet:
        if isinstance(text, LevelSet):
            return text
        return super().__new__(cls, _canonical(text))

    @property
    def letters(self) -> tuple[str, ...]:
        """Its level letters in stack order: ("M", "F")."""
        return tuple(self)

    @property
    def framework(self) -> bool:
        """Records level F: modules and aten ops."""
        return "F" in self

    @property
    def library(self) -> bool:
        """Records level L: library and CUDA API calls (oneDNN on CPU)."""
        return "L" in self

    @property
    def gpu(self) -> bool:
        """Records level G: kernels, copies and memsets."""
        return "G" in self

    @property
    def counters(self) -> bool:
        """The hardware-counter level set (MH, under Nsight Compute): that of a level that runs
        alone."""
        return any(level(ch).alone for ch in self)

    @property
    def starts_its_process(self) -> bool:
        """A level of it needs its environment set before its process's libraries start (L, G:
        a ``Capture.environment`` in the table of levels) or runs alone (H, under Nsight
        Compute): it never runs in the process of a level set before it."""
        rows = [level(ch) for ch in self]
        captures = [c for info in rows for c in (info.cuda, info.cpu) if c is not None]
        return any(info.alone for info in rows) or any(c.environment for c in captures)

    @property
    def timed_levels(self) -> tuple[str, ...]:
        """The names of the levels whose spans it times ("model", "framework"); H times none."""
        return tuple(LEVEL_BY_LETTER[ch] for ch in self.letters if ch in LEVEL_BY_LETTER)


def parse_level_sets(text: str) -> list[LevelSet]:
    """Parse "M,MF,MFLG" into [LevelSet("M"), ...], rejecting none and duplicates."""
    return list(level_sets([part for part in text.split(",") if part.strip()], text))


def level_sets(texts: Iterable[str], text: str | None = None) -> tuple[LevelSet, ...]:
    """The level sets of ``texts`` (a LevelSet passes as it is), rejecting none and duplicates;
    ``text`` is what the error messages quote (the texts, comma-separated, by default)."""
    texts = list(texts)
    quoted = ",".join(texts) if text is None else text
    sets = tuple(LevelSet(part) for part in texts)
    if not sets:
        raise ValueError(f"bad level sets {quoted!r}: give at least one, e.g. M,MF")
    if len(set(sets)) != len(sets):
        raise ValueError(f"bad level sets {quoted!r}: a level set repeats")
    return sets


def continuous_counters(levels: LevelSet) -> str:
    """Why the hardware-counter level set ``levels`` cannot run in a continuous session: the one
    wording, wherever the rule is checked."""
    return (
        f"level set {levels}: level H cannot run in a continuous session (Nsight Compute "
        "replays each kernel in a run of its own): leave level H out for a service, or give "
        "a fixed --iterations"
    )
