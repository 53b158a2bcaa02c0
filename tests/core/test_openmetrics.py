"""Pages read by what they are: Prometheus text 0.0.4 and OpenMetrics 1.0, by content type
and by content; OpenMetrics 2.0's composite histograms named; framing that lies refused.

The oracle is prometheus_client's own parsers (its OpenMetrics one for OpenMetrics pages),
written apart from glassbox's: on every captured page, and on pages generated from the
grammars' shapes, glassbox reads exactly the values they read.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as text_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import (
    COMPOSITE_SHAPE,
    ITL_COUNT,
    ITL_SUM,
    WANTED_SAMPLES,
    EngineKey,
    read_snapshot,
)
from vllm_glassbox.core.textformat import (
    OPENMETRICS,
    OPENMETRICS_2,
    TEXT,
    page_format,
    parse_samples,
    read_page,
)

from tests.fixtures import METRICS, page

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OM2 = "application/openmetrics-text; version=2.0.0; charset=utf-8"
PLAIN = "text/plain; version=0.0.4; charset=utf-8"
RUST = sorted(str(p.relative_to(METRICS)) for p in (METRICS / "rust-frontend-0.32").glob("*.txt"))
Read = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _oracle(text: str, wanted: frozenset[str] = WANTED_SAMPLES, openmetrics: bool = True) -> Read:
    """The wanted samples as prometheus_client's parser of that grammar reads them."""
    out: Read = {}
    families = om_families(text) if openmetrics else text_families(text)
    for family in families:
        for sample in family.samples:
            if sample.name in wanted:
                labels = tuple(sorted(sample.labels.items()))
                out.setdefault(sample.name, {})[labels] = float(sample.value)
    return out


def _refused(text: str, content_type: str | None = None) -> ScrapeError:
    with pytest.raises(ScrapeError) as info:
        read_snapshot(text, content_type=content_type)
    return info.value


# --- the two grammars, where they differ ---------------------------------------------------

EXEMPLAR = 'x_count{a="1"} 3 # {trace_id="abc"} 0.4\n'
FLOAT_TS = 'x_count{a="1"} 3 1700000000.123\n'
HISTOGRAM_META = "# TYPE x histogram\n"


@pytest.mark.parametrize("line", [EXEMPLAR, FLOAT_TS], ids=["exemplar", "float-timestamp"])
def test_openmetrics_exemplars_and_seconds_timestamps_are_read(line: str) -> None:
    text = HISTOGRAM_META + 'x_sum{a="1"} 1.5\n' + line + "# EOF\n"
    want = {"x_count": {(("a", "1"),): 3.0}}
    assert parse_samples(text, ["x_count"], content_type=OM) == want
    assert parse_samples(text, ["x_count"]) == want  # by content: its `# EOF`


@pytest.mark.parametrize("line", [EXEMPLAR, FLOAT_TS], ids=["exemplar", "float-timestamp"])
def test_the_same_lines_on_a_text_page_are_refused_naming_the_line(line: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_samples(HISTOGRAM_META + line, ["x_count"], content_type=PLAIN)
    assert info.value.reason == "parse" and "line 2" in str(info.value)


@pytest.mark.parametrize("line", [EXEMPLAR, FLOAT_TS], ids=["exemplar", "float-timestamp"])
def test_an_openmetrics_line_on_an_untyped_page_without_eof_is_a_page_cut_short(line: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_samples(HISTOGRAM_META + line, ["x_count"])
    assert info.value.reason == "truncated" and "without `# EOF`" in str(info.value)


def test_created_unit_and_exemplars_on_a_counter_and_a_bucket_read_as_the_oracle() -> None:
    text = (
        "# TYPE vllm:generation_tokens counter\n# UNIT vllm:generation_tokens tokens\n"
        "# HELP vllm:generation_tokens Generated tokens.\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 64 1700000000.5 '
        '# {trace_id="t1"} 1 1700000000.25\n'
        'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9 1700000000.5\n'
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m",le="0.1"} 60 '
        '# {span="s"} 0.05\n'
        'vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m",le="+Inf"} 63\n'
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 63\n'
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.2\n'
        'vllm:inter_token_latency_seconds_created{engine="0",model_name="m"} 1.7e9\n'
        "# EOF"  # the last newline is optional
    )
    assert page_format(text) == OPENMETRICS
    assert parse_samples(text, WANTED_SAMPLES) == _oracle(text)
    assert parse_samples(text, WANTED_SAMPLES)["vllm:inter_token_latency_seconds_sum"] == {
        (("engine", "0"), ("model_name", "m")): 0.2
    }


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('x_total{a="1"}  3', "two spaces"),
        ('x_total{a = "1"} 3', "spaces in the label set"),
        ('x_total{a="1",} 3', "a trailing comma"),
        ('x_total{a="1"} 3\t1', "a tab"),
        ('x_total{a="1"} 3 # {t="1"} 1 # {t="2"} 2', "two exemplars"),
        ('x_total{a="1"} 3 # trace', "an exemplar without labels"),
        ('x_total{a="1"} 3 1 2', "two timestamps"),
        ('x_total{a="\\t"} 3', "an escape OpenMetrics has not"),
    ],
)
def test_openmetrics_lines_text_would_take_are_refused(line: str, why: str) -> None:
    text = f"# TYPE x counter\n{line}\n# EOF\n"
    with pytest.raises(ScrapeError) as info:
        parse_samples(text, ["x_total"], content_type=OM)
    assert info.value.reason == "parse", why


@pytest.mark.parametrize(
    "body", ["x_total 1\n\nx_total 2\n", "# a comment\nx_total 1\n"], ids=["blank", "comment"]
)
def test_lines_only_text_allows_are_refused_on_an_openmetrics_page(body: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_samples(body + "# EOF\n", ["y"], content_type=OM)
    assert info.value.reason == "parse" and "OpenMetrics 1.0" in str(info.value)


def test_the_content_type_decides_and_the_content_otherwise() -> None:
    text = "x_total 1\n# EOF\n"
    assert page_format(text, OM) == OPENMETRICS
    assert page_format(text, OM2) == OPENMETRICS_2
    assert page_format(text, "application/openmetrics-text") == OPENMETRICS  # 1.0.0 by default
    assert page_format(text, PLAIN) == TEXT  # `# EOF` is a comment of the text format
    assert page_format(text, "text/html") == OPENMETRICS  # an unknown type: the content
    assert page_format(text) == OPENMETRICS
    assert page_format("x_total 1\n") == TEXT
    assert page_format("# UNIT x seconds\n") == OPENMETRICS
    with pytest.raises(ScrapeError) as info:
        page_format(text, "application/openmetrics-text; version=3.0.0")
    assert info.value.reason == "parse" and "3.0.0" in str(info.value)


# --- framing that lies ------------------------------------------------------------------


def test_an_openmetrics_page_without_eof_is_refused_as_truncated_and_nothing_is_read() -> None:
    whole = page("rust-frontend-0.32/plain-after-3x64.txt")
    cut = whole[: whole.rindex("# EOF")]  # every line whole: only the EOF line is missing
    error = _refused(cut, OM)
    assert error.reason == "truncated" and "without `# EOF`" in str(error)


def test_an_eof_before_the_end_is_refused_in_either_grammar() -> None:
    whole = page("rust-frontend-0.32/plain-after-3x64.txt")
    joined = whole + whole  # two pages glued: its first `# EOF` is mid-page
    for content_type in (OM, PLAIN, None):
        error = _refused(joined, content_type)
        assert error.reason == "parse" and "line 646" in str(error), content_type
    text_page = page("cpu-0.32/plain-after-3x64.txt")
    half = len(text_page) // 2
    middle = text_page.index("\n", half) + 1
    error = _refused(text_page[:middle] + "# EOF\n" + text_page[middle:], PLAIN)
    assert error.reason == "parse" and "not the page's last line" in str(error)


# --- OpenMetrics 2.0's composite histograms -------------------------------------------------


def _composite(text: str) -> str:
    """The captured page with the ITL histogram written as OpenMetrics 2.0 composite values
    (one line per series: count, sum and buckets in one value), its other lines as they are."""
    out, done = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("vllm:inter_token_latency_seconds_"):
            if not done:
                out.append(
                    'vllm:inter_token_latency_seconds{model_name="tiny",engine="0"} '
                    "{count:189,sum:0.59,bucket:[0.01:100,0.1:189,+Inf:189]}\n"
                )
                done = True
            continue
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize("content_type", [OM2, None], ids=["om2", "by-content"])
def test_a_composite_histogram_is_a_shape_of_its_own_and_its_series_are_absent(
    content_type: str | None,
) -> None:
    text = _composite(page("rust-frontend-0.32/plain-after-3x64.txt"))
    read = read_page(text, WANTED_SAMPLES, content_type=content_type)
    assert read.composite == {"vllm:inter_token_latency_seconds"}
    snapshot = read_snapshot(text, content_type=content_type)
    counters = snapshot.engines[EngineKey("tiny", "0")].counters
    assert ITL_SUM not in counters and ITL_COUNT not in counters
    assert counters["generation_tokens"] == 192.0  # the rest of the page is read
    assert "vllm:inter_token_latency_seconds" in snapshot.unrecognised[COMPOSITE_SHAPE]


def test_openmetrics_2_start_timestamps_and_several_exemplars_are_read_only_there() -> None:
    line = 'x_total{a="1"} 3 1700000001 st@1700000000.5 # {t="1"} 1 # {t="2"} 2\n'
    text = f"# TYPE x counter\n{line}# EOF\n"
    assert parse_samples(text, ["x_total"], content_type=OM2) == {"x_total": {(("a", "1"),): 3.0}}
    with pytest.raises(ScrapeError):
        parse_samples(text, ["x_total"], content_type=OM)


# --- both grammars against the oracle, on generated pages ----------------------------------

_label_value = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\r"), max_size=12
).filter(lambda v: v == v.strip() or not v)
_value = st.one_of(
    st.integers(min_value=0, max_value=10**12),
    st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False),
)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _series(draw: st.DrawFn) -> list[tuple[str, float, bool, bool]]:
    """Label values of one counter family's series: (model, value, exemplar?, timestamp?)."""
    models = draw(st.lists(_label_value, min_size=1, max_size=5, unique=True))
    return [(m, draw(_value), draw(st.booleans()), draw(st.booleans())) for m in models]


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


@settings(max_examples=150, deadline=None)
@given(_series(), st.booleans())
def test_generated_pages_read_as_the_oracle_reads_them_in_both_grammars(
    series: list[tuple[str, float, bool, bool]], created: bool
) -> None:
    name = "vllm:generation_tokens"
    om = [f"# TYPE {name} counter", f"# HELP {name} Tokens."]
    text = [f"# TYPE {name}_total counter", f"# HELP {name}_total Tokens."]
    for i, (model, value, exemplar, stamped) in enumerate(series):
        stamp = " 1700000000.125" if stamped else ""
        labels = f'{{engine="0",model_name="{_quoted(model)}"}}'
        sample = f"{name}_total{labels} {_number(value)}"
        om.append(
            sample
            + stamp
            # (prometheus_client's exemplar reader loses its way at an escaped quote: the
            # oracle does not apply to those, so the exemplars' labels have none)
            + (f' # {{trace_id="t{i}"}} 0.5' if exemplar else "")
        )
        text.append(sample + (" 1700000000125" if stamped else ""))
        if created:
            om.append(f"{name}_created{labels} 1700000000.0{stamp}")
    om_page, text_page = "\n".join(om) + "\n# EOF\n", "\n".join(text) + "\n"
    wanted = frozenset({f"{name}_total"})
    assert parse_samples(om_page, wanted, content_type=OM) == _oracle(om_page, wanted)
    assert parse_samples(text_page, wanted, content_type=PLAIN) == _oracle(
        text_page, wanted, openmetrics=False
    )
