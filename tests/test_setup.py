"""The README's two set-up commands: the quickstart repeats them, CI runs the test command
word for word, and scripts/venv, which both start with, makes the checkout's venv or says
what is missing.

(Debian 12 and 13's own python3, with and without python3-pip and python3-venv, were tried
by hand in chroots: issue #27.)
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def setup_commands(markdown: str) -> list[str]:
    """The ``sh`` blocks of the section on setting up, one command each."""
    section = re.search(r"^## (?:Set up|The two commands)\n(.*?)^## ", markdown, re.MULTILINE | re.DOTALL)
    assert section, "no set-up section"
    blocks = re.findall(r"^```sh\n(.*?)```", section.group(1), re.MULTILINE | re.DOTALL)
    assert all(block.count("\n") == 1 for block in blocks), blocks
    return [block.strip() for block in blocks]


def test_the_readme_has_two_one_line_commands_and_the_quickstart_the_same() -> None:
    readme = setup_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(readme) == 2, readme
    assert all(command.startswith("scripts/venv ") for command in readme), readme
    assert setup_commands((ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")) == readme


def test_ci_runs_the_readme_test_command_word_for_word() -> None:
    _, test_command = setup_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(line == test_command or line.startswith(f"{test_command} ||") for line in lines), test_command


@pytest.mark.parametrize("script", ["venv", "install", "test", "check", "check-wheel"])
def test_scripts_are_executable(script: str) -> None:
    assert (ROOT / "scripts" / script).stat().st_mode & stat.S_IXUSR


def checkout_copy(tmp_path: Path) -> Path:
    """A checkout with only scripts/venv in it: its .venv is made under ``tmp_path``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "venv", tmp_path / "scripts" / "venv")
    return tmp_path / "scripts" / "venv"


def python3_on_path(tmp_path: Path, refuse: str = "") -> dict[str, str]:
    """An environment whose ``python3`` is this Python, made to fail the shell patterns ``refuse``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    case = f'case "$*" in {refuse}) exit 1;; esac\n' if refuse else ""
    python3.write_text(f'#!/bin/sh\n{case}exec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    return env


def test_venv_without_a_command_says_how_to_use_it(tmp_path: Path) -> None:
    done = subprocess.run([checkout_copy(tmp_path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "usage: scripts/venv CMD" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_venv_stops_on_a_python3_with_neither_ensurepip_nor_pip(tmp_path: Path) -> None:
    # Debian's bare python3: `python3 -m venv` works only --without-pip, and
    # there is no pip to put pip into the venv with.
    venv = checkout_copy(tmp_path)
    env = python3_on_path(tmp_path, refuse="*'import ensurepip'*|'-m pip'*")
    done = subprocess.run([venv, "true"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done
    assert "apt install python3-venv" in done.stderr, done.stderr
    assert not (tmp_path / ".venv").exists(), "a venv without pip is left behind"


@pytest.mark.skipif(importlib.util.find_spec("ensurepip") is None, reason="this Python has no ensurepip")
def test_venv_makes_a_broken_venv_again_and_runs_the_command_in_it(tmp_path: Path) -> None:
    # A creation cut short: the directory, no python in it.
    venv = checkout_copy(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    env = python3_on_path(tmp_path)
    show = "import os, sys; print(sys.prefix, os.environ['VIRTUAL_ENV'])"
    command = [venv, "sh", "-c", f'python3 -c "{show}" && python3 -m pip --version >/dev/null']
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done
    assert "its python does not run: making it again" in done.stderr, done.stderr
    made = str(tmp_path / ".venv")
    assert done.stdout.split() == [made, made]
    # Reused the second time, silently.
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0, again
    assert again.stderr == ""
