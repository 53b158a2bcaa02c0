"""Which vLLM process each page came from: a restart, or several servers answering in turn.

A `--target` that names a Service in front of two replicas (a common mistake: the
exporter is a sidecar, one per vLLM) gets each page from whichever replica the Service
picked. Every switch looks like a restart, and rates across it mix two servers. A real
restart cannot look like that: a restarted process never has an older start time again,
and it takes longer than a poll interval, so its counters do not go down at two
consecutive successful polls.
"""

from __future__ import annotations

from collections import deque

#: The shape flagged in glassbox_input_unrecognised{source="page"}.
SEVERAL_SERVERS = "several_servers_behind_the_target"
SEVERAL_SERVERS_SHOWN = (
    "pages from several vLLM processes in turn (process start times or counters switch "
    "back and forth): --target names a Service in front of replicas? Point each exporter "
    "at one vLLM (a sidecar); no rate is published meanwhile"
)
#: Polls the flag stays up after the last sign, so a Service that happens to pick the
#: same replica twice does not clear it.
KEEP_FLAGGED = 6


class ServerTrail:
    def __init__(self) -> None:
        self._starts: deque[float] = deque(maxlen=KEEP_FLAGGED)
        self._restarted_last = False  # the last successful poll saw a counter restart
        self._flagged_for = 0

    def switched_back(self, start: float | None) -> bool:
        """Before the poll is folded in: whether this page's process start time is one the
        trail saw before another one (a process the target already switched away from)."""
        return start is not None and start in self._starts and self._starts[-1] != start

    def observe(self, start: float | None, restarted: bool, after_failure: bool) -> bool:
        """Note one successful poll (its start time; whether its counters said restart;
        whether polls failed since the last one): True while pages come from several
        servers in turn."""
        sign = self.switched_back(start) or (
            restarted and not after_failure and self._restarted_last
        )
        if start is not None and (not self._starts or self._starts[-1] != start):
            self._starts.append(start)
        self._restarted_last = restarted and not after_failure
        self._flagged_for = KEEP_FLAGGED if sign else max(self._flagged_for - 1, 0)
        return self._flagged_for > 0
