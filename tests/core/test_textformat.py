"""The strict, targeted reader of Prometheus text exposition (core/textformat.py)."""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import WANTED_SAMPLES
from vllm_glassbox.core.textformat import (
    DEFAULT_LIMITS,
    OPENMETRICS,
    Limits,
    page_format,
    parse_samples,
)

from tests.fixtures import METRICS, grow_engines, page

ALL_PAGES = sorted(str(p.relative_to(METRICS)) for p in METRICS.rglob("*.txt"))
GEN = "vllm:generation_tokens_total"


def _reference(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The wanted samples as prometheus_client's full parser of the page's grammar reads them."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    parse = om_families if page_format(text) == OPENMETRICS else text_string_to_metric_families
    for family in parse(text):
        for sample in family.samples:
            if sample.name in WANTED_SAMPLES:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_fixture_set_covers_captured_and_synthesized_pages() -> None:
    # Plain, speculating, the flood, TP=2, DP=2, and a trial on two API servers and on one.
    assert len([p for p in ALL_PAGES if p.startswith("cpu-0.32/")]) == 16
    # TP=2 idle; one H200: idle, the flood, speculation; two H200s: 11 of vLLM's pages and
    # the exporter's page beside each.
    assert len([p for p in ALL_PAGES if p.startswith("cuda-0.24.0-")]) == 8 + 2 * 11
    assert len([p for p in ALL_PAGES if p.startswith("v0.11.0-")]) == 6
    # The Rust front end (OpenMetrics): plain and speculating, idle and after requests.
    assert len([p for p in ALL_PAGES if p.startswith("rust-frontend-0.32/")]) == 7


@pytest.mark.parametrize("name", ALL_PAGES)
def test_every_fixture_page_reads_exactly_as_prometheus_client_reads_it(name: str) -> None:
    text = page(name)
    assert parse_samples(text, WANTED_SAMPLES) == _reference(text)


def test_grown_page_reads_as_prometheus_client_reads_it() -> None:
    text = grow_engines(page("cpu-0.32/flood-after.txt"), 8)
    assert parse_samples(text, WANTED_SAMPLES) == _reference(text)


def test_only_wanted_names_are_returned_and_timestamps_are_dropped() -> None:
    text = '# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 3 1700000000000\nb_total 4\n'
    assert parse_samples(text, ["a_total"]) == {"a_total": {(("x", "1"),): 3.0}}


def test_a_name_that_prefixes_another_is_not_confused_with_it() -> None:
    text = "vllm:x_total 1\nvllm:x_total_created 1.7e9\nvllm:x_totally 5\n"
    assert parse_samples(text, ["vllm:x_total"]) == {"vllm:x_total": {(): 1.0}}


def test_label_values_with_escaped_quotes_braces_backslashes_and_newlines() -> None:
    text = 'm{a="say \\"hi\\" }",b="c:\\\\dir",c="two\\nlines",d="{x}"} 7\n'
    [(labels, value)] = parse_samples(text, ["m"])["m"].items()
    assert dict(labels) == {"a": 'say "hi" }', "b": "c:\\dir", "c": "two\nlines", "d": "{x}"}
    assert value == 7.0


def test_labels_are_sorted_so_label_order_does_not_make_a_new_series() -> None:
    text = 'm{b="2",a="1"} 1\n'
    assert list(parse_samples(text, ["m"])["m"]) == [(("a", "1"), ("b", "2"))]


def test_scientific_notation_and_negative_values() -> None:
    text = "a 1.79596897276e+09\nb -2.5\n"
    assert parse_samples(text, ["a", "b"]) == {"a": {(): 1.79596897276e9}, "b": {(): -2.5}}


def test_empty_page_has_no_samples() -> None:
    assert parse_samples("", WANTED_SAMPLES) == {}


# --- malformed pages: each is refused with the reason the exporter counts -------------


def _reason(text: str, limits: Limits = DEFAULT_LIMITS) -> tuple[str, str]:
    with pytest.raises(ScrapeError) as info:
        parse_samples(text, WANTED_SAMPLES, limits)
    return info.value.reason, str(info.value)


def test_truncated_page_is_a_parse_error_that_says_truncated() -> None:
    text = page("cpu-0.32/plain-after-3x64.txt")
    cut = text[: text.index(GEN) + len(GEN) + 12]  # mid-line, inside the labels
    reason, message = _reason(cut)
    assert reason == "parse"
    assert "truncated" in message


def test_garbage_bytes_are_a_parse_error() -> None:
    text = page("cpu-0.32/plain-idle.txt") + "\x00\x89PNG\r\n\x1a\n\x00garbage\n"
    reason, message = _reason(text)
    assert reason == "parse"
    assert "not exposition text" in message


def test_an_html_error_page_is_a_parse_error() -> None:
    assert _reason("<html><body>502 Bad Gateway</body></html>\n")[0] == "parse"


@pytest.mark.parametrize("value", ["abc", "1,5", "0x10", ""])
def test_a_value_that_is_not_a_number_is_a_parse_error_naming_the_line(value: str) -> None:
    text = f'# HELP x\n{GEN}{{engine="0",model_name="m"}} {value}\n'
    reason, message = _reason(text)
    assert reason == "parse"
    assert "line 2" in message


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "nan", "inf"])
def test_nan_and_inf_in_a_series_glassbox_reads_are_invalid_values(value: str) -> None:
    text = f'{GEN}{{engine="0",model_name="m"}} {value}\n'
    assert _reason(text)[0] == "invalid_value"


def test_nan_in_a_series_glassbox_does_not_read_does_not_refuse_the_page() -> None:
    text = f'{GEN}{{engine="0",model_name="m"}} 5\nsomething_else NaN\n'
    assert parse_samples(text, WANTED_SAMPLES)[GEN] == {(("engine", "0"), ("model_name", "m")): 5}


def test_duplicate_series_is_refused_even_with_labels_in_another_order() -> None:
    text = f'{GEN}{{engine="0",model_name="m"}} 5\n{GEN}{{model_name="m",engine="0"}} 6\n'
    reason, message = _reason(text)
    assert reason == "duplicate_series"
    assert "line 2" in message


def test_too_many_series_in_one_family_is_a_cardinality_error() -> None:
    def lines(n: int) -> str:
        return "".join(f'{GEN}{{engine="{i}",model_name="m"}} 1\n' for i in range(n))

    limits = Limits(max_series_per_metric=8)
    assert len(parse_samples(lines(8), WANTED_SAMPLES, limits)[GEN]) == 8
    reason, message = _reason(lines(9), limits)
    assert reason == "cardinality"
    assert "more than 8 series" in message


def test_a_grown_page_of_many_engines_passes_the_default_series_limit() -> None:
    grown = grow_engines(page("cpu-0.32/spec-after-1x256.txt"), 64)
    assert len(parse_samples(grown, WANTED_SAMPLES)[GEN]) == 64


def test_huge_label_value_is_a_cardinality_error() -> None:
    text = f'{GEN}{{engine="0",model_name="{"m" * 5000}"}} 1\n'
    reason, message = _reason(text)
    assert reason == "cardinality"
    assert "5000-character value" in message


def test_a_label_set_read_under_a_larger_limit_is_still_refused_under_a_smaller_one() -> None:
    # Label sets are parsed once and looked up after: the limit is part of what is looked up.
    text = f'{GEN}{{engine="0",model_name="{"m" * 100}"}} 1\n'
    assert parse_samples(text, WANTED_SAMPLES)[GEN] == {
        (("engine", "0"), ("model_name", "m" * 100)): 1.0
    }
    reason, message = _reason(text, Limits(max_label_value_length=99))
    assert reason == "cardinality"
    assert "model_name has a 100-character value (limit 99)" in message


@pytest.mark.parametrize(
    "line",
    [
        f'{GEN}{{engine="0",model_name="m" 1',  # unterminated label set
        f"{GEN}{{engine=0}} 1",  # unquoted value
        f'{GEN}{{engine="0" model_name="m"}} 1',  # missing comma
        f'{GEN}{{engine="0",engine="1"}} 1',  # repeated label name
        f'{GEN}{{engine="0"}}',  # no value
        f'{GEN}{{engine="0"}} 1 2 3',  # trailing junk
    ],
)
def test_malformed_sample_lines_are_parse_errors(line: str) -> None:
    assert _reason(line + "\n")[0] == "parse"


def test_a_page_error_reason_must_be_a_known_one() -> None:
    with pytest.raises(AssertionError):
        ScrapeError("made_up", "x")


@pytest.mark.parametrize("value", ["1_000", "1_0.5", "0x10", "1,5"])
def test_a_value_prometheus_would_refuse_is_a_parse_error(value: str) -> None:
    # Python's float() takes "1_000" (it was read as 1000.0); Prometheus' parser does not.
    with pytest.raises(ScrapeError) as info:
        parse_samples(f"{GEN} {value}\n", [GEN])
    assert info.value.reason == "parse"
