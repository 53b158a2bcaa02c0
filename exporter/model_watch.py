"""Whose weights the exporter publishes: the model vLLM's page serves, the model
--weights-bytes and --model-dir are of, and which of the log's starts is the page's
process, followed poll after poll.

The log's latest start is the page's process at the first page (as the exporter always
took it); after vLLM restarts, only a start the log shows later is the new process's:
until then the log's facts are the previous process's (`log_behind`). --weights-bytes and
--model-dir are of the model the first page serves, with the checkpoint the log says it
loaded. A source of another model is refused, and what shows it is said
(`glassbox_model_weights_info`'s `weights_of_another_model`).
"""

from __future__ import annotations

from dataclasses import replace

from vllm_glassbox.core.layout import ParallelLayout
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.core.startup_log import StartupFacts
from vllm_glassbox.core.weights import (
    CheckpointSize,
    Model,
    Weights,
    checkpoint_weights,
    resolve_weights,
    told_apart,
)


class ModelWatch:
    """The model of each poll's page and the weights of it (`follow` once a poll)."""

    def __init__(self, weights_bytes: float | None, checkpoint: CheckpointSize | None) -> None:
        self.weights_bytes = weights_bytes  # --weights-bytes
        self.checkpoint = checkpoint  # --model-dir, read once at startup
        # The model the page serves (None before the first page), the model --weights-bytes
        # and --model-dir are of (the first page's), and which of the log's starts is the
        # page's process.
        self.model: Model | None = None
        self._static_owner: Model | None = None
        self._owned_at_restarts = 0
        self._log_start: int | None = None  # the log's start (StartupFacts.startups) of the page
        self._first_log_start: int | None = None
        self.log_behind = False  # vLLM restarted and the log shows no start since
        self._log_names: tuple[str, str] | None = None  # (log's, page's) name at the start

    def log_model(self, facts: StartupFacts | None) -> Model | None:
        """The model of the log's latest start, named as the page names it; None without a
        log or before it shows a start."""
        if facts is None or facts.startups == 0:
            return None
        served = facts.served_model_name
        if self._log_names is not None and served == self._log_names[0]:
            served = self._log_names[1]
        return Model(served, facts.model)

    def follow(
        self, snapshot: Snapshot, restarted: bool, facts: StartupFacts | None, restarts: int
    ) -> None:
        """Which model the page serves, and which of the log's starts is its process's
        (`restarted`: this poll saw vLLM restart, the `restarts`-th it saw)."""
        names = {key.model_name for key in snapshot.engines}
        served = next(iter(names)) if len(names) == 1 else None
        if facts is not None:
            if self._log_start is None:
                self._log_start = self._first_log_start = facts.startups
            elif restarted:
                self.log_behind = True
            if self.log_behind and facts.startups > self._log_start:
                self._log_start, self.log_behind = facts.startups, False
            first = restarts == 0 and facts.startups == self._first_log_start
            if self._log_names is None and first and served and facts.served_model_name:
                # What the log and the page call the first model (a name the log shows in
                # another form, or a log of a server named otherwise, stays as it was read).
                self._log_names = (facts.served_model_name, served)
        log_model = None if self.log_behind else self.log_model(facts)
        checkpoint = None
        if log_model is not None and told_apart(log_model, Model(served)) is None:
            checkpoint = log_model.checkpoint
        self.model = Model(served, checkpoint)
        owner = self._static_owner
        if owner is None:
            self._static_owner, self._owned_at_restarts = self.model, restarts
        elif (
            owner.checkpoint is None
            and checkpoint is not None
            and owner.served == served
            and restarts == self._owned_at_restarts
        ):  # the log named the first process's checkpoint after its first page
            self._static_owner = replace(owner, checkpoint=checkpoint)

    def served_weights(
        self, facts: StartupFacts | None, layout: ParallelLayout
    ) -> tuple[Weights | None, dict[str, str]]:
        """The weights of the model the page serves (of whichever before the first page),
        or what shows that a source's are of another model."""
        return self.weights_of(self.model, self.log_behind, facts, layout)

    def start_weights(self, facts: StartupFacts | None, layout: ParallelLayout) -> Weights | None:
        """The weights of the model the log's latest start loaded (its load rate's)."""
        return self.weights_of(self.log_model(facts), False, facts, layout)[0]

    def weights_of(
        self,
        model: Model | None,
        log_behind: bool,
        facts: StartupFacts | None,
        layout: ParallelLayout,
    ) -> tuple[Weights | None, dict[str, str]]:
        """The weights of `model` (None: not known yet, every source counts): from the
        sources of that model only. With none, what shows that a source's weights are of
        another model, by the input that shows it (`weights_of_another_model`)."""
        static = self.weights_bytes is not None or self.checkpoint is not None
        static_ok = log_ok = True
        refused: dict[str, str] = {}
        owner = self._static_owner
        if model is not None and static and owner is not None:
            named = "--weights-bytes" if self.weights_bytes is not None else "--model-dir"
            if by := told_apart(owner, model):
                static_ok = False
                refused[by] = f"{named} is of {owner}; vLLM serves {model}"
            elif log_behind and owner.checkpoint is not None:
                static_ok = False
                refused["log"] = (
                    f"{named} is of {owner}; vLLM restarted and its log shows no start "
                    "since: which checkpoint it loaded is not known"
                )
        log_model = self.log_model(facts)
        logged = facts is not None and bool(facts.weights_by_rank)
        if model is not None and facts is not None and log_model is not None:
            if log_behind:
                log_ok = False
                if logged:
                    refused.setdefault(
                        "log",
                        "vLLM restarted and its log shows no start since: the logged "
                        f"weights are of the previous process ({log_model})",
                    )
            elif by := told_apart(log_model, model):
                log_ok = False
                if logged:
                    refused.setdefault(
                        by, f"the log's weights are of {log_model}; vLLM serves {model}"
                    )
        checkpoint = None
        if self.checkpoint is not None and static_ok:
            checkpoint = checkpoint_weights(self.checkpoint, facts)
        flag = self.weights_bytes if static_ok else None
        weights = resolve_weights(flag, facts if log_ok else None, checkpoint, layout)
        return weights, ({} if weights is not None else refused)
