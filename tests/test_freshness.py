"""The served model's age, the wait for the first model, and when the fit is urgent (service/freshness.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamsemi.service.freshness import ModelFreshness


def _gauge(reg: CollectorRegistry, name: str) -> float:
    return reg.get_sample_value(name)


def test_before_the_first_model_the_fit_is_urgent_and_the_wait_grows_until_late():
    reg = CollectorRegistry()
    f = ModelFreshness(stale_after_s=60, first_model_late_s=90, registry=reg)
    r = f.update(100.0, serving=False, version=0, refitting=False, documents_seen=False)
    assert r.urgent and not r.first_model_late and r.first_model_wait_s is None and r.reason() is None
    f.update(110.0, serving=False, version=0, refitting=True, documents_seen=True)  # the first document
    r = f.update(190.0, serving=False, version=0, refitting=True, documents_seen=True)
    assert r.urgent and not r.first_model_late and r.first_model_wait_s == 80.0
    assert _gauge(reg, "streamsemi_first_model_wait_seconds") == 80.0
    r = f.update(201.0, serving=False, version=0, refitting=True, documents_seen=True)
    assert r.first_model_late and _gauge(reg, "streamsemi_first_model_late") == 1
    assert r.reason().startswith("first model late: no model 91 s after the first document")


def test_a_served_model_ages_and_a_refit_on_a_stale_model_is_urgent():
    reg = CollectorRegistry()
    f = ModelFreshness(stale_after_s=60, first_model_late_s=90, registry=reg)
    f.update(0.0, serving=False, version=0, refitting=False, documents_seen=True)
    r = f.update(20.0, serving=True, version=1, refitting=False, documents_seen=True)
    assert not r.urgent and r.model_age_s == 0.0 and r.first_model_wait_s == 20.0
    assert _gauge(reg, "streamsemi_first_model_late") == 0
    # a quiet stream: the model ages, nothing is due, nothing is urgent
    r = f.update(200.0, serving=True, version=1, refitting=False, documents_seen=True)
    assert r.model_age_s == 180.0 and not r.urgent and not r.stale and r.reason() is None
    assert _gauge(reg, "streamsemi_model_age_seconds") == 180.0
    # a refit runs on a model older than the bound: stale and urgent
    r = f.update(201.0, serving=True, version=1, refitting=True, documents_seen=True)
    assert r.stale and r.urgent and _gauge(reg, "streamsemi_model_stale") == 1
    assert r.reason().startswith("model stale: a refit runs while the served model is 181 s old")
    # the refit's model is swapped in: fresh again, the first wait is kept
    r = f.update(230.0, serving=True, version=2, refitting=False, documents_seen=True)
    assert r.model_age_s == 0.0 and not r.urgent and not r.stale and r.first_model_wait_s == 20.0
    assert _gauge(reg, "streamsemi_model_stale") == 0 and _gauge(reg, "streamsemi_first_model_wait_seconds") == 20.0
    # a refit running on a young model is not urgent
    r = f.update(250.0, serving=True, version=2, refitting=True, documents_seen=True)
    assert not r.urgent and r.model_age_s == 20.0
    assert _gauge(reg, "streamsemi_model_stale_after_seconds") == 60.0
