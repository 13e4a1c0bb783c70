"""semgate's own CPU kernels (engine/kernels/*.c: block-quantized matmuls, RMSNorm,
RoPE, paged attention), one library compiled on first use and kept in semgate's
disk cache under a name that hashes the sources and the compiler flags, as torch's
own C++ extensions are. `scripts/bootstrap` and the Docker image build it ahead
(`built_library()`), so no server start pays for the compiler (about a second).
The kernels need AVX-512 VNNI (Intel since Cascade Lake, AMD since
Zen 4); elsewhere, or with SEMGATE_CPU_KERNELS=off, the engine falls back to aten's
kernels and says so in its log.

The library links OpenMP by its soname, libgomp.so.1, which torch has loaded by
then: the kernels run on torch's own thread pool and its torch.set_num_threads,
not on a second pool competing for the same cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # (loads torch's libgomp before the kernels ask for one)

from engine.disk_cache import cache_dir, write_atomically

log = logging.getLogger("semgate.engine")

KERNELS = Path(__file__).parent / "kernels"
SOURCES = sorted(KERNELS.glob("*.c"))
HEADERS = sorted(KERNELS.glob("*.h"))
# Instructions the kernels are written in; the CPU must have every one of them.
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma")
# -ffp-contract=off: a multiply then an add stay two roundings (gcc would fuse them),
# which keeps the RoPE kernel bit-identical to aten's.
COMPILE_FLAGS = (
    "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp",
    "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma",
)  # fmt: skip


class CpuKernelsUnavailable(RuntimeError):
    """Why the kernels cannot run here (CPU, compiler): the caller falls back to aten's."""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _compile(library: Path) -> None:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise CpuKernelsUnavailable(f"no C compiler ({compiler}) to build semgate's CPU kernels")
    errors: list[str] = []

    def build(temp: Path) -> None:
        done = subprocess.run(
            [compiler, *COMPILE_FLAGS, "-o", str(temp), *map(str, SOURCES)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            errors.append(done.stderr.strip())
            raise OSError(done.returncode, "compiler failed")  # write_atomically cleans up

    if not write_atomically(library, build):
        reason = f"{compiler} failed on engine/kernels: {errors[0]}" if errors else None
        raise CpuKernelsUnavailable(reason or f"cannot write {library}")


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# Each kernel's C signature (engine/kernels/*.c): argument types, result type.
SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "int4_matmul": ([_P, _I, _I, _I, _P, _P, _P, ctypes.c_int], ctypes.c_int),
    "int8_matmul": ([_P, _I, _I, _I, _P, _P, _P, ctypes.c_int], ctypes.c_int),
    "rms_norm": ([_P, _I, _I, _P, _F, _P], None),
    "rope": ([_P, _I, _I, _I, _I, _P, _P, _P], None),
    "paged_attention": (
        [_P, _I, _P, _P, _I, _P, _P, ctypes.c_int, _P, _P, _I, _P, _P, _I, _I, _I, _I, _I, _F, _P],
        ctypes.c_int,
    ),
}


def _bind(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def built_library() -> Path:
    """The library for these sources and flags, compiled first if it is not in the cache
    yet (on any x86 CPU: whether this one can run it is cpu_kernels()'s question)."""
    key = hashlib.sha256(" ".join(COMPILE_FLAGS).encode())
    for source in SOURCES + HEADERS:
        key.update(source.read_bytes())
    library = cache_dir() / "kernels" / f"semgate-{key.hexdigest()[:16]}.so"
    if not library.exists():
        _compile(library)
    return library


@functools.cache
def cpu_kernels() -> ctypes.CDLL:
    """The loaded kernels. Raises CpuKernelsUnavailable, with the reason, where they
    cannot run."""
    if os.environ.get("SEMGATE_CPU_KERNELS", "").lower() in ("0", "off", "false", "no"):
        raise CpuKernelsUnavailable("turned off by SEMGATE_CPU_KERNELS")
    missing = [flag for flag in CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        raise CpuKernelsUnavailable(f"this CPU lacks {', '.join(missing)}")
    return _bind(built_library())


@functools.cache
def cpu_kernels_or_none() -> ctypes.CDLL | None:
    """cpu_kernels(), or None (said once in the log) where it cannot run."""
    try:
        return cpu_kernels()
    except CpuKernelsUnavailable as e:
        log.warning("semgate's CPU kernels unavailable (%s): using aten's", e)
        return None


def cpu_kernel(name: str, device: torch.device, dtype: torch.dtype) -> Callable[..., Any] | None:
    """The named kernel for work on float32 CPU tensors, or None where it cannot run
    (another device or dtype, or no kernels here): the caller uses aten's."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    kernels = cpu_kernels_or_none()
    return None if kernels is None else getattr(kernels, name)
