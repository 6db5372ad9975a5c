"""The derived values of ``xsp.analysis.measurement.derived``: each declared once, each need a declaration,
no cycle among them, and a value computed once per store whatever asks first."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import xsp.analysis
from xsp.analysis.measurement import derived
from xsp.analysis.measurement.derived import Derived


def _declarations() -> dict[str, tuple[str, ...]]:
    for module in pkgutil.walk_packages(xsp.analysis.__path__, "xsp.analysis."):
        importlib.import_module(module.name)
    return {name: item.needs for name, item in derived.declared().items()}


def test_every_need_names_a_declaration_and_none_is_its_own_ancestor() -> None:
    needs = _declarations()
    assert {"replay", "reconstruction", "flops", "counter_join"} <= set(needs)
    for name, named in needs.items():
        assert set(named) <= set(needs), name
        seen, todo = set(), list(named)
        while todo:
            need = todo.pop()
            assert need != name, f"{name} needs itself"
            if need not in seen:
                seen.add(need)
                todo.extend(needs[need])


def test_a_name_is_declared_once() -> None:
    _declarations()
    with pytest.raises(ValueError, match="declared twice"):
        Derived("replay", lambda store: None)


def test_a_value_is_computed_once_and_registered_for_sql() -> None:
    import pyarrow as pa

    class _Store:
        def __init__(self) -> None:
            import duckdb

            self.derived_values: dict[object, object] = {}
            self.con = duckdb.connect()

    calls = []

    def compute(store: object) -> pa.Table:
        calls.append(store)
        return pa.table({"x": [1, 2]})

    table = Derived("test_numbers", compute, view=lambda t: t)
    store = _Store()
    assert table.of(store) is table.of(store)  # type: ignore[arg-type]
    assert len(calls) == 1
    assert store.con.execute("SELECT sum(x) FROM test_numbers").fetchall() == [(3,)]
