"""`glassbox rules --slo` on bad input: a clear message naming the file or the field, a
non-zero exit, and nothing half-written (CONTRIBUTING.md, "Bad input")."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_glassbox import rules

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "alerts" / "slo" / "example.yaml"
OBJECTIVE = "objectives:\n  - name: a\n    sli: errors\n    target: 99%\n"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = rules.main(args)
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def test_an_empty_slo_file_is_said_to_be_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "slo.yaml"
    empty.write_text("# nothing yet\n")
    code, err = run(["--slo", str(empty), "--out", str(tmp_path / "out")], capsys)
    assert code == 1
    assert f"{empty}: 1 problem(s):\n  is empty: it needs `objectives`" in err
    assert "NoneType" not in err
    assert not (tmp_path / "out").exists()


def test_a_yaml_error_names_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "slo.yaml"
    broken.write_text(OBJECTIVE.replace("    target", "   target"))
    code, err = run(["--slo", str(broken), "--out", str(tmp_path / "out")], capsys)
    assert code == 1
    assert f'in "{broken}", line 4' in err and "<unicode string>" not in err


@pytest.mark.parametrize(
    ("key", "means"),
    [("model", "every model"), ("namespace", "every namespace"), ("window", "the default 28d")],
)
def test_a_key_without_a_value_is_refused_naming_it(
    key: str, means: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`model:` with nothing after it is YAML's null: refused, never read as left out."""
    path = tmp_path / "slo.yaml"
    path.write_text(OBJECTIVE + f"    {key}:\n")
    code, err = run(["--slo", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 1
    assert (
        f"objectives[0].{key}: given without a value: name one, or leave the key out for {means}"
    ) in err
    assert not (tmp_path / "out").exists()


def test_out_naming_a_file_is_refused_and_the_file_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rules.yaml"
    out.write_text("mine\n")
    code, err = run(["--slo", str(EXAMPLE), "--out", str(out)], capsys)
    assert code == 2
    assert f"--out: {str(out)!r} is a file, not a folder" in err
    assert "Traceback" not in err and out.read_text() == "mine\n"


def test_out_below_a_file_is_a_message_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    code, err = run(["--slo", str(EXAMPLE), "--out", str(tmp_path / "file" / "rules")], capsys)
    assert code == 1 and "--out: cannot write into" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_write_that_fails_leaves_no_file_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.yaml").write_text("the old a\n")
    real = Path.write_text
    calls: list[Path] = []

    def failing(self: Path, text: str, *args: object, **kwargs: object) -> int:
        calls.append(self)
        if len(calls) == 2:  # the second file: the disk is full
            real(self, text[: len(text) // 2])
            raise OSError(28, "No space left on device")
        return real(self, text)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(OSError, match="No space left"):
        rules.write_files(out, {"a.yaml": "the new a\n", "b.yaml": "the new b\n"})
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["a.yaml"]
    assert (out / "a.yaml").read_text() == "the old a\n"
