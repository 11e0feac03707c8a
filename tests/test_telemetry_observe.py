"""``observe_many``: the worker's per-batch latency observations equal one ``observe`` per value."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from streamsemi.core.telemetry import LATENCY_BUCKETS, observe_many


def _samples(h: Histogram) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("le", "")): s.value for m in h.collect() for s in m.samples if not s.name.endswith("_created")}


@pytest.mark.parametrize("n", [0, 3, 8, 500])
def test_observe_many_equals_observe_per_value(n) -> None:
    rng = np.random.default_rng(n)
    # values on the bounds themselves (a bucket counts values up to and including its bound), below, between, above
    values = list(rng.choice(np.array([0.0, *LATENCY_BUCKETS, 1e4]), size=n)) + list(rng.exponential(0.2, size=n))
    one, many = (Histogram("lat", "x", buckets=LATENCY_BUCKETS, registry=CollectorRegistry()) for _ in range(2))
    for v in values:
        one.observe(float(v))
    observe_many(many, [float(v) for v in values])
    a, b = _samples(one), _samples(many)
    assert a.keys() == b.keys()
    for k in a:
        assert math.isclose(a[k], b[k], rel_tol=1e-12, abs_tol=1e-12), k
    assert b[("lat_count", "")] == len(values)
    assert b[("lat_bucket", "0.005")] == sum(1 for v in values if v <= 0.005)


def test_observe_many_on_a_labelled_child_and_without_the_internals() -> None:
    reg = CollectorRegistry()
    h = Histogram("lat", "x", ["algorithm"], buckets=(0.1, 1.0), registry=reg)
    observe_many(h.labels("a"), [0.05] * 10 + [0.5] * 5 + [7.0])
    assert reg.get_sample_value("lat_bucket", {"algorithm": "a", "le": "0.1"}) == 10
    assert reg.get_sample_value("lat_bucket", {"algorithm": "a", "le": "1.0"}) == 15
    assert reg.get_sample_value("lat_bucket", {"algorithm": "a", "le": "+Inf"}) == 16
    assert reg.get_sample_value("lat_sum", {"algorithm": "a"}) == pytest.approx(0.5 + 2.5 + 7.0)

    class Plain:  # no prometheus_client internals: one observe per value
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, v: float) -> None:
            self.seen.append(v)

    p = Plain()
    observe_many(p, [float(i) for i in range(20)])  # type: ignore[arg-type]
    assert p.seen == [float(i) for i in range(20)]
