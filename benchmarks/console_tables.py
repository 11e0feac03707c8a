"""The console's tables: memory per entry (measured vs accounted), ingest rate and page computation times.

Usage::

    python benchmarks/console_tables.py [--entries 50000]

Feeds ``--entries`` Reuters R8 documents, their primary labels and their assignments (one algorithm,
records shaped like the worker's) into a :class:`streamsemi.console.state.ConsoleState` whose bounds do not
bind, and reports per table the bytes the table accounts and the bytes ``tracemalloc`` traced while filling
it; then, without tracemalloc, the ingest rate and the time to compute each page's data (median of 5).
Results go to ``benchmarks/results/console_tables.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from streamsemi.console.state import Bounds, ConsoleState
from streamsemi.core import datasets

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

OUT = _bench.RESULTS / "console_tables.json"


def records(n: int) -> list[tuple[bytes, bytes, bytes]]:
    ds = datasets.load("reuters-r8")
    classes = sorted(set(ds.labels))
    out = []
    now = time.time()
    for i in range(n):
        doc_id = f"reuters-r8:{i}"
        label = ds.labels[i % len(ds.texts)]
        probs = {c: round(0.6 if c == label else 0.4 / (len(classes) - 1), 4) for c in classes}
        a = {"id": doc_id, "algorithm": "constrained-kmeans", "model_version": 3, "revision": 0, "label": label,
             "score": 0.6, "labels": probs, "cluster": label, "new_cluster": False,
             "explain": ["vs", "cts", "net", "shr", "mln", "loss", "qtr", "revs"], "primary": True,
             "provisional": False, "ts": now}
        out.append((doc_id.encode(), json.dumps({"id": doc_id, "text": ds.texts[i % len(ds.texts)]}).encode(),
                    json.dumps(a).encode()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=50_000)
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, ["--entries", "200"])
    recs = records(args.entries)
    unbounded = Bounds(max_entries=args.entries, max_bytes=10**12)
    st = ConsoleState(unbounded)
    memory = {}
    for kind, table, idx in (("documents", st.texts, 1), ("labels", st.labels, 2), ("assignments", st.assignments, 2)):
        tracemalloc.start()
        for r in recs:
            st.ingest(kind, r[0], r[idx])
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        memory[kind] = {"accounted_mib": round(table.bytes / 2**20, 1), "traced_mib": round(traced / 2**20, 1),
                        "entries": len(table)}
    fresh = ConsoleState(unbounded)
    t0 = time.perf_counter()
    for r in recs:
        fresh.ingest("labels", r[0], r[2])
    ingest = args.entries / (time.perf_counter() - t0)
    pages = {}
    for name, fn in (("overview", st.overview), ("clusters", st.clusters_view), ("queue", st.queue),
                     ("classes", st.classes)):
        times = []
        for _ in range(5):
            st._cache.clear()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        pages[name] = round(1000 * statistics.median(times), 1)
    result = {"entries": args.entries, "memory": memory, "ingest_labels_per_s": round(ingest),
              "page_ms_median_of_5": pages, "machine": f"{platform.machine()} {platform.python_version()}",
              "date": time.strftime("%Y-%m-%d"), "commit": _bench.commit()}
    path = _bench.results_dir(args.smoke) / OUT.name
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
