"""The lab's way to a vLLM started with an API key: the key from a file (the chart mounts
its Secret) or from VLLM_API_KEY, refused with a clear message when unreadable, never
printed. The requests themselves carry it: tests/test_chart_secured.py (real vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_glassbox.lab.cli import main, vllm_api_key


def test_the_key_comes_from_the_file_first_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY_FILE", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert vllm_api_key() is None
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert vllm_api_key() == "from-env"
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(tmp_path / "token"))
    assert vllm_api_key() == "from-file"


def test_an_unreadable_key_file_stops_the_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "token").write_text("  \n")
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(tmp_path / "token"))
    assert main(["run", "cpu-demo", "--backend", "local", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"VLLM_API_KEY_FILE: cannot read {tmp_path / 'token'}: the file is empty" in err
    assert not (tmp_path / "out").exists()
