"""Real servers for the client's tests: the release binary (`$JOINTSPACE_BIN`, default target/release/jointspace
at the repository root) on the fixture bundle, a scratch SQLite database, API keys (an admin, a read key, and
named keys from a keys file: a writer, a key limited to one collection, two rate-limited keys), a small request
body limit and URL ingest from a local photo host. Two more servers on the same database play replicas that
have not loaded a new collection yet (real 503s). A TCP proxy that drops answers plays a lost connection."""

from __future__ import annotations

import contextlib
import functools
import glob
import http.server
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from jointspace_client import Client, RetryPolicy

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "tests" / "fixtures" / "images"
PHOTOS = sorted(IMAGES.glob("fixture_*.png"))
MAX_REQUEST_BYTES = 512 * 1024

KEYS = {
    "admin": "client-test-admin-" + uuid.uuid4().hex,
    "read": "client-test-read-" + uuid.uuid4().hex,
    "writer": "client-test-writer-" + uuid.uuid4().hex,
    "shop-a": "client-test-shop-a-" + uuid.uuid4().hex,
    "limited": "client-test-limited-" + uuid.uuid4().hex,
    "limited-async": "client-test-limited-async-" + uuid.uuid4().hex,
    "slow": "client-test-slow-" + uuid.uuid4().hex,
}
# The named keys: role, collections, requests per second (burst 1).
NAMED = {
    "writer": ("write", None, None),
    "shop-a": ("write", ["shop-a"], None),
    "limited": ("write", None, 1.0),  # a second request at once waits ~1 s: Retry-After: 1
    "limited-async": ("write", None, 1.0),
    "slow": ("write", None, 0.05),  # Retry-After: 20, more than any test's budget
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ort_dylib() -> str:
    path = os.environ.get("ORT_DYLIB_PATH") or next(
        iter(sorted(glob.glob(str(REPO / ".venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*")))),
        "",
    )
    if not path or not Path(path).is_file():
        pytest.exit("no onnxruntime library: set ORT_DYLIB_PATH (scripts/lib.sh ort_dylib)", returncode=2)
    return path


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_server(work: Path, name: str, *args: str, env: dict[str, str] | None = None) -> Server:
    binary = Path(os.environ.get("JOINTSPACE_BIN", REPO / "target" / "release" / "jointspace"))
    if not binary.is_file():
        pytest.exit(f"no server binary at {binary}: build it (cargo build --release) or set JOINTSPACE_BIN", 2)
    port = free_port()
    log = work / f"{name}.log"
    full_env = {**os.environ, "ORT_DYLIB_PATH": ort_dylib(), "RUST_LOG": "info,ort=warn", **(env or {})}
    for var in ("JOINTSPACE_ADMIN_KEY", "JOINTSPACE_READ_KEY", "JOINTSPACE_KEYS_FILE", "JOINTSPACE_URL_INGEST"):
        if env is None or var not in env:
            full_env.pop(var, None)
    proc = subprocess.Popen(
        [str(binary), "serve", "--addr", f"127.0.0.1:{port}", "--bundle", str(REPO / "models" / "fixture-tiny"),
         "--database-url", f"sqlite://{work / 'js.db'}", "--snapshot-interval", "0", *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env, cwd=work,
    )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.exit(f"the {name} server stopped at start:\n{server.log_tail()}", returncode=2)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        if time.monotonic() > deadline:
            proc.kill()
            pytest.exit(f"the {name} server was not ready within 120 s:\n{server.log_tail()}", returncode=2)
        time.sleep(0.05)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jointspace")


@pytest.fixture(scope="session")
def photo_host() -> Iterator[str]:
    """The fixture photos over HTTP on 127.0.0.1, for URL ingest (the server is allowed to reach it)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(IMAGES))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="session")
def server(work: Path, photo_host: str) -> Iterator[Server]:
    lines = []
    for name, (role, collections, rate) in NAMED.items():
        lines += ["[[key]]", f'name = "{name}"', f'key = "{KEYS[name]}"', f'role = "{role}"']
        if collections is not None:
            lines.append(f"collections = {collections!r}".replace("'", '"'))
        if rate is not None:
            lines += [f"requests_per_second = {rate}", "burst = 1"]
    keys_file = work / "keys.toml"
    keys_file.write_text("\n".join(lines) + "\n")
    env = {
        "JOINTSPACE_ADMIN_KEY": KEYS["admin"],
        "JOINTSPACE_READ_KEY": KEYS["read"],
        "JOINTSPACE_KEYS_FILE": str(keys_file),
    }
    s = start_server(
        work, "main", "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--url-ingest", "--url-ingest-allow", "127.0.0.1/32", "--url-ingest-timeout-ms", "5000", env=env,
    )  # fmt: skip
    yield s
    stop_server(s)
    log = s.log.read_text(errors="replace")
    assert "panicked" not in log, s.log_tail()


@pytest.fixture(scope="session")
def unfollowing(server: Server, work: Path) -> Iterator[Server]:
    """A second server on the same database that never follows the change sequence: a collection created after
    it started is never loaded here, so its searches and adds answer 503 `unavailable`."""
    s = start_server(work, "unfollowing", "--follow-interval-ms", "0", "--index-dir", str(work / "idx-unfollowing"))
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def follower(server: Server, work: Path) -> Iterator[Server]:
    """A second server that follows the database every 3 s: a new collection answers 503 here until then."""
    s = start_server(
        work, "follower", "--follow-interval-ms", "3000", "--ready-max-lag-ms", "20000",
        "--index-dir", str(work / "idx-follower"),
    )  # fmt: skip
    yield s
    stop_server(s)


FAST_RETRY = RetryPolicy(max_attempts=10, max_seconds=20, backoff=0.2, max_backoff=1.0)


@pytest.fixture
def admin(server: Server) -> Iterator[Client]:
    with Client(server.url, api_key=KEYS["admin"], retry=FAST_RETRY) as c:
        yield c


@pytest.fixture
def collection(admin: Client) -> Iterator[str]:
    """A fresh, empty collection, deleted after the test."""
    name = "t-" + uuid.uuid4().hex[:12]
    admin.create_collection(name)
    yield name
    with contextlib.suppress(Exception):
        admin.delete_collection(name)


class DroppingProxy:
    """A TCP proxy to the server that, for its first `drop` connections, passes the request on, waits for the
    first byte of the answer (the server has then done the work) and closes the connection without handing the
    answer over: a lost answer, as a dropped connection or a load balancer's reset makes one."""

    def __init__(self, upstream: str, drop: int) -> None:
        self.upstream = httpx.URL(upstream)
        self.drop = drop
        self.dropped = 0
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            dropping = self.dropped < self.drop
            if dropping:
                self.dropped += 1
            threading.Thread(target=self._serve, args=(client, dropping), daemon=True).start()

    def _serve(self, client: socket.socket, dropping: bool) -> None:
        up = socket.create_connection((self.upstream.host, self.upstream.port or 80))

        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        threading.Thread(target=pump, args=(client, up), daemon=True).start()
        if dropping:
            with contextlib.suppress(OSError):
                up.recv(1)  # the answer has begun: the request was carried out
            for s in (client, up):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        else:
            pump(up, client)
            client.close()
            up.close()

    def close(self) -> None:
        self.sock.close()
