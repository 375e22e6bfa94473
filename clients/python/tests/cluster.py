"""A real ringlimit cluster for the integration tests: ``ringlimit serve`` processes from the
binary at ``$RINGLIMIT_BIN`` on loopback with ephemeral ports, every one killed and reaped at
the end. Waits are bounded and on conditions (a log line, ``/v1/cluster``), never sleeps."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from typing import Dict, List, NamedTuple, Optional

import pytest

BIN = os.environ.get("RINGLIMIT_BIN", "")
START_WITHIN = 20.0

needs_bin = pytest.mark.skipif(
    not BIN, reason="RINGLIMIT_BIN is not set: give the path of a ringlimit binary to run the integration tests"
)


def _die_with_parent() -> None:
    """In the node's process before exec: killed when the test process dies, however it dies
    (Linux's PR_SET_PDEATHSIG; elsewhere the tests' own cleanup is all there is)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, cond, within: float = 15.0, every: float = 0.02):
    """Polls ``cond`` until it returns something truthy, at most ``within`` seconds."""
    end = time.monotonic() + within
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(every)


def get_json(url: str, timeout: float = 2.0, context: Optional[ssl.SSLContext] = None):
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:  # noqa: S310 (loopback only)
        return json.loads(r.read())


def get_text(url: str, timeout: float = 2.0, context: Optional[ssl.SSLContext] = None) -> str:
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:  # noqa: S310 (loopback only)
        return r.read().decode()


class Certs(NamedTuple):
    """A CA and a server certificate it signed (PEM files)."""

    ca: str
    cert: str
    key: str


needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None and not os.environ.get("CI"), reason="no openssl CLI to make certificates with"
)


def make_certs(dir: str, san: str, name: str = "node") -> Certs:
    """A CA of its own and a P-256 server certificate for ``san`` (``DNS:x,IP:y``), made with
    the openssl CLI as the TLS guide does."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=dir, check=True, capture_output=True, timeout=30)

    ca, ca_key = f"{name}-ca.crt", f"{name}-ca.key"
    run(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={name} test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", ca_key, "-out", ca,
    )
    run(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
    )
    with open(os.path.join(dir, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    run(
        "x509", "-req", "-in", f"{name}.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
        "-extfile", f"{name}.ext", "-out", f"{name}.crt",
    )
    return Certs(*(os.path.join(dir, f) for f in (ca, f"{name}.crt", f"{name}.key")))


class Node:
    def __init__(
        self, node_id: str, peer_port: int, seeds: List[str], env: Dict[str, str], args: List[str], scheme: str = "http"
    ) -> None:
        self.node_id = node_id
        self.peer = f"127.0.0.1:{peer_port}"
        self.scheme = scheme
        self.context: Optional[ssl.SSLContext] = None
        self.log: List[str] = []
        self.http: Optional[str] = None
        self.grpc: Optional[str] = None
        self._serving = threading.Event()
        cmd = [
            BIN, "serve", "--node-id", node_id, "--http", "127.0.0.1:0", "--peer", self.peer,
            "--grpc", "127.0.0.1:0", "--seeds", ",".join(seeds), *args,
        ]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLIMIT_")}
        full_env.update({"RUST_LOG": "info", "NO_COLOR": "1"})
        full_env.update(env)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            if "ringlimit node serving" in line:
                m = re.search(r"\bhttp=(\S+)", line)
                if m:
                    self.http = f"{self.scheme}://" + m.group(1)
            if "gRPC serving" in line:
                m = re.search(r"\bgrpc=Some\((\S+?)\)", line) or re.search(r"\bgrpc=(\d\S+)", line)
                if m:
                    self.grpc = m.group(1)
            if self.http and self.grpc:
                self._serving.set()

    def await_serving(self) -> None:
        if not self._serving.wait(START_WITHIN):
            raise AssertionError(f"{self.node_id} did not log its addresses; its log:\n" + "\n".join(self.log[-50:]))

    def metrics(self) -> str:
        return get_text(f"{self.http}/metrics", context=self.context)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


class Cluster:
    """``n`` nodes seeding each other; ``env`` for every node (a secret, client tokens);
    ``tls``: their HTTP and gRPC ports serve this certificate."""

    def __init__(
        self,
        n: int = 3,
        env: Optional[Dict[str, str]] = None,
        args: Optional[List[str]] = None,
        rules: Optional[str] = None,
        tmp: Optional[str] = None,
        tls: Optional[Certs] = None,
    ) -> None:
        env = dict(env or {})
        args = list(args or [])
        self.context: Optional[ssl.SSLContext] = None
        if tls is not None:
            args += ["--tls-cert", tls.cert, "--tls-key", tls.key]
            # The test's own reads trust the CA and check no name (loopback, whatever the SAN).
            self.context = ssl.create_default_context(cafile=tls.ca)
            self.context.check_hostname = False
        if rules is not None:
            import tempfile

            path = os.path.join(tmp or tempfile.mkdtemp(prefix="ringlimit-sdk-"), "rules.yaml")
            with open(path, "w") as f:
                f.write(rules)
            args += ["--config", path]
        if "RINGLIMIT_CLUSTER_SECRET" not in env:
            env["RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS"] = "true"
        ports = [free_port() for _ in range(n)]
        seeds = [f"127.0.0.1:{p}" for p in ports]
        self.nodes: List[Node] = []
        try:
            for i, p in enumerate(ports):
                node = Node(f"n{i}", p, seeds, env, args, "https" if tls else "http")
                node.context = self.context
                self.nodes.append(node)
            for node in self.nodes:
                node.await_serving()
            self.await_alive(n)
        except BaseException:
            self.stop()
            raise

    def alive_seen_by(self, node: Node) -> List[str]:
        try:
            view = get_json(f"{node.http}/v1/cluster", context=self.context)
        except OSError:
            return []
        return sorted(m["node_id"] for m in view["members"] if m["state"] == "alive")

    def await_alive(self, n: int, within: float = 30.0) -> None:
        live = [x for x in self.nodes if x.proc.poll() is None]
        wait_for(
            f"{n} members alive at every node",
            lambda: all(len(self.alive_seen_by(x)) == n for x in live),
            within,
        )

    @property
    def seeds(self) -> List[str]:
        return [n.http for n in self.nodes if n.http]

    @property
    def grpc_addrs(self) -> Dict[str, str]:
        """Each node's gRPC address by node id (for nodes that do not advertise theirs)."""
        return {n.node_id: n.grpc for n in self.nodes if n.grpc}

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def stop(self) -> None:
        for node in self.nodes:
            try:
                node.kill()
            except Exception:
                pass
            if node.proc.stderr is not None:
                node.proc.stderr.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def metric(text: str, name: str) -> float:
    """The sum of every sample of metric ``name`` in a Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total
