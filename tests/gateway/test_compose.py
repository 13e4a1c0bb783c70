"""The container deployment: Dockerfile and docker-compose files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_GPU]], ids=["cpu", "gpu"])
def test_docker_compose_config_is_valid(files: list[Path]) -> None:
    if not _has_compose():
        pytest.skip("no docker CLI with the compose plugin (`docker compose version` fails)")
    args = [arg for f in files for arg in ("-f", str(f))]
    result = subprocess.run(
        ["docker", "compose", *args, "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_compose_wires_the_three_roles() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert set(services) == {"redis", "engine", "gateway"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"

    assert "redis-stack" in services["redis"]["image"]
    assert "--no-cache" in services["engine"]["command"]

    gateway = services["gateway"]
    assert gateway["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "engine": {"condition": "service_healthy"},
    }
    assert gateway["environment"]["REDIS_URL"].startswith("redis://redis:")
    command = gateway["command"]
    assert "--no-cache" not in command
    upstream = command[command.index("--upstream") + 1]
    assert "http://engine:8000" in upstream
    assert "8000:8000" in gateway["ports"]


def test_gpu_override_reserves_a_gpu_for_the_engine_only() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE_GPU.read_text())["services"]
    assert set(services) == {"engine"}
    devices = services["engine"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]
    assert "/whl/cu" in services["engine"]["build"]["args"]["TORCH_INDEX"]


def test_dockerfile_installs_torch_before_the_project() -> None:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]

    def first(predicate) -> int:
        return next(i for i, line in enumerate(lines) if predicate(line))

    torch = first(lambda line: line.startswith("RUN pip install") and "torch==" in line)
    code = first(lambda line: line.startswith("COPY") and "engine" in line)
    project = first(lambda line: re.search(r"pip install\b.*\s\.(\s|$)", line) is not None)
    assert torch < code < project
    assert "--index-url" in lines[torch]
    assert any(line.startswith("FROM python:3.11-slim") for line in lines)
    assert any(line.startswith("USER") and "root" not in line for line in lines)
    assert 'ENTRYPOINT ["semgate"]' in lines
