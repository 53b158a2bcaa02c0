"""disaggregation: a prefill/decode pair as one server of it sees it — a consumer that
prefills its prompts itself, transfers that fail, KV that expires unfetched, transfers
slower than the decode they feed — with what the pair would save and the bandwidth its
traffic needs."""

from __future__ import annotations

from vllm_glassbox.core import derive
from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.explain.diagnoses.common import RUNBOOK, window
from vllm_glassbox.explain.findings import Figure, Finding, core, counted, read, say, say_if
from vllm_glassbox.explain.scene import Scene

#: VLLMDisaggregationInactive: a consumer computing over this share of its prompt tokens,
#: of at least MIN_PROMPT_TOKENS in the window.
INACTIVE_LOCAL_SHARE = 0.9
MIN_PROMPT_TOKENS = 500.0
#: VLLMKVTransferFailures: over this share of transfers failed, at least MIN_FAILURES.
FAILED_SHARE = 0.05
MIN_FAILURES = 3.0
#: VLLMKVTransferExpired: at least this many requests' KV expired unfetched.
MIN_EXPIRED = 3.0
#: VLLMKVTransferSlow: a transfer longer than this many decode steps, of MIN_TRANSFERS.
SLOW_DECODE_STEPS = 10.0
MIN_TRANSFERS = 20.0
#: Shapes that leave every number of a server untrustworthy: nothing is judged.
UNTRUSTED = ("several_servers_behind_the_target",)
#: Shapes that leave the transfers unread: the shares are still judged, the link is not.
UNREAD_TRANSFERS = ("kv_consumer_without_transfer_families", "kv_transfer_families_not_read")


def disaggregation(scene: Scene) -> list[Finding]:
    """What one server of a prefill/decode pair shows: a consumer prefilling for itself,
    failed or expired transfers, a link slower than the decode, or a pair that works."""
    if scene.kv_role in (None, "none") or scene.decode is None:
        return []
    side = (
        _consumer(scene)
        if scene.kv_role in ("consumer", "both")
        else _producer(scene)
        if scene.kv_role == "producer"
        else []
    )
    return [*_failures(scene), *_expired(scene), *_slow(scene), *side]


def _tokens(scene: Scene) -> Figure | None:
    return core(derive.prompt_tokens_by_source, scene.decode, unit="tokens")


def _consumer(scene: Scene) -> list[Finding]:
    tokens = _tokens(scene)
    local = core(derive.prompt_tokens_computed_share, scene.decode, unit="ratio")
    if tokens is None or local is None or tokens.value < MIN_PROMPT_TOKENS:
        return []
    if local.value > INACTIVE_LOCAL_SHARE:
        return [_inactive(scene, tokens, local)]
    transferred = core(derive.prompt_tokens_transferred_share, scene.decode, unit="ratio")
    bandwidth = core(derive.kv_transfer_bandwidth, scene.decode, unit="bytes_per_second")
    what = say_if(
        "the pair works: {transferred} of the {tokens} prompt tokens of the last {window} "
        "arrived by KV transfer ({local} computed here), at {bandwidth} while transferring",
        transferred=transferred,
        tokens=tokens,
        window=window(scene),
        local=local,
        bandwidth=bandwidth,
    ) or say(
        "the pair works: {local} of the {tokens} prompt tokens of the last {window} were "
        "computed here",
        local=local,
        tokens=tokens,
        window=window(scene),
    )
    return [Finding("disaggregation", "working", "ok", "Disaggregation works", what)]


def _inactive(scene: Scene, tokens: Figure, local: Figure) -> Finding:
    """A consumer that computed its prompts itself: what working transfers would save it,
    and the bandwidth its traffic needs against what the link gave."""
    rate = core(derive.locally_prefilled_tokens_per_second, scene.decode, unit="count")
    saved = core(derive.prefill_seconds_on_local_tokens, scene.decode, unit="seconds")
    per_token = core(derive.kv_transfer_bytes_per_token, scene.decode, unit="bytes") or core(
        derive.kv_cache_bytes_per_token, scene.kv_memory, scene.kv_capacity, unit="bytes"
    )
    needed = core(derive.kv_transfer_bandwidth_needed, rate, per_token, unit="bytes_per_second")
    achieved = core(derive.kv_transfer_bandwidth, scene.decode, unit="bytes_per_second")
    link = read(scene.kv_link_bandwidth, "bytes_per_second")
    change = [
        say(
            "send each request to a producer first (kv_transfer_params.do_remote_decode) "
            f"and on to {_consumers(scene)} with the producer's answer: the router or gateway in "
            "front of the pair is bypassing the producers"
        )
    ]
    for part in (
        say_if(
            "with working transfers the producers would take the {saved} of prefill per "
            f"second of this window off {_consumers(scene)}",
            saved=saved,
        ),
        say_if(
            "receiving these {rate} prompt tokens a second as KV needs {needed} ({per_token} "
            "a token); the transfers of this window ran at {achieved}",
            rate=rate,
            needed=needed,
            per_token=per_token,
            achieved=achieved,
        )
        or say_if(
            "receiving these {rate} prompt tokens a second as KV needs {needed} ({per_token} "
            "a token) of a link of {link}",
            rate=rate,
            needed=needed,
            per_token=per_token,
            link=link,
        )
        or say_if(
            "receiving these {rate} prompt tokens a second as KV needs {needed} ({per_token} "
            "a token)",
            rate=rate,
            needed=needed,
            per_token=per_token,
        ),
    ):
        if part is not None:
            change.append(part)
    return Finding(
        "disaggregation",
        "inactive",
        "warning",
        "Disaggregation is not working: the decode side prefills for itself",
        say(_inactive_template(scene), local=local, tokens=tokens, window=window(scene)),
        tuple(change),
        ("the prefill seconds saved are the decode side's own prefill times of those requests",),
        runbook=f"{RUNBOOK}#vllmdisaggregationinactive",
        also_read=(scene.kv_role_source,) if scene.kv_role_source else (),
    )


def _inactive_template(scene: Scene) -> str:
    if scene.scope.source == "exporter":
        return (
            f"this server is a KV consumer ({_connector(scene)}), yet {{local}} of its "
            "{tokens} prompt tokens of the last {window} were computed here: its producers "
            "prefill nothing for it"
        )
    return (
        f"the model's KV consumers ({_connector(scene)}) computed {{local}} of their "
        "{tokens} prompt tokens of the last {window} themselves: their producers prefill "
        "nothing for them"
    )


def _consumers(scene: Scene) -> str:
    """Who receives the KV: this server (an exporter's scene), or a model's consumers."""
    return "this server" if scene.scope.source == "exporter" else "its KV consumers"


def _producers(scene: Scene) -> str:
    return "this KV producer" if scene.scope.source == "exporter" else "the model's KV producers"


def _connector(scene: Scene) -> str:
    """The connector's name, as the sentence's template holds it (where the role was read
    is the finding's evidence)."""
    said = scene.kv_connector or "its connector unnamed"
    return said.replace("{", "{{").replace("}", "}}")


def _producer(scene: Scene) -> list[Finding]:
    tokens = _tokens(scene)
    if tokens is None:
        return []
    if tokens.value > 0:
        return [
            Finding(
                "disaggregation",
                "prefilling",
                "ok",
                "Prefilling for the pair",
                say(
                    f"{_producers(scene)} prefilled {{tokens}} prompt tokens in the last "
                    "{window}",
                    tokens=tokens,
                    window=window(scene),
                ),
            )
        ]
    return [
        Finding(
            "disaggregation",
            "producer_idle",
            "info",
            "The prefill side prefilled nothing",
            say(
                f"{_producers(scene)} prefilled {{tokens}} prompt tokens in the "
                "last {window}: if its consumers are busy, requests bypass it",
                tokens=tokens,
                window=window(scene),
            ),
            (say("look at the consumers' prompt tokens by source (VLLMDisaggregationInactive)"),),
            runbook=f"{RUNBOOK}#vllmdisaggregationinactive",
        )
    ]


def _failures(scene: Scene) -> list[Finding]:
    failures = counted(scene.decode, kv.KV_TRANSFER_FAILURES)
    share = core(derive.kv_transfer_failure_ratio, scene.decode, unit="ratio")
    if failures is None or share is None:
        return []
    if failures.value < MIN_FAILURES or share.value <= FAILED_SHARE:
        return []
    return [
        Finding(
            "disaggregation",
            "transfer_failures",
            "warning",
            "KV transfers fail",
            say(
                "{failures} KV transfers failed in the last {window}, {share} of those tried: "
                "each such request is recomputed or errors (the connector's "
                "kv_load_failure_policy)",
                failures=failures,
                window=window(scene),
                share=share,
            ),
            (
                say(
                    "read the connector's errors in this server's log (handshakes name the "
                    "remote engine); check the network and side channel between the pair"
                ),
            ),
            runbook=f"{RUNBOOK}#vllmkvtransferfailures",
        )
    ]


def _expired(scene: Scene) -> list[Finding]:
    expired = counted(scene.decode, kv.KV_TRANSFER_EXPIRED)
    if expired is None or expired.value < MIN_EXPIRED:
        return []
    return [
        Finding(
            "disaggregation",
            "expired",
            "warning",
            "Prefilled KV expires unfetched",
            say(
                "{expired} requests prefilled here had their KV expire before a consumer "
                "fetched it in the last {window}: their prefill was for nothing",
                expired=expired,
                window=window(scene),
            ),
            (
                say(
                    "check that the router sends each prefilled request on to a consumer, "
                    "and that the consumers start their fetches (kv_fetch_by_stage)"
                ),
            ),
            runbook=f"{RUNBOOK}#vllmkvtransferexpired",
        )
    ]


def _slow(scene: Scene) -> list[Finding]:
    if any(b.shape in UNREAD_TRANSFERS for b in scene.blind):
        return []
    transfers = counted(scene.decode, kv.KV_TRANSFERS)
    steps = core(derive.kv_transfer_decode_steps, scene.decode, unit="factor")
    if transfers is None or steps is None or transfers.value < MIN_TRANSFERS:
        return []
    if steps.value <= SLOW_DECODE_STEPS:
        return []
    bandwidth = core(derive.kv_transfer_bandwidth, scene.decode, unit="bytes_per_second")
    utilization = core(
        derive.kv_transfer_link_utilization, scene.decode, scene.kv_link_bandwidth, unit="ratio"
    )
    what = say(
        "one KV transfer lasts {steps} of this server's decode steps ({transfers} transfers "
        "in the last {window}): each request's first decode step waits that long for its KV",
        steps=steps,
        transfers=transfers,
        window=window(scene),
    )
    change = [
        s
        for s in (
            say_if(
                "the link gave {bandwidth} while transferring, {utilization} of its peak",
                bandwidth=bandwidth,
                utilization=utilization,
            )
            or say_if("the link gave {bandwidth} while transferring", bandwidth=bandwidth),
            say(
                "check the transports UCX chose (a TCP fallback instead of RDMA) and the "
                "pair's placement; KV in FP8 halves the bytes"
            ),
        )
        if s is not None
    ]
    return [
        Finding(
            "disaggregation",
            "slow_transfers",
            "warning",
            "KV transfers are slower than the decode they feed",
            what,
            tuple(change),
            runbook=f"{RUNBOOK}#vllmkvtransferslow",
        )
    ]
