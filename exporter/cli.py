"""`glassbox exporter`: flags in, a validated ExporterConfig out, then serve."""

from __future__ import annotations

import argparse
import re
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from vllm_glassbox.core.errors import plain_reason
from vllm_glassbox.core.fetch import (
    DEFAULT_MAX_BYTES,
    TargetCredentials,
    read_token,
    tls_context,
)
from vllm_glassbox.core.gpus import gpu_bandwidth
from vllm_glassbox.core.helptext import examples
from vllm_glassbox.core.launchers import AUTO_PREFIX, KNOWN_PREFIXES
from vllm_glassbox.core.logs import add_log_flags, set_up_logging
from vllm_glassbox.core.prices import parse_gpu_hour_prices
from vllm_glassbox.core.units import (
    base_url_problems,
    parse_duration,
    parse_host_port,
    parse_positive_number,
)
from vllm_glassbox.core.weights import read_checkpoint
from vllm_glassbox.exporter.service import ExporterConfig, serve
from vllm_glassbox.exporter.webconfig import WebConfigError, load_web_config

METRIC_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Poll one vLLM server in the background and serve derived series "
        "(values are as of the latest poll; scrapes never call vLLM).",
        **examples(
            "glassbox exporter --target http://127.0.0.1:8000 --listen :9400",
            "glassbox exporter --target http://vllm:8000 --model-dir /models/qwen --gpu L40S "
            "--vllm-log /logs/vllm.log",
            "glassbox exporter --web-config-file web.yml --log-format json",
        ),
    )
    _add_polling_flags(p)
    _add_model_flags(p)
    add_log_flags(p, default_level="info")
    _add_security_flags(p)
    return p


def _add_polling_flags(p: argparse.ArgumentParser) -> None:
    """What to poll and where to serve, how often, over which window, within what."""
    p.add_argument(
        "--target",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="vLLM base URL; reads URL/metrics and URL/version (default %(default)s)",
    )
    p.add_argument(
        "--listen",
        default="0.0.0.0:9400",
        metavar="HOST:PORT",
        help="where to serve /metrics and /healthz (default %(default)s)",
    )
    p.add_argument(
        "--interval",
        default="5s",
        metavar="DUR",
        help="poll period: 500ms, 5s, 1m or seconds (default %(default)s)",
    )
    p.add_argument(
        "--window",
        default="60s",
        metavar="DUR",
        help="window of every windowed series (default %(default)s)",
    )
    p.add_argument(
        "--forecast-window",
        default=None,
        metavar="DUR",
        help="how far back the KV pool's growth is measured for its exhaustion forecast "
        "(default: --window)",
    )
    p.add_argument(
        "--timeout",
        default="10s",
        metavar="DUR",
        help="hard deadline of one poll; a poll that answers after --interval but within "
        "it is counted slow, not failed (default %(default)s)",
    )
    p.add_argument(
        "--max-bytes",
        default=str(DEFAULT_MAX_BYTES),
        metavar="N",
        help="refuse pages larger than N bytes after decompression (default 8 MiB)",
    )


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """What the page does not say: the model's weights, vLLM's log, the GPU, the layout;
    the prefix of vLLM's names on it."""
    p.add_argument(
        "--weights-bytes",
        metavar="N",
        help="model weight bytes, when known (plain or scientific: 15231233024, 15.2e9)",
    )
    p.add_argument(
        "--vllm-log",
        metavar="FILE",
        help="vLLM's log, followed for startup facts (weights, KV memory)",
    )
    p.add_argument(
        "--model-dir",
        metavar="DIR",
        help="checkpoint or Hugging Face cache dir: weights from safetensors "
        "headers, else estimated from config.json",
    )
    bw = p.add_mutually_exclusive_group()
    bw.add_argument(
        "--gpu", metavar="NAME", help="GPU model for the datasheet bandwidth (e.g. L40S)"
    )
    bw.add_argument(
        "--gpu-memory-bandwidth",
        metavar="B",
        help="peak memory bandwidth in bytes/s (plain or scientific: 864e9)",
    )
    p.add_argument(
        "--gpu-hour-price",
        metavar="PRICE",
        help="price of one GPU hour, for the cost series: 3.5 (or 3.5/h), or by GPU "
        "model and node pool: H200=3.5,A100=1.8,pool:spot=1.2 (with --gpu, --node-pool)",
    )
    p.add_argument(
        "--node-pool",
        metavar="NAME",
        help="the node pool the server runs in, for a --gpu-hour-price by pool:NAME",
    )
    p.add_argument(
        "--kv-link-bandwidth",
        metavar="B",
        help="peak bandwidth in bytes/s of the link a KV consumer receives KV on "
        "(400 Gb/s RDMA: 50e9), for glassbox_kv_transfer_link_utilization_ratio",
    )
    # The parallel layout, when vLLM's log does not say it (or says it wrong).
    for size in ("tensor", "pipeline"):
        p.add_argument(
            f"--{size}-parallel-size",
            metavar="N",
            help=f"vLLM's {size}-parallel size (default: what its log says, else 1)",
        )
    p.add_argument(
        "--metric-prefix",
        default=AUTO_PREFIX,
        metavar="PREFIX",
        help="what vLLM's metric names start with on the page: auto (the one of "
        f"{', '.join(KNOWN_PREFIXES)} the page shows; a page with two is refused), or a "
        "prefix, e.g. ray_vllm_ behind Ray Serve LLM (default: auto)",
    )


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """Our own endpoint (web config), and a vLLM behind TLS or a token check."""
    p.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth of /metrics: Prometheus' web-config format "
        "(tls_server_config, basic_auth_users with bcrypt hashes); re-read on change",
    )
    p.add_argument("--target-ca-file", metavar="FILE", help="CA to trust for an https target")
    p.add_argument("--target-cert-file", metavar="FILE", help="client certificate for the target")
    p.add_argument("--target-key-file", metavar="FILE", help="its private key")
    p.add_argument(
        "--target-bearer-token-file",
        metavar="FILE",
        help="send 'Authorization: Bearer <token>' from FILE (read per poll: rotation works)",
    )


def security_problems(args: argparse.Namespace) -> list[str]:
    """The security flags' problems; none of them quotes a secret."""
    problems: list[str] = []
    if args.web_config_file:
        try:
            load_web_config(args.web_config_file)
        except WebConfigError as e:
            problems.append(f"--web-config-file: {e}")
    if bool(args.target_cert_file) != bool(args.target_key_file):
        problems.append("--target-cert-file and --target-key-file go together")
    credentials = target_credentials(args)
    try:
        tls_context(credentials)
    except (OSError, ssl.SSLError) as e:
        problems.append(f"--target-ca/cert/key-file: cannot load: {plain_reason(e)}")
    if credentials.tls_files and not args.target.startswith("https://"):
        problems.append("--target-ca/cert/key-file need an https:// --target")
    if args.target_bearer_token_file:
        try:
            read_token(args.target_bearer_token_file)
        except (OSError, ValueError) as e:
            problems.append(f"--target-bearer-token-file: {plain_reason(e)}")
    return problems


def target_credentials(args: argparse.Namespace) -> TargetCredentials:
    return TargetCredentials(
        args.target_ca_file,
        args.target_cert_file,
        args.target_key_file,
        args.target_bearer_token_file,
    )


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _span_problems(
    args: argparse.Namespace,
    interval: float | None,
    window: float | None,
    forecast_window: float | None,
) -> list[str]:
    """A window must span at least two polls."""
    problems = []
    if interval and window and window < 2 * interval:
        problems.append(
            f"--window: {args.window} must span at least two polls (--interval {args.interval})"
        )
    if interval and forecast_window and forecast_window < 2 * interval:
        problems.append(
            f"--forecast-window: {args.forecast_window} must span at least two polls "
            f"(--interval {args.interval})"
        )
    return problems


def _vllm_log_problems(vllm_log: str | None) -> list[str]:
    """The file itself may appear later (the exporter can start before vLLM): only its
    directory must exist."""
    if not vllm_log:
        return []
    if Path(vllm_log).is_dir():
        return [f"--vllm-log: {vllm_log!r} is a directory, not a log file"]
    if not Path(vllm_log).parent.is_dir():
        return [f"--vllm-log: directory of {vllm_log!r} does not exist"]
    return []


def _metric_prefix_problems(prefix: str) -> list[str]:
    if prefix != AUTO_PREFIX and not METRIC_PREFIX.fullmatch(prefix):
        return [
            f"--metric-prefix: {prefix!r} cannot start a metric name "
            "(letters, digits, '_' and ':'; not a digit first)"
        ]
    return []


def _model_dir_problems(model_dir: str | None) -> list[str]:
    if not model_dir:
        return []
    try:
        read_checkpoint(Path(model_dir))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"--model-dir: {model_dir!r}: {type(e).__name__}: {e}"]
    return []


def _gpu_hour_price(args: argparse.Namespace) -> float:
    """The price of one GPU hour of this server: --gpu-hour-price, for its --gpu and
    --node-pool."""
    return parse_gpu_hour_prices(args.gpu_hour_price).for_server(args.gpu, args.node_pool)


def config_from_args(args: argparse.Namespace) -> ExporterConfig:
    """Validate every flag; raise ConfigError listing all problems at once."""
    problems: list[str] = []

    def check(flag: str, parse: Callable[[str], T], raw: str) -> T | None:
        try:
            return parse(raw)
        except ValueError as e:
            problems.append(f"{flag}: {e}")
            return None

    problems += [f"--target: {p}" for p in base_url_problems(args.target)]
    address = check("--listen", parse_host_port, args.listen)
    interval = check("--interval", parse_duration, args.interval)
    window = check("--window", parse_duration, args.window)
    forecast_window = (
        check("--forecast-window", parse_duration, args.forecast_window)
        if args.forecast_window is not None
        else None
    )
    timeout = check("--timeout", parse_duration, args.timeout)
    max_bytes = check("--max-bytes", parse_positive_number, args.max_bytes)
    weights = (
        check("--weights-bytes", parse_positive_number, args.weights_bytes)
        if args.weights_bytes is not None
        else None
    )
    peak = None
    if args.gpu:
        peak = check("--gpu", gpu_bandwidth, args.gpu)
    elif args.gpu_memory_bandwidth is not None:
        peak = check("--gpu-memory-bandwidth", parse_positive_number, args.gpu_memory_bandwidth)
    price = None
    if args.gpu_hour_price is not None:
        price = check("--gpu-hour-price", lambda _: _gpu_hour_price(args), args.gpu_hour_price)
    elif args.node_pool is not None:
        problems.append("--node-pool: chooses a price of --gpu-hour-price, which is not given")
    link = None
    if args.kv_link_bandwidth is not None:
        link = check("--kv-link-bandwidth", parse_positive_number, args.kv_link_bandwidth)
    problems += _span_problems(args, interval, window, forecast_window)
    problems += _vllm_log_problems(args.vllm_log)
    sizes = {
        flag: check(flag, _positive_int, raw) if raw is not None else None
        for flag, raw in (
            ("--tensor-parallel-size", args.tensor_parallel_size),
            ("--pipeline-parallel-size", args.pipeline_parallel_size),
        )
    }
    problems += _model_dir_problems(args.model_dir)
    problems += _metric_prefix_problems(args.metric_prefix)
    problems += security_problems(args)
    if problems:
        raise ConfigError("\n".join(problems))
    assert interval and window and timeout and max_bytes and address is not None
    host, port = address
    return ExporterConfig(
        target=args.target.rstrip("/"),
        listen_host=host,
        listen_port=port,
        interval_seconds=interval,
        window_seconds=window,
        forecast_window_seconds=forecast_window,
        timeout_seconds=timeout,
        max_bytes=int(max_bytes),
        weights_bytes=weights,
        vllm_log=args.vllm_log,
        model_dir=args.model_dir,
        peak_bandwidth=peak,
        kv_link_bandwidth=link,
        web_config_file=args.web_config_file,
        target_credentials=target_credentials(args),
        tensor_parallel=_int_or_none(sizes["--tensor-parallel-size"]),
        pipeline_parallel=_int_or_none(sizes["--pipeline-parallel-size"]),
        metric_prefix=args.metric_prefix,
        gpu_hour_price=price,
    )


def main(argv: Sequence[str], prog: str = "glassbox exporter") -> int:
    args = build_parser(prog).parse_args(argv)
    set_up_logging(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
    except ConfigError as e:
        print(f"{prog}: invalid flags:\n{e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve(config, stop)
    except OSError as e:
        print(f"{prog}: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 1
    return 0
