"""The exporter beside each server of a captured NIXL pair (tests/fixtures/README.md).

Each exporter polls its server's captured pages 10 s apart (a 60 s window, so a page's
increase over the one before it is in the window) with the server's startup log; every
value is worked out by hand from the pages' raw counters.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.exporter.service import Poller, make_registry

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import LOGS, page

DIR = "cpu-0.32-disagg/"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def published(pages: list[str], log: str | None = None, **flags: object) -> Series:
    """The exporter's page after polling `pages` 10 s apart: every sample by name and
    labels (model_name and engine left out: one engine, "tiny")."""
    clock = Clock()
    extra = {"vllm_log": str(LOGS / log)} if log else {}
    poller = Poller(
        config(**extra, **flags),
        fetcher=PageSequence([page(DIR + n) for n in pages], "0.32.0"),
        clock=clock,
    )
    for _ in pages:
        poller.poll_once()
        clock.now += 10.0
    text = generate_latest(make_registry(poller)).decode()
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


CONSUMER_PAIR = ["nixl-consumer-idle.txt", "nixl-consumer-after-pair.txt"]
CONSUMER_LOG = "cpu-0.32-nixl-consumer-startup.log"


def test_the_consumers_exporter_reads_its_role_from_the_log_and_the_pairs_transfers() -> None:
    out = published(CONSUMER_PAIR, CONSUMER_LOG, kv_link_bandwidth=1.25e9)
    role = ("role", "consumer"), ("connector", "NixlConnector"), ("source", "log")
    assert out[("glassbox_kv_transfer_role_info", tuple(sorted(role)))] == 1.0
    share = "glassbox_prompt_tokens_source_ratio"
    assert out[(share, (("source", "external_kv_transfer"),))] == 1.0  # 1,200 of 1,200
    assert out[(share, (("source", "local_compute"),))] == 0.0
    assert out[("glassbox_kv_consumer_local_prefill_tokens_per_second", ())] == 0.0
    bandwidth = 3_145_728 / 0.164887  # Δ nixl_bytes_transferred_sum / Δ xfer_time sum
    assert out[("glassbox_kv_transfer_bandwidth_bytes_per_second", ())] == pytest.approx(bandwidth)
    assert out[("glassbox_kv_transfer_link_utilization_ratio", ())] == pytest.approx(
        bandwidth / 1.25e9
    )
    assert out[("glassbox_kv_transfer_seconds", ())] == pytest.approx(0.164887 / 4)
    assert out[("glassbox_kv_transfer_failures_per_second", ())] == 0.0


def test_without_the_log_the_page_says_consumer_and_the_link_utilization_is_absent() -> None:
    out = published(CONSUMER_PAIR)
    role = ("role", "consumer"), ("connector", "nixl"), ("source", "page")
    assert out[("glassbox_kv_transfer_role_info", tuple(sorted(role)))] == 1.0
    assert ("glassbox_kv_transfer_link_utilization_ratio", ()) not in out  # no peak given


def test_the_misrouted_consumer_prefills_every_prompt_token_itself() -> None:
    pages = [*CONSUMER_PAIR, "nixl-consumer-after-misrouted.txt"]
    out = published(pages[1:], CONSUMER_LOG)  # the window: after the pair to misrouted
    assert out[("glassbox_prompt_tokens_source_ratio", (("source", "local_compute"),))] == 1.0
    # 900 tokens computed here in the 10 s between the two polls, over the 10 s covered.
    assert out[("glassbox_kv_consumer_local_prefill_tokens_per_second", ())] == pytest.approx(90.0)
    assert ("glassbox_kv_transfer_bandwidth_bytes_per_second", ()) not in out  # no transfer


def test_the_producer_is_a_producer_by_its_log_and_by_its_page() -> None:
    pages = ["nixl-producer-idle.txt", "nixl-producer-after-pair.txt"]
    for log, source, connector in (
        ("cpu-0.32-nixl-producer-startup.log", "log", "NixlConnector"),
        (None, "page", "nixl"),
    ):
        out = published(pages, log)
        role = ("role", "producer"), ("connector", connector), ("source", source)
        assert out[("glassbox_kv_transfer_role_info", tuple(sorted(role)))] == 1.0
        assert ("glassbox_kv_consumer_local_prefill_tokens_per_second", ()) not in out
        assert out[("glassbox_prompt_tokens_source_ratio", (("source", "local_compute"),))] == 1.0


def test_a_plain_server_is_of_no_role_and_has_no_transfer_series() -> None:
    clock = Clock()
    poller = Poller(
        config(),
        fetcher=PageSequence(
            [page("cpu-0.32/plain-idle.txt"), page("cpu-0.32/plain-after-3x64.txt")], "0.32.0"
        ),
        clock=clock,
    )
    for _ in range(2):
        poller.poll_once()
        clock.now += 10.0
    text = generate_latest(make_registry(poller)).decode()
    role = 'connector="",model_name="tiny",role="none",source="page"'
    assert f"glassbox_kv_transfer_role_info{{{role}}} 1.0" in text
    assert "glassbox_kv_transfer_bandwidth_bytes_per_second{" not in text
    assert "glassbox_lora_adapters_active{" not in text


def test_an_example_connector_consumer_has_shares_and_is_flagged_without_transfers() -> None:
    # ExampleConnector exports no transfer family: the consumer loaded the 2 whole blocks
    # (256 tokens) of each 300-token prompt and computed the 44 after them.
    out = published(["example-consumer-idle.txt", "example-consumer-after-pair.txt"])
    share = "glassbox_prompt_tokens_source_ratio"
    assert out[(share, (("source", "external_kv_transfer"),))] == pytest.approx(1024 / 1200)
    assert out[(share, (("source", "local_compute"),))] == pytest.approx(176 / 1200)
    flagged = (
        "glassbox_input_unrecognised",
        (("shape", "kv_consumer_without_transfer_families"), ("source", "page")),
    )
    assert out[flagged] == 1.0
    assert ("glassbox_kv_transfer_bandwidth_bytes_per_second", ()) not in out


def test_adapters_in_flight_the_budget_and_the_deferred_waits() -> None:
    # One adapter at a time (--max-loras 1); three requests of the second deferred.
    out = published(["lora-idle.txt", "lora-deferred.txt"])
    assert out[("glassbox_lora_max_adapters", ())] == 1.0
    assert out[("glassbox_lora_adapters_active", ())] == 1.0  # the page names alpha only
    assert out[("glassbox_waiting_deferred_ratio", ())] == 1.0  # 3 deferred of 3 waiting
    after = published(["lora-deferred.txt", "lora-after.txt"])
    # The newest of the page's three lora_requests_info series: no adapter in flight.
    assert after[("glassbox_lora_adapters_active", ())] == 0.0
    assert ("glassbox_waiting_deferred_ratio", ()) not in after  # none waits: absent
