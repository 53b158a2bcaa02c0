"""The local backend and the run around it, fast: a stand-in server instead of vLLM.

The stand-in (this file run as a script, see `fake_server` below) takes vLLM's flags,
writes vLLM-like startup lines, serves /health, /version, /metrics — a real page
captured from the vLLM CPU build (tests/fixtures/metrics/cpu-0.32), its counters moved
by the requests it answers — and /v1/completions. It spawns a worker process, like
vLLM's engine core, so "no process left" means the whole group. The real vLLM runs in
tests/e2e/test_lab_run.py.

With FAKE_GPU=1 it stands in for vLLM's CUDA build instead (no GPU can run here: the
narrowest honest double): the startup lines of vLLM 0.24 on an H200 (the engine-config
line, "Model loading took X GiB memory", "GPU KV cache size"), 16-token blocks, weights
by the precision the model folder or --quantization asks for (as large as BF16 when a
GPTQ config does not name its quantized modules, as vLLM 0.24 does), and decode steps
that take longer with more weights. The shipped gpu-7b plan is rehearsed against it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

# The path by hand: the stand-in runs as a script, without the tests package.
FIXTURE_PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "cpu-0.32"
SERVER_COMMAND = f"{sys.executable} {Path(__file__).resolve()}"


# --- the stand-in server ----------------------------------------------------------------


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


class _Counters:
    """The stand-in's engine: counters a finished request moves, like vLLM's."""

    def __init__(self, page: str, served: str, spec: bool) -> None:
        self.template = page.replace('model_name="tiny"', f'model_name="{served}"')
        self.spec = spec
        self.lock = threading.Lock()
        self.values: dict[str, float] = {}
        self.running = 0

    def add(self, **increments: float) -> None:
        with self.lock:
            for name, value in increments.items():
                self.values[name] = self.values.get(name, 0.0) + value

    def request(self, prompt_tokens: int, tokens: int, speculate: bool, step: float) -> None:
        """Decode `tokens`; with speculation, four tokens per forward pass."""
        per_pass = 4 if speculate else 1
        passes = math.ceil((tokens - 1) / per_pass)
        with self.lock:
            self.running += 1
        time.sleep(0.01 + passes * step)
        with self.lock:
            self.running -= 1
        self.add(
            **{
                "vllm:prompt_tokens_total": prompt_tokens,
                "vllm:generation_tokens_total": tokens,
                "vllm:time_to_first_token_seconds_count": 1,
                "vllm:time_to_first_token_seconds_sum": 0.01,
                "vllm:inter_token_latency_seconds_count": passes,
                "vllm:inter_token_latency_seconds_sum": passes * step,
                "vllm:iteration_tokens_total_count": passes + 1,
                "vllm:e2e_request_latency_seconds_count": 1,
                "vllm:request_prefill_time_seconds_count": 1,
                "vllm:request_prefill_time_seconds_sum": 0.01,
            }
        )
        if speculate:
            self.add(
                **{
                    "vllm:spec_decode_num_drafts_total": passes,
                    "vllm:spec_decode_num_draft_tokens_total": 5 * passes,
                    "vllm:spec_decode_num_accepted_tokens_total": tokens - 1 - passes,
                }
            )

    def page(self) -> str:
        with self.lock:
            values = {**self.values, "vllm:num_requests_running": float(self.running)}

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            return f"{name}{m.group(2)} {values[name]}" if name in values else m.group(0)

        return re.sub(r"^([a-zA-Z0-9_:]+)(\{[^}]*\}) (\S+)$", sub, self.template, flags=re.M)


# The stand-in's GPU: weights by precision (a Qwen2.5-7B shape, as vLLM 0.24 logged them
# on an H200), and a decode step of FAKE_STEP_SECONDS + 0.2 ms per GiB of weights.
FAKE_GPU_WEIGHTS_GIB = {"bf16": 14.29, "awq": 5.2, "gptq": 5.4, "fp8": 8.2}
FAKE_GPU_KV_TOKENS = 2_085_488


def _gpu_precision(model: str, argv: list[str]) -> tuple[str, str | None]:
    """(precision of the weights as loaded, what the engine config says it quantizes)."""
    if _flag(argv, "--quantization") == "fp8":
        return "fp8", "fp8"
    try:
        quant = json.loads((Path(model) / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError):
        quant = None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if (
        method == "gptq"
        and isinstance(quant, dict)
        and not quant.get("modules_in_block_to_quantize")
    ):
        return "bf16", "gptq_marlin"  # vLLM 0.24 serves every layer unquantized
    if method in ("awq", "gptq"):
        return method, f"{method}_marlin"
    return "bf16", None


def fake_server(argv: list[str]) -> None:
    """A stand-in for `python -m vllm.entrypoints.openai.api_server` (see the docstring)."""
    model = _flag(argv, "--model") or "none"
    served = _flag(argv, "--served-model-name") or model
    port = int(_flag(argv, "--port") or "8000")
    spec = _flag(argv, "--speculative-config") is not None
    step = float(os.environ.get("FAKE_STEP_SECONDS", "0.002"))
    gpu = os.environ.get("FAKE_GPU") == "1"
    pid = os.getpid()
    version = "0.24.0" if gpu else "0.32.0"
    print(f"(APIServer pid={pid}) INFO fake vLLM args: {json.dumps(argv)}", flush=True)
    print(f"(APIServer pid={pid}) INFO ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}", flush=True)
    if model.endswith("crash"):
        print("ValueError: this model cannot start", flush=True)
        sys.exit(1)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    page = (FIXTURE_PAGES / ("spec-idle.txt" if spec else "plain-idle.txt")).read_text()
    if gpu:
        precision, quantization = _gpu_precision(model, argv)
        weights = FAKE_GPU_WEIGHTS_GIB[precision]
        step += 0.0002 * weights
        load_format = _flag(argv, "--load-format") or "auto"
        print(
            f"(EngineCore pid={pid}) INFO Initializing a V1 LLM engine (v0.24.0) with config: "
            f"model='{model}', quantization={quantization}, load_format={load_format}, "
            "tensor_parallel_size=1",
            flush=True,
        )
        print(
            f"(Worker pid={worker.pid}) INFO Model loading took {weights} GiB memory and "
            "0.56 seconds",
            flush=True,
        )
        kv_bytes = _flag(argv, "--kv-cache-memory-bytes")
        tokens = int(kv_bytes) // 57344 // 16 * 16 if kv_bytes else FAKE_GPU_KV_TOKENS
        print(f"(EngineCore pid={pid}) INFO GPU KV cache size: {tokens:,} tokens", flush=True)
        page = re.sub(r'block_size="128"', 'block_size="16"', page)
        page = re.sub(r'num_gpu_blocks="\d+"', f'num_gpu_blocks="{tokens // 16}"', page)
        page = re.sub(r'kv_cache_size_tokens="\d+"', f'kv_cache_size_tokens="{tokens}"', page)
    else:
        print(f"(Worker pid={worker.pid}) INFO Loading weights took 0.01 seconds", flush=True)
        tokens = int(re.search(r'kv_cache_size_tokens="(\d+)"', page).group(1))  # type: ignore[union-attr]
        print(
            f"(EngineCore pid={pid}) INFO CPU KV cache size: {tokens:,} tokens, "
            "Maximum concurrency for 2,048 tokens per request: 8.00x",
            flush=True,
        )
    engine = _Counters(page, served, spec)
    scrape = os.environ.get("FAKE_SCRAPE_URL")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"", "text/plain")
            elif self.path == "/metrics":
                self._send(200, engine.page().encode(), "text/plain; version=0.0.4")
            elif self.path == "/version":
                self._send(200, json.dumps({"version": version}).encode(), "application/json")
            else:
                self._send(404, b"", "text/plain")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            print(f"completion started: {json.dumps(body)}", flush=True)
            if scrape:  # what the lab serves while this phase runs
                import urllib.request

                lines = urllib.request.urlopen(scrape, timeout=5).read().decode()
                for line in lines.splitlines():
                    if line.startswith("glassbox_lab_phase_info"):
                        print(f"lab says: {line}", flush=True)
            if body["model"] != served:
                self._send(404, b'{"error": "model not found"}', "application/json")
                return
            tokens = int(body["max_tokens"])
            speculate = spec and body.get("repetition_penalty") == 1.0
            engine.request(len(body["prompt"].split()), tokens, speculate, step)
            answer = {
                "choices": [{"text": " x" * tokens}],
                "usage": {
                    "prompt_tokens": len(body["prompt"].split()),
                    "completion_tokens": tokens,
                },
            }
            self._send(200, json.dumps(answer).encode(), "application/json")

        def _send(self, code: int, data: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # a flood connects all at once, as vLLM's server accepts

    server = Server(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    time.sleep(float(os.environ.get("FAKE_STARTUP_SECONDS", "0.1")))
    server.serve_forever()
    worker.terminate()


if __name__ == "__main__":
    fake_server(sys.argv[1:])
    sys.exit(0)


# --- the tests --------------------------------------------------------------------------

from vllm_glassbox.lab.backends.local import LocalBackend  # noqa: E402
from vllm_glassbox.lab.cli import main as lab_main  # noqa: E402
from vllm_glassbox.lab.plan import parse_plan  # noqa: E402
from vllm_glassbox.lab.progress import Progress  # noqa: E402
from vllm_glassbox.lab.runner import Lab, run_lab  # noqa: E402

from tests.jobs import with_sigint_ignored  # noqa: E402

BASE_ARGS = ["--model", "base-model", "--served-model-name", "tiny", "--max-model-len", "2048"]


def plan_data(**phases: Any) -> dict[str, Any]:
    return {
        "name": "fake",
        "target": {"local": {"args": BASE_ARGS, "startup_timeout": "60s"}},
        "phases": [
            {
                "kind": "quantization",
                "name": "quant",
                "max_tokens": 24,
                "flags": {"--kv-cache-memory-bytes": 8388608},
                "variants": [
                    {"name": "big", "model": "model-big"},
                    {"name": "small", "model": "model-small", "flags": {"--dtype": "float16"}},
                ],
            },
            {
                "kind": "kv-pressure",
                "name": "flood",
                "concurrency": 4,
                "max_tokens": 64,
                "poll": "100ms",
                "flags": {"--gpu-memory-utilization": False},
            },
            {"kind": "spec-decode", "name": "spec", "max_tokens": 33},
        ],
        **phases,
    }


def write_plan(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def asked_max_tokens(log: str) -> list[int]:
    """`max_tokens` of every completion the stand-in server began, in order (the flood's
    threads may print on one line: each body is read from where its marker ends)."""
    decoder = json.JSONDecoder()
    marker = "completion started: "
    return [decoder.raw_decode(log, m.end())[0]["max_tokens"] for m in re.finditer(marker, log)]


def pids_in(log: str) -> list[int]:
    return [int(p) for p in re.findall(r"pid=(\d+)\)", log)]


def pollers_of(url: str) -> list[int]:
    """Live processes of the lab's poller (lab/vllm/poller.py) polling `url`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        poller = b"vllm_glassbox.lab.vllm.poller" in cmdline and url.encode() in cmdline
        if poller and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; /proc says which.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class AnnotationSink:
    """A loopback double of Grafana's one endpoint the lab uses: POST /api/annotations."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, dict[str, Any]]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sink.received.append((self.path, self.headers["Authorization"], data))
                body = b'{"id": 1, "message": "Annotation added"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def grafana() -> Iterator[AnnotationSink]:
    sink = AnnotationSink()
    yield sink
    sink.server.shutdown()
    sink.server.server_close()


def test_each_phase_gets_its_own_server_with_its_flags_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grafana: AnnotationSink
) -> None:
    from vllm_glassbox.lab.backends.server_process import free_port

    listen = free_port()
    monkeypatch.setenv("GLASSBOX_GRAFANA_URL", grafana.url)
    monkeypatch.setenv("GLASSBOX_GRAFANA_TOKEN", "s3cret")
    monkeypatch.setenv("FAKE_SCRAPE_URL", f"http://127.0.0.1:{listen}/metrics")
    out = tmp_path / "out"
    code = lab_main(
        [
            "run",
            str(write_plan(tmp_path, plan_data())),
            "--out",
            str(out),
            "--server-command",
            SERVER_COMMAND,
            "--metrics-listen",
            f"127.0.0.1:{listen}",
        ],
        "lab",
    )
    assert code == 0
    logs = sorted((out / "logs").glob("*.log"))
    assert [p.name for p in logs] == [
        "01-model-big.log",
        "02-model-small.log",
        "03-base-model.log",
        "04-base-model.log",
        "05-base-model.log",
    ]
    texts = [p.read_text() for p in logs]
    argvs = [json.loads(re.search(r"fake vLLM args: (.*)", t).group(1)) for t in texts]  # type: ignore[union-attr]
    assert argvs[0][:6] == [
        "--model",
        "model-big",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
    ]
    assert "--kv-cache-memory-bytes=8388608" in argvs[0] and "--dtype=float16" not in argvs[0]
    assert argvs[1][1] == "model-small" and "--dtype=float16" in argvs[1]
    assert not any(a.startswith("--kv-cache-memory-bytes") for a in argvs[2])  # per phase
    assert not any("gpu-memory-utilization" in a for a in argvs[2])  # the default removed
    assert any(a.startswith("--speculative-config=") for a in argvs[3])
    assert not any("speculative-config" in a for a in argvs[4])  # the baseline's server
    # While a phase ran, the lab served which one it was.
    assert (
        'lab says: glassbox_lab_phase_info{kind="quantization",phase="quant",variant="big"} 1.0'
        in texts[0]
    )
    assert 'glassbox_lab_phase_info{kind="kv-pressure",phase="flood",variant=""} 1.0' in texts[2]
    # Every server and its worker are gone.
    pids = [pid for t in texts for pid in pids_in(t)]
    assert len(set(pids)) == 10
    assert not [pid for pid in pids if alive(pid)]

    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok"
    quant, flood, spec = results["phases"]
    # One warm-up, then three requests measured apart: TPOT is their median.
    assert [v["generated_tokens"] for v in quant["variants"]] == [72, 72]
    # A warm-up asks for 16 tokens at most; the measured requests for the phase's.
    asked = [asked_max_tokens(t) for t in texts]
    assert asked[0] == [16, 24, 24, 24]
    assert asked[2] == [16, 64, 64, 64, 64]
    assert [len(v["samples"]) for v in quant["variants"]] == [3, 3]
    assert quant["variants"][0]["tpot_seconds"] == pytest.approx(0.002)
    assert quant["variants"][0]["tpot_seconds_min"] <= quant["variants"][0]["tpot_seconds_max"]
    assert quant["variants"][0]["kv_cache_tokens"] == 16384  # from the startup log
    assert quant["variants"][0]["block_size"] == 128  # from cache_config_info
    assert quant["variants"][0]["load_seconds"] == 0.01
    assert flood["completed"] == 4 and flood["timeline"][-1]["generated_tokens"] == 256
    assert flood["timeline"][0]["t"] < 1 and flood["timeline"][0]["generated_tokens"] == 0
    assert flood["missed_polls"] == [] and flood["max_gap_seconds"] < 1
    assert [r["label"] for r in spec["runs"]] == [
        "repetition_penalty 1.0",
        "model defaults",
        "no speculation",
    ]
    assert [r["speculation"] for r in spec["runs"]] == [True, True, False]
    assert [r["forward_passes"] for r in spec["runs"]] == [24, 96, 96]  # 3 requests each
    assert [r["drafts"] for r in spec["runs"]] == [24, 0, 0]
    assert spec["speedup"] == pytest.approx(4, rel=0.2) and spec["baseline_problem"] is None
    # One annotation per server start, with the token, each a region.
    assert len(grafana.received) == 5
    path, auth, first = grafana.received[0]
    assert (path, auth) == ("/api/annotations", "Bearer s3cret")
    assert first["tags"] == ["glassbox-lab", "quantization", "quant", "big"]
    assert first["time"] < first["timeEnd"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_phase_stops_the_server_and_its_worker(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "FAKE_STEP_SECONDS": "1.0"}  # a long request: we interrupt it
    lab = subprocess.Popen(
        with_sigint_ignored(
            [
                sys.executable,
                "-m",
                "vllm_glassbox",
                "lab",
                "run",
                str(write_plan(tmp_path, plan_data())),
                "--out",
                str(out),
                "--server-command",
                SERVER_COMMAND,
            ]
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    log = out / "logs" / "01-model-big.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "completion started" not in (
        log.read_text() if log.exists() else ""
    ):
        time.sleep(0.1)
    assert "completion started" in log.read_text()
    pids = set(pids_in(log.read_text()))
    assert len(pids) == 2 and all(alive(p) for p in pids)

    port = json.loads(re.search(r"fake vLLM args: (.*)", log.read_text()).group(1))  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port[port.index('--port') + 1]}"
    # After the warm-up request, the measured ones with the progress poller (a process).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not pollers_of(url):
        time.sleep(0.1)
    assert pollers_of(url)
    lab.send_signal(sig)
    _, err = lab.communicate(timeout=60)
    assert lab.returncode == code
    assert "interrupted; the server was stopped" in err.decode()
    assert not [p for p in pids if alive(p)]
    assert not pollers_of(url)  # gone with the lab
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted"
    assert results["phases"][0]["status"] == "interrupted"
    assert (out / "report.md").exists()
    assert len(list((out / "logs").glob("*.log"))) == 1  # nothing started after the interrupt


def test_a_failing_phase_is_reported_and_the_next_still_runs(tmp_path: Path) -> None:
    data = plan_data()
    data["phases"][0]["variants"] = [{"name": "broken", "model": "model-crash"}]
    out = tmp_path / "out"
    code = lab_main(
        [
            "run",
            str(write_plan(tmp_path, data)),
            "--out",
            str(out),
            "--server-command",
            SERVER_COMMAND,
        ],
        "lab",
    )
    assert code == 1
    results = json.loads((out / "results.json").read_text())
    quant, flood, spec = results["phases"]
    assert quant["status"] == "failed" and quant["error"] == "every variant failed"
    assert "exited with code 1" in quant["variants"][0]["error"]
    assert "this model cannot start" in quant["variants"][0]["error"]  # the log's tail
    assert (flood["status"], spec["status"]) == ("ok", "ok")
    report = (out / "report.md").read_text()
    assert "**quant** failed: every variant failed" in report
    assert "failed: server exited with code 1" in report


def test_a_crash_of_the_lab_still_stops_the_server(tmp_path: Path) -> None:
    plan = parse_plan(plan_data())
    assert plan.local is not None
    backend = LocalBackend(plan.local, tmp_path / "logs", SERVER_COMMAND)

    def publish(results: object) -> None:
        raise OSError("disk full")

    with Progress(tty=False) as progress, pytest.raises(OSError, match="disk full"):
        run_lab(plan, Lab(backend, progress, publish=publish))
    assert backend.server is None
    logs = sorted((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 2  # the first phase's two variants ran; then the lab crashed
    pids = {pid for log in logs for pid in pids_in(log.read_text())}
    assert len(pids) == 4 and not [p for p in pids if alive(p)]


def test_a_server_already_running_with_the_same_args_is_kept_not_started_again(
    tmp_path: Path,
) -> None:
    plan = parse_plan(plan_data())
    assert plan.local is not None
    backend = LocalBackend(plan.local, tmp_path / "logs", SERVER_COMMAND)
    try:
        first = backend.deploy({"--model": "model-small"})
        server = backend.server
        again = backend.deploy({"--model": "model-small"})
        assert backend.server is server and server is not None and server.running()
        assert (first.reused, again.reused) == (False, True)
        assert again.url == first.url and again.log_path == first.log_path
        assert again.startup_seconds == first.startup_seconds  # the start it had, not ~0
        other = backend.deploy({"--model": "model-big"})  # other args: a fresh server
        assert not other.reused and backend.server is not server and not server.running()
        backend.restore()
        after = backend.deploy({"--model": "model-big"})  # nothing kept across a restore
        assert not after.reused
    finally:
        backend.restore()
    assert [p.name for p in sorted((tmp_path / "logs").glob("*.log"))] == [
        "01-model-small.log",
        "02-model-big.log",
        "03-model-big.log",
    ]


def test_tiny_model_references_become_generated_directories(tmp_path: Path) -> None:
    plan = parse_plan(
        {
            "target": {
                "local": {
                    "args": ["--model", "tiny:small", "--tokenizer=tiny:small"],
                    "tiny_models": {"small": {"hidden_size": 128, "num_layers": 1}},
                    "model_cache": str(tmp_path / "models"),
                }
            },
            "phases": [{"kind": "kv-pressure"}],
        }
    )
    assert plan.local is not None
    backend = LocalBackend(plan.local, tmp_path / "logs")
    args = backend.resolve(list(plan.local.args))
    model = tmp_path / "models" / "small"
    assert args == ["--model", str(model), f"--tokenizer={model}"]
    config = json.loads((model / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 1)
    assert (model / "model.safetensors").stat().st_size > 128 * 1024 * 2


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    import io

    now = [100.0]
    stream = io.StringIO()
    with Progress(stream, tty=False, clock=lambda: now[0], quiet_seconds=15) as progress:
        progress.begin("quantization", "AWQ")
        progress.status("starting the server")
        now[0] += 65
        progress.status("1 request(s)")
        progress.tokens(32, 128)  # within the quiet period after the last line: kept quiet
        now[0] += 20
        progress.tokens(128, 128)
        progress.note("  AWQ: 128 tokens")
    assert stream.getvalue().splitlines() == [
        "quantization › AWQ  0:00  starting the server",
        "quantization › AWQ  1:05  1 request(s)",
        "quantization › AWQ  1:25  1 request(s)  ████████████████████████ 128/128 tokens",
        "  AWQ: 128 tokens",
    ]


@pytest.mark.prometheus
def test_the_demo_runs_the_exporter_beside_each_server_and_draws_the_dashboards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_glassbox.lab.demo import main as demo_main

    out = tmp_path / "out"
    plan = write_plan(tmp_path, plan_data())
    code = demo_main(["--plan", str(plan), "--out", str(out), "--server-command", SERVER_COMMAND])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "glassbox demo finished in" in stdout and str(out / "report.md") in stdout
    results = json.loads((out / "results.json").read_text())
    # The exporter's view of each segment: its windowed TPOT of the stand-in's requests.
    segments = {e["segment"]: e["values"] for e in results["exporter"]}
    assert list(segments) == [
        "quant › big",
        "quant › small",
        "flood",
        "spec › speculation on",
        "spec › speculation off",
    ]
    assert segments["quant › big"]["glassbox_kv_cache_capacity_tokens"] == 16384
    assert segments["quant › big"]["glassbox_time_per_output_token_seconds"] == pytest.approx(0.002)
    assert segments["spec › speculation on"]["glassbox_tokens_per_forward_pass"] > 1
    # The lab's own numbers over the same requests agree with the exporter's.
    lab = {s["segment"]: s["values"] for s in results["segments"]}
    for name, values in segments.items():
        for series in (
            "glassbox_time_per_output_token_seconds",
            "glassbox_tokens_per_forward_pass",
        ):
            assert values[series] == pytest.approx(lab[name][series], rel=1e-6)
    # Compared when each segment ended, on a page polled since: every row agrees.
    compared = results["compared"]
    assert [c["segment"] for c in compared] == list(segments)
    assert all(c["polled_since_end"] and c["engine"] is None for c in compared)
    assert {r["agree"] for c in compared for r in c["rows"]} <= {True, None}
    report = (out / "report.md").read_text()
    assert "## The exporter's live series" in report
    assert "The exporter and the lab agree on every series both have." in report
    from vllm_glassbox.dashboards import catalog

    boards = [catalog.as_json(d)["uid"] for d in catalog.dashboards()]
    assert "glassbox-slo" in boards and "glassbox-disaggregation" in boards and len(boards) == 7
    for board in boards:  # every dashboard's picture, embedded, with every panel drawn
        assert f"(dashboards/{board}.png)" in report
        assert (out / "dashboards" / f"{board}.png").read_bytes().startswith(b"\x89PNG")
    assert not any("dashboard" in note for note in results["notes"]), results["notes"]
    assert "not drawn" not in (out / "dashboards" / "index.md").read_text()
    # The recording rules are loaded: the fleet panels have data too; and the demo's
    # objectives' rules: the SLO dashboard and the overview's SLO row.
    empty = results["empty_panels"]
    assert "glassbox-decode / Generated tokens per second" not in empty
    slo_panels = (
        "glassbox-overview / SLO attainment, worst",
        "glassbox-slo / Error budget remaining",
    )
    assert [p for p in slo_panels if p in empty] == []
    # The stand-in's models are no readable checkpoints and the plan names no peak: those
    # panels are empty, and say why; every empty panel does.
    assert empty["glassbox-decode / Peak memory bandwidth"].startswith("Present only when")
    assert [k for k, why in empty.items() if why == "(its description does not say why)"] == []
    assert "Panels without data on this run, and why:" in report


def test_the_gpu_plan_runs_unchanged_against_a_stand_in_of_the_cuda_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rehearsal of gpu-7b's mechanics: the shipped plan as it is (only the model cache
    moved), its seven server starts with their flags, its 7B folders built without
    weights, the exporter beside each server, and the report the GPU run will write."""
    from vllm_glassbox.lab.plan import packaged_plan

    data = yaml.safe_load(packaged_plan("gpu-7b").read_text())  # type: ignore[union-attr]
    data["target"]["local"]["model_cache"] = str(tmp_path / "models")
    # The rate sweep streams vLLM's benchmark at the server: it runs against the real CPU
    # build (tests/e2e/test_lab_sweep.py), not this stand-in.
    assert data["phases"][-1]["kind"] == "rate-sweep"
    data["phases"] = data["phases"][:-1]
    monkeypatch.setenv("FAKE_GPU", "1")
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.0002")
    out = tmp_path / "out"
    code = lab_main(
        [
            "run",
            str(write_plan(tmp_path, data)),
            "--backend",
            "local",
            "--out",
            str(out),
            "--server-command",
            SERVER_COMMAND,
        ],
        "lab",
    )
    assert code == 0
    logs = sorted((out / "logs").glob("*.log"))
    argvs = [json.loads(re.search(r"fake vLLM args: (.*)", p.read_text()).group(1)) for p in logs]  # type: ignore[union-attr]
    assert len(argvs) == 7
    assert all("--load-format" in a and "dummy" in a for a in argvs)
    assert "--quantization=fp8" in argvs[3]
    assert "--kv-cache-memory-bytes=3325952000" in argvs[4]
    assert not any("gpu-memory-utilization" in a for a in argvs[4])
    assert any("speculative-config" in a for a in argvs[5])
    assert not any("speculative-config" in a for a in argvs[6])
    models = tmp_path / "models"
    assert not list(models.rglob("*.safetensors"))  # config and tokenizer only
    gptq = json.loads((models / "qwen7b-gptq" / "config.json").read_text())
    assert gptq["quantization_config"]["modules_in_block_to_quantize"]
    assert gptq["hidden_size"] == 3584 and gptq["vocab_size"] == 152064

    results = json.loads((out / "results.json").read_text())
    assert results["peak_bandwidth"]["bytes_per_second"] == 4.8e12
    quant, kv, spec = results["phases"]
    bf16, awq, _, fp8 = quant["variants"]
    assert [v["weights_gib"] for v in quant["variants"]] == pytest.approx([14.29, 5.2, 5.4, 8.2])
    assert bf16["block_size"] == 16 and bf16["weights_source"] == "log"
    assert (awq["quantization"], fp8["quantization"]) == ("awq_marlin", "fp8")
    assert bf16["load_format"] == "dummy"
    # The stand-in's steps cost 0.2 ms per GiB: the slope implies 5.4 TB/s, above the peak.
    assert quant["fit"]["exceeds_peak"] is True
    assert quant["fit"]["r_squared"] is None  # two points
    assert kv["kv_cache_tokens"] == 58000 and kv["kv_cache_blocks"] == 3625
    assert [r["speculation"] for r in spec["runs"]] == [True, True, False]
    assert spec["baseline_problem"] is None and spec["speedup"] > 1
    assert "skips speculation under a repetition penalty" in spec["penalty_finding"]
    assert {e["segment"] for e in results["exporter"]} == {
        s["segment"] for s in results["segments"]
    }
    report = (out / "report.md").read_text()
    assert "**not a bandwidth**" in report
    assert "The weights were filled by vLLM's dummy loader (`--load-format dummy`" in report
    assert "## Cold starts" in report and "| quantization › BF16 | 0.56 |" in report
    assert "The exporter and the lab agree on every series both have." in report


def test_a_poll_that_fails_or_hangs_is_recorded_and_the_next_follows() -> None:
    from vllm_glassbox.lab.vllm.client import Sampler, VllmClient

    page = (FIXTURE_PAGES / "plain-idle.txt").read_text().encode()
    polls = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            polls[0] += 1
            if polls[0] == 2:  # vLLM answers an error
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if polls[0] == 4:  # vLLM is stuck: past the sampler's deadline
                time.sleep(2.5)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # gave up
                self.send_response(200)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen: list[float] = []
    missed: list[tuple[float, str]] = []
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with Sampler(
            VllmClient(url, "m"),
            0.5,
            lambda t, snap, latency, delay: seen.append(t),
            on_missed=lambda t, error: missed.append((t, error)),
            deadline=2.0,  # the default waits 10 s for a stalled server
        ) as sampler:
            while polls[0] < 6:
                time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert [error for _, error in missed[:2]] == [
        f"cannot read {url}: /metrics: HTTP 500",
        f"cannot read {url}: /metrics: no complete answer within 2s",  # a hard deadline
    ]
    assert sampler.deadline == 2.0 and sampler.errors == len(missed)
    # Every page after the hung poll is still recorded, in order.
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] > missed[1][0]
