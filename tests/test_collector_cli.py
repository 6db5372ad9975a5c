"""``xsp collector serve``'s arguments: a request limit that cannot be, the token kept out of
``ps``, and one line when a receiver listens beyond this machine unprotected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from xsp.cli import main


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The configurations ``serve`` would start, without starting a server."""
    started: list[Any] = []
    monkeypatch.setattr("xsp.collector.server.serve", lambda config, ready: started.append(config))
    monkeypatch.delenv("XSP_COLLECTOR_TOKEN", raising=False)
    return started


def _serve(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["collector", "serve", "--store", str(tmp_path / "s"), *args])


@pytest.mark.parametrize("size", ["nan", "inf", "-1", "0", "2048"])
def test_a_request_limit_that_cannot_be_is_one_line(
    size: str, tmp_path: Path, served: list[Any]
) -> None:
    done = _serve(tmp_path, "--max-request-mib", size)
    assert done.exit_code == 2
    assert "--max-request-mib" in done.output and "Traceback" not in done.output
    assert served == []


def test_the_request_limit_is_the_same_for_both_receivers(
    tmp_path: Path, served: list[Any]
) -> None:
    assert _serve(tmp_path, "--max-request-mib", "0.5").exit_code == 0
    assert served[0].max_request_bytes == 512 * 1024


def test_the_token_comes_from_a_file(tmp_path: Path, served: list[Any]) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    done = _serve(tmp_path, "--token-file", str(tmp_path / "token"))
    assert done.exit_code == 0, done.output
    assert served[0].token == "s3cret"


def test_the_token_is_given_once(tmp_path: Path, served: list[Any]) -> None:
    (tmp_path / "token").write_text("a")
    done = _serve(tmp_path, "--token", "b", "--token-file", str(tmp_path / "token"))
    assert done.exit_code == 2 and "give the token once" in done.output
    missing = _serve(tmp_path, "--token-file", str(tmp_path / "none"))
    assert missing.exit_code == 2 and "cannot read the token file" in missing.output


def test_listening_beyond_this_machine_unprotected_says_so(
    tmp_path: Path, served: list[Any]
) -> None:
    open_ = _serve(tmp_path, "--http", "0.0.0.0:4318", "--grpc", "")
    assert open_.exit_code == 0
    assert "0.0.0.0:4318 without a token" in open_.output
    in_clear = _serve(tmp_path, "--http", "0.0.0.0:4318", "--grpc", "", "--token", "t")
    assert "without TLS" in in_clear.output
    local = _serve(tmp_path)  # the loopback defaults
    assert "warning" not in local.output


def test_a_sender_chosen_name_reaches_the_terminal_as_characters() -> None:
    """An escape sequence in a span name is printed as its escape, and Rich markup as text."""
    import pyarrow as pa

    from xsp.cli.common import out_console
    from xsp.cli.render import print_table

    name = "evil\x1b[2J[red]x[/red]\u202e"
    table = pa.table({"name": [name], "ms": [1.5]})
    with out_console.capture() as captured:
        print_table("spans", table, rows=5)
    shown = captured.get()
    assert "\x1b[2J" not in shown and "\u202e" not in shown
    assert "\\x1b[2J[red]x[/red]\\u202e" in shown.replace("\n", "").replace("│", "").replace(
        " ", ""
    )


def test_a_replica_is_named_by_option_or_environment(
    tmp_path: Path, served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _serve(tmp_path, "--replica", "gw-1.a").exit_code == 0
    monkeypatch.setenv("XSP_COLLECTOR_REPLICA", "r2")
    assert _serve(tmp_path).exit_code == 0
    assert [config.replica for config in served] == ["gw-1.a", "r2"]


@pytest.mark.parametrize("name", ["a/b", ".hidden", "x" * 64])
def test_a_replica_name_that_cannot_name_files_is_one_line(name: str, tmp_path: Path) -> None:
    done = _serve(tmp_path, "--replica", name, "--http", "127.0.0.1:0", "--grpc", "")
    assert done.exit_code == 2
    assert (
        done.output.startswith("xsp: error: bad replica name")
        and len(done.output.splitlines()) == 1
    )


def test_an_s3_store_keeps_its_spool_and_working_copy_in_a_local_directory(
    tmp_path: Path, served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = CliRunner().invoke
    store = ["collector", "serve", "--store", "s3://traces/collected/"]
    assert run(main, [*store, "--replica", "r1", "--spool", str(tmp_path / "r1")]).exit_code == 0
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert run(main, [*store, "--replica", "r2"]).exit_code == 0
    assert run(main, store).exit_code == 0
    assert [(c.object_store, c.replica) for c in served] == [
        ("s3://traces/collected/", "r1"),
        ("s3://traces/collected/", "r2"),
        ("s3://traces/collected/", None),
    ]
    default = served[1].store.parent
    assert served[0].store == tmp_path / "r1"
    assert default.parent == tmp_path / "state/xsp/collector"
    assert default.name.startswith("traces_collected~")  # one directory a store, hashed
    assert [c.store.name for c in served[1:]] == ["r2", "collector"]  # and one a replica
    assert served[2].store.parent == default


def test_a_spool_directory_is_for_an_s3_store_only(tmp_path: Path, served: list[Any]) -> None:
    done = _serve(tmp_path, "--spool", str(tmp_path / "spool"))
    assert done.exit_code == 2
    assert done.output == (
        "xsp: error: --spool is for an s3:// store (a local store keeps its spool in "
        "STORE/.spool)\n"
    )
    assert served == []
