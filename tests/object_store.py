"""A real S3 server for the tests: SeaweedFS's S3 gateway (``weed server -s3``, built by
scripts/build-seaweedfs.sh), on loopback ports of its own, with one static identity, and a
pytest fixture that starts one per module. Without the binary the tests are skipped, except
under CI, where they must run (as the Jaeger tests decide)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from tests.fixtures import free_ports

VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
WEED_BIN = Path(
    os.environ.get("XSP_SEAWEEDFS_BIN", Path.home() / f".cache/xsp/seaweedfs-{VERSION}/weed")
)
ACCESS_KEY = "xsp-test"
SECRET_KEY = "xsp-test-secret"
BUCKET = "xsp"
#: A second identity that reads everything but writes only a campaign's records
#: (``campaign.json``, ``jobs/*``): every publish of a run is refused, as a store that has run
#: out of quota or permission for it refuses one.
RECORDS_ONLY_KEY = "xsp-records-only"


class SeaweedS3:
    """One SeaweedFS (master, volume, filer, S3 gateway) in ``work``; ``env`` holds the AWS
    variables that point xsp at it."""

    def __init__(self, work: Path) -> None:
        ports = free_ports(8)
        master, volume, filer, s3 = ports[:4]
        self.endpoint = f"http://127.0.0.1:{s3}"
        config = work / "s3.json"
        identity = {
            "name": "xsp",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        records_only = {
            "name": "xsp-records-only",
            "credentials": [{"accessKey": RECORDS_ONLY_KEY, "secretKey": SECRET_KEY}],
            "actions": [
                "Read",
                "List",
                f"Write:{BUCKET}/*/campaign.json",
                f"Write:{BUCKET}/*/jobs/*",
            ],
        }
        config.write_text(json.dumps({"identities": [identity, records_only]}))
        (work / "data").mkdir()
        self.work = work
        self.command = [
            str(WEED_BIN),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={work / 'data'}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={s3}",
            # each its own ports (the defaults are fixed: a second server would clash)
            *(
                f"-{name}.port.grpc={port}"
                for name, port in zip(("master", "volume", "filer", "s3"), ports[4:], strict=True)
            ),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={work / 'filer.sock'}",
            f"-s3.localSocket={work / 's3.sock'}",
            "-volume.max=0",
            "-master.volumeSizeLimitMB=64",
            "-s3",
            f"-s3.config={config}",
        ]
        self._launch()
        self.env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups off EC2
        }
        #: ``env`` as the identity that may store a campaign's records but no run
        self.records_only_env = {**self.env, "AWS_ACCESS_KEY_ID": RECORDS_ONLY_KEY}
        self._wait_for_bucket(work)

    def _launch(self) -> None:
        self.log = (self.work / "weed.log").open("ab")
        self.proc = subprocess.Popen(
            self.command,
            cwd=self.work,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """Stop at once (SIGKILL to its process group): an outage, as a crashed server."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()

    def restart(self) -> None:
        """Start the stopped server again, on the same ports and data (an outage's end)."""
        self._launch()
        self._wait_for_bucket(self.work)

    def filesystem(self, **options: object) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
            **options,
        )

    def _wait_for_bucket(self, work: Path) -> None:
        """Wait until the gateway answers, making the test bucket (the first write needs the
        master, a volume and the filer up, which takes a few seconds)."""
        deadline = time.time() + 90
        last: Exception | None = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                filesystem = self.filesystem(allow_bucket_creation=True)
                filesystem.create_dir(BUCKET)
                with filesystem.open_output_stream(f"{BUCKET}/.probe") as sink:
                    sink.write(b"ok")
                filesystem.delete_file(f"{BUCKET}/.probe")
                return
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"SeaweedFS did not come up ({last}); see {work / 'weed.log'}")

    def uri(self, name: str = "") -> str:
        """A fresh prefix of the test bucket (each test its own)."""
        return f"s3://{BUCKET}/{name or 'm'}-{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        """Stop for good, at once: its data is thrown away, and SeaweedFS's graceful stop
        (SIGTERM) took 25 s of each test module's teardown."""
        if self.proc.poll() is None:
            self.kill()
        self.log.close()


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    if not WEED_BIN.exists():
        reason = f"needs SeaweedFS at {WEED_BIN}: run scripts/build-seaweedfs.sh"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI builds it in .ci/run)")
        pytest.skip(reason)
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()
