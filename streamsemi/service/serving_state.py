"""What the worker's documents wait for, from the engine's own state (``/readyz``'s ``serving`` field).

Until the first model serves, documents are buffered; the first fit waits for its
gates (:meth:`streamsemi.engine.Engine.tick`), and later a backlog may wait for the
refit fitted on it (:attr:`streamsemi.engine.Engine.holding_backlog`). A user who sees
no output wants to know which of these it is: :func:`serving_state` reports the
gates' counts and :func:`waiting_for` says it in one sentence (``streamsemi demo``
prints it while nothing is assigned).
"""

from __future__ import annotations

from typing import Any


def serving_state(engine: Any) -> dict[str, Any]:
    """The serving gates of one engine (or, with per-stream models, of each stream's).

    Parameters
    ----------
    engine : Engine or StreamEngines
        The worker's engine (:class:`~streamsemi.engine.Engine`), or the per-stream
        engines (:class:`~streamsemi.service.streams.StreamEngines`, an ``engines`` dict).

    Returns
    -------
    dict
        JSON-ready: ``serving``, ``holding_backlog``, ``backlog`` (records known to
        wait unread on the broker; the first fit waits for them when they are more than
        ``backlog_in_flight``), ``buffer_full``, ``first_fit`` (the first fit's
        gates while there is no model: documents, seed classes, stable seeds, wait),
        ``refit`` (version and window size of the running refit, or None) and
        ``waiting`` (a sentence, or None when documents are served as they come).
    """
    streams = getattr(engine, "engines", None)
    if isinstance(streams, dict):
        per = {name: serving_state(e) for name, e in streams.items()}
        waiting = [f"{name}: {s['waiting']}" for name, s in per.items() if s["waiting"]]
        return {"serving": bool(engine.serving), "holding_backlog": bool(engine.holding_backlog),
                "waiting": "; ".join(waiting) or None, "streams": per}
    cfg = engine.config
    now = engine.clock()
    counts = engine.seeds.class_counts()
    first_doc = engine._first_doc_at
    refit = ({"version": int(engine._refit_version), "documents": int(engine._refit_window)}
             if engine.refitting else None)
    state: dict[str, Any] = {
        "serving": bool(engine.serving), "holding_backlog": bool(engine.holding_backlog),
        "backlog": int(engine.backlog), "backlog_in_flight": int(getattr(engine, "backlog_in_flight", 0)),
        "buffer_full": bool(engine.buffer_full), "refit": refit,
        "first_fit": None if engine.models else {
            "documents": len(engine.window), "min_documents": cfg.min_docs_first_refit,
            "seed_classes": len(counts),
            "seed_classes_ready": sum(1 for n in counts.values() if n >= cfg.min_seeds_per_class),
            "min_seed_classes": cfg.min_seed_classes, "min_seeds_per_class": cfg.min_seeds_per_class,
            "seeds_since_new_class": int(engine._seeds_since_new_class),
            "stable_seeds_needed": cfg.first_fit_stable_seeds,
            "waited_s": None if first_doc is None else round(max(0.0, now - first_doc), 1),
            "max_wait_s": cfg.first_fit_max_wait_s or None,
        },
    }
    state["waiting"] = waiting_for(state, len(engine.buffer))
    return state


def waiting_for(state: dict[str, Any], buffered: int) -> str | None:
    """One sentence on what the buffered documents wait for (the order of :meth:`Engine.tick`'s gates).

    Parameters
    ----------
    state : dict
        :func:`serving_state` of one engine (without ``waiting``).
    buffered : int
        Documents in the pre-model buffer.

    Returns
    -------
    str or None
        None when nothing waits: documents are assigned in the poll that reads them.
    """
    refit = state["refit"]
    gate = state["first_fit"]
    if gate is not None:
        if refit is not None:
            return f"first model fitting (v{refit['version']}, {refit['documents']:,} documents)"
        limit = (f"; at most {max(0.0, gate['max_wait_s'] - gate['waited_s']):.0f} s more"
                 if gate["max_wait_s"] and gate["waited_s"] is not None else "")
        if state["backlog"] > state["backlog_in_flight"] and not state["buffer_full"]:
            return f"waiting for the backlog to be read first: {state['backlog']:,} records unread on the broker{limit}"
        if gate["documents"] < gate["min_documents"]:
            return (f"waiting for the first model: {gate['documents']:,} of {gate['min_documents']:,} documents "
                    "read into the window")
        if gate["seed_classes_ready"] < gate["min_seed_classes"]:
            return (f"waiting for the first model: seeds of {gate['seed_classes_ready']}/{gate['min_seed_classes']} classes "
                    f"({gate['min_seeds_per_class']} seeds each){limit}")
        if gate["seeds_since_new_class"] < gate["stable_seeds_needed"]:
            return (f"waiting for the first model: the seeded classes to stop growing ({gate['seed_classes']} classes, "
                    f"{gate['seeds_since_new_class']}/{gate['stable_seeds_needed']} seeds with no new class; "
                    f"or an idle stream{limit})")
        return "waiting for the first model: its fit is starting"
    if state["holding_backlog"] and refit is not None:
        return (f"holding the backlog ({buffered:,} documents) for v{refit['version']} "
                f"({refit['documents']:,} documents)")
    if buffered and not state["serving"]:
        return f"waiting for every algorithm's first model (revisions off): {buffered:,} documents buffered"
    return None


def worker_status(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The worker's ``/readyz`` JSON at ``url`` (its metrics server, e.g. ``http://127.0.0.1:9464``).

    A worker that is not ready answers 503 with the same JSON; that is returned too.

    Parameters
    ----------
    url : str
        Base URL of the worker's metrics server (http or https).
    timeout_s : float
        Seconds to wait for the answer.

    Returns
    -------
    dict or None
        The JSON object, or None when the worker does not answer (or not with a JSON object).
    """
    import json
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/readyz", timeout=timeout_s) as r:  # noqa: S310 - http(s)
            body = r.read()
    except urllib.error.HTTPError as exc:
        body = exc.read() if exc.code == 503 else b""
    except (OSError, ValueError):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
