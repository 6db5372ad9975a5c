"""Where a store lives: a local directory, or a prefix of an S3-compatible object store
(``s3://bucket/prefix``), for a measurement, a campaign and the collector alike.

One mechanism serves every command: an object store is *staged*. Its objects are copied whole
into a local temporary directory (``staged_read``), the store's readers read that directory as
they read any other, and a writer writes there and then uploads each finished file as one whole
object (``staged_write``). The readers verify every parquet page's checksum with pyarrow before
DuckDB sees a file, so each object is read once either way; DuckDB's httpfs extension cannot be
installed offline (the PyPI wheels are built for other DuckDB releases).

Writes are whole-object and atomic: a local file is only ever written to a temporary name and
renamed when complete (``json_io``, ``files``), the upload skips temporary names, and each
object is one PUT (or one multipart upload, which S3 makes visible only when it completes) of
a finished file read whole first. A writer killed mid-upload leaves the object absent or whole,
never half. Span parts and side tables go up before ``run.json``, run.json before
``manifest.json``, and a campaign's job results last, so a reader that finds a run's index
finds the files it lists.

A run written elsewhere (a campaign job on a Ray node) is *published* whole at its prefix
(``ObjectStore.publish``), with no rename: its index (``manifest.json``) is deleted first, the
objects it does not hold are deleted next, its files go up, and the index last. A reader given
such prefixes (``committed``) copies one only with its index, the same before and after the copy.

Credentials and the endpoint come from the usual AWS settings (pyarrow's S3 client, the AWS
SDK's default chain): ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``), or ``AWS_PROFILE`` with ``~/.aws/credentials`` and ``~/.aws/config``;
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for a server other than AWS (``http://`` for
plain HTTP); ``AWS_REGION`` or ``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyarrow import fs as pafs

from xsp.core.errors import StoreError, XspError
from xsp.core.store.files import MANIFEST

__all__ = [
    "RUN_INDEX",
    "ObjectStore",
    "is_uri",
    "object_store",
    "shown",
    "staged_read",
    "staged_store",
    "staged_write",
]

SCHEME = "s3://"
#: Objects downloaded and uploaded at a time: each is one request, mostly waiting on the network.
_THREADS = 8
#: What a local writer leaves that is never an object: its temporary files (renamed when whole).
_NEVER_UPLOADED = (".tmp-*", "*.tmp", ".xsp-write-test-*")
#: The object that commits a published run prefix (``ObjectStore.publish``): deleted first,
#: written last; a reader takes a committed prefix without it as absent.
RUN_INDEX = MANIFEST
#: Times a reader copies a committed prefix whose index changed while it copied (a writer
#: replaced it meanwhile) before it takes the prefix as absent.
_READ_TRIES = 3


def is_uri(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names an object store (``s3://...``) rather than a local path."""
    return str(target).startswith(SCHEME)


def _upload_rank(relative: str) -> int:
    """Upload order: a part's resources before the spans naming them, other data with the
    spans, then the files that list it (run.json, the manifest, a campaign's job results, its
    spec), so a reader never finds an index before its data, nor a span before its resource."""
    name = relative.rsplit("/", 1)[-1]
    if relative.startswith("jobs/"):
        return 4
    if name.startswith("resources-"):
        return 0
    return {"run.json": 2, "manifest.json": 3, "campaign.json": 5}.get(name, 1)


class _Missing(StoreError):
    """An object that is not there (any more)."""


@dataclass(frozen=True)
class _Listed:
    size: int
    mtime_ns: int


@dataclass
class ObjectStore:
    """The objects under one ``s3://bucket/prefix``, through pyarrow's S3 filesystem.

    ``download`` and ``upload`` keep a record of what they copied (``known``), so an upload
    sends only the files that are new or changed since, and removes the objects of files the
    local writer deleted (a re-run replaces its span parts)."""

    uri: str
    fs: pafs.FileSystem
    base: str  # bucket/prefix, as the filesystem names it
    known: dict[str, _Listed] = field(default_factory=dict)

    def key(self, relative: str) -> str:
        return f"{self.base}/{relative}" if relative else self.base

    def listing(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (under ``under`` in it, when given): its path relative
        to the prefix, and its size."""
        selector = pafs.FileSelector(self.key(under), recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot list {self.uri}: {_reason(exc)}") from exc
        prefix = self.base + "/"
        return {
            info.path[len(prefix) :]: info.size or 0
            for info in infos
            if info.type == pafs.FileType.File and info.path.startswith(prefix)
        }

    def get(self, relative: str) -> bytes:
        """One object, whole."""
        try:
            with self.fs.open_input_stream(self.key(relative)) as source:
                return bytes(source.read())
        except FileNotFoundError as exc:
            raise _Missing(f"{self.uri}/{relative}: missing") from exc
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot read {self.uri}/{relative}: {_reason(exc)}") from exc

    def put(self, relative: str, data: bytes) -> None:
        """One object, whole: a single write of finished bytes, so the object is absent or
        complete (a failed request completes no upload)."""
        try:
            with self.fs.open_output_stream(self.key(relative)) as sink:
                sink.write(data)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot write {self.uri}/{relative}: {_reason(exc)}") from exc

    def delete(self, relative: str) -> None:
        try:
            self.fs.delete_file(self.key(relative))
        except FileNotFoundError:
            pass
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot delete {self.uri}/{relative}: {_reason(exc)}") from exc

    def download(
        self, local: Path, only: tuple[str, ...] = (), committed: tuple[str, ...] = ()
    ) -> int:
        """Copy every object (those matching a pattern of ``only``, when given) into ``local``,
        whole; the number copied. A prefix matching a pattern of ``committed`` (``runs/*``)
        is one published whole (``publish``): copied only with its index, and only when its
        index was the same before and after the copy; else it is absent."""
        listed = self.listing()
        wanted = [r for r in listed if _wanted(r, only)]
        plain = [r for r in wanted if _committed_prefix(r, committed) is None]
        self.fetch(local, plain)
        prefixes = {p for r in wanted if (p := _committed_prefix(r, committed)) is not None}
        with ThreadPoolExecutor(_THREADS) as pool:  # a prefix at a time each, its objects 8 at once
            counts = pool.map(lambda prefix: self._fetch_committed(local, prefix, only), prefixes)
            return len(plain) + sum(counts)

    def fetch(self, local: Path, relatives: list[str]) -> None:
        """Copy the objects ``relatives`` into ``local``, each whole: written under a temporary
        name (``.tmp-*``, never uploaded) and renamed, so a reader of ``local`` (the collector's
        working copy, across a crash too) finds a file absent or complete."""

        def fetch(relative: str) -> None:
            path = local / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".tmp-{path.name}")
            partial.write_bytes(self.get(relative))
            os.replace(partial, path)
            self._remember(relative, path)

        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(fetch, relatives))

    def _fetch_committed(self, local: Path, prefix: str, only: tuple[str, ...]) -> int:
        """Copy a committed prefix's objects (those matching a pattern of ``only``, when
        given) when its index is there and unchanged across the copy: the number copied, 0
        when it reads as absent. Each try reads the index, then lists the prefix, copies what
        it lists and reads the index again, so the listing is one of the copy's window: a
        writer that replaced the prefix meanwhile deleted the index first and wrote a new
        one, which says when it began, last, so the two reads differ."""
        index = f"{prefix}/{RUN_INDEX}"
        if not _wanted(index, only):
            return 0  # a run is taken with its index or not at all
        for _ in range(_READ_TRIES):
            try:
                before = self.get(index)
            except _Missing:  # no index: never published whole, or being replaced
                return 0
            listed = self.listing(prefix)
            objects = [r for r in listed if _wanted(r, only)]
            try:
                self.fetch(local, objects)
                if self.get(index) == before:
                    return len(objects)
            except _Missing:  # an object deleted under the copy: the prefix was being replaced
                pass
            shutil.rmtree(local / prefix, ignore_errors=True)
            for relative in objects:
                self.known.pop(relative, None)
        return 0

    def upload(self, local: Path, only: tuple[str, ...] = ()) -> int:
        """Upload each finished file of ``local`` (each matching a pattern of ``only``, when
        given) that is new or changed since the last download or upload, as one whole object,
        data before the files that index it; remove the objects of files downloaded earlier
        and deleted since. The number uploaded."""
        files = {r: p for r, p in _finished_files(local).items() if _wanted(r, only)}
        changed = [r for r, p in files.items() if self.known.get(r) != _stat(p)]
        self.send(files, changed)
        gone = [r for r in self.known if r not in files]
        for relative in [r for r in gone if _wanted(r, only)]:
            self.delete(relative)
            del self.known[relative]
        return len(changed)

    def publish(self, local: Path, prefix: str) -> int:
        """Put the finished directory ``local`` at ``prefix`` (``runs/<job>``), replacing what
        an earlier attempt left there, by the commit rule of a run prefix: its index
        (``manifest.json``) is deleted first, so that readers take the prefix as absent from
        then on; the objects that ``local`` does not hold are deleted (a dead attempt's parts:
        readers find a run's files by listing, so none may stay); ``local``'s files go up as
        whole objects, data first and the index last, which commits them. An attempt killed
        midway leaves the prefix without its index: absent, never a mix. The number uploaded."""
        files = {f"{prefix}/{r}": p for r, p in _finished_files(local).items()}
        self.delete(f"{prefix}/{RUN_INDEX}")
        stale = [r for r in self.listing(prefix) if r not in files]
        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(self.delete, stale))
        self.send(files, list(files), remember=False)  # not a staged copy's: never re-sent
        return len(files)

    def send(self, files: Mapping[str, Path], names: list[str], remember: bool = True) -> None:
        """Upload ``names`` (keys of ``files``), each whole, in ``_upload_rank``'s order (a
        lower rank is up before any higher one starts); with ``remember``, as what the staged
        copy holds (``known``)."""

        def send(relative: str) -> None:
            path = files[relative]
            seen = _stat(path)
            self.put(relative, path.read_bytes())  # read whole first: never half a file
            if remember:
                self.known[relative] = seen

        for rank in sorted({_upload_rank(r) for r in names}):  # each rank done before the next
            with ThreadPoolExecutor(_THREADS) as pool:
                list(pool.map(send, [r for r in names if _upload_rank(r) == rank]))

    def _remember(self, relative: str, path: Path) -> None:
        self.known[relative] = _stat(path)


def _wanted(relative: str, only: tuple[str, ...]) -> bool:
    """Whether ``relative`` matches a pattern of ``only`` (every object does, where none)."""
    return not only or any(fnmatch.fnmatch(relative, pattern) for pattern in only)


def _finished_files(local: Path) -> dict[str, Path]:
    """Each file under ``local`` that a writer finished (no temporary name), by its path
    relative to ``local``."""
    return {
        p.relative_to(local).as_posix(): p
        for p in local.rglob("*")
        if p.is_file() and not any(fnmatch.fnmatch(p.name, n) for n in _NEVER_UPLOADED)
    }


def _committed_prefix(relative: str, committed: tuple[str, ...]) -> str | None:
    """The prefix of ``relative`` that matches a pattern of ``committed`` (as many path
    components as the pattern has), if one does and ``relative`` lies under it."""
    parts = relative.split("/")
    for pattern in committed:
        depth = pattern.count("/") + 1
        if len(parts) > depth and fnmatch.fnmatch("/".join(parts[:depth]), pattern):
            return "/".join(parts[:depth])
    return None


def _stat(path: Path) -> _Listed:
    info = path.stat()
    return _Listed(info.st_size, info.st_mtime_ns)


def _reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].endswith(":") and len(lines) > 1:  # the AWS SDK says what failed on the next
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def _s3_options(env: Mapping[str, str]) -> dict[str, str]:
    """pyarrow S3FileSystem options from the AWS variables of ``env``: the endpoint, the
    region, and a key pair when it holds one (else the AWS SDK's chain finds credentials:
    ``AWS_PROFILE`` and its files, a role)."""
    options: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, sep, host = endpoint.rstrip("/").partition("://")
        options["endpoint_override"] = host if sep else scheme
        options["scheme"] = scheme if sep else "https"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["access_key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["session_token"] = env["AWS_SESSION_TOKEN"]
    return options


def object_store(uri: str, env: Mapping[str, str] | None = None) -> ObjectStore:
    """The object store at ``uri`` (``s3://bucket/prefix``), configured from the AWS
    environment (``env``, default ``os.environ``)."""
    rest = uri[len(SCHEME) :].strip("/")
    bucket = rest.split("/", 1)[0]
    if not is_uri(uri) or not bucket:
        raise StoreError(f"{uri}: not an object-store location (expected s3://bucket/prefix)")
    try:
        # delayed open: a file smaller than one part goes up as one PutObject on close
        options = _s3_options(os.environ if env is None else env)
        filesystem = pafs.S3FileSystem(allow_delayed_open=True, **options)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise StoreError(f"cannot open {uri}: {_reason(exc)}") from exc
    return ObjectStore(uri=f"{SCHEME}{rest}", fs=filesystem, base=rest)


#: Local staging directories and the object-store location each stands for, so that what xsp
#: says about a file names the object (``shown``) rather than a temporary path.
_ALIASES: dict[str, str] = {}
#: Each staging directory's object store, with its record of what it copied (``staged_store``).
_STAGED: dict[str, ObjectStore] = {}


def shown(text: str) -> str:
    """``text`` with each staging directory's path written as the location it stands for."""
    for local, uri in _ALIASES.items():
        text = text.replace(local, uri)
    return text


def staged_store(local: Path) -> ObjectStore | None:
    """The object store that the staging directory ``local`` stands for (None for a local
    store): a command that writes records as it goes uploads them through it (``upload``)
    without waiting for its end."""
    return _STAGED.get(str(local))


@contextlib.contextmanager
def _staging(uri: str) -> Iterator[tuple[ObjectStore, Path]]:
    store = object_store(uri)
    scratch = Path(tempfile.mkdtemp(prefix="xsp-s3-"))
    local = scratch / "store"
    _ALIASES[str(local)] = store.uri
    _STAGED[str(local)] = store
    try:
        yield store, local
    except XspError as exc:  # its message names the object, not the scratch copy
        exc.args = (shown(str(exc)), *exc.args[1:])
        raise
    finally:
        _STAGED.pop(str(local), None)
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def staged_read(
    target: str | Path, only: tuple[str, ...] = (), committed: tuple[str, ...] = ()
) -> Iterator[Path]:
    """A local path that holds the store at ``target``: itself when local, else a temporary
    copy of its objects (those matching ``only``'s patterns, when given; of the prefixes
    matching ``committed``'s, those whose index is there: ``ObjectStore.download``), removed
    afterwards. With no object there the path does not exist, as a missing directory would
    not."""
    if not is_uri(target):
        yield Path(target)
        return
    with _staging(str(target)) as (store, local):
        store.download(local, only, committed)
        yield local


@contextlib.contextmanager
def staged_write(
    target: str | Path, only: tuple[str, ...] = (), committed: tuple[str, ...] = ()
) -> Iterator[Path]:
    """A local directory to write the store at ``target`` into: itself when local, else a
    temporary copy of what is stored there (a rerun resumes, a re-run level set replaces its
    own; ``only`` and ``committed`` as for ``staged_read``), whose new and changed files are
    uploaded when the block ends, also when it fails or is interrupted (what finished is
    kept, as on a local disk)."""
    if not is_uri(target):
        yield Path(target)
        return
    with _staging(str(target)) as (store, local):
        store.download(local, only, committed)
        try:
            yield local
        finally:
            if local.exists():
                store.upload(local, only)  # what it staged: the rest is not its to write
