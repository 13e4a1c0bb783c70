"""A Redis Sentinel deployment of Redis Stack for the tests: a primary, a replica and
three sentinels, each a real process on a free local port, all from the embedded Redis's
binary (cache/redis_server.py; a sentinel is `redis-server CONF --sentinel`). The data
nodes load the search and JSON modules and require a password; Sentinel's timings are
short, so a failover takes a few seconds. The sentinels are told of each other and of the
replica in their configuration, so none waits to discover them."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import redis

from cache.redis_server import LIBSSL_DIR, MODULES, dies_with_parent, free_port, redis_stack_dir
from tests.waiting import until

SERVICE = "semgate"
PASSWORD = "sentinel:secret"  # a colon too: the URL must quote it
DOWN_AFTER_MS = 1000  # no answer this long: down, in a sentinel's eyes
FAILOVER_TIMEOUT_MS = 5000  # a failover stuck this long is tried again
QUORUM = 2


class _Process:
    """A redis-server process of the cluster, on its own port and data directory (where
    it writes its log)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        data_dir.mkdir()

    def _spawn(self, args: list[str]) -> None:
        """Runs redis-server with `args`, and waits until it answers PING."""
        binary = redis_stack_dir() / "bin" / "redis-server"
        self.proc = subprocess.Popen(
            dies_with_parent([str(binary), *args]),
            env={**os.environ, "LD_LIBRARY_PATH": str(LIBSSL_DIR)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        until(f"the redis-server on port {self.port} answers", self._answers, 15)

    def client(self) -> redis.Redis:
        raise NotImplementedError

    def _answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.ConnectionError:  # refused, or loading the dataset
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would; reaped at once."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Node(_Process):
    """A data node: Redis Stack with the cache's modules, nothing kept on disk."""

    def start(self, primary: Node | None = None) -> None:
        """Starts it as the primary, or as a replica of `primary`."""
        modules = [a for m in MODULES for a in ("--loadmodule", str(redis_stack_dir() / "lib" / m))]
        replica_of = ["--replicaof", "127.0.0.1", str(primary.port)] if primary else []
        self._spawn(
            ["--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
             "--logfile", "redis.log", "--save", "", "--appendonly", "no",
             "--requirepass", PASSWORD, "--masterauth", PASSWORD,
             "--repl-diskless-sync-delay", "0", *modules, *replica_of]
        )  # fmt: skip
        if primary is not None:
            until("the replica has synced", self.synced, 15)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(port=self.port, db=db, password=PASSWORD, socket_timeout=2)

    def synced(self) -> bool:
        with self.client() as client:
            return client.info("replication").get("master_link_status") == "up"


class SentinelProcess(_Process):
    def __init__(self, data_dir: Path, index: int) -> None:
        super().__init__(data_dir)
        self.id = f"{index + 1:040x}"  # a sentinel's run id: 40 hex digits

    def start(self, primary: Node, replica: Node, peers: list[SentinelProcess]) -> None:
        conf = self.data_dir / "sentinel.conf"  # Sentinel rewrites it: its own copy
        lines = [
            f"port {self.port}", "bind 127.0.0.1", f"dir {self.data_dir}",
            "logfile sentinel.log", f"sentinel myid {self.id}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} {QUORUM}",
            f"sentinel auth-pass {SERVICE} {PASSWORD}",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel known-replica {SERVICE} 127.0.0.1 {replica.port}",
            *(f"sentinel known-sentinel {SERVICE} 127.0.0.1 {p.port} {p.id}"
              for p in peers if p is not self),
        ]  # fmt: skip
        conf.write_text("\n".join(lines) + "\n")
        self._spawn([str(conf), "--sentinel"])

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)


class SentinelCluster:
    """`start()`, then `url()` for semgate; `primary()` and `replica()` as the sentinels
    name them now; `mend()` after a test killed a node; `stop()` ends every process and
    removes the files."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="semgate-sentinel-")
        root = Path(self._tmp.name)
        self.nodes = [Node(root / "node-a"), Node(root / "node-b")]
        self.sentinels = [SentinelProcess(root / f"sentinel-{i}", i) for i in range(3)]

    def start(self) -> SentinelCluster:
        try:
            primary, replica = self.nodes
            primary.start()
            replica.start(primary)
            for sentinel in self.sentinels:
                sentinel.start(primary, replica, self.sentinels)
            until("the sentinels see a replica in sync", self._watched, 15)
        except BaseException:
            self.stop()
            raise
        return self

    def url(self, db: int = 0) -> str:
        sentinels = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://:{quote(PASSWORD, safe='')}@{sentinels}/{SERVICE}/{db}"

    def primary(self) -> Node:
        """The node the sentinels name as primary now."""
        with self.sentinels[0].client() as client:
            _, port = client.sentinel_get_master_addr_by_name(SERVICE)
        return next(n for n in self.nodes if n.port == int(port))

    def replica(self) -> Node:
        primary = self.primary()
        return next(n for n in self.nodes if n is not primary)

    def replicated(self) -> None:
        """Waits until the replica has applied every write the primary has taken. (Not
        WAIT: that counts the writes of its own connection. After a full sync the primary
        holds the stream back until the replica's first acknowledgement, up to a second.)"""
        with self.primary().client() as primary:
            offset = primary.info("replication")["master_repl_offset"]
        replica = self.replica()

        def caught_up() -> bool:
            with replica.client() as client:
                return int(client.info("replication")["slave_repl_offset"]) >= offset

        until("the replica has the primary's writes", caught_up, 15)

    def mend(self) -> None:
        """A node a test killed is started again, as a replica of the primary now, and
        waited for until it is in sync and every sentinel counts it in (ready for the
        next failover)."""
        for node in self.nodes:
            if not node.running:
                node.start(self.primary())
        until("the sentinels see a replica in sync", self._watched, 30)

    def _watched(self) -> bool:
        """Whether every sentinel sees a replica in sync, and both other sentinels."""
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                replicas = client.sentinel_slaves(SERVICE)
                peers = client.sentinel_sentinels(SERVICE)
            ok = [r for r in replicas if not r["is_sdown"] and r["master-link-status"] == "ok"]
            if not ok or len(peers) != len(self.sentinels) - 1:
                return False
        return True

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()
        self._tmp.cleanup()
