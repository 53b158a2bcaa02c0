"""`glassbox exporter`: every flag, fail-fast validation, and the real console command.

The console command runs as a subprocess against a fake vLLM on loopback
(tests/misbehaving.py); it is scraped over HTTP and stopped with SIGTERM / SIGINT.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import series, series_disagg
from vllm_glassbox.core.errors import ERROR_REASONS, ScrapeError
from vllm_glassbox.core.fetch import Fetched
from vllm_glassbox.core.gpus import GPU_MEMORY_BANDWIDTH
from vllm_glassbox.core.weights import weights_from_config
from vllm_glassbox.exporter.cli import build_parser, config_from_args, main
from vllm_glassbox.exporter.service import ExporterConfig, Poller
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, write_safetensors

from tests.fixtures import page as fixture_page
from tests.misbehaving import FakeVllm, Misbehaving

GLASSBOX = str(Path(sys.executable).parent / "glassbox")
GIB = 1024**3


def parse(argv: Sequence[str]) -> ExporterConfig:
    return config_from_args(build_parser("glassbox exporter").parse_args(argv))


# --- flags -> config --------------------------------------------------------------------


def test_every_flag_reaches_the_config(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path / "model")
    config = parse(
        [
            "--target", "http://10.0.0.5:8000/",
            "--listen", "127.0.0.1:9500",
            "--interval", "500ms",
            "--window", "1m",
            "--timeout", "2s",
            "--max-bytes", "1048576",
            "--weights-bytes", "15.2e9",
            "--vllm-log", str(tmp_path / "vllm.log"),
            "--model-dir", str(model),
            "--gpu-memory-bandwidth", "864e9",
            "--tensor-parallel-size", "2",
            "--pipeline-parallel-size", "3",
        ]
    )  # fmt: skip
    assert config.target == "http://10.0.0.5:8000"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9500)
    assert config.interval_seconds == 0.5
    assert config.window_seconds == 60.0
    assert config.timeout_seconds == 2.0
    assert config.max_bytes == 1048576
    assert config.weights_bytes == 15.2e9
    assert config.vllm_log == str(tmp_path / "vllm.log")
    assert config.model_dir == str(model)
    assert config.peak_bandwidth == 864e9
    assert (config.tensor_parallel, config.pipeline_parallel) == (2, 3)


def test_defaults_follow_the_spec() -> None:
    config = parse([])
    assert config.target == "http://127.0.0.1:8000"
    assert config.interval_seconds == 5.0
    assert config.window_seconds == 60.0
    # Longer than the interval: a busy vLLM answering late is read (and counted slow).
    assert config.timeout_seconds == 10.0
    assert config.weights_bytes is None and config.peak_bandwidth is None
    # The parallel layout: what vLLM's log says, else 1 (resolved while running).
    assert (config.tensor_parallel, config.pipeline_parallel) == (None, None)


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("5s", 5.0), ("1m", 60.0), ("7", 7.0), ("2.5", 2.5)]
)
def test_durations_accept_ms_s_m_and_plain_seconds(text: str, seconds: float) -> None:
    config = parse(["--interval", text, "--window", "10m"])
    assert config.interval_seconds == seconds
    assert config.timeout_seconds == 10.0  # not tied to the interval


@pytest.mark.parametrize(("text", "value"), [("864e9", 864e9), ("864000000000", 864e9)])
def test_bandwidth_accepts_plain_and_scientific_bytes(text: str, value: float) -> None:
    assert parse(["--gpu-memory-bandwidth", text]).peak_bandwidth == value


def test_gpu_name_gives_the_datasheet_bandwidth() -> None:
    assert parse(["--gpu", "L40S"]).peak_bandwidth == GPU_MEMORY_BANDWIDTH["L40S"]
    assert parse(["--gpu", "h100"]).peak_bandwidth == GPU_MEMORY_BANDWIDTH["H100-SXM"]


def test_ipv6_listen_address_is_unbracketed() -> None:
    config = parse(["--listen", "[::1]:9401"])
    assert (config.listen_host, config.listen_port) == ("::1", 9401)


# --- bad flags fail fast, naming the flag -----------------------------------------------

BAD_FLAGS = [
    (["--interval", "5x"], "--interval"),
    (["--interval", "0"], "--interval"),
    (["--window", "-1m"], "--window"),
    (["--interval", "10s", "--window", "15s"], "--window"),
    (["--timeout", "soon"], "--timeout"),
    (["--target", "ftp://vllm:8000"], "--target"),
    (["--target", "vllm:8000"], "--target"),
    (["--listen", "127.0.0.1:99999"], "--listen"),
    (["--listen", "127.0.0.1:http"], "--listen"),
    (["--max-bytes", "-5"], "--max-bytes"),
    (["--weights-bytes", "lots"], "--weights-bytes"),
    (["--weights-bytes", "0"], "--weights-bytes"),
    (["--gpu", "Z80"], "--gpu"),
    (["--gpu-memory-bandwidth", "fast"], "--gpu-memory-bandwidth"),
    (["--gpu", "L40S", "--gpu-memory-bandwidth", "1e12"], "--gpu-memory-bandwidth"),
    (["--vllm-log", "/nonexistent/dir/vllm.log"], "--vllm-log"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--log-level", "loud"], "--log-level"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    (["--tensor-parallel-size", "two"], "--tensor-parallel-size"),
    (["--pipeline-parallel-size", "1.5"], "--pipeline-parallel-size"),
    (["--pipeline-parallel-size", "-2"], "--pipeline-parallel-size"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_exits_2_naming_it(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main_exit_code(argv) == 2
    assert flag in capsys.readouterr().err


def test_model_dir_without_a_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main_exit_code(["--model-dir", str(tmp_path)]) == 2
    assert "--model-dir" in capsys.readouterr().err


def test_log_path_that_is_a_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main_exit_code(["--vllm-log", str(tmp_path)]) == 2
    assert "--vllm-log" in capsys.readouterr().err


def test_every_bad_flag_is_listed_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main_exit_code(["--interval", "x", "--window", "y", "--gpu", "Z80"]) == 2
    err = capsys.readouterr().err
    assert "--interval" in err and "--window" in err and "--gpu" in err


@pytest.mark.slow
def test_console_command_refuses_a_bad_flag_before_it_polls(target: Misbehaving) -> None:
    done = subprocess.run(
        [GLASSBOX, "exporter", "--target", target.url, "--interval", "soon"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--interval" in done.stderr
    assert target.fake.polls == 0, "it polled vLLM before checking its flags"


def _main_exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return int(e.code or 0)


# --- the real console command -----------------------------------------------------------


class Running:
    """`glassbox exporter ...` as a child process, its port read from its own log."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            [GLASSBOX, "exporter", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_url()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def _wait_url(self, seconds: float = 120.0) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for line in self.lines:
                if m := re.search(r"serving on (http://\S+)/metrics", line):
                    return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("exporter did not start:\n" + "".join(self.lines))

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        r = httpx.get(self.url + "/metrics", timeout=30)
        r.raise_for_status()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def value(self, name: str, **labels: str) -> float | None:
        for have, v in self.scrape().get(name, []):
            if all(have.get(k) == want for k, want in labels.items()):
                return v
        return None

    def wait_value(self, name: str, seconds: float = 60.0, **labels: str) -> float:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            v = self.value(name, **labels)
            if v is not None:
                return v
            time.sleep(0.1)
        raise AssertionError(f"{name}{labels} never appeared; last: {self.scrape()}")

    def wait_for(self, condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, f"not {what} after {seconds}s"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, seconds: float = 60.0) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=seconds)
        self._reader.join(timeout=5)
        return code


@contextlib.contextmanager
def running(args: Sequence[str]) -> Iterator[Running]:
    r = Running(args)
    try:
        yield r
    finally:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving(FakeVllm(version="0.32.0")) as t:
        yield t


@pytest.mark.slow
def test_console_command_serves_derived_series_and_stops_cleanly_on_sigterm(
    target: Misbehaving,
) -> None:
    with running(["--target", target.url, "--interval", "500ms", "--window", "5s"]) as exporter:
        tpot = exporter.wait_value("glassbox_time_per_output_token_seconds", model_name="fake")
        step = target.fake.step
        assert tpot == pytest.approx(step.itl_sum / (step.generation_tokens - step.ttft_count))
        assert exporter.value("glassbox_target_up") == 1.0
        assert exporter.value("glassbox_window_seconds") == 5.0
        # /version is asked at the first poll and again while unanswered (a busy machine).
        assert exporter.wait_value("glassbox_vllm_info", version="0.32.0") == 1.0
        # It keeps polling (how often is Poller.run's schedule, tested on a fake clock).
        polls = target.fake.polls
        exporter.wait_for(lambda: target.fake.polls >= polls + 3, "three more polls")
        assert httpx.get(exporter.url + "/healthz", timeout=30).text == "ok\n"
        assert exporter.stop(signal.SIGTERM) == 0
    assert "Traceback" not in "".join(exporter.lines)


@pytest.mark.slow
def test_sigterm_ends_a_poll_that_hangs_at_once_not_at_its_deadline(
    target: Misbehaving,
) -> None:
    hanging = threading.Event()

    def stall(h: Any) -> None:
        h.send_head(50_000)
        h.wfile.flush()
        hanging.set()
        h.server.owner.stopping.wait(600)

    target.behave(stall)
    with running(["--target", target.url, "--timeout", "10m"]) as exporter:
        assert hanging.wait(60), "the exporter did not poll"
        # Waiting for the 10-minute deadline would run into this wait's limit.
        assert exporter.stop(signal.SIGTERM, seconds=120) == 0
    assert "Traceback" not in "".join(exporter.lines)


class _FakeTime:
    """Poller.run's clock and its stop event in one: waiting advances the clock."""

    def __init__(self, poll_seconds: list[float]) -> None:
        self.now = 0.0
        self.poll_seconds = poll_seconds
        self.starts: list[float] = []

    def clock(self) -> float:
        return self.now

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/version":
            return '{"version": "0.32.0"}'
        if path != "/metrics":  # no filtered page here: the whole page each poll
            raise ScrapeError("http_status", f"{path}: HTTP 404")
        self.starts.append(self.now)
        self.now += self.poll_seconds[len(self.starts) - 1]
        return fixture_page("cpu-0.32/plain-idle.txt")

    def get_page(self, path: str, timeout_seconds: float | None = None) -> Fetched:
        return Fetched(self.get_text(path, timeout_seconds))

    def close(self) -> None:
        pass


class _StopAfter(threading.Event):
    def __init__(self, fake: _FakeTime) -> None:
        super().__init__()
        self.fake = fake

    def is_set(self) -> bool:
        return len(self.fake.starts) == len(self.fake.poll_seconds)

    def wait(self, timeout: float | None = None) -> bool:
        self.fake.now += timeout or 0.0
        return self.is_set()


def test_poller_polls_every_interval_and_skips_the_ticks_a_slow_poll_missed() -> None:
    fake = _FakeTime(poll_seconds=[0.1, 0.1, 1.2, 0.1, 0.1])
    poller = Poller(
        ExporterConfig(target="http://vllm.invalid", interval_seconds=0.5, window_seconds=5.0),
        fetcher=fake,  # type: ignore[arg-type]
        clock=fake.clock,
    )
    poller.run(_StopAfter(fake))
    # The third poll overran two ticks: the next comes one interval after it, no burst.
    assert fake.starts == pytest.approx([0.0, 0.5, 1.0, 2.7, 3.2])
    assert poller.errors["slow"] == 1  # answered after the interval, and read
    assert poller.history.restarts == 0


@pytest.mark.slow
def test_console_command_stops_cleanly_on_sigint(target: Misbehaving) -> None:
    with running(["--target", target.url, "--interval", "1s"]) as exporter:
        exporter.wait_value("glassbox_kv_cache_capacity_tokens")
        assert exporter.stop(signal.SIGINT) == 0
    assert "Traceback" not in "".join(exporter.lines)


@pytest.mark.slow
def test_console_command_starts_and_serves_while_vllm_is_down() -> None:
    with Misbehaving() as down:
        down.refuse()
        with running(["--target", down.url, "--interval", "500ms"]) as exporter:
            deadline = time.monotonic() + 10
            while (exporter.value("glassbox_scrape_errors_total", reason="connect") or 0) < 2:
                assert time.monotonic() < deadline, exporter.scrape()
                time.sleep(0.1)
            assert exporter.value("glassbox_target_up") == 0.0
            assert exporter.value("glassbox_time_per_output_token_seconds") is None
            assert exporter.stop() == 0


@pytest.mark.slow
def test_listen_address_in_use_exits_1_naming_it(target: Misbehaving) -> None:
    port = target.port  # already taken by the fake vLLM
    done = subprocess.run(
        [GLASSBOX, "exporter", "--listen", f"127.0.0.1:{port}", "--target", target.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert f"127.0.0.1:{port}" in done.stderr


# --- where the weights come from: flag > log > safetensors > config ---------------------

LOG_LINE = (
    "(EngineCore_DP0 pid=4242) INFO 10-05 12:00:00 [gpu_model_runner.py:2653] "
    "Model loading took 1.2500 GiB and 3.123456 seconds\n"
)
CPU_LOG_LINE = (
    "(EngineCore pid=4242) INFO 11-29 12:00:00 [kv_cache_utils.py:1149] CPU KV cache size: "
    "4,096 tokens, Maximum concurrency for 2,048 tokens per request: 2.00x\n"
)


def _checkpoint(directory: Path, safetensors: bool = True) -> Path:
    spec = TinyModelSpec("tiny-cli", hidden_size=64, num_layers=2, intermediate_size=128)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "vocab_size": 1024,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    if safetensors:
        write_safetensors(directory / "model.safetensors", spec.tensor_shapes())
    return directory


def _tensor_bytes(path: Path) -> int:
    """Bytes after the safetensors header: the tensors themselves (by hand)."""
    with open(path, "rb") as f:
        (header_length,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header_length


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "log", "safetensors", "source"),
    [
        (True, LOG_LINE, True, "flag"),
        (False, LOG_LINE, True, "log"),
        (False, CPU_LOG_LINE, True, "safetensors"),  # vLLM on CPU logs no weights
        (False, None, True, "safetensors"),
        (False, None, False, "config"),
    ],
)
def test_weights_source_precedence_is_flag_log_safetensors_config(
    flag: bool,
    log: str | None,
    safetensors: bool,
    source: str,
    target: Misbehaving,
    tmp_path: Path,
) -> None:
    model = _checkpoint(tmp_path / "model", safetensors=safetensors)
    args = ["--target", target.url, "--interval", "500ms", "--model-dir", str(model)]
    if flag:
        args += ["--weights-bytes", "7.5e9"]
    if log is not None:
        (tmp_path / "vllm.log").write_text("INFO starting\n" + log)
        args += ["--vllm-log", str(tmp_path / "vllm.log")]
    if source == "flag":
        expected = 7.5e9
    elif source == "log":
        expected = 1.25 * GIB
    elif source == "safetensors":
        expected = float(_tensor_bytes(model / "model.safetensors"))
    else:  # the estimate's arithmetic has its own tests; here only where it comes from
        expected = float(weights_from_config(model))
    with running([*args, "--gpu-memory-bandwidth", "50e9"]) as exporter:
        assert exporter.wait_value("glassbox_model_weights_info", source=source) == 1.0
        assert exporter.value("glassbox_model_weights_bytes") == expected
        assert exporter.value("glassbox_decode_floor_seconds") == pytest.approx(expected / 50e9)
        assert exporter.stop() == 0


@pytest.mark.slow
def test_kv_tokens_from_the_vllm_log_are_published(target: Misbehaving, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")  # vLLM not started yet: the exporter follows the file as it grows
    with running(["--target", target.url, "--interval", "500ms", "--vllm-log", str(log)]) as e:
        e.wait_value("glassbox_target_up")
        assert e.value("glassbox_kv_cache_logged_capacity_tokens") is None
        with open(log, "a") as f:
            f.write(CPU_LOG_LINE)
        assert e.wait_value("glassbox_kv_cache_logged_capacity_tokens") == 4096.0
        assert e.stop() == 0


# --- docs/exporter.md against the code --------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "exporter.md"
TABLE_BEGIN = "<!-- windowed-series: begin (generated) -->\n"
TABLE_END = "\n<!-- windowed-series: end -->"


def _windowed_table() -> str:
    rows = ["| series | what it is: formula |", "| --- | --- |"]
    rows += [f"| `{family.name}` | {family.help} |" for family in series.WINDOWED]
    return "\n".join(rows)


def test_docs_table_of_windowed_series_matches_the_code(update_golden: bool) -> None:
    text = DOC.read_text()
    head, rest = text.split(TABLE_BEGIN)
    table, tail = rest.split(TABLE_END)
    if update_golden:
        DOC.write_text(head + TABLE_BEGIN + _windowed_table() + TABLE_END + tail)
        return
    assert table == _windowed_table(), "run pytest --update-golden to regenerate the table"


DISAGG_BEGIN = "<!-- disaggregation-series: begin (generated) -->\n"
DISAGG_END = "\n<!-- disaggregation-series: end -->"


def _disaggregation_table() -> str:
    rows = ["| series | labels | what |", "| --- | --- | --- |"]
    rows += [
        f"| `{family.name}` | {', '.join(family.labels)} | {family.help} |"
        for family in series_disagg.ALL
    ]
    return "\n".join(rows)


def test_docs_table_of_disaggregation_series_matches_the_code(update_golden: bool) -> None:
    text = DOC.read_text()
    head, rest = text.split(DISAGG_BEGIN)
    table, tail = rest.split(DISAGG_END)
    if update_golden:
        DOC.write_text(head + DISAGG_BEGIN + _disaggregation_table() + DISAGG_END + tail)
        return
    assert table == _disaggregation_table(), "run pytest --update-golden to regenerate the table"


def test_docs_name_every_flag() -> None:
    text = DOC.read_text()
    flags = [
        flag
        for action in build_parser("glassbox exporter")._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    ]
    assert len(flags) == 25
    missing = [flag for flag in flags if f"| `{flag}" not in text]
    assert missing == []


def test_docs_name_every_error_reason() -> None:
    text = DOC.read_text()
    assert [r for r in ERROR_REASONS if f"| `{r}` |" not in text] == []


def test_docs_name_every_series_of_the_catalogue_and_no_other() -> None:
    text = DOC.read_text()
    assert [f.name for f in series.ALL if f"`{f.name}" not in text] == []
    named = set(re.findall(r"\bglassbox_[a-z0-9_]*[a-z0-9]\b", text))
    assert sorted(named - set(series.BY_NAME)) == []
