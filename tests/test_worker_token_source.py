"""``tokentrace worker`` reads its token from a file or the environment, so ``ps`` never
shows it (issue 23, item 9); ``--token`` still works, with a warning saying why not."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.cli.args import UsageError
from app.cli.worker_cmd import TOKEN_ENV, read_token
from tests.live_server import ROOT, LiveServerFactory
from tests.worker_helpers import wait_for

SECRET = "tt_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"


def _ns(token: str | None = None, token_file: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(token=token, token_file=token_file)


def test_a_token_file_is_read_and_a_loose_one_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "token"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    assert read_token(_ns(token_file=f)) == SECRET
    assert capsys.readouterr().err == ""
    f.chmod(0o644)
    assert read_token(_ns(token_file=f)) == SECRET
    assert "readable by other users (chmod 600)" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "\n  \n", "tt_a tt_b", "x" * 5000])
def test_a_token_file_not_holding_one_token_is_a_usage_error(tmp_path: Path, content: str) -> None:
    f = tmp_path / "token"
    f.write_text(content)
    with pytest.raises(UsageError, match=r"--token-file: .* does not hold one token"):
        read_token(_ns(token_file=f))


def test_missing_file_both_sources_and_no_token_are_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UsageError, match="--token-file: cannot read"):
        read_token(_ns(token_file=tmp_path / "nope"))
    with pytest.raises(UsageError, match="not both"):
        read_token(_ns(token="tt_x", token_file=tmp_path / "nope"))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(UsageError, match=f"a token is required .*{TOKEN_ENV}"):
        read_token(_ns())


def test_the_environment_is_read_and_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    assert read_token(_ns()) == SECRET
    assert TOKEN_ENV not in os.environ  # nothing the worker starts inherits it


def test_token_on_the_command_line_warns(capsys: pytest.CaptureFixture[str]) -> None:
    assert read_token(_ns(token=SECRET)) == SECRET
    err = capsys.readouterr().err
    assert "--token is visible to every user of this machine (ps)" in err and SECRET not in err


@pytest.mark.slow
def test_a_worker_with_a_token_file_registers_and_ps_never_shows_the_token(
    live_server: LiveServerFactory, sqlite_url: str, tmp_path: Path
) -> None:
    srv = live_server(sqlite_url)
    f = tmp_path / "token"
    f.write_text(srv.worker_token)
    f.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--server", srv.url, "--name",
           "from-file", "--token-file", str(f), "--state-dir", str(tmp_path / "s")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:

        def registered() -> bool:
            r = httpx.get(srv.url + "/api/v1/workers", timeout=5)
            return any(w["name"] == "from-file" for w in r.json()["items"])

        wait_for(registered, 30, "the worker to register")
        shown = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        assert srv.worker_token not in shown
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert srv.worker_token not in err.decode(errors="replace")
