"""Checkpoints of the worker's state: safe encodings, atomic writes, verified restore.

A checkpoint is a directory ``<state_dir>/ckpt-<sequence>/`` holding

* ``manifest.json``: format name and version, creation time, counts, the models
  (algorithm, registry name, version, class), and the SHA-256 and size of every
  other file;
* ``engine.json``: model version, refit count, seed labels, held labels and the
  per-document control-operation bookkeeping;
* ``window.npz`` / ``seeds.npz``: the window (ids, event times, kept texts, rows)
  and the seed rows, as numpy arrays;
* ``sketch.json``: the word sketch (:meth:`WordSketch.to_dict`);
* ``model-<k>.json`` + ``model-<k>.npz``: one fitted estimator each.

``<state_dir>/CURRENT`` names the newest complete checkpoint. Every file is written
to a temporary name, fsync'ed and renamed; ``CURRENT`` is replaced last, so a crash
at any moment leaves the previous checkpoint intact.

Only JSON and ``.npz`` (read with ``allow_pickle=False``) are used: nothing in a
checkpoint is ever unpickled or executed. Estimators are stored generically
(:func:`estimator_state`): constructor parameters plus every other instance
attribute, as long as each value is a whitelisted type (numbers, strings, numpy
arrays of numeric/bool/str dtype, scipy sparse matrices, lists/tuples/dicts/sets of
those, nested estimators of the package). A mostly-zero numeric array (k-means centroids over
the hashed features) is stored as its nonzero entries and expanded bit for bit on restore
(format version 2; version-1 checkpoints, every array dense, are still read). Classes are
re-created only through the
algorithm registry (:data:`streamsemi.algorithms.REGISTRY`) and the package's own
class list, never from a path found in the file. A model that cannot be stored is
skipped (and logged); the next refit rebuilds it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from streamsemi import __version__
from streamsemi.core.errors import StreamsemiError
from streamsemi.core.logs import event

if TYPE_CHECKING:  # pragma: no cover
    from streamsemi.engine import Engine, EngineState

log = logging.getLogger("streamsemi.service.checkpoint")

FORMAT = "streamsemi-checkpoint"
FORMAT_VERSION = 2
#: versions this code reads: 1 (every array stored dense) and 2 (mostly-zero arrays stored as their
#: nonzero entries, ``"t": "zeros"``); a reader of version 1 refuses a version-2 file by its version
READABLE_FORMAT_VERSIONS = (1, 2)
CURRENT = "CURRENT"
KEEP = 2
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_DIR_NAME = re.compile(r"^ckpt-[0-9]{1,12}$")
_ARRAY_KINDS = "biufcUS"
_SPARSE_FORMATS = ("csr", "csc", "coo")
#: a numeric array of at least this many entries whose nonzero entries (index + value) take at most
#: half its dense bytes is stored as those entries (k-means centroids over 2^18 hashed features
#: are 96% zeros: 42 MB dense, 2.5 MB so)
ZEROS_MIN_SIZE = 4096
ZEROS_MAX_RATIO = 0.5
#: the most a model's ``zeros`` entries may expand to, all together (a hostile state of small files must not
#: allocate without bound; checked before any is expanded)
ZEROS_MAX_DENSE_BYTES = 4 << 30


class CheckpointError(StreamsemiError):
    """A checkpoint is missing, of another format version, or corrupted."""


class UnsupportedState(StreamsemiError, TypeError):
    """A value that the safe encoding does not allow (the model is skipped)."""


# ---------------------------------------------------------------- safe value encoding
def _whitelisted_classes() -> dict[str, type]:
    """Estimator classes that may be re-created: the registry's and the package's helpers."""
    import streamsemi.algorithms as algos

    out: dict[str, type] = {}
    for name in sorted(set(getattr(algos, "_CLASS_MODULES", {})) | {c for _, c, _ in algos.REGISTRY.values()}):
        try:
            out[name] = getattr(algos, name)
        except Exception:  # noqa: BLE001 - an unavailable algorithm is simply not restorable
            continue
    return out


class _Encoder:
    """Turn a value tree into JSON (tagged objects) plus a dict of numpy arrays."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def _array(self, a: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.ascontiguousarray(a)
        return key

    def encode(self, v: Any, where: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int) and type(v) is int:
            return v
        if type(v) is float:
            return v if math.isfinite(v) else {"t": "float", "v": repr(v)}
        if isinstance(v, np.generic):
            if v.dtype.kind not in "biuf":
                raise UnsupportedState(f"{where}: numpy scalar of dtype {v.dtype}")
            item = v.item()
            if isinstance(item, float) and not math.isfinite(item):
                item = repr(item)
            return {"t": "npscalar", "dtype": v.dtype.str, "v": item}
        if isinstance(v, np.ndarray):
            return self._encode_array(v, where)
        if sp.issparse(v):
            return self._encode_sparse(v, where)
        if type(v) in (list, tuple, set, frozenset):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            return {"t": type(v).__name__, "v": [self.encode(x, f"{where}[{i}]") for i, x in enumerate(items)]}
        if type(v) is dict:
            return {"t": "dict", "v": [[self.encode(k, f"{where} key"), self.encode(x, f"{where}[{k!r}]")]
                                       for k, x in v.items()]}
        allowed = _whitelisted_classes()
        name = type(v).__name__
        if name in allowed and allowed[name] is type(v) and hasattr(v, "get_params"):
            state, arrays = estimator_state(v, self.arrays)
            self.arrays = arrays
            return {"t": "estimator", **state}
        raise UnsupportedState(f"{where}: values of type {type(v).__module__}.{type(v).__qualname__} are not stored")

    def _encode_array(self, a: np.ndarray, where: str) -> dict:
        if a.dtype.kind == "O":
            flat = a.ravel()
            if not all(isinstance(x, str) for x in flat):
                raise UnsupportedState(f"{where}: object array with non-string items")
            as_str = np.array(flat.tolist(), dtype=str).reshape(a.shape) if flat.size else np.zeros(a.shape, dtype="<U1")
            return {"t": "ndarray", "key": self._array(as_str), "object": True}
        if a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None:
            raise UnsupportedState(f"{where}: arrays of dtype {a.dtype} are not stored")
        nonzero = nonzero_entries(a)
        if nonzero is not None:
            index, values = nonzero
            return {"t": "zeros", "shape": [int(x) for x in a.shape], "index": self._array(index),
                    "values": self._array(values)}
        return {"t": "ndarray", "key": self._array(a)}

    def _encode_sparse(self, m: Any, where: str) -> dict:
        fmt = m.format
        if fmt not in _SPARSE_FORMATS or m.dtype.kind not in "biufc":
            raise UnsupportedState(f"{where}: sparse {fmt} of dtype {m.dtype} is not stored")
        out = {"t": "sparse", "format": fmt, "array": isinstance(m, sp.sparray), "shape": [int(x) for x in m.shape]}
        if fmt == "coo":
            out.update(row=self._array(m.row), col=self._array(m.col), data=self._array(m.data))
        else:
            out.update(indptr=self._array(m.indptr), indices=self._array(m.indices), data=self._array(m.data))
        return out


def nonzero_entries(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(flat C-order index, values)`` of the entries of ``a`` that are not +0, or None when
    ``a`` is not a mostly-zero numeric array (:data:`ZEROS_MIN_SIZE`, :data:`ZEROS_MAX_RATIO`).

    Zero is tested on the bits, so ``-0.0`` and NaN are kept as entries and
    :func:`expand_nonzero` gives back an array equal bit for bit.
    """
    if a.dtype.kind not in "iuf" or a.size < ZEROS_MIN_SIZE or a.dtype.fields is not None:
        return None
    flat = np.ascontiguousarray(a).reshape(-1)
    bits = flat.view(np.dtype(f"u{flat.dtype.itemsize}")) if flat.dtype.kind == "f" else flat
    index_dtype = np.int32 if flat.size < 2**31 else np.int64
    # the count first: a dense array (most models' other arrays) costs one pass and no index
    nnz = int(np.count_nonzero(bits))
    if nnz * (flat.dtype.itemsize + np.dtype(index_dtype).itemsize) > ZEROS_MAX_RATIO * flat.nbytes:
        return None
    index = np.flatnonzero(bits).astype(index_dtype, copy=False)
    return index, flat[index]


def expand_nonzero(shape: Any, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The dense array of a ``zeros`` entry (:func:`nonzero_entries`), its inputs checked.

    Raises
    ------
    CheckpointError
        A shape that is not a list of non-negative integers or would take more than
        :data:`ZEROS_MAX_DENSE_BYTES`, values that are not numeric, or an index that is not
        an integer array of the values' length, strictly increasing, within the shape.
    """
    if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
        raise CheckpointError(f"zeros entry with a bad shape {shape!r}")
    if values.ndim != 1 or values.dtype.kind not in "iuf" or values.dtype.fields is not None:
        raise CheckpointError(f"zeros entry with values of dtype {values.dtype} and {values.ndim} dimensions")
    size = math.prod(shape)
    if size * values.dtype.itemsize > ZEROS_MAX_DENSE_BYTES:
        raise CheckpointError(f"zeros entry of shape {tuple(shape)} would take more than "
                              f"{ZEROS_MAX_DENSE_BYTES} bytes")
    if index.ndim != 1 or index.dtype.kind not in "iu" or index.size != values.size:
        raise CheckpointError(f"zeros entry with an index of dtype {index.dtype}, {index.ndim} dimensions and "
                              f"{index.size} entries for {values.size} values")
    if index.size and (int(index[0]) < 0 or int(index[-1]) >= size or np.any(np.diff(index) <= 0)):
        raise CheckpointError(f"zeros entry with an index outside 0..{size - 1} or not increasing")
    out = np.zeros(size, dtype=values.dtype)
    out[index] = values
    return out.reshape(shape)


def zeros_expanded_bytes(tree: Any, arrays: dict[str, np.ndarray]) -> int:
    """Bytes that every ``zeros`` entry of a model state (nested estimators included) expands to;
    entries with a malformed shape count 0 here and are refused by :func:`expand_nonzero`."""
    total, stack = 0, [tree]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            if v.get("t") == "zeros":
                shape, values = v.get("shape"), arrays.get(v.get("values")) if isinstance(v.get("values"), str) else None
                if isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape) and values is not None:
                    total += math.prod(shape) * values.dtype.itemsize
            else:
                stack.extend(v.values())
    return total


def _decode(v: Any, arrays: dict[str, np.ndarray]) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        raise CheckpointError("untagged list in a model state")
    if not isinstance(v, dict) or "t" not in v:
        raise CheckpointError("untagged object in a model state")
    t = v["t"]
    if t == "float":
        return float(v["v"])
    if t == "npscalar":
        dtype = np.dtype(v["dtype"])
        if dtype.kind not in "biuf":
            raise CheckpointError(f"numpy scalar dtype {dtype} not allowed")
        return dtype.type(float(v["v"]) if isinstance(v["v"], str) else v["v"])
    if t == "ndarray":
        a = _get_array(arrays, v["key"])
        return a.astype(object) if v.get("object") else a
    if t == "zeros":
        return expand_nonzero(v.get("shape"), _get_array(arrays, v.get("index")), _get_array(arrays, v.get("values")))
    if t == "sparse":
        return _decode_sparse(v, arrays)
    if t in ("list", "tuple", "set", "frozenset"):
        items = [_decode(x, arrays) for x in v["v"]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[t](items)
    if t == "dict":
        return {_decode(k, arrays): _decode(x, arrays) for k, x in v["v"]}
    if t == "estimator":
        return restore_estimator(v, arrays)
    raise CheckpointError(f"unknown tag {t!r} in a model state")


def _get_array(arrays: dict[str, np.ndarray], key: Any) -> np.ndarray:
    if not isinstance(key, str) or key not in arrays:
        raise CheckpointError(f"model state refers to a missing array {key!r}")
    return arrays[key]


def _decode_sparse(v: dict, arrays: dict[str, np.ndarray]) -> Any:
    fmt, shape = v["format"], tuple(int(x) for x in v["shape"])
    if fmt not in _SPARSE_FORMATS or len(shape) != 2:
        raise CheckpointError(f"sparse format {fmt!r} not allowed")
    if fmt == "coo":
        parts = (_get_array(arrays, v["data"]), (_get_array(arrays, v["row"]), _get_array(arrays, v["col"])))
    else:
        parts = (_get_array(arrays, v["data"]), _get_array(arrays, v["indices"]), _get_array(arrays, v["indptr"]))
    kinds = {"csr": (sp.csr_matrix, sp.csr_array), "csc": (sp.csc_matrix, sp.csc_array),
             "coo": (sp.coo_matrix, sp.coo_array)}[fmt]
    return kinds[1 if v.get("array") else 0](parts, shape=shape)


def estimator_state(est: Any, arrays: dict[str, np.ndarray] | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """Safe state of a fitted estimator: ``({"class", "params", "attrs"}, arrays)``.

    ``params`` are the constructor parameters (``get_params(deep=False)``);
    ``attrs`` every other instance attribute (the fitted ``*_`` attributes and any
    private helper arrays).

    Raises
    ------
    UnsupportedState
        An attribute holds a type the safe encoding does not allow.
    """
    enc = _Encoder()
    enc.arrays = arrays if arrays is not None else {}
    cls = type(est).__name__
    params = est.get_params(deep=False)
    p = {k: enc.encode(v, f"{cls}.{k}") for k, v in params.items()}
    attrs = {k: enc.encode(v, f"{cls}.{k}") for k, v in vars(est).items() if k not in params}
    return {"class": cls, "params": p, "attrs": attrs}, enc.arrays


def restore_estimator(state: dict, arrays: dict[str, np.ndarray], registry_name: str | None = None) -> Any:
    """Re-create an estimator from :func:`estimator_state` output.

    The class comes from the algorithm registry (``registry_name``) or, for nested
    estimators, from the package's fixed class list; the class name in the file
    must match it.
    """
    cls_name = state.get("class")
    if registry_name is not None:
        from streamsemi.algorithms import algorithm_class

        cls, _ = algorithm_class(registry_name)
        if cls.__name__ != cls_name:
            raise CheckpointError(f"model of class {cls_name!r} stored under algorithm {registry_name!r} "
                                  f"(registry class {cls.__name__})")
    else:
        allowed = _whitelisted_classes()
        if cls_name not in allowed:
            raise CheckpointError(f"class {cls_name!r} is not an estimator of streamsemi")
        cls = allowed[cls_name]
    if registry_name is not None:  # a whole model (nested estimators are counted with it)
        expanded = zeros_expanded_bytes(state, arrays)
        if expanded > ZEROS_MAX_DENSE_BYTES:
            raise CheckpointError(f"model state whose mostly-zero arrays would take {expanded} bytes, more than "
                                  f"{ZEROS_MAX_DENSE_BYTES}")
    params = {str(k): _decode(v, arrays) for k, v in state["params"].items()}
    est = cls(**params)
    for k, v in state["attrs"].items():
        setattr(est, str(k), _decode(v, arrays))
    return est


# ---------------------------------------------------------------- files
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> dict[str, Any]:
    """Write ``data`` to ``path`` atomically (temp name, fsync, rename); return its sha256 and size."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _load_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _strings_to_arrays(items: list[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UTF-8 blob, offsets and a presence mask for a list of optional strings."""
    encoded = [(s or "").encode("utf-8", "surrogatepass") for s in items]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if encoded:
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return blob, offsets, np.array([s is not None for s in items], dtype=bool)


def _arrays_to_strings(blob: np.ndarray, offsets: np.ndarray, present: np.ndarray) -> list[str | None]:
    raw = blob.tobytes()
    if offsets.ndim != 1 or len(offsets) != len(present) + 1 or (len(offsets) and offsets[-1] != len(raw)):
        raise CheckpointError("string table offsets do not match")
    return [raw[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogatepass") if present[i] else None
            for i in range(len(present))]


def _rows_to_arrays(rows: list[Any], prefix: str) -> dict[str, np.ndarray]:
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    if rows:
        np.cumsum([r.nnz for r in rows], out=indptr[1:])
    indices = np.concatenate([r.indices for r in rows]).astype(np.int32) if rows else np.zeros(0, np.int32)
    data = np.concatenate([r.data for r in rows]).astype(np.float32) if rows else np.zeros(0, np.float32)
    return {f"{prefix}indptr": indptr, f"{prefix}indices": indices, f"{prefix}data": data}


def _arrays_to_rows(z: dict[str, np.ndarray], prefix: str, n: int, n_features: int) -> list[Any]:
    from streamsemi.core.store import Row

    indptr, indices, data = z[f"{prefix}indptr"], z[f"{prefix}indices"], z[f"{prefix}data"]
    if len(indptr) != n + 1 or indptr[-1] != len(indices) or len(indices) != len(data) or np.any(np.diff(indptr) < 0):
        raise CheckpointError(f"{prefix}rows: inconsistent sparse arrays")
    if len(indices) and (indices.min() < 0 or indices.max() >= n_features):
        raise CheckpointError(f"{prefix}rows: column index outside n_features={n_features}")
    return [Row(indices[indptr[i]:indptr[i + 1]].astype(np.int32), data[indptr[i]:indptr[i + 1]].astype(np.float32))
            for i in range(n)]


# ---------------------------------------------------------------- capture / write
@dataclass
class Capture:
    """Everything a checkpoint holds, taken on the engine's thread (files are written from it)."""

    files: dict[str, bytes]
    manifest: dict[str, Any]
    skipped: list[dict[str, str]] = field(default_factory=list)


def capture(engine: Engine, offsets: list[list[Any]] | None = None) -> Capture:
    """Snapshot the engine's state into file contents (on the engine's thread)."""
    return encode(engine.export_state(), offsets)


def encode(g: EngineState, offsets: list[list[Any]] | None = None) -> Capture:
    """File contents of a checkpoint from :meth:`Engine.export_state` output (may run on any thread).

    ``offsets`` (``[topic, partition, next offset]``) tell a restore which documents
    the window already holds: those after them are read back into the window at start.
    """
    files: dict[str, bytes] = {}
    win_ids = [w[0] for w in g.window]
    ids_blob, ids_off, _ = _strings_to_arrays(win_ids)
    txt_blob, txt_off, has_text = _strings_to_arrays([w[3] for w in g.window])
    files["window.npz"] = _npz_bytes({"ids_blob": ids_blob, "ids_off": ids_off, "text_blob": txt_blob,
                                      "text_off": txt_off, "has_text": has_text,
                                      "ts": np.asarray([w[1] for w in g.window], dtype=np.float64),
                                      **_rows_to_arrays([w[2] for w in g.window], "")})
    seed_ids = [k for k, _, _ in g.seeds]
    sid_blob, sid_off, _ = _strings_to_arrays(seed_ids)
    files["seeds.npz"] = _npz_bytes({"ids_blob": sid_blob, "ids_off": sid_off,
                                     **_rows_to_arrays([r for _, _, r in g.seeds], "")})
    pending = [[k, list(labels), expires, off] for k, labels, expires, off in g.pending]
    last_ops = [[k, off, op] for k, off, op in g.last_ops]
    files["engine.json"] = _json_bytes({"version": g.version, "refit_count": g.refit_count,
                                        "docs_since_refit": g.docs_since_refit, "cluster_ids": g.cluster_ids,
                                        "seed_labels": [list(lb) for _, lb, _ in g.seeds],
                                        "pending": pending, "last_ops": last_ops,
                                        "offsets": [list(o) for o in offsets or []]})
    sketch = g.sketch_dict()
    files["sketch.json"] = _json_bytes(sketch)
    n_sketch = len(sketch["slots"])
    model_files, models_meta, skipped = encode_models(g.models)
    files.update(model_files)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "created": time.time(),
        "streamsemi_version": __version__, "n_features": g.n_features, "stop_words": g.stop_words,
        "model_version": g.version,
        "counts": {"window": len(win_ids), "seeds": len(seed_ids), "pending_labels": len(pending),
                   "control_ops": len(last_ops), "sketch_features": n_sketch,
                   "models": len(models_meta)},
        "models": models_meta, "skipped_models": skipped,
    }
    return Capture(files, manifest, skipped)


def encode_models(models: dict[str, Any]) -> tuple[dict[str, bytes], list[dict[str, Any]], list[dict[str, str]]]:
    """Files (``model-<k>.json`` + ``.npz``), manifest entries and skipped models of a dict of model slots.

    The safe encoding of checkpoints (:func:`estimator_state`), also used by the models
    topic (:mod:`streamsemi.service.models_topic`); a model shared by several
    algorithms (the fallback) is stored once.
    """
    from streamsemi.engine import FALLBACK_ALGORITHM

    files: dict[str, bytes] = {}
    models_meta: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    stored: dict[int, str] = {}
    for name, slot in models.items():
        registry = FALLBACK_ALGORITHM if slot.fallback else name
        key = stored.get(id(slot.model))
        if key is None:
            try:
                state, arrays = estimator_state(slot.model)
                state_bytes = _json_bytes(state)
            except (UnsupportedState, ValueError, TypeError) as exc:
                skipped.append({"algorithm": name, "reason": str(exc)})
                event(log, "checkpoint_model_skipped", logging.WARNING, algorithm=name, version=slot.version,
                      reason=str(exc))
                continue
            key = f"model-{len(stored)}"
            stored[id(slot.model)] = key
            files[f"{key}.json"] = state_bytes
            files[f"{key}.npz"] = _npz_bytes(arrays)
        models_meta.append({
            "algorithm": name, "registry": registry, "class": type(slot.model).__name__, "state": key,
            "version": slot.version, "fitted_at": slot.fitted_at, "fallback": slot.fallback,
            "n_train": slot.n_train, "multilabel": slot.multilabel,
            "new_clusters": sorted(slot.new_clusters), "explain": slot.explain,
            "classes": [str(c) for c in slot.classes], "renamed": slot.renamed,
        })
    return files, models_meta, skipped


def _next_sequence(state_dir: Path) -> int:
    seqs = [int(p.name.split("-")[1]) for p in state_dir.iterdir() if _DIR_NAME.match(p.name)]
    return max(seqs, default=0) + 1


def write(state_dir: str | Path, cap: Capture, keep: int = KEEP) -> dict[str, Any]:
    """Write a captured checkpoint atomically; returns ``{"path", "bytes", "seconds"}``."""
    t0 = time.perf_counter()
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{_next_sequence(root):012d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir()
    try:
        entries = {fname: _write_file(tmp / fname, data) for fname, data in cap.files.items()}
        manifest = {**cap.manifest, "files": entries}
        _write_file(tmp / "manifest.json", _json_bytes(manifest))
        _fsync_dir(tmp)
        os.replace(tmp, root / name)
        _fsync_dir(root)
        _write_file(root / CURRENT, (name + "\n").encode())
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, name, keep)
    total = sum(e["bytes"] for e in entries.values())
    return {"path": str(root / name), "bytes": total, "seconds": round(time.perf_counter() - t0, 3)}


def _prune(root: Path, current: str, keep: int) -> None:
    dirs = sorted((p for p in root.iterdir() if _DIR_NAME.match(p.name)), key=lambda p: p.name)
    for p in dirs[:-keep] if keep > 0 else dirs:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.iterdir():
        if p.name.startswith(".tmp-") or (p.name.startswith(f".{CURRENT}.") and p.name.endswith(".tmp")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def save(engine: Engine, state_dir: str | Path) -> dict[str, Any]:
    """Capture and write a checkpoint of ``engine`` to ``state_dir``."""
    cap = capture(engine)
    info = write(state_dir, cap)
    info.update(counts=cap.manifest["counts"], skipped_models=[s["algorithm"] for s in cap.skipped],
                model_version=cap.manifest["model_version"])
    return info


class Checkpointer:
    """Writes checkpoints on a background thread so that the polling loop stays short.

    :meth:`submit` gathers references on the caller's thread and encodes/writes them
    on a worker thread; one checkpoint at a time (a submit while one is written is
    declined). ``on_done(info)`` / ``on_error(exc)`` are called from that thread.
    """

    def __init__(self, state_dir: str | Path, on_done: Any = None, on_error: Any = None) -> None:
        self.state_dir = Path(state_dir)
        self.on_done = on_done
        self.on_error = on_error
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, engine: Engine, reason: str, offsets: list[list[Any]] | None = None) -> bool:
        """Start writing a checkpoint of ``engine``; False if one is still being written."""
        if self.busy:
            return False
        state = engine.export_state()
        self._thread = threading.Thread(target=self._run, args=(state, offsets, reason), name="checkpoint",
                                        daemon=True)
        self._thread.start()
        return True

    def _run(self, state: EngineState, offsets: list[list[Any]] | None, reason: str) -> None:
        try:
            cap = encode(state, offsets)
            info = write(self.state_dir, cap)
            info.update(reason=reason, counts=cap.manifest["counts"], model_version=cap.manifest["model_version"],
                        skipped_models=[x["algorithm"] for x in cap.skipped])
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            if self.on_error:
                self.on_error(exc, reason)
            return
        if self.on_done:
            self.on_done(info)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the checkpoint being written; True when none is running any more."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.busy


# ---------------------------------------------------------------- read / verify
@dataclass
class Loaded:
    """A verified checkpoint: its manifest and file contents."""

    path: Path
    manifest: dict[str, Any]
    files: dict[str, bytes]


def _checkpoint_dirs(root: Path) -> list[Path]:
    """Candidate checkpoint directories, the one named by CURRENT first, then newest first."""
    out: list[Path] = []
    cur = root / CURRENT
    if cur.is_file():
        name = cur.read_text(encoding="utf-8", errors="replace").strip()
        if _DIR_NAME.match(name) and (root / name).is_dir():
            out.append(root / name)
    for p in sorted((p for p in root.iterdir() if _DIR_NAME.match(p.name) and p.is_dir()), reverse=True):
        if p not in out:
            out.append(p)
    return out


def _loads(data: bytes, where: str) -> Any:
    """JSON from checkpoint bytes; CheckpointError for bad JSON, bad UTF-8 or nesting too deep to parse."""
    try:
        return json.loads(data)
    except RecursionError:
        raise CheckpointError(f"{where}: not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where}: not valid JSON ({exc})") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_NOTHING = object()


def _require(ok: bool, where: str, what: str, got: Any = _NOTHING) -> None:
    """Raise :class:`CheckpointError` ``"{where}: {what}, got {value}"`` unless ``ok`` (value shortened)."""
    if not ok:
        shown = "" if got is _NOTHING else f", got {_short_repr(got)}"
        raise CheckpointError(f"{where}: {what}{shown}")


def _short_repr(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deeply>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_manifest(m: Any, where: str = "manifest.json") -> None:
    """Check the structure and types of a parsed manifest (format and version included).

    Raises
    ------
    CheckpointError
        With the first problem found, e.g. ``manifest.json: 'models' must be a list``.
    """
    _require(isinstance(m, dict) and m.get("format") == FORMAT, where, "not a streamsemi checkpoint")
    _require(_is_int(m.get("format_version")) and m.get("format_version") in READABLE_FORMAT_VERSIONS, where,
             f"format version {m.get('format_version')!r}, this streamsemi reads versions "
             f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))}")
    _require(_is_number(m.get("created")), where, "'created' must be a number", m.get("created"))
    _require(_is_int(m.get("n_features")) and m["n_features"] > 0, where, "'n_features' must be a positive integer", m.get("n_features"))
    _require(m.get("stop_words") is None or isinstance(m.get("stop_words"), str), where,
             "'stop_words' must be text or null", m.get("stop_words"))
    _require(_is_int(m.get("model_version")) and m["model_version"] >= 0, where,
             "'model_version' must be a non-negative integer", m.get("model_version"))
    counts = m.get("counts")
    _require(isinstance(counts, dict) and all(_is_int(v) for v in counts.values()), where,
             "'counts' must map names to integers")
    files = m.get("files")
    _require(isinstance(files, dict), where, "no file list")
    for fname, meta in files.items():
        _require(bool(_FILE_NAME.match(fname)) and not fname.startswith(".") and isinstance(meta, dict)
                 and isinstance(meta.get("sha256"), str) and _is_int(meta.get("bytes")), where,
                 f"bad file entry {fname!r}")
    models = m.get("models")
    _require(isinstance(models, list), where, "'models' must be a list", models)
    for i, meta in enumerate(models):
        at = f"models[{i}]"
        _require(isinstance(meta, dict), where, f"{at} must be an object", meta)
        for key in ("algorithm", "registry", "class", "state"):
            _require(isinstance(meta.get(key), str), where, f"{at}.{key} must be text", meta.get(key))
        _require(bool(re.fullmatch(r"model-[0-9]{1,6}", meta["state"])), where, f"{at}.state must be model-<n>", meta["state"])
        for suffix in (".json", ".npz"):
            _require(meta["state"] + suffix in files, where, f"{at}: {meta['state']}{suffix} is not in the file list")
        _require(_is_int(meta.get("version")) and meta["version"] >= 0, where, f"{at}.version must be an integer", meta.get("version"))
        _require(_is_number(meta.get("fitted_at")), where, f"{at}.fitted_at must be a number", meta.get("fitted_at"))
        _require(_is_int(meta.get("n_train", 0)), where, f"{at}.n_train must be an integer", meta.get("n_train"))
        for key in ("multilabel", "fallback"):
            _require(isinstance(meta.get(key, False), bool), where, f"{at}.{key} must be true or false", meta.get(key))
        for key in ("classes", "new_clusters"):
            _require(_is_str_list(meta.get(key, [])), where, f"{at}.{key} must be a list of text", meta.get(key))
        explain = meta.get("explain") or {}
        _require(isinstance(explain, dict) and all(_is_str_list(v) for v in explain.values()), where,
                 f"{at}.explain must map clusters to lists of words")
    _require(isinstance(m.get("skipped_models", []), list), where, "'skipped_models' must be a list", m.get("skipped_models"))


def read_dir(path: str | Path) -> Loaded:
    """Read and verify one checkpoint directory.

    Raises
    ------
    CheckpointError
        Missing manifest, bad JSON, another format or version, a manifest of the
        wrong structure (:func:`validate_manifest`), a missing file, a size or
        SHA-256 mismatch.
    """
    path = Path(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CheckpointError(f"{path}: no manifest.json")
    manifest = _loads(mpath.read_bytes(), str(mpath))
    validate_manifest(manifest, str(mpath))
    files: dict[str, bytes] = {}
    for fname, meta in manifest["files"].items():
        fpath = path / fname
        if not fpath.is_file():
            raise CheckpointError(f"{fpath}: missing")
        data = fpath.read_bytes()
        if len(data) != meta["bytes"]:
            raise CheckpointError(f"{fpath}: {len(data)} bytes, manifest says {meta['bytes']} (truncated?)")
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise CheckpointError(f"{fpath}: checksum mismatch")
        files[fname] = data
    for required in ("engine.json", "window.npz", "seeds.npz", "sketch.json"):
        if required not in files:
            raise CheckpointError(f"{path}: {required} missing from the manifest")
    return Loaded(path, manifest, files)


def read_latest(state_dir: str | Path) -> tuple[Loaded | None, list[str]]:
    """Newest verified checkpoint under ``state_dir`` (CURRENT first) and the problems met on the way."""
    root = Path(state_dir)
    problems: list[str] = []
    if not root.is_dir():
        return None, [f"{root}: no state directory"]
    dirs = _checkpoint_dirs(root)
    if not dirs:
        return None, [f"{root}: no checkpoint"]
    for d in dirs:
        try:
            return read_dir(d), problems
        except CheckpointError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{d}: {exc}")
    return None, problems


# ---------------------------------------------------------------- restore
@dataclass
class RestoreReport:
    """Outcome of :func:`restore`: ``status`` is ``restored``, ``missing`` or ``unusable``."""

    status: str
    path: str | None = None
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)
    skipped_models: dict[str, str] = field(default_factory=dict)
    model_version: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def _json(files: dict[str, bytes], name: str) -> Any:
    return _loads(files[name], name)


def _decode_models(config: Any, loaded: Loaded, report: RestoreReport) -> dict[str, Any]:
    """The stored models of enabled algorithms; one that cannot be restored is skipped (the next refit rebuilds it)."""
    from streamsemi.engine import ModelSlot

    out: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    for meta in loaded.manifest["models"]:
        name = meta["algorithm"]
        if name not in config.algorithms:
            report.skipped_models[name] = "not enabled"
            continue
        key = meta["state"]
        try:
            if key not in cache:
                arrays = _load_npz(loaded.files[f"{key}.npz"])
                cache[key] = restore_estimator(_json(loaded.files, f"{key}.json"), arrays, meta["registry"])
            est = cache[key]
            renamed = meta.get("renamed") or {}  # raw cluster name -> public id (streamsemi.core.clusters)
            if not (isinstance(renamed, dict) and all(isinstance(v, str) for v in renamed.values())):
                raise CheckpointError("'renamed' must map cluster names to ids")
            classes = (np.asarray([renamed.get(str(c), str(c)) for c in est.classes_], dtype=object) if renamed
                       else np.asarray(est.classes_))
            slot = ModelSlot(est, meta["version"], float(meta["fitted_at"]), classes,
                             frozenset(meta.get("new_clusters", [])), meta["multilabel"],
                             {k: list(v) for k, v in (meta.get("explain") or {}).items()},
                             fallback=meta.get("fallback", False), n_train=meta.get("n_train", 0), renamed=renamed)
            if [str(c) for c in slot.classes] != meta.get("classes", []):
                raise CheckpointError("restored classes differ from the manifest")
        except Exception as exc:  # noqa: BLE001 - one unrestorable model is rebuilt by the next refit
            report.skipped_models[name] = f"{type(exc).__name__}: {exc}"
            event(log, "checkpoint_model_skipped", logging.WARNING, algorithm=name, reason=report.skipped_models[name])
            continue
        out[name] = slot
    return out


def decode_models(config: Any, manifest: dict[str, Any], files: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, str]]:
    """Model slots of a verified manifest's ``models`` (enabled algorithms only) and the skipped ones with the reason.

    The models topic (:mod:`streamsemi.service.models_topic`) carries a manifest of
    this format with the model files only.
    """
    report = RestoreReport("restored")
    models = _decode_models(config, Loaded(Path("."), manifest, files), report)
    return models, dict(report.skipped_models)


def _engine_json(state: Any) -> dict[str, Any]:
    """Check the structure and types of ``engine.json``."""
    w = "engine.json"
    _require(isinstance(state, dict), w, "must be an object", state)
    for key in ("version", "refit_count", "docs_since_refit"):
        _require(_is_int(state.get(key, 0)) and state.get(key, 0) >= 0, w, f"{key!r} must be a non-negative integer", state.get(key))
    seed_labels = state.get("seed_labels")
    _require(isinstance(seed_labels, list) and all(_is_str_list(x) for x in seed_labels), w,
             "'seed_labels' must be a list of lists of text", seed_labels)
    pending = state.get("pending")
    _require(isinstance(pending, list) and all(
        isinstance(x, list) and len(x) == 4 and isinstance(x[0], str) and _is_str_list(x[1]) and _is_number(x[2])
        and (x[3] is None or _is_int(x[3])) for x in pending), w,
        "'pending' must be a list of [id, labels, expiry, offset or null]", pending)
    last_ops = state.get("last_ops")
    _require(isinstance(last_ops, list) and all(
        isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and _is_int(x[1]) and x[2] in ("label", "unlabel")
        for x in last_ops), w, "'last_ops' must be a list of [id, offset, 'label' | 'unlabel']", last_ops)
    cluster_ids = state.get("cluster_ids", {})
    _require(isinstance(cluster_ids, dict) and all(_is_int(v) and v >= 0 for v in cluster_ids.values()), w,
             "'cluster_ids' must map algorithms to non-negative integers", cluster_ids)
    offsets = state.get("offsets", [])
    _require(isinstance(offsets, list) and all(
        isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and _is_int(x[1]) and _is_int(x[2])
        for x in offsets), w, "'offsets' must be a list of [topic, partition, offset]", offsets)
    return state


def decode(config: Any, loaded: Loaded, report: RestoreReport) -> EngineState:
    """The :class:`EngineState` held by a verified checkpoint, for an engine with ``config``.

    Raises
    ------
    CheckpointError
        Settings that do not match ``config``, files of the wrong structure or types.
    """
    from streamsemi.core.features import WordSketch
    from streamsemi.engine import EngineState

    m = loaded.manifest
    if m["n_features"] != config.n_features or m["stop_words"] != config.stop_words:
        raise CheckpointError(f"checkpoint made with n_features={m['n_features']}, stop_words={m['stop_words']!r}; "
                              f"the worker uses n_features={config.n_features}, stop_words={config.stop_words!r}")
    state = _engine_json(_json(loaded.files, "engine.json"))
    try:
        win = _load_npz(loaded.files["window.npz"])
        seeds_z = _load_npz(loaded.files["seeds.npz"])
    except (ValueError, OSError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read arrays: {exc}") from None
    try:
        win_ids = _arrays_to_strings(win["ids_blob"], win["ids_off"], np.ones(len(win["ids_off"]) - 1, bool))
        texts = _arrays_to_strings(win["text_blob"], win["text_off"], win["has_text"])
        ts = win["ts"]
        if not (len(win_ids) == len(texts) == len(ts)):
            raise CheckpointError("window arrays have different lengths")
        win_rows = _arrays_to_rows(win, "", len(win_ids), config.n_features)
        seed_ids = _arrays_to_strings(seeds_z["ids_blob"], seeds_z["ids_off"], np.ones(len(seeds_z["ids_off"]) - 1, bool))
        seed_rows = _arrays_to_rows(seeds_z, "", len(seed_ids), config.n_features)
        if len(state["seed_labels"]) != len(seed_ids):
            raise CheckpointError("seed labels and seed rows differ in number")
        sketch = WordSketch.from_dict(_json(loaded.files, "sketch.json"))
        if sketch.n_features != config.n_features:
            raise CheckpointError("word sketch of another n_features")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CheckpointError(f"engine state: {type(exc).__name__}: {exc}") from None
    models = _decode_models(config, loaded, report)
    report.offsets = {(t, p): o for t, p, o in state.get("offsets", [])}
    return EngineState(
        window=list(zip(win_ids, ts.tolist(), win_rows, texts, strict=True)),
        seeds=[(k, tuple(lb), row) for k, lb, row in zip(seed_ids, state["seed_labels"], seed_rows, strict=True)],
        pending=[(k, tuple(lb), float(exp), off) for k, lb, exp, off in state["pending"]],
        last_ops=[(k, off, op) for k, off, op in state["last_ops"]],
        version=state["version"], refit_count=state["refit_count"], docs_since_refit=state.get("docs_since_refit", 0),
        models=models, n_features=config.n_features, stop_words=config.stop_words, sketch=sketch,
        cluster_ids=dict(state.get("cluster_ids", {})),
    )


def restore(engine: Engine, state_dir: str | Path) -> RestoreReport:
    """Restore ``engine`` (fresh, empty) from the newest usable checkpoint under ``state_dir``.

    Candidates are tried newest first (the one named by ``CURRENT`` first): any
    failure while reading, verifying, decoding or applying one (logged as
    ``checkpoint_rejected``) moves on to the previous one; when none is usable the
    engine stays empty (``checkpoint_unusable``; the control topic replay brings the
    seeds back). Never raises on a bad checkpoint. Returns what was done.
    """
    root = Path(state_dir)
    dirs = _checkpoint_dirs(root) if root.is_dir() else []
    if not dirs:
        problems = [f"{root}: no state directory" if not root.is_dir() else f"{root}: no checkpoint"]
        event(log, "checkpoint_missing", state_dir=str(state_dir), problems=problems,
              action="starting from empty state; seeds come back from the control topic")
        return RestoreReport("missing", problems=problems)
    problems: list[str] = []
    for d in dirs:
        report = RestoreReport("restored", path=str(d), problems=problems)
        try:
            loaded = read_dir(d)
            state = decode(engine.config, loaded, report)
            engine.restore_state(state)
        except Exception as exc:  # noqa: BLE001 - any failure: try the previous checkpoint
            problem = str(exc) if isinstance(exc, CheckpointError) else f"{d}: {type(exc).__name__}: {exc}"
            problems.append(problem)
            event(log, "checkpoint_rejected", logging.WARNING, path=str(d), problem=problem,
                  action="trying the previous checkpoint")
            continue
        report.models = {name: slot.version for name, slot in engine.models.items()}
        report.model_version = engine.version
        report.counts = {"window": len(engine.window), "seeds": len(engine.seeds),
                         "pending_labels": len(engine.pending), "control_ops": len(state.last_ops),
                         "restored_models": len(engine.models)}
        event(log, "checkpoint_restored", path=str(d), created=loaded.manifest.get("created"),
              model_version=report.model_version, models=report.models, skipped_models=report.skipped_models,
              problems=problems, **report.counts)
        return report
    event(log, "checkpoint_unusable", logging.WARNING, state_dir=str(state_dir), problems=problems,
          action="starting from empty state; seeds come back from the control topic")
    return RestoreReport("unusable", problems=problems)


# ---------------------------------------------------------------- inspect
def inspect(path: str | Path) -> dict[str, Any]:
    """What a checkpoint (a state directory or one ``ckpt-*`` directory) holds, as a JSON-able dict."""
    p = Path(path)
    if (p / "manifest.json").is_file():
        try:
            loaded, problems = read_dir(p), []
        except CheckpointError as exc:
            loaded, problems = None, [str(exc)]
    else:
        loaded, problems = read_latest(p)
    streams = p / "streams"  # per-stream models (streamsemi.service.streams): one checkpoint root per stream
    if streams.is_dir() and not (p / "manifest.json").is_file():
        per = {d.name: inspect(d) for d in sorted(streams.iterdir()) if d.is_dir()}
        info = inspect_streamless(p, loaded, problems)
        return {**info, "valid": info["valid"] or any(v["valid"] for v in per.values()), "streams": per}
    return inspect_streamless(p, loaded, problems)


def inspect_streamless(p: Path, loaded: Loaded | None, problems: list[str]) -> dict[str, Any]:
    """:func:`inspect` of one checkpoint root (without its streams)."""
    if loaded is None:
        return {"path": str(p), "valid": False, "problems": problems}
    m = loaded.manifest
    sizes = {name: len(data) for name, data in loaded.files.items()}
    models = []
    for meta in m.get("models", []):
        key = meta.get("state")
        models.append({"algorithm": meta.get("algorithm"), "registry": meta.get("registry"),
                       "class": meta.get("class"), "version": meta.get("version"),
                       "fitted_at": meta.get("fitted_at"), "fallback": meta.get("fallback"),
                       "classes": len(meta.get("classes", [])), "new_clusters": len(meta.get("new_clusters", [])),
                       "n_train": meta.get("n_train"),
                       "bytes": sizes.get(f"{key}.json", 0) + sizes.get(f"{key}.npz", 0)})
    return {"path": str(loaded.path), "valid": True, "format": m["format"], "format_version": m["format_version"],
            "created": m.get("created"), "streamsemi_version": m.get("streamsemi_version"),
            "n_features": m.get("n_features"), "model_version": m.get("model_version"), "counts": m.get("counts"),
            "models": models, "skipped_models": m.get("skipped_models", []), "files": sizes,
            "total_bytes": sum(sizes.values()), "problems": problems}


def inspect_command(args: argparse.Namespace) -> int:
    """``streamsemi state inspect DIR``: print :func:`inspect` as JSON; exit 1 if no valid checkpoint."""
    info = inspect(args.dir)
    sys.stdout.write(json.dumps(info, indent=2, default=str) + "\n")
    return 0 if info.get("valid") else 1
