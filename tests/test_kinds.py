"""The table of kinds: every option declared once, and what reads it kept to the table."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from connlist import ConnectionsMiddleware
from connlist.core import checks, kinds
from connlist.core.kinds import OPTIONS, TIMEOUT_KINDS, Options, Settings, resolve
from connlist.core.sweep import STEPS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_option_is_a_settings_field_an_options_key_and_a_keyword_of_the_middleware() -> None:
    assert OPTIONS == tuple(item.name for item in fields(Settings)) == tuple(Options.__annotations__)
    parameters = inspect.signature(ConnectionsMiddleware).parameters
    for name in OPTIONS:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    # Each shown with the default resolve applies (None: derived by resolve).
    defaults = {name: parameters[name].default for name in OPTIONS}
    assert defaults == {
        "headers_timeout": None,
        "request_timeout": 300.0,
        "send_timeout": 60.0,
        "body_min_rate": 500.0,
        "body_grace": 10.0,
        "max_connections": None,
        "max_upgraded": None,
        "max_header_size": 16384,
    }
    derived = resolve()
    for name, default in defaults.items():
        if default is not None:
            assert getattr(derived, name) == default


def test_every_option_has_its_row_in_the_settings_page() -> None:
    table = (DOCS / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE))
    assert set(OPTIONS) <= documented, set(OPTIONS) - documented


def test_every_kind_is_cut_by_one_step_of_the_sweep() -> None:
    # What the import check cannot see: the table does not know the sweep.
    cut_by = [name for step in STEPS for name in step.kinds]
    assert sorted(cut_by) == sorted(kind.name for kind in TIMEOUT_KINDS)
    # Every timeout bounds how far away the timer may be, but the server's
    # keep-alive: the response that starts an idle time wakes the timer (Enforcer.wake_by).
    assert [kind.name for kind in TIMEOUT_KINDS if kind.soonest is None] == ["keepalive"]


def test_the_table_imports_nothing_of_connlist_but_the_checks() -> None:
    imported = re.findall(
        r"^\s*(?:from|import) (connlist\S*)", Path(kinds.__file__).read_text(), re.MULTILINE
    )
    assert imported == ["connlist.core.checks"]
    assert not re.search(r"^\s*(from|import) connlist", Path(checks.__file__).read_text(), re.MULTILINE)


def test_shortest_is_the_least_soonest_of_the_kinds_that_are_on() -> None:
    assert resolve().shortest == 10.0  # body_grace
    assert resolve(body_min_rate=0).shortest == 15.0  # send_timeout / 4
    assert resolve(body_min_rate=0, send_timeout=0, request_timeout=30).shortest == 30.0
    assert resolve(body_min_rate=0, send_timeout=0, headers_timeout=5).shortest == 5.0
    assert resolve(body_min_rate=0, send_timeout=0, headers_timeout=0, request_timeout=0).shortest == 0.0


def test_an_unknown_option_names_the_nearest() -> None:
    with pytest.raises(TypeError, match=r"^unknown option 'send_timout'; did you mean 'send_timeout'\?$"):
        resolve(send_timout=1)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^unknown option 'zzz'; the options are headers_timeout, request_timeout, "
    ):
        resolve(zzz=1)  # type: ignore[call-arg]


def test_each_option_is_checked_by_its_unit() -> None:
    with pytest.raises(ValueError, match=r"^body_min_rate must be a finite number of bytes per second >= 0"):
        resolve(body_min_rate=-1)
    with pytest.raises(TypeError, match=r"^send_timeout must be a number of seconds, got str$"):
        resolve(send_timeout="1")  # type: ignore[typeddict-item]
    with pytest.raises(TypeError, match=r"^max_connections must be None or an int, got float$"):
        resolve(max_connections=1.5)  # type: ignore[typeddict-item]
    assert resolve(send_timeout=1, body_grace=2).send_timeout == 1.0
    assert isinstance(resolve(send_timeout=1).send_timeout, float)
