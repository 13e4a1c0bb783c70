"""The `semgate` command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _semgate(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("quantization", ["auto", "none", "int8"])
def test_chat_answers_one_prompt(quantization):
    result = _semgate(
        "chat",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--quantization",
        quantization,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_rejects_an_unknown_model_readably():
    result = _semgate("chat", "--model", "no-such-model", "hi")
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in result.stderr
    assert "smollm2-135m-instruct" in result.stderr


def test_chat_without_prompt_or_terminal_explains_usage():
    result = _semgate("chat")
    assert result.returncode == 2
    assert "usage" in result.stderr


def test_an_unknown_quantization_is_refused_readably():
    result = _semgate("chat", "--quantization", "int3", "hi")
    assert result.returncode == 2
    assert "invalid choice: 'int3'" in result.stderr
