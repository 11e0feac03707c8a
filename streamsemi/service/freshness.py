"""How fresh the served model is, and whether the fit is the hot path right now.

A worker on a shared machine competes for CPU with its neighbours. Its fit process runs
at a lower priority than the polling thread so that fresh documents keep their latency
(:mod:`streamsemi.service.fitter`), but a fit that nothing waits for is not the same as a
fit that everything waits for: before the first model nothing is served, and a refit that
runs while the served model is older than ``model_stale_after_s`` leaves the stream on an
old model. :class:`ModelFreshness` tells these apart once per loop, from what the
engine reports, and publishes it:

* ``streamsemi_model_age_seconds``: seconds since the served model version appeared
  (0 before the first model);
* ``streamsemi_first_model_wait_seconds``: seconds from the first document to the first
  served model (growing while it waits, then kept);
* ``streamsemi_first_model_late`` (0/1): no model ``first_model_late_s`` seconds after
  the first document;
* ``streamsemi_model_stale`` (0/1): a refit runs while the served model is older than
  ``stale_after_s``;
* ``streamsemi_model_stale_after_seconds``: the bound itself (for alert rules).

The fit is *urgent* (:meth:`FitProcess.set_urgent`: it runs at the worker's own priority)
while no model serves, and while the served model is stale.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge


@dataclass(frozen=True)
class Freshness:
    """One reading of :meth:`ModelFreshness.update`."""

    serving: bool
    urgent: bool
    first_model_late: bool
    stale: bool
    model_age_s: float
    first_model_wait_s: float | None

    def reason(self) -> str | None:
        """A short sentence for ``/readyz`` when the model is late or stale, else None."""
        if self.first_model_late and self.first_model_wait_s is not None:
            return (f"first model late: no model {self.first_model_wait_s:.0f} s after the first document "
                    "(the fit runs at the worker's priority)")
        if self.stale:
            return (f"model stale: a refit runs while the served model is {self.model_age_s:.0f} s old "
                    "(the fit runs at the worker's priority)")
        return None


class ModelFreshness:
    """Age of the served model, time to the first model, and the fit's urgency (module docstring).

    Parameters
    ----------
    stale_after_s : float
        A refit that runs while the served model is older than this is urgent and the
        model counts as stale (setting ``model_stale_after_s``).
    first_model_late_s : float
        No model this many seconds after the first document: the first model is late.
    registry : CollectorRegistry, optional
        Where the gauges are registered.
    """

    def __init__(self, stale_after_s: float, first_model_late_s: float,
                 registry: CollectorRegistry | None = None) -> None:
        self.stale_after_s = float(stale_after_s)
        self.first_model_late_s = float(first_model_late_s)
        self.first_doc_at: float | None = None
        self.model_at: float | None = None
        self.version = 0
        self.first_wait: float | None = None
        self.last = Freshness(False, True, False, False, 0.0, None)
        r = registry or CollectorRegistry()
        self.age_gauge = Gauge("streamsemi_model_age_seconds",
                               "Seconds since the served model version appeared (0 before the first model)",
                               registry=r)
        self.wait_gauge = Gauge("streamsemi_first_model_wait_seconds",
                                "Seconds from the first document to the first served model (growing while it waits)",
                                registry=r)
        self.late_gauge = Gauge("streamsemi_first_model_late",
                                "1 while no model serves first_model_late_s after the first document", registry=r)
        self.stale_gauge = Gauge("streamsemi_model_stale",
                                 "1 while a refit runs and the served model is older than model_stale_after_s",
                                 registry=r)
        self.bound_gauge = Gauge("streamsemi_model_stale_after_seconds", "The model_stale_after_s setting",
                                 registry=r)
        self.bound_gauge.set(self.stale_after_s)

    def update(self, now: float, *, serving: bool, version: int, refitting: bool, documents_seen: bool) -> Freshness:
        """One reading at monotonic time ``now`` from the engine's state; sets the gauges.

        Parameters
        ----------
        now : float
            Monotonic seconds.
        serving : bool
            Documents are assigned (the engine's ``serving``).
        version : int
            The served model version (changes when a refit's models are swapped in).
        refitting : bool
            A refit round runs.
        documents_seen : bool
            At least one document has arrived.
        """
        if documents_seen and self.first_doc_at is None:
            self.first_doc_at = now
        if serving and (self.model_at is None or version != self.version):
            self.model_at = now
            self.version = version
            if self.first_wait is None:
                self.first_wait = now - self.first_doc_at if self.first_doc_at is not None else 0.0
        if serving:
            age = now - self.model_at if self.model_at is not None else 0.0
            wait = self.first_wait
        else:
            age = 0.0
            wait = None if self.first_doc_at is None else now - self.first_doc_at
        late = (not serving) and wait is not None and wait > self.first_model_late_s
        stale = serving and refitting and age > self.stale_after_s
        f = Freshness(serving=serving, urgent=(not serving) or stale, first_model_late=late, stale=stale,
                      model_age_s=age, first_model_wait_s=wait)
        self.age_gauge.set(age)
        self.wait_gauge.set(wait or 0.0)
        self.late_gauge.set(1 if late else 0)
        self.stale_gauge.set(1 if stale else 0)
        self.last = f
        return f


__all__ = ["Freshness", "ModelFreshness"]
