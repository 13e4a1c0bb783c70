"""How a run was made (when, from which commit, against what servers, with which workload
and load), for results.json's `meta` and the header of report.md."""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.runner import LoadShape
from loadtest.work_item import WorkloadOptions

REPO_ROOT = Path(__file__).resolve().parents[1]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def git_commit(root: Path = REPO_ROOT) -> str:
    """The checkout's short commit hash, "-dirty" when tracked files differ from it (as
    `git describe --dirty`: untracked files do not count); "unknown" outside a checkout or
    without git."""
    try:
        commit = _git(root, "rev-parse", "--short", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class RunInfo:
    workload: str
    options: WorkloadOptions
    shape: LoadShape
    # The servers' settings, one line each: a scenario side's command line; the URL a load
    # test was pointed at and the models it lists.
    settings: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)  # the caller's own meta entries
    date: str = field(default_factory=utc_now)  # when the run started, in UTC
    commit: str = field(default_factory=git_commit)

    def as_dict(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "commit": self.commit,
            "workload": self.workload,
            "options": asdict(self.options),
            "shape": asdict(self.shape),
            "settings": self.settings,
            **self.extra,
        }

    def header(self) -> str:
        """Markdown bullets: date and commit, each server's settings, workload and load."""
        options = ", ".join(f"{key}={value}" for key, value in asdict(self.options).items())
        shape = self.shape
        return "\n".join(
            [
                f"- date: {self.date}; commit: `{self.commit}`",
                *(f"- {label}: `{value}`" for label, value in self.settings.items()),
                f"- workload: `{self.workload}` ({options})",
                f"- load: {shape.describe()}, for at most {shape.duration:g} s, seed {shape.seed}",
            ]
        )
