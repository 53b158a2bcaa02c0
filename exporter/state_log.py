"""What the exporter tells its log: each change of state once, never a line per poll.

A sidecar runs for months: a line per poll at `info` is 17,280 lines a day at 5 s polls,
and hides the few that matter. Each state below is logged when it changes, with what
changed; a poll that changes nothing logs nothing above `debug` (the counters and gauges
keep the tally):

- the target: down (a failure, or another reason), up again; slow, on time again;
- a restart of vLLM seen; vLLM's log unreadable, read again;
- a shape of vLLM's page or log glassbox does not read, flagged and gone;
- the findings: the set of their kinds when it changes, as the scrapes build them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from vllm_glassbox.core.errors import ScrapeError

log = logging.getLogger("glassbox.exporter")

#: The findings of this diagnosis are the target's state and the shapes glassbox does not
#: read, logged as such: not a second time as findings.
OWN_STATE_DIAGNOSIS = "glassbox"
#: A finding raised with one of these severities makes its line a warning.
LOUD_SEVERITIES = frozenset({"warning", "critical"})


class StateLog:
    """The states of one exporter's poller, each logged when it changes."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._failing: str | None = None  # reason of the failure in progress
        self._slow = False
        self._log_error: str | None = None  # why vLLM's log could not be read
        self._shapes: set[tuple[str, str]] = set()  # unread inputs already told
        self._findings: frozenset[tuple[str, str]] | None = None  # (diagnosis, finding)
        self._findings_lock = threading.Lock()  # scrapes build findings side by side

    def failed(self, e: ScrapeError) -> None:
        """A poll failed: an error line when the failure starts or changes its reason."""
        level = logging.DEBUG if e.reason == self._failing else logging.ERROR
        log.log(level, "poll failed target=%s reason=%s err=%s", self.target, e.reason, e)
        self._failing = e.reason

    def succeeded(self) -> None:
        if self._failing is not None:
            log.info("poll succeeded again target=%s", self.target)
            self._failing = None

    def lateness(self, seconds: float, interval: float) -> None:
        """A poll that answered after the interval: a warning when slowness starts."""
        slow = seconds > interval
        if slow:
            level = logging.DEBUG if self._slow else logging.WARNING
            log.log(
                level,
                "poll slow target=%s took=%.2fs interval=%gs (vLLM answered late: busy)",
                self.target,
                seconds,
                interval,
            )
        elif self._slow:
            log.info("poll on time again target=%s", self.target)
        self._slow = slow

    def restarted(self, restarts: int, process_start: float | None) -> None:
        started = f"{process_start:.0f}" if process_start is not None else "unknown"
        log.info(
            "vLLM restarted target=%s restarts=%d process_start=%s",
            self.target,
            restarts,
            started,
        )

    def vllm_log(self, path: str | None, error: OSError | None) -> None:
        """vLLM's log unreadable (a warning when that starts or says another thing), read
        again."""
        told = self._log_error
        self._log_error = str(error) if error is not None else None
        if error is not None and str(error) != told:
            log.warning("cannot read vLLM log path=%s err=%s", path, error)
        elif error is None and told is not None:
            log.info("vLLM log read again path=%s", path)

    def shapes(self, shapes: Mapping[tuple[str, str], str]) -> None:
        """A warning when a shape glassbox does not read appears (the gauge has it), a
        line when it is gone."""
        for (source, shape), shown in sorted(shapes.items()):
            if (source, shape) not in self._shapes:
                log.warning(
                    "input glassbox does not read source=%s shape=%s shown_by=%r "
                    "(the series it would feed are absent)",
                    source,
                    shape,
                    shown,
                )
        for source, shape in sorted(self._shapes - set(shapes)):
            log.info("input read again source=%s shape=%s", source, shape)
        self._shapes = set(shapes)

    def findings(self, model: str, found: Iterable[tuple[str, str, str]], up: bool) -> None:
        """The findings one scrape built, as (diagnosis, finding, severity): a line when
        the set of their kinds changes (a warning when a warning or worse is raised).
        While the target is down nothing is judged: its findings are held, not cleared,
        so a flapping target is one line a change (the target's own)."""
        if not up:
            return
        severities = {(d, f): s for d, f, s in found if d != OWN_STATE_DIAGNOSIS}
        kinds = frozenset(severities)
        with self._findings_lock:
            before, self._findings = self._findings, kinds
        if before is None and not kinds:
            return  # nothing found from the start: nothing to tell
        if kinds == before:
            return
        raised = sorted(kinds - (before or frozenset()))
        cleared = sorted((before or frozenset()) - kinds)
        loud = any(severities[k] in LOUD_SEVERITIES for k in raised)
        log.log(
            logging.WARNING if loud else logging.INFO,
            "findings changed target=%s model=%s raised=%s cleared=%s now=%s",
            self.target,
            model,
            _kinds(raised),
            _kinds(cleared),
            _kinds(sorted(kinds)),
        )


def _kinds(kinds: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{d}/{f}" for d, f in kinds)
