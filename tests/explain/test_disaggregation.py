"""The disaggregation and adapters diagnoses: on the exporter's state after polling the
captured NIXL pair and LoRA server (tests/fixtures/README.md), and on scenes written by
hand for the thresholds the captures did not cross. Every expected number is worked out
by hand from the pages' counters."""

from __future__ import annotations

import pytest
from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.scene import Reading, Scene, Scope, Window

from tests.explain.test_exporter import polled, scene_of
from tests.fixtures import LOGS

D = "cpu-0.32-disagg/"
CONSUMER_LOG = str(LOGS / "cpu-0.32-nixl-consumer-startup.log")


def found(scene: Scene, diagnosis: str) -> dict[str, Finding]:
    return {f.finding: f for f in explain(scene).findings if f.diagnosis == diagnosis}


def test_the_misrouted_consumer_is_found_prefilling_for_itself_with_what_it_would_save() -> None:
    poller = polled(
        [D + "nixl-consumer-after-pair.txt", D + "nixl-consumer-after-misrouted.txt"],
        "0.32.0",
        vllm_log=CONSUMER_LOG,
        kv_link_bandwidth=1.25e9,
    )
    inactive = found(scene_of(poller), "disaggregation")["inactive"]
    assert inactive.severity == "warning"
    figures = inactive.figures
    assert figures["local"].value == 1.0  # 900 of 900 computed here
    assert figures["tokens"].value == 900
    # Its prefill seconds over the 10 s between the polls: 0.651277314 − 0.311729855.
    prefill = 0.6512773139984347 - 0.3117298549991574
    assert figures["change1.saved"].value == pytest.approx(prefill / 10)
    # 900 tokens in 10 s at the pool's 2,048 bytes a token (no transfer in the window).
    assert figures["change2.needed"].value == pytest.approx(90 * 2048)
    assert figures["change2.link"].value == 1.25e9
    assert inactive.runbook is not None and inactive.runbook.endswith("#vllmdisaggregationinactive")


def test_the_working_pair_is_said_to_work_at_its_bandwidth() -> None:
    poller = polled(
        [D + "nixl-consumer-idle.txt", D + "nixl-consumer-after-pair.txt"],
        "0.32.0",
        vllm_log=CONSUMER_LOG,
    )
    working = found(scene_of(poller), "disaggregation")["working"]
    assert working.severity == "ok"
    assert working.figures["transferred"].value == 1.0  # 1,200 of 1,200
    assert working.figures["bandwidth"].value == pytest.approx(3_145_728 / 0.164887)


def test_a_producer_is_said_to_prefill_and_its_two_expired_leases_are_under_the_alerts_three() -> (
    None
):
    poller = polled(
        [D + "nixl-producer-after-misrouted.txt", D + "nixl-producer-after-expiry.txt"],
        "0.32.0",
        vllm_log=str(LOGS / "cpu-0.32-nixl-producer-startup.log"),
    )
    by = found(scene_of(poller), "disaggregation")
    assert set(by) == {"prefilling"}
    assert by["prefilling"].figures["tokens"].value == 600  # the 2 requests never fetched


def test_a_server_without_a_connector_has_no_disaggregation_finding() -> None:
    poller = polled(["cpu-0.32/plain-idle.txt", "cpu-0.32/plain-after-3x64.txt"], "0.32.0")
    assert found(scene_of(poller), "disaggregation") == {}


def test_the_deferred_adapter_requests_are_found_against_the_budget() -> None:
    poller = polled([D + "lora-idle.txt", D + "lora-deferred.txt"], "0.32.0")
    bound = found(scene_of(poller), "adapters")["budget_bound"]
    assert bound.severity == "info"
    assert bound.figures["deferred"].value == 3
    assert bound.figures["budget"].value == 1
    assert bound.figures["active"].value == 1  # the page names alpha only


# --- scenes written by hand: the thresholds --------------------------------------------

WINDOW = 600.0


def scene(role: str, counters: dict[str, float], **readings: object) -> Scene:
    scope = Scope("exporter", "hand", None, "m", 1, WINDOW)
    window = Window(Increase(counters, WINDOW), "by hand")
    return Scene(
        scope,
        decode=window,
        kv_role=role,
        kv_connector="NixlConnector",
        kv_role_source="by hand",
        **readings,
    )  # type: ignore[arg-type]


def test_transfers_fail_over_5_percent_and_3_not_below() -> None:
    failing = {kv.KV_TRANSFER_FAILURES: 3.0, kv.KV_TRANSFERS: 50.0}  # 3 of 53: 5.7 %
    assert "transfer_failures" in found(scene("consumer", failing), "disaggregation")
    few = {kv.KV_TRANSFER_FAILURES: 2.0, kv.KV_TRANSFERS: 0.0}  # 100 %, but 2
    assert "transfer_failures" not in found(scene("consumer", few), "disaggregation")
    rare = {kv.KV_TRANSFER_FAILURES: 3.0, kv.KV_TRANSFERS: 60.0}  # 4.8 %
    assert "transfer_failures" not in found(scene("consumer", rare), "disaggregation")


def test_three_expired_leases_on_a_producer_are_found() -> None:
    expired = found(scene("producer", {kv.KV_TRANSFER_EXPIRED: 3.0}), "disaggregation")
    assert expired["expired"].figures["expired"].value == 3


def test_transfers_longer_than_ten_decode_steps_are_slow() -> None:
    # 20 transfers of 0.6 s; 100 decode steps of 30 ms: 20 steps a transfer.
    counters = {
        kv.KV_TRANSFER_SECONDS: 12.0,
        kv.KV_TRANSFERS: 20.0,
        kv.KV_TRANSFER_BYTES: 2e9,
        s.ITL_SUM: 3.0,
        s.ITL_COUNT: 100.0,
    }
    slow = found(
        scene("consumer", counters, kv_link_bandwidth=Reading(1.25e9, "flag")), "disaggregation"
    )["slow_transfers"]
    assert slow.figures["steps"].value == pytest.approx(20.0)
    assert slow.figures["change0.bandwidth"].value == pytest.approx(2e9 / 12)
    assert slow.figures["change0.utilization"].value == pytest.approx(2e9 / 12 / 1.25e9)
    fast = {**counters, kv.KV_TRANSFER_SECONDS: 4.8}  # 8 steps
    assert "slow_transfers" not in found(scene("consumer", fast), "disaggregation")


def test_a_producer_that_prefilled_nothing_says_so() -> None:
    idle = {kv.PROMPT_FROM + source: 0.0 for source in kv.SOURCES}
    assert "producer_idle" in found(scene("producer", idle), "disaggregation")


def test_adapters_beyond_the_budget_cost_their_share_of_the_queue() -> None:
    # 3 adapters in flight, a budget of 1; 4 of 5 waiting requests deferred; 10 requests
    # scheduled after 20 s of queue in all: 2 s each, 1.6 s of it the deferred waits'.
    bound = found(
        scene(
            "none",
            {s.QUEUE_SUM: 20.0, s.QUEUE_COUNT: 10.0},
            adapters_active=Reading(3.0, "h"),
            adapter_budget=Reading(1.0, "h"),
            waiting_deferred_peak=Reading(4.0, "h"),
            waiting_peak=Reading(5.0, "h"),
        ),
        "adapters",
    )["budget_bound"]
    assert bound.figures["over"].value == 2
    assert bound.figures["change0.costs"].value == pytest.approx(2.0 * 4 / 5)
    assert bound.figures["change0.queue"].value == pytest.approx(2.0)
