"""The checked-in stubs are what gen.sh makes of the node's proto (crates/proto)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ["ratelimiter_pb2.py", "ratelimiter_pb2.pyi", "ratelimiter_pb2_grpc.py"]


def test_regenerating_gives_the_same_files(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    import grpc_tools

    version = getattr(grpc_tools, "__version__", None)
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    except Exception:
        pass
    if version != "1.66.2":
        pytest.skip(f"gen.sh is pinned to grpcio-tools 1.66.2, found {version}")
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    subprocess.run(["bash", str(ROOT / "gen.sh")], check=True, env=env, timeout=120)
    for name in GENERATED:
        fresh = (tmp_path / "ringlimit" / "v1" / name).read_text()
        kept = (ROOT / "src" / "ringlimit" / "v1" / name).read_text()
        assert fresh == kept, f"{name} differs from what gen.sh makes: run clients/python/gen.sh"

