"""The lab's way to a vLLM started with an API key: the key from a file (the chart mounts
its Secret) or from VLLM_API_KEY, refused with a clear message when unreadable, never
printed. The requests themselves carry it: tests/e2e/test_chart_secured.py (real vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_glassbox.lab.cli import main
from vllm_glassbox.lab.vllm.credentials import ApiKeySource, key_source, open_api_key


def test_the_key_comes_from_the_file_first_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY_FILE", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert key_source(None) is None
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert _key(key_source(None)) == "from-env"
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(tmp_path / "token"))
    assert _key(key_source(None)) == "from-file"
    # A plan that names its key's source wins over the environment.
    (tmp_path / "planned").write_text("from-plan\n")
    assert _key(key_source(ApiKeySource(file=str(tmp_path / "planned")))) == "from-plan"


def _key(source: ApiKeySource | None) -> str:
    assert source is not None
    key = open_api_key(source)
    try:
        return key.value
    finally:
        key.close()


def test_an_unreadable_key_file_stops_the_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "token").write_text("  \n")
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(tmp_path / "token"))
    assert main(["run", "cpu-demo", "--backend", "local", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"cannot read the file {tmp_path / 'token'}: " in err
    assert not (tmp_path / "out").exists()
