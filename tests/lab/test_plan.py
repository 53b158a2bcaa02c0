"""Plans: the shipped ones are valid and say what SPEC §1 says; a bad plan is refused
whole, with every problem named by its path, before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from vllm_glassbox.lab.backends.backend import REMOVE
from vllm_glassbox.lab.cli import choose_backend
from vllm_glassbox.lab.cli import main as lab_main
from vllm_glassbox.lab.experiments.kv_pressure import KvPressurePhase
from vllm_glassbox.lab.experiments.quantization import QuantizationPhase
from vllm_glassbox.lab.experiments.rate_sweep import RateSweepPhase
from vllm_glassbox.lab.experiments.spec_decode import SpecDecodePhase
from vllm_glassbox.lab.plan import (
    PeakBandwidth,
    PlanError,
    load_plan,
    packaged_plan,
    parse_plan,
    resolve_plan,
)
from vllm_glassbox.lab.plan_yaml import flag_value

LOCAL = {"local": {"args": ["--model", "m", "--max-model-len", "2048"]}}


def problems_of(data: object) -> list[str]:
    with pytest.raises(PlanError) as e:
        parse_plan(data)
    return e.value.problems


def test_seed_plan_is_the_articles_run() -> None:
    plan = load_plan(packaged_plan("seed-l40s"))  # type: ignore[arg-type]
    quant, kv, spec = plan.phases
    assert isinstance(quant, QuantizationPhase)
    assert [v.model for v in quant.variants] == [
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
        "RedHatAI/Qwen2.5-7B-Instruct-FP8-dynamic",
    ]
    assert [v.fit for v in quant.variants] == [True, True, False, False]
    assert quant.flags == {"--gpu-memory-utilization": "0.90"}
    assert (quant.request.prompt, quant.request.max_tokens, quant.request.temperature) == (
        "Kubernetes is",
        128,
        0.0,
    )
    assert isinstance(kv, KvPressurePhase)
    assert kv.model == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert kv.flags == {"--gpu-memory-utilization": "0.20"}
    assert kv.concurrency == 32 and kv.poll_seconds == 5.0
    assert kv.request.body("q", i=7) == {
        "model": "q",
        "prompt": "Write an extremely long and detailed essay, number 7.",
        "max_tokens": 4096,
        "temperature": 0.7,
    }
    assert isinstance(spec, SpecDecodePhase)
    assert json.loads(str(spec.flags["--speculative-config"])) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }
    assert spec.request.prompt == " ".join(["1 2 3 4 5"] * 10)
    assert len(spec.request.prompt) == 99
    assert (spec.request.max_tokens, spec.request.temperature) == (256, 0.0)
    # The article's two requests with speculation, and a baseline that cannot draft: the
    # same request with the Deployment restarted without --speculative-config.
    assert [(r.extra, r.baseline, r.speculation) for r in spec.runs] == [
        ({"repetition_penalty": 1.0}, False, True),
        ({}, False, True),
        ({"repetition_penalty": 1.0}, True, False),
    ]
    assert spec.flags_without_speculation["--speculative-config"] is REMOVE
    assert plan.peak_bandwidth is not None and plan.peak_bandwidth.bytes_per_second == 864e9
    assert plan.kubernetes is not None and plan.local is None


def test_cpu_demo_plan_is_valid_and_names_only_its_own_tiny_models() -> None:
    plan = load_plan(packaged_plan("cpu-demo.yaml"))  # type: ignore[arg-type]
    assert plan.local is not None
    quant = plan.phases[0]
    assert isinstance(quant, QuantizationPhase)
    bf16 = [plan.local.tiny_models[v.model.removeprefix("tiny:")] for v in quant.variants]
    assert sum(s.precision == "awq" for s in bf16) == 1
    sizes = sorted(s.parameter_count() for s in bf16 if s.precision == "bf16")
    assert len(sizes) == 3 and sizes[-1] / sizes[0] >= 8  # about 10× in bytes
    assert {p.kind for p in plan.phases} == {"quantization", "kv-pressure", "spec-decode"}


def test_defaults_are_the_articles_parameters() -> None:
    plan = parse_plan(
        {
            "target": LOCAL,
            "phases": [
                {"kind": "quantization", "variants": [{"name": "a", "model": "m"}]},
                {"kind": "kv-pressure"},
                {"kind": "spec-decode"},
            ],
        }
    )
    quant, kv, spec = plan.phases
    assert isinstance(quant, QuantizationPhase)
    assert quant.request.prompt == "Kubernetes is" and quant.request.max_tokens == 128
    assert quant.variants[0].fit  # no point chosen: the line goes through all
    assert isinstance(kv, KvPressurePhase)
    assert kv.request.max_tokens == 4096 and kv.request.temperature == 0.7
    assert kv.flags == {"--gpu-memory-utilization": "0.20"}
    assert kv.poll_seconds == 5.0 and kv.concurrency == 32
    assert (quant.warmup, quant.requests, quant.rounds, quant.tolerance) == (1, 3, 1, 0.10)
    assert kv.warmup == 1
    assert isinstance(spec, SpecDecodePhase)
    assert spec.baseline.label == "no speculation" and not spec.baseline.speculation
    assert spec.runs[0].extra == {"repetition_penalty": 1.0}
    assert spec.requests == 3
    assert [p.name for p in plan.phases] == ["quantization", "kv-pressure", "spec-decode"]
    assert plan.peak_bandwidth is None and plan.server_starts == 4


def test_every_parameter_is_overridable() -> None:
    plan = parse_plan(
        {
            "target": LOCAL,
            "phases": [
                {
                    "kind": "kv-pressure",
                    "name": "flood",
                    "prompt": "essay {i}",
                    "max_tokens": 1900,
                    "temperature": 0,
                    "concurrency": 12,
                    "poll": "500ms",
                    "timeout": "2m",
                    "saturation": 0.9,
                    "extra": {"ignore_eos": True},
                    "flags": {"--gpu-memory-utilization": False, "--enforce-eager": None},
                }
            ],
        }
    )
    (kv,) = plan.phases
    assert isinstance(kv, KvPressurePhase)
    assert kv.name == "flood"
    assert kv.flags == {"--gpu-memory-utilization": REMOVE, "--enforce-eager": None}
    assert (kv.poll_seconds, kv.timeout_seconds, kv.saturation) == (0.5, 120.0, 0.9)
    assert kv.request.body("t", i=3) == {
        "model": "t",
        "prompt": "essay 3",
        "max_tokens": 1900,
        "temperature": 0.0,
        "ignore_eos": True,
    }


def test_flag_values_from_yaml() -> None:
    assert flag_value(2048) == "2048"
    assert flag_value("0.90") == "0.90"
    assert flag_value(None) is None and flag_value(True) is None
    assert flag_value(False) is REMOVE
    assert flag_value({"method": "ngram", "k": [1, 2]}) == '{"method":"ngram","k":[1,2]}'


def test_a_bad_plan_lists_every_problem_with_its_path() -> None:
    problems = problems_of(
        {
            "target": {"local": {"args": ["--model", "tiny:nope"], "gpu": "L40S"}},
            "phases": [
                {"kind": "quantization", "variants": [{"name": "a"}], "colour": "red"},
                {
                    "kind": "quantization",
                    "name": "q2",
                    "variants": [
                        {"name": "x", "model": "m", "flags": {"gpu-memory-utilization": 1}},
                        {"name": "x", "model": "m", "flags": {"--model": "other"}},
                    ],
                },
                {"kind": "kv-pressure", "poll": "5 parsecs", "concurrency": 0},
                {"kind": "warp-drive"},
                {"kind": "spec-decode", "runs": [{"label": "alone"}], "temperature": "hot"},
            ],
        }
    )
    assert problems == [
        "target.local.args: [1] names 'tiny:nope', which target.local.tiny_models lacks",
        "target.local.gpu: unknown key (known here: args, env, exporter, model_cache, "
        "startup_timeout, tiny_models)",
        "phases[0].variants[0].model: required",
        "phases[0].colour: unknown key (known here: extra, flags, kind, max_tokens, name, "
        "prompt, requests, rounds, temperature, tolerance, variants, warmup)",
        "phases[1].variants[0].flags.gpu-memory-utilization: malformed flag name "
        "'gpu-memory-utilization' (use --lowercase-with-dashes)",
        "phases[1].variants[1].flags.--model: set the model with the `model` key",
        "phases[1].variants: duplicate names ['x']",
        "phases[2].concurrency: must be a positive whole number, not 0",
        "phases[2].poll: not a duration: '5 parsecs' (use e.g. 500ms, 5s, 1m or 2.5)",
        "phases[3].kind: unknown kind 'warp-drive' "
        "(known: quantization, kv-pressure, spec-decode, rate-sweep)",
        "phases[4].temperature: must be a number ≥ 0, not 'hot'",
        "phases[4].runs: needs at least two runs to compare",
    ]


def test_missing_target_and_phases_are_named() -> None:
    assert problems_of({}) == ["target: required", "phases: required"]
    assert problems_of({"target": {}, "phases": []}) == [
        "target: needs a local or a kubernetes section",
        "phases: needs at least one phase",
    ]
    assert problems_of(["not", "a", "mapping"]) == [
        "plan: must be a mapping, not a list",
        "target: required",
        "phases: required",
    ]


def test_kubernetes_target_needs_its_names_and_an_http_url() -> None:
    problems = problems_of(
        {
            "target": {"kubernetes": {"namespace": "vllm", "url": "vllm:8000"}},
            "phases": [{"kind": "kv-pressure"}],
        }
    )
    assert problems == [
        "target.kubernetes.deployment: required",
        "target.kubernetes.container: required",
        "target.kubernetes.url: must be an http(s) URL, not 'vllm:8000'",
    ]


def test_tiny_models_are_checked_and_referenced_by_name() -> None:
    problems = problems_of(
        {
            "target": {
                "local": {
                    "args": [],
                    "tiny_models": {
                        "odd": {"hidden_size": 100, "num_heads": 3},
                        "q": {"precision": "awq", "hidden_size": 200},
                        "big": {"precison": "bf16"},
                    },
                }
            },
            "phases": [{"kind": "spec-decode", "model": "tiny:missing"}],
        }
    )
    assert problems == [
        "target.local.tiny_models.odd.num_heads: must divide hidden_size 100",
        "target.local.tiny_models.q: AWQ needs hidden_size and intermediate_size divisible by 128",
        "target.local.tiny_models.big.precison: unknown key (known here: checkpoint, "
        "hidden_size, intermediate_size, max_position_embeddings, num_heads, num_kv_heads, "
        "num_layers, precision, repetition_penalty, vocab_size)",
        "phases[0].model: 'tiny:missing' is not in target.local.tiny_models",
    ]


def test_a_plan_file_that_is_not_yaml_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("phases: [\n")
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert e.value.source == str(path)
    assert e.value.problems[0].startswith("not valid YAML")
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "absent.yaml")


def test_backend_choice_follows_the_targets() -> None:
    both = parse_plan(
        {
            "target": {
                **LOCAL,
                "kubernetes": {
                    "namespace": "n",
                    "deployment": "d",
                    "container": "c",
                    "url": "http://v:8000",
                },
            },
            "phases": [{"kind": "kv-pressure"}],
        }
    )
    with pytest.raises(PlanError, match="choose one with --backend"):
        choose_backend(both, None)
    assert choose_backend(both, "local") == "local"
    only_local = parse_plan({"target": LOCAL, "phases": [{"kind": "kv-pressure"}]})
    assert choose_backend(only_local, None) == "local"
    with pytest.raises(PlanError, match=r"target\.kubernetes: required"):
        choose_backend(only_local, "kubernetes")


def test_lab_run_refuses_a_bad_plan_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"target": LOCAL, "phases": [{"kind": "quantization"}]}))
    out = tmp_path / "out"
    code = lab_main(["run", str(path), "--out", str(out), "--server-command", "false"], "lab")
    assert code == 2
    assert "phases[0].variants: required" in capsys.readouterr().err
    assert not out.exists()


def test_lab_check_prints_the_phases(capsys: pytest.CaptureFixture[str]) -> None:
    assert lab_main(["check", "seed-l40s"], "lab") == 0
    out = capsys.readouterr().out
    assert "seed-l40s: valid; targets: kubernetes" in out
    assert "kv-pressure (kv-pressure): 32 requests of 4096 tokens at once" in out
    assert "7 server start(s)" in out


def test_the_gpu_plan_is_the_articles_scale_on_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert lab_main(["check", "gpu-7b"], "lab") == 0
    out = capsys.readouterr().out
    assert "gpu-7b: valid; targets: local" in out
    assert "peak memory bandwidth: 4,800 GB/s from the H200 datasheet" in out
    assert "8 server start(s)" in out
    plan = load_plan(packaged_plan("gpu-7b"))  # type: ignore[arg-type]
    assert plan.local is not None and plan.local.exporter
    assert plan.local.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert flag_value_of(plan.local.args, "--load-format") == "dummy"
    models = plan.local.tiny_models
    for spec in models.values():  # Qwen2.5-7B-Instruct's shape, no weights written
        assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (
            3584,
            28,
            28,
            4,
        )
        assert (spec.intermediate_size, spec.vocab_size) == (18944, 152064)
        assert not spec.writes_checkpoint and spec.repetition_penalty == 1.05
    assert sorted(s.precision for s in models.values()) == ["awq", "bf16", "gptq"]
    quant, kv, spec_phase, sweep = plan.phases
    assert isinstance(quant, QuantizationPhase) and isinstance(kv, KvPressurePhase)
    assert [v.name for v in quant.variants if v.fit] == ["BF16", "AWQ"]
    fp8 = quant.variants[3]
    assert fp8.model == "tiny:qwen7b" and fp8.flags == {"--quantization": "fp8"}
    # A pool of about the article's size: 3,625 blocks of 16 tokens at 57,344 bytes each.
    kv_bytes = int(str(kv.flags["--kv-cache-memory-bytes"]))
    assert kv_bytes == 3625 * 16 * 28 * 4 * 128 * 2 * 2
    assert kv.flags["--gpu-memory-utilization"] is REMOVE
    assert (kv.concurrency, kv.request.max_tokens) == (32, 4096)
    assert isinstance(spec_phase, SpecDecodePhase)
    assert [(r.label, r.speculation) for r in spec_phase.runs] == [
        ("repetition_penalty 1.0", True),
        ("model defaults (1.05)", True),
        ("no speculation", False),
    ]
    # Poisson arrivals at rising rates against the kv-pressure phase's pool (BF16 there:
    # the same KV bytes per token): the queue at a full pool that the all-at-once flood did
    # not show on the H200; a start and three 30 s steps fit one 10-minute run.
    assert isinstance(sweep, RateSweepPhase)
    assert sweep.model == "tiny:qwen7b" and sweep.flags == kv.flags
    assert sweep.arrivals == "Poisson" and sweep.rates == (1.0, 2.0, 4.0)
    assert sweep.step_seconds == 30.0
    per_request = (sweep.input_len + sweep.output_len) * 57344
    assert int(str(kv.flags["--kv-cache-memory-bytes"])) // per_request == 26  # fit at once
    assert "rate-sweep (rate-sweep): vllm bench serve at 1, 2, 4 req/s" in out


def flag_value_of(args: tuple[str, ...], name: str) -> str | None:
    from vllm_glassbox.lab.backends.args import flag_value as value_in_args

    return value_in_args(list(args), name)


def test_the_peak_bandwidth_is_a_number_a_gpu_or_measured() -> None:
    def peak(value: object) -> object:
        return parse_plan(
            {"target": LOCAL, "phases": [{"kind": "kv-pressure"}], "peak_bandwidth": value}
        ).peak_bandwidth

    assert peak(4.8e12) == PeakBandwidth(4.8e12, "the plan")
    assert peak("H200") == PeakBandwidth(4.8e12, "the H200 datasheet")
    assert peak("measure") == PeakBandwidth(None, "measure")
    assert problems_of(
        {"target": LOCAL, "phases": [{"kind": "kv-pressure"}], "peak_bandwidth": "Z80"}
    )[0].startswith("peak_bandwidth: unknown GPU 'Z80' (known: A10, A100-40GB")


def test_a_spec_phase_without_a_speculative_config_is_refused() -> None:
    assert problems_of(
        {
            "target": LOCAL,
            "phases": [{"kind": "spec-decode", "flags": {"--speculative-config": False}}],
        }
    ) == ["phases[0].flags: --speculative-config is needed by the runs with speculation"]


def test_a_big_model_is_served_by_the_dummy_loader_not_written() -> None:
    problems = problems_of(
        {
            "target": {
                "local": {
                    "args": [],
                    "tiny_models": {
                        "big": {
                            "hidden_size": 4096,
                            "num_layers": 32,
                            "num_heads": 32,
                            "intermediate_size": 11008,
                        },
                        "awq": {
                            "precision": "awq",
                            "hidden_size": 512,
                            "intermediate_size": 1536,
                            "checkpoint": True,
                        },
                    },
                }
            },
            "phases": [{"kind": "kv-pressure"}],
        }
    )
    assert problems == [
        "target.local.tiny_models.big.checkpoint: would write 10.2 GiB of random weights: set "
        "`checkpoint: false` and serve it with --load-format dummy",
        "target.local.tiny_models.awq.checkpoint: only BF16 checkpoints are written (awq: dummy)",
    ]


def test_quantization_rounds_reverse_the_order_each_round() -> None:
    plan = parse_plan(
        {
            "target": LOCAL,
            "phases": [
                {
                    "kind": "quantization",
                    "rounds": 3,
                    "variants": [{"name": n, "model": n} for n in ("a", "b", "c")],
                }
            ],
        }
    )
    (quant,) = plan.phases
    assert isinstance(quant, QuantizationPhase)
    assert [(r, v.name) for r, v in quant.order()] == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (1, "c"),
        (1, "b"),
        (1, "a"),
        (2, "a"),
        (2, "b"),
        (2, "c"),
    ]
    # c ends round 0 and begins round 1, a ends round 1 and begins round 2: one server each
    assert plan.server_starts == 7


def test_the_demo_leaves_awq_out_on_a_cpu_without_avx512() -> None:
    from vllm_glassbox.lab.demo import cpu_flags, without_awq

    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nbugs\t\t: none\n"
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx", "avx2", "fma"}
    plan = load_plan(packaged_plan("cpu-demo"))  # type: ignore[arg-type]
    trimmed, dropped = without_awq(plan)
    assert dropped == ["large-awq"]
    quant = trimmed.phases[0]
    assert isinstance(quant, QuantizationPhase)
    assert [v.name for v in quant.variants] == ["small-bf16", "medium-bf16", "large-bf16"]
    assert trimmed.phases[1:] == plan.phases[1:]


def test_kubernetes_run_without_a_cluster_configuration_is_refused_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No Kubernetes API server can run here: without in-cluster credentials or a
    # kube-config, the run stops before anything is patched.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = lab_main(["run", "seed-l40s", "--out", str(tmp_path / "out")], "lab")
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot set up the kubernetes backend: no Kubernetes configuration" in err
    assert not (tmp_path / "out" / "results.json").exists()


def test_running_a_local_plan_needs_neither_grafanalib_nor_kubernetes() -> None:
    """The GPU machine has vLLM's and glassbox's run-time needs only (no grafanalib, no
    Kubernetes client): a local run must not import them."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from vllm_glassbox.lab import cli, demo, report, runner, sidecar\n"
        "from vllm_glassbox.lab.backends import local\n"
        "from vllm_glassbox.lab.plan import load_plan, packaged_plan\n"
        "load_plan(packaged_plan('gpu-7b'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grafanalib', 'kubernetes', 'promql_parser')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_plan_is_a_file_else_a_shipped_plan_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = packaged_plan("cpu-demo")
    assert shipped is not None and resolve_plan("cpu-demo") == load_plan(shipped)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu-demo").write_text("phases: [\n")  # a file of that name wins
    with pytest.raises(PlanError, match="not valid YAML"):
        resolve_plan("cpu-demo")
    with pytest.raises(PlanError, match=r"no such file or shipped plan: nowhere\.yaml"):
        resolve_plan("nowhere.yaml")


def test_the_demo_flood_runs_on_the_server_of_the_last_quantization_variant() -> None:
    """The local backend keeps a server whose args are the ones asked for: the demo's
    plan gives the flood exactly the args of the quantization's last variant (small, in
    the reversed second round), so one start serves both."""
    from vllm_glassbox.lab.backends.args import apply_overrides
    from vllm_glassbox.lab.experiments.kv_pressure import KvPressurePhase

    plan = load_plan(packaged_plan("cpu-demo"))  # type: ignore[arg-type]
    assert plan.local is not None
    quant, flood, _ = plan.phases
    assert isinstance(quant, QuantizationPhase) and isinstance(flood, KvPressurePhase)
    _, last = quant.order()[-1]
    last_args = apply_overrides(
        plan.local.args, {**quant.flags, "--model": last.model, **last.flags}
    )
    flood_args = apply_overrides(plan.local.args, {**flood.flags, "--model": flood.model})
    assert last.model == "tiny:small"
    assert flood_args == last_args
    # The AWQ variant ends the first round and begins the second: one start for both.
    order = [v.name for _, v in quant.order()]
    assert order[3] == order[4] == "large-awq"
