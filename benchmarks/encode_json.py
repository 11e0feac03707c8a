"""What keeping an encoded output costs: orjson's own bytes against ``encode_json``'s copy (issue 16).

The worker keeps every output's bytes until the broker acknowledges it (the output
ledger, up to ``max_unacked_outputs``). ``orjson.dumps`` writes into a 4 KiB allocation
that its result keeps; ``encode_json`` copies the result into bytes of their own length.
For three message sizes (a control op, an assignment, a large message) this encodes
``--messages`` messages and keeps them, each way, interleaved ``--repeats`` times, and
reports microseconds per kept message (min over the runs) and the bytes held per message
(``tracemalloc``, one extra run)::

    python benchmarks/encode_json.py --tag s18

Writes ``benchmarks/results/encode_json[_TAG].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from streamsemi.core.messages import encode_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import run_record, save, table  # noqa: E402 - this folder's throughput.py

RESULTS = Path(__file__).parent / "results"


def messages(n: int) -> dict[str, list[dict[str, Any]]]:
    """``n`` distinct messages of each size (distinct ids and scores, as a stream's outputs)."""
    classes = [f"comp.sys.class{i}" for i in range(20)]
    assign = [{"id": f"doc-{i:07d}", "algorithm": "semi-ldc", "model_version": 3, "revision": 0, "label": classes[i % 20],
               "score": 0.5 + (i % 997) / 1e4, "labels": {c: round(0.9 / (j + 2) + i / 1e9, 6) for j, c in enumerate(classes[:10])},
               "cluster": classes[i % 20], "new_cluster": False, "explain": ["image", "graphics", "file", "jpeg", "format"],
               "primary": i % 6 == 0, "provisional": False, "ts": 1764260000.123 + i, "worker": "w1234"}
              for i in range(n)]
    return {"control op": [{"op": "label", "id": f"doc-{i}", "labels": ["grain"]} for i in range(n)],
            "assignment": assign,
            "large (6 assignments)": [{"batch": assign[i:i + 6]} for i in range(n)]}


def kept_us(encode: Callable[[Any], bytes], msgs: list[dict[str, Any]]) -> float:
    kept = []
    t0 = time.perf_counter()
    for m in msgs:
        kept.append(encode(m))
    return 1e6 * (time.perf_counter() - t0) / len(msgs)


def held_bytes(encode: Callable[[Any], bytes], msgs: list[dict[str, Any]]) -> tuple[float, float]:
    """(traced bytes held per kept message, mean encoded length)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [encode(m) for m in msgs]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held / len(kept), sum(map(len, kept)) / len(kept)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    ways = {"orjson.dumps (kept as it is)": orjson.dumps, "encode_json (copied)": encode_json}
    rows: dict[str, dict[str, Any]] = {}
    for size, msgs in messages(args.messages).items():
        runs: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeats):
            for w, f in ways.items():
                runs[w].append(round(kept_us(f, msgs), 3))
        for w, f in ways.items():
            held, length = held_bytes(f, msgs)
            rows[f"{size} / {w}"] = {"size": size, "way": w, "us_per_kept_message_min": min(runs[w]),
                                     "us_runs": runs[w], "bytes_held_per_message": round(held, 1),
                                     "encoded_length": round(length, 1)}
    out = run_record(args, rows=rows)
    lines = [f"# Keeping encoded outputs, {out['when']}", "", f"`{out['command']}`", "",
             f"{args.messages:,} distinct messages of each size, kept in a list; {args.repeats} interleaved runs, "
             "min; bytes held from tracemalloc.", ""]
    lines += table(["message", "way", "bytes", "us per kept message", "bytes held per message"],
                   ([r["size"], r["way"], f"{r['encoded_length']:g}", r["us_per_kept_message_min"],
                     f"{r['bytes_held_per_message']:g}"] for r in rows.values()))
    save("encode_json", args.tag, out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
