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

Nothing under the state directory is trusted to stay inside it: no symbolic link is
followed there (directories are opened with ``O_NOFOLLOW`` one level at a time, files
with ``O_NOFOLLOW`` and must be regular files by ``fstat``; listings skip links with a
``checkpoint_path_skipped`` event), a file is read only up to the size its manifest
declares, an ``.npz`` is inflated only up to its own declared size (the arrays are
stored uncompressed; a compressed member may not expand past it), and a restored model
passes :func:`streamsemi.service.model_validation.validate_model`, the check a model
from the models topic passes. The state directory itself may be a link (the operator's
choice). Per-stream checkpoint roots are ``<state_dir>/streams/stream=<hex of the UTF-8
name>/`` (:func:`stream_dir_name`), never the stream name itself.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import stat
import struct
import sys
import threading
import time
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from streamsemi import __version__
from streamsemi.core.errors import StreamsemiError
from streamsemi.core.logs import event
from streamsemi.core.names import check_name

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
#: the most bytes read from one checkpoint file, or inflated from one ``.npz``, whatever its manifest says
MAX_FILE_BYTES = 4 << 30
#: the most bytes read from a ``manifest.json`` (it lists files, models, classes and explanations)
MAX_MANIFEST_BYTES = 64 << 20
#: the most bytes read from ``CURRENT`` (one directory name)
MAX_CURRENT_BYTES = 4096
#: the directory of the per-stream checkpoint roots, and the prefix of each root's name in it
STREAMS_DIR = "streams"
STREAM_DIR_PREFIX = "stream="
_STREAM_DIR_NAME = re.compile(r"^stream=((?:[0-9a-f]{2}){1,120})$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = os.O_NOFOLLOW


class CheckpointError(StreamsemiError):
    """A checkpoint is missing, of another format version, or corrupted.

    ``file`` is the path of the file or directory at fault, when one is.
    """

    def __init__(self, message: str, file: str | Path | None = None) -> None:
        super().__init__(message)
        self.file = None if file is None else str(file)


class _Missing(CheckpointError):
    """The file or directory does not exist."""


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
def _path_error(where: Path, exc: OSError, dir_fd: int | None = None, name: str | None = None) -> CheckpointError:
    """The :class:`CheckpointError` of a failed open of ``where`` (a link is named as one)."""
    is_link = exc.errno == errno.ELOOP
    if not is_link and exc.errno in (errno.ENOTDIR, errno.EMLINK):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False) if dir_fd is not None else os.lstat(where)
            is_link = stat.S_ISLNK(st.st_mode)
        except OSError:
            pass
    if is_link:
        return CheckpointError(f"{where}: a symbolic link, not followed", where)
    if exc.errno == errno.ENOENT:
        return _Missing(f"{where}: missing", where)
    if exc.errno == errno.ENOTDIR:
        return CheckpointError(f"{where}: not a directory", where)
    return CheckpointError(f"{where}: {exc.strerror or exc}", where)


def _open_dir(where: Path, dir_fd: int | None = None, name: str | None = None, follow: bool = False) -> int:
    """A file descriptor of the directory ``where`` (``name`` in ``dir_fd`` when given), not through a link
    unless ``follow`` (only the state directory itself, the operator's choice, is followed)."""
    flags = _DIR_FLAGS | (0 if follow else _NOFOLLOW)
    try:
        return os.open(name if dir_fd is not None else where, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _path_error(where, exc, dir_fd, name) from None


def _root_parts(stream: str | None) -> tuple[str, ...]:
    """The directories below the state directory of a checkpoint root (none: the state directory's own)."""
    return () if stream is None else (STREAMS_DIR, stream_dir_name(stream))


def _open_root(state_dir: Path, stream: str | None, create: bool = False,
               parts: tuple[str, ...] | None = None) -> tuple[int, Path]:
    """``(fd, path)`` of a checkpoint root: ``state_dir``, or its stream's root under :data:`STREAMS_DIR`.

    The state directory itself is followed if it is a link (the operator's choice); the
    directories below it (``parts``, by default :func:`_root_parts` of ``stream``) are
    opened one at a time without following a link, and made when ``create``. The
    caller closes the descriptor.
    """
    fd = _open_dir(state_dir, follow=True)
    path = state_dir
    try:
        for part in _root_parts(stream) if parts is None else parts:
            path = path / part
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            nfd = _open_dir(path, fd, part)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, path


def _read_at(dir_fd: int, name: str, where: Path, limit: int, expect: int | None = None) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``, opened without following a link.

    With ``expect`` (the manifest's size) the file must have exactly that many bytes,
    checked before anything is read; at most ``limit`` bytes are ever read.
    """
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError as exc:
        raise _path_error(where, exc, dir_fd, name) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: not a regular file", where)
        if expect is not None and st.st_size != expect:
            raise CheckpointError(f"{where}: {st.st_size} bytes, manifest says {expect} (truncated?)", where)
        if st.st_size > limit:
            raise CheckpointError(f"{where}: {st.st_size} bytes, more than the {limit} a checkpoint file may have",
                                  where)
        want = min(limit, st.st_size if expect is None else expect)
        data = _read_up_to(fd, want + 1)
    except OSError as exc:
        raise CheckpointError(f"{where}: {exc.strerror or exc}", where) from None
    finally:
        os.close(fd)
    if len(data) > want or (expect is not None and len(data) != expect):
        raise CheckpointError(f"{where}: changed while read ({len(data)} bytes)", where)
    return data


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the file ``path`` in the state directory, not through a symbolic link, at most ``limit`` of them.

    For the worker's other files there (``control_rejections.json``, ``inflight.json``):
    the last component is opened with ``O_NOFOLLOW`` and must be a regular file whose
    size, checked before anything is read, is at most ``limit``.

    Raises
    ------
    OSError
        Missing, a link (``ELOOP``, "a symbolic link, not followed"), not a regular file,
        larger than ``limit`` (``EFBIG``), or a read error.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than {limit}", str(path))
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"more than {limit} bytes", str(path))
    return data


def _read_up_to(fd: int, n: int) -> bytes:
    """At most ``n`` bytes of ``fd`` (fewer at its end), read in steps of 16 MiB."""
    chunks, got = [], 0
    while got < n and (chunk := os.read(fd, min(n - got, 1 << 24))):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


def _write_file(dir_fd: int, name: str, data: bytes) -> dict[str, Any]:
    """Write ``data`` to ``name`` in ``dir_fd`` atomically (a new temporary file, fsync, rename); its sha256 and size.

    The temporary file is created exclusively and without following a link, and the
    rename replaces a link planted at ``name`` instead of writing through it.
    """
    tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666,
                 dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


_ZIP_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # signature ... file name length, extra field length
_NPY_DTYPE_KINDS = "biufcUS"
_NPY_MAX_HEADER = 10_000  # numpy's own default bound on an .npy header


def _load_npz(data: bytes, limit: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``, never inflating more than ``limit`` bytes in all (``pickle`` never used).

    ``limit`` defaults to the file's own size (the size its manifest declares, once
    verified): :func:`_npz_bytes` stores its members uncompressed, so a member that
    would expand past it is refused as soon as its output does, before more is
    inflated; never more than :data:`MAX_FILE_BYTES`. Each member must be an ``.npy``
    of a numeric, boolean or text dtype whose data has exactly the size of its shape.

    Raises
    ------
    CheckpointError
        Not a zip, a member that is not an array, an object dtype ("Object arrays
        cannot be loaded when allow_pickle=False"), a compression other than deflate,
        a bad checksum, or more output than ``limit``.
    """
    budget = min(len(data) if limit is None else limit, MAX_FILE_BYTES)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"not an .npz archive ({exc})") from None
    out: dict[str, np.ndarray] = {}
    with zf:
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".npy") or name[:-4] in out:
                raise CheckpointError(f"npz member {name[:80]!r} is not an array or comes twice")
            raw = _zip_member(data, info, budget)
            budget -= len(raw)
            out[name[:-4]] = _npy_array(raw, name)
    return out


def _zip_member(data: bytes, info: zipfile.ZipInfo, budget: int) -> bytearray:
    """The contents of one zip member, inflated in steps of at most ``budget + 1`` bytes of output."""
    name = info.filename[:80]
    at = info.header_offset
    if info.flag_bits & 0x1 or at < 0 or at + _ZIP_LOCAL_HEADER.size > len(data):
        raise CheckpointError(f"npz member {name!r}: encrypted or outside the archive")
    sig, *_, name_len, extra_len = _ZIP_LOCAL_HEADER.unpack_from(data, at)
    start = at + _ZIP_LOCAL_HEADER.size + name_len + extra_len
    end = start + info.compress_size
    if sig != b"PK\x03\x04" or end > len(data):
        raise CheckpointError(f"npz member {name!r}: bad local header or truncated")
    packed = memoryview(data)[start:end]
    if info.compress_type == zipfile.ZIP_STORED:
        if len(packed) > budget:
            raise CheckpointError(f"npz member {name!r}: {len(packed)} bytes, more than the {budget} left "
                                  "of the file's declared size")
        raw = bytearray(packed)
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        raw, pending = bytearray(), bytes(packed)
        try:
            while not inflater.eof:
                chunk = inflater.decompress(pending, min(budget - len(raw) + 1, 1 << 24))
                raw += chunk
                if len(raw) > budget:
                    raise CheckpointError(f"npz member {name!r} inflates to more than the {budget} bytes left of "
                                          "the file's declared size (stopped there)")
                pending = inflater.unconsumed_tail
                if not chunk and not pending:
                    break
        except zlib.error as exc:
            raise CheckpointError(f"npz member {name!r}: {exc}") from None
        if not inflater.eof:
            raise CheckpointError(f"npz member {name!r}: compressed data ends early")
    else:
        raise CheckpointError(f"npz member {name!r}: compression method {info.compress_type} is not read")
    if zlib.crc32(raw) != info.CRC:
        raise CheckpointError(f"npz member {name!r}: CRC mismatch")
    return raw


def _npy_array(raw: bytearray, name: str) -> np.ndarray:
    """The array of an ``.npy`` held in ``raw`` (no copy: the array is a writable view of ``raw``)."""
    where = f"npz member {name[:80]!r}"
    if len(raw) < 12 or bytes(raw[:6]) != b"\x93NUMPY" or raw[6] not in (1, 2):
        raise CheckpointError(f"{where}: not an .npy array of format version 1 or 2")
    start = 10 if raw[6] == 1 else 12
    header_len = int.from_bytes(raw[8:start], "little")
    if header_len > _NPY_MAX_HEADER or start + header_len > len(raw):
        raise CheckpointError(f"{where}: .npy header of {header_len} bytes")
    fp = io.BytesIO(bytes(raw[:start + header_len]))
    fp.seek(8)
    try:
        reader = np.lib.format.read_array_header_1_0 if raw[6] == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(fp, max_header_size=_NPY_MAX_HEADER)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise CheckpointError(f"{where}: bad .npy header ({exc})") from None
    if dtype.hasobject:
        raise CheckpointError(f"{where}: Object arrays cannot be loaded when allow_pickle=False")
    if dtype.kind not in _NPY_DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CheckpointError(f"{where}: arrays of dtype {dtype} are not read")
    count = math.prod(shape)
    if dtype.itemsize == 0 and count:
        raise CheckpointError(f"{where}: items of zero size")
    offset = start + header_len
    if len(raw) - offset != count * dtype.itemsize:
        raise CheckpointError(f"{where}: {len(raw) - offset} bytes of data for shape {shape} of {dtype}")
    if not count:
        return np.empty(shape, dtype=dtype)
    flat = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)


def stream_dir_name(stream: str) -> str:
    """The directory name of ``stream``'s checkpoint root in ``<state_dir>/streams/``: ``stream=<hex of its UTF-8>``.

    Never the name itself (``..``, ``.`` or ``CURRENT`` would land elsewhere), always
    one directory level, and reversible (:func:`stream_from_dir_name`).

    Raises
    ------
    CheckpointError
        A name whose UTF-8 takes more than 120 bytes (the directory name would pass the
        file system's 255).
    """
    raw = stream.encode("utf-8")
    if not raw or len(raw) > 120:
        raise CheckpointError(f"stream name of {len(raw)} UTF-8 bytes: a checkpoint directory holds 1..120")
    return STREAM_DIR_PREFIX + raw.hex()


def stream_from_dir_name(dirname: str) -> str | None:
    """The stream whose checkpoint root :func:`stream_dir_name` names ``dirname``, or None when it names none."""
    m = _STREAM_DIR_NAME.match(dirname)
    if not m:
        return None
    try:
        return bytes.fromhex(m.group(1)).decode("utf-8")
    except UnicodeDecodeError:
        return None


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


def _entries(dir_fd: int) -> list[os.DirEntry]:
    with os.scandir(dir_fd) as it:
        return list(it)


def _ckpt_seq(name: str) -> int:
    return int(name.split("-")[1])


def _next_sequence(root_fd: int) -> int:
    """One past the newest checkpoint directory (links with a checkpoint's name are not checkpoints)."""
    seqs = [_ckpt_seq(e.name) for e in _entries(root_fd)
            if _DIR_NAME.match(e.name) and e.is_dir(follow_symlinks=False)]
    return max(seqs, default=0) + 1


def write(state_dir: str | Path, cap: Capture, keep: int = KEEP, *, stream: str | None = None) -> dict[str, Any]:
    """Write a captured checkpoint atomically; returns ``{"path", "bytes", "seconds"}``.

    ``stream``: into that stream's root ``<state_dir>/streams/stream=<hex>/``
    (:func:`stream_dir_name`), made if missing. Nothing below ``state_dir`` is written
    through a symbolic link: a link where ``streams/`` or the stream's root should be
    makes the write fail (:class:`CheckpointError`), one planted where a file or the
    new checkpoint directory goes is replaced, not followed.
    """
    t0 = time.perf_counter()
    base = Path(state_dir)
    base.mkdir(parents=True, exist_ok=True)
    root_fd, root = _open_root(base, stream, create=True)
    try:
        name = f"ckpt-{_next_sequence(root_fd):012d}"
        tmp = f".tmp-{name}-{uuid.uuid4().hex[:6]}"
        os.mkdir(tmp, dir_fd=root_fd)
        try:
            tmp_fd = _open_dir(root / tmp, root_fd, tmp)
            try:
                entries = {fname: _write_file(tmp_fd, fname, data) for fname, data in cap.files.items()}
                manifest = {**cap.manifest, "files": entries}
                _write_file(tmp_fd, "manifest.json", _json_bytes(manifest))
                _fsync_fd(tmp_fd)
            finally:
                os.close(tmp_fd)
            try:  # a link (or file) planted under the new checkpoint's name goes; a directory would stay
                if not stat.S_ISDIR(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=root_fd)
            except FileNotFoundError:
                pass
            os.replace(tmp, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            _fsync_fd(root_fd)
            _write_file(root_fd, CURRENT, (name + "\n").encode())
            _fsync_fd(root_fd)
        except BaseException:
            shutil.rmtree(tmp, dir_fd=root_fd, ignore_errors=True)
            raise
        _prune(root_fd, name, keep)
    finally:
        os.close(root_fd)
    total = sum(e["bytes"] for e in entries.values())
    return {"path": str(root / name), "bytes": total, "seconds": round(time.perf_counter() - t0, 3)}


def _prune(root_fd: int, current: str, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoint directories and leftover temporary files (links: only the link)."""
    entries = _entries(root_fd)
    dirs = sorted((e.name for e in entries if _DIR_NAME.match(e.name) and e.is_dir(follow_symlinks=False)),
                  key=_ckpt_seq)
    for name in dirs[:-keep] if keep > 0 else dirs:
        if name != current:
            shutil.rmtree(name, dir_fd=root_fd, ignore_errors=True)
    for e in entries:
        if e.name.startswith(".tmp-") or (e.name.startswith(f".{CURRENT}.") and e.name.endswith(".tmp")):
            try:
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.name, dir_fd=root_fd, ignore_errors=True)
                else:
                    os.unlink(e.name, dir_fd=root_fd)
            except OSError:
                pass


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


def _skipped(path: Path, reason: str) -> None:
    event(log, "checkpoint_path_skipped", logging.WARNING, path=str(path), reason=reason)


def _checkpoint_names(root_fd: int, root: Path) -> list[str]:
    """Candidate checkpoint directories of an open root: the one ``CURRENT`` names first, then newest first.

    Only real directories: a link with a checkpoint's name, or a ``CURRENT`` that is a
    link or not a regular file, is skipped with a ``checkpoint_path_skipped`` event.
    """
    current = None
    try:
        text = _read_at(root_fd, CURRENT, root / CURRENT, MAX_CURRENT_BYTES)
        current = text.decode("utf-8", errors="replace").strip()
    except _Missing:
        pass
    except CheckpointError as exc:
        _skipped(root / CURRENT, str(exc).removeprefix(f"{root / CURRENT}: "))
    names = []
    for e in _entries(root_fd):
        if not _DIR_NAME.match(e.name):
            continue
        if e.is_symlink():
            _skipped(root / e.name, "a symbolic link, not followed")
        elif e.is_dir(follow_symlinks=False):
            names.append(e.name)
    names.sort(key=_ckpt_seq, reverse=True)
    return ([current] if current in names else []) + [n for n in names if n != current]


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


def read_dir(path: str | Path, *, _dir_fd: int | None = None) -> Loaded:
    """Read and verify one checkpoint directory.

    The directory, ``manifest.json`` and every file it lists are opened without
    following a symbolic link and must be a directory / regular files; a file is read
    only when its size is the one the manifest declares (at most
    :data:`MAX_FILE_BYTES`; the manifest at most :data:`MAX_MANIFEST_BYTES`).

    Raises
    ------
    CheckpointError
        A link, missing manifest, bad JSON, another format or version, a manifest of
        the wrong structure (:func:`validate_manifest`), a missing file, a size or
        SHA-256 mismatch; ``file`` names the file at fault.
    """
    path = Path(path)
    fd = _open_dir(path, _dir_fd, path.name if _dir_fd is not None else None)
    try:
        mpath = path / "manifest.json"
        try:
            raw = _read_at(fd, "manifest.json", mpath, MAX_MANIFEST_BYTES)
        except _Missing:
            raise CheckpointError(f"{path}: no manifest.json", mpath) from None
        try:
            manifest = _loads(raw, str(mpath))
            validate_manifest(manifest, str(mpath))
        except CheckpointError as exc:
            raise CheckpointError(str(exc), mpath) from None
        files: dict[str, bytes] = {}
        for fname, meta in manifest["files"].items():
            fpath = path / fname
            if meta["bytes"] < 0 or meta["bytes"] > MAX_FILE_BYTES:
                raise CheckpointError(f"{fpath}: the manifest declares {meta['bytes']} bytes, a checkpoint file "
                                      f"holds 0..{MAX_FILE_BYTES}", fpath)
            data = _read_at(fd, fname, fpath, MAX_FILE_BYTES, expect=meta["bytes"])
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise CheckpointError(f"{fpath}: checksum mismatch", fpath)
            files[fname] = data
    finally:
        os.close(fd)
    for required in ("engine.json", "window.npz", "seeds.npz", "sketch.json"):
        if required not in files:
            raise CheckpointError(f"{path}: {required} missing from the manifest", path / "manifest.json")
    return Loaded(path, manifest, files)


def _read_candidates(root_fd: int, root: Path, problems: list[str]) -> Iterator[Loaded]:
    """The verified checkpoints of an open root, in :func:`_checkpoint_names` order; failures go to ``problems``."""
    for name in _checkpoint_names(root_fd, root):
        try:
            yield read_dir(root / name, _dir_fd=root_fd)
        except CheckpointError as exc:
            problems.append(str(exc))


def read_latest(state_dir: str | Path, *, stream: str | None = None) -> tuple[Loaded | None, list[str]]:
    """Newest verified checkpoint under ``state_dir`` (CURRENT first) and the problems met on the way.

    ``stream``: of that stream's root (:func:`stream_dir_name`).
    """
    try:
        parts = _root_parts(stream)
    except CheckpointError as exc:
        return None, [str(exc)]
    return _read_latest(Path(state_dir), parts)


def _read_latest(state_dir: Path, parts: tuple[str, ...]) -> tuple[Loaded | None, list[str]]:
    try:
        root_fd, root = _open_root(state_dir, None, parts=parts)
    except _Missing:
        return None, [f"{state_dir}: no state directory" if not parts else f"{state_dir / Path(*parts)}: missing"]
    except CheckpointError as exc:
        return None, [str(exc)]
    problems: list[str] = []
    try:
        for loaded in _read_candidates(root_fd, root, problems):
            return loaded, problems
    finally:
        os.close(root_fd)
    return None, problems or [f"{root}: no checkpoint"]


def stream_roots(state_dir: str | Path, *, migrate: bool = True) -> dict[str, Path]:
    """The per-stream checkpoint roots under ``<state_dir>/streams/``: stream name -> directory.

    Directories named by :func:`stream_dir_name`; links and other entries are skipped
    (``checkpoint_path_skipped``). A directory of the earlier layout, named by the
    stream itself (a valid stream name holding ``CURRENT`` or ``ckpt-*`` directories),
    is renamed to its encoded name when ``migrate`` (``stream_checkpoint_migrated``;
    left alone when the encoded one exists too) or, without ``migrate`` (``state
    inspect``), listed where it is. A ``streams/`` that is a link gives nothing.
    """
    from streamsemi.service.config import stream_name_problem

    base = Path(state_dir)
    try:
        sfd, streams = _open_root(base, None, parts=(STREAMS_DIR,))
    except _Missing:
        return {}
    except CheckpointError as exc:
        _skipped(base / STREAMS_DIR, str(exc).removeprefix(f"{base / STREAMS_DIR}: "))
        return {}
    out: dict[str, Path] = {}
    legacy: list[str] = []
    try:
        for e in sorted(_entries(sfd), key=lambda e: e.name):
            if e.is_symlink():
                _skipped(streams / e.name, "a symbolic link, not followed")
            elif not e.is_dir(follow_symlinks=False):
                continue
            elif (name := stream_from_dir_name(e.name)) is not None:
                out[name] = streams / e.name
            elif not e.name.startswith(STREAM_DIR_PREFIX) and stream_name_problem(e.name) is None:
                legacy.append(e.name)
            else:
                _skipped(streams / e.name, "not the checkpoint root of a stream")
        for name in legacy:
            here = _entries_or_none(sfd, name)
            if here is None or not (CURRENT in here or any(_DIR_NAME.match(n) for n in here)):
                _skipped(streams / name, "not the checkpoint root of a stream")
                continue
            try:
                target = stream_dir_name(name)
            except CheckpointError as exc:
                _skipped(streams / name, str(exc))
                continue
            if name in out:
                _skipped(streams / name, f"a checkpoint root of the earlier layout; {target} is used instead")
            elif not migrate:
                out[name] = streams / name
            else:
                try:
                    os.rename(name, target, src_dir_fd=sfd, dst_dir_fd=sfd)
                    _fsync_fd(sfd)
                except OSError as exc:
                    _skipped(streams / name, f"a checkpoint root of the earlier layout that cannot be renamed to "
                                             f"{target}: {exc.strerror or exc}")
                    continue
                event(log, "stream_checkpoint_migrated", stream=name, path=str(streams / name),
                      to=str(streams / target))
                out[name] = streams / target
    finally:
        os.close(sfd)
    return out


def _entries_or_none(dir_fd: int, name: str) -> set[str] | None:
    """Names in the directory ``name`` of ``dir_fd`` (not through a link), or None when it cannot be opened."""
    try:
        fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return {e.name for e in _entries(fd)}
    finally:
        os.close(fd)


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


def _decode_models(config: Any, loaded: Loaded, report: RestoreReport, validate: bool = False) -> dict[str, Any]:
    """The stored models of enabled algorithms; one that cannot be restored is skipped (the next refit rebuilds it).

    ``validate`` (a restore): a model that :func:`~streamsemi.service.model_validation.validate_model`
    refuses (NaN centroids, another width, a shadowed method, ...) is not skipped but
    rejects the whole checkpoint (:class:`CheckpointError` naming its file): its values
    were written by someone else than this code, so nothing else of it is trusted.
    """
    from streamsemi.engine import ModelSlot
    from streamsemi.service.model_validation import validate_model

    out: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    checked: set[str] = set()
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
        if validate and key not in checked:
            reason = validate_model(meta["registry"], est, n_features=config.n_features)
            if reason is not None:
                raise CheckpointError(f"{loaded.path / (key + '.json')}: model of {name!r} refused: {reason}",
                                      loaded.path / f"{key}.json")
            checked.add(key)
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
    # the labels a control message could not carry either (a "grain\n" would become a class of its own)
    for what, lists in (("seed_labels", seed_labels), ("pending", [x[1] for x in pending])):
        for labels in lists:
            for label in labels:
                problem = check_name("label", label)
                _require(problem is None, w, f"{what!r} holds a label that is no class label: it {problem}", label)
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
    models = _decode_models(config, loaded, report, validate=True)
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


def restore(engine: Engine, state_dir: str | Path, *, stream: str | None = None) -> RestoreReport:
    """Restore ``engine`` (fresh, empty) from the newest usable checkpoint under ``state_dir``.

    ``stream``: from that stream's root ``<state_dir>/streams/stream=<hex>/``.
    Candidates are tried newest first (the one named by ``CURRENT`` first; links are
    never candidates): any failure while reading, verifying, decoding, validating a
    model (:func:`streamsemi.service.model_validation.validate_model`) or applying one
    (logged as ``checkpoint_rejected`` with the file at fault and the reason) moves on
    to the previous one; when none is usable the engine stays empty
    (``checkpoint_unusable``; the control topic replay brings the seeds back). Never
    raises on a bad checkpoint. Returns what was done.
    """
    try:
        root_fd, root = _open_root(Path(state_dir), stream)
    except CheckpointError as exc:
        missing = isinstance(exc, _Missing)
        problems = [f"{state_dir}: no state directory" if missing and stream is None
                    else f"{state_dir}: no checkpoint of stream {stream!r}" if missing else str(exc)]
        event(log, "checkpoint_missing" if missing else "checkpoint_unusable",
              logging.INFO if missing else logging.WARNING, state_dir=str(state_dir), problems=problems,
              action="starting from empty state; seeds come back from the control topic")
        return RestoreReport("missing" if missing else "unusable", problems=problems)
    try:
        return _restore_from(engine, root_fd, root)
    finally:
        os.close(root_fd)


def _restore_from(engine: Engine, root_fd: int, root: Path) -> RestoreReport:
    names = _checkpoint_names(root_fd, root)
    if not names:
        problems = [f"{root}: no checkpoint"]
        event(log, "checkpoint_missing", state_dir=str(root), problems=problems,
              action="starting from empty state; seeds come back from the control topic")
        return RestoreReport("missing", problems=problems)
    problems: list[str] = []
    for name in names:
        d = root / name
        report = RestoreReport("restored", path=str(d), problems=problems)
        try:
            loaded = read_dir(d, _dir_fd=root_fd)
            state = decode(engine.config, loaded, report)
            engine.restore_state(state)
        except Exception as exc:  # noqa: BLE001 - any failure: try the previous checkpoint
            problem = str(exc) if isinstance(exc, CheckpointError) else f"{d}: {type(exc).__name__}: {exc}"
            problems.append(problem)
            event(log, "checkpoint_rejected", logging.WARNING, path=str(d), problem=problem,
                  file=getattr(exc, "file", None) or str(d), action="trying the previous checkpoint")
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
    event(log, "checkpoint_unusable", logging.WARNING, state_dir=str(root), problems=problems,
          action="starting from empty state; seeds come back from the control topic")
    return RestoreReport("unusable", problems=problems)


# ---------------------------------------------------------------- inspect
def inspect(path: str | Path) -> dict[str, Any]:
    """What a checkpoint (a state directory or one ``ckpt-*`` directory) holds, as a JSON-able dict.

    A state directory's per-stream roots are under ``streams``, by stream name (read
    only: a root of the earlier layout is shown, not migrated).
    """
    p = Path(path)
    if _is_checkpoint_dir(p):
        try:
            return inspect_streamless(p, read_dir(p), [])
        except CheckpointError as exc:
            return inspect_streamless(p, None, [str(exc)])
    loaded, problems = read_latest(p)
    info = inspect_streamless(p, loaded, problems)
    roots = stream_roots(p, migrate=False)
    if not roots:
        return info
    per = {}
    for name, root in roots.items():
        loaded, problems = _read_latest(p, (STREAMS_DIR, root.name))
        per[name] = inspect_streamless(root, loaded, problems)
    return {**info, "valid": info["valid"] or any(v["valid"] for v in per.values()), "streams": per}


def _is_checkpoint_dir(p: Path) -> bool:
    """Whether ``p`` holds a ``manifest.json`` entry (of any type: :func:`read_dir` judges it)."""
    return os.path.lexists(p / "manifest.json")


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
