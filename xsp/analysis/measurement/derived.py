"""Values derived from a measurement, each declared once by name with what it needs, as
Perfetto's standard library declares its tables: the reconstruction, the replay, the FLOP count,
the counter join, ...

A declaration's value is computed on first use and kept on the store (``derived_values``), so
an analysis asks for what it reads and never depends on another analysis having run first. A
value that SQL reads is registered in the store's DuckDB connection under its name when it is
computed (``view``), so a query that names it asks for it first, whoever computed it.

``needs`` names the declared values a compute reads (``declared`` lists the graph; a test
checks that each names a declaration and that they form no cycle). They are named rather than
imported so that a module which loads its inputs lazily (to keep ``xsp summary`` light) can still
say what it reads; they are computed when the compute asks for them, not before, so the order in
which a computation reads and warns stays its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import pyarrow as pa

if TYPE_CHECKING:
    from xsp.analysis.measurement.store import MeasurementStore

__all__ = ["Derived", "DerivedPer", "declared"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_DECLARED: dict[str, Derived[Any] | DerivedPer[Any, Any]] = {}


def _declare(item: Derived[Any] | DerivedPer[Any, Any]) -> None:
    if item.name in _DECLARED:
        raise ValueError(f"derived value {item.name!r} is declared twice")
    _DECLARED[item.name] = item


def declared() -> Mapping[str, Derived[Any] | DerivedPer[Any, Any]]:
    """Every declaration made so far (those of the modules imported), by name."""
    return dict(_DECLARED)


def _kept(
    store: MeasurementStore,
    name: str,
    key: Hashable,
    compute: Callable[[], T],
    view: Callable[[T], pa.Table | None] | None,
) -> T:
    values = store.derived_values
    if (name, key) not in values:
        value = compute()
        table = view(value) if view is not None else None
        if table is not None:
            store.con.register(name, table)
        values[(name, key)] = value
    return cast(T, values[(name, key)])


@dataclass(frozen=True)
class Derived(Generic[T]):
    """One value per store: ``compute(store)``, which reads the values it ``needs``.

    ``view``: the SQL table to register under ``name`` once computed (None: none)."""

    name: str
    compute: Callable[[MeasurementStore], T]
    needs: tuple[str, ...] = ()
    view: Callable[[T], pa.Table | None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _declare(self)

    def of(self, store: MeasurementStore) -> T:
        """The value for ``store``, computed on its first use."""
        return _kept(store, self.name, None, lambda: self.compute(store), self.view)


@dataclass(frozen=True)
class DerivedPer(Generic[K, T]):
    """One value per store and key (a run's index, a what-if edit): ``compute(store, key)``."""

    name: str
    compute: Callable[[MeasurementStore, K], T]
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _declare(self)

    def of(self, store: MeasurementStore, key: K) -> T:
        """The value for ``store`` and ``key``, computed on its first use."""
        return _kept(store, self.name, key, lambda: self.compute(store, key), None)
