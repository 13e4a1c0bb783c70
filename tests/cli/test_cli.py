"""The `semgate` command line, run as a user runs it."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import MISSING, fields
from typing import Any

import pytest

from cli.main import build_parser
from gateway.engine_settings import EngineSettings
from gateway.settings import Settings
from tests.engine.prompts import CAPITAL_QUESTION

slow = pytest.mark.slow


def _semgate(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )


# The tests that chat load the model in a process of their own.
@slow
@pytest.mark.parametrize("quantization", ["auto", "none", "int8"])
def test_chat_answers_one_prompt(quantization):
    result = _semgate(
        "chat",
        CAPITAL_QUESTION,
        "--temperature",
        "0",
        "--quantization",
        quantization,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@slow
def test_chat_runs_on_atens_kernels_when_ours_are_turned_off():
    # The path of a CPU without AVX-512 VNNI or a machine without a C compiler.
    result = _semgate(
        "chat",
        CAPITAL_QUESTION,
        "--temperature",
        "0",
        env={"SEMGATE_CPU_KERNELS": "off"},
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


def test_version_and_bare_semgate_print_help():
    assert _semgate("--version").stdout.strip() == "semgate 0.1.0"
    bare = _semgate()
    assert bare.returncode == 0
    assert bare.stdout.startswith("usage: semgate")
    assert all(command in bare.stdout for command in ("chat", "serve", "bench", "loadtest"))


def _parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, Any]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_is_described_and_every_option_says_its_default():
    for path, parser in _parsers(build_parser(), "semgate"):
        assert parser.description, path
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{path} {action.option_strings[0]}"
    # The serve flags default to None (a settings file or SEMGATE_* may set them): their
    # help states the settings' own defaults, which must not drift from them.
    serve = dict(_parsers(build_parser(), "semgate"))["semgate serve"]
    defaults = {
        f.name: f.default
        for f in (*fields(Settings), *fields(EngineSettings))
        if f.default not in (MISSING, None) and not isinstance(f.default, bool)
    }
    flags = [a for a in serve._actions if a.dest in defaults]
    assert len(flags) >= 9
    for action in flags:
        assert f"(default: {defaults[action.dest]}" in action.help, action.option_strings


@slow
def test_chat_says_when_an_answer_was_cut():
    result = _semgate("chat", "Tell me a long story.", "--max-tokens", "4", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert "(cut at --max-tokens 4)" in result.stderr


@slow
def test_the_repl_knows_help_and_quit():
    """On a terminal (a pseudo-terminal here), without a prompt: the REPL."""
    controller, terminal = os.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "cli.main", "chat"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as repl:
        os.write(controller, b"/help\n/quit\n")
        _, err = repl.communicate(timeout=300)
    os.close(controller)
    os.close(terminal)
    assert repl.returncode == 0, err
    assert err.count("/reset forgets the conversation") == 2  # the banner, then /help


def test_serve_refuses_a_busy_port_before_loading_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _semgate("serve", "--no-cache", "--port", str(port))
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "admin key" not in result.stderr  # refused before a key is made


def test_serve_refuses_a_bad_redis_url_readably():
    result = _semgate("serve", "--redis-url", "redis+sentinel://:hunter2@h1:26379/mymaster")
    said = " ".join(result.stderr.split())  # as one line, however the console wrapped it
    assert result.returncode == 2, result.stderr
    assert "error: redis_url: Redis Sentinel URL 'redis+sentinel://:***@h1:26379/mymaster'" in said
    assert "DB '' is not a database number" in said and "/SERVICE/DB" in said
    assert "Traceback" not in said and "hunter2" not in said
