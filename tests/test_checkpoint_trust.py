"""Checkpoints stay in their directory: links are not followed, inflation is bounded, restored models are validated.

Each test plants on real files what someone with write access to the state directory
could plant: symbolic links to files and checkpoints elsewhere, a deflate bomb with a
recomputed manifest, a NaN model, stream names that are directory names.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import types
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint import _engine, _fill, _rewrite, _two_checkpoints
from test_streams import NEWS, TECH, _docs, _seed, _streams
from test_streams import _config as _stream_config

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.engine import Engine
from streamsemi.service import checkpoint
from streamsemi.service.checkpoint import CheckpointError
from streamsemi.service.streams import StreamsCheckpointer

LOGGER = "streamsemi.service.checkpoint"


@pytest.fixture(scope="module")
def r8():
    return load("reuters-r8")


@pytest.fixture
def dirs(tmp_path):
    """``(state, outside)``: the state directory and a directory beside it that it must not reach."""
    state, outside = tmp_path / "state", tmp_path / "outside"
    state.mkdir()
    outside.mkdir()
    return state, outside


def _events(caplog, name: str) -> list[dict]:
    return [r.fields for r in caplog.records if r.getMessage() == name]


def _restores_first(state, first, second, a, caplog) -> list[str]:
    """Restore into a fresh engine: the older checkpoint comes back, the newer one is rejected once; its problems."""
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "restored" and rep.path == str(first), rep.problems
    assert "late" not in e.window and len(e.window) == len(a.window) - 1 and e.ready
    rejected = _events(caplog, "checkpoint_rejected")
    assert [r["path"] for r in rejected] == [str(second)]
    assert len(rep.problems) == 1
    return rep.problems


# ---------------------------------------------------------------- files of a checkpoint that are links
def test_a_window_file_linked_to_a_file_outside_is_not_read_and_its_size_not_told(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, outside = dirs
    a, first, second = _two_checkpoints(r8, state)
    secret = outside / "secret"
    secret.write_bytes(b"s" * 12345)
    (second / "window.npz").unlink()
    (second / "window.npz").symlink_to(secret)
    problems = _restores_first(state, first, second, a, caplog)
    assert problems == [f"{second / 'window.npz'}: a symbolic link, not followed"]
    assert "12345" not in json.dumps([r.__dict__.get("fields") for r in caplog.records])
    assert _events(caplog, "checkpoint_rejected")[0]["file"] == str(second / "window.npz")


@pytest.mark.parametrize("fname", ["manifest.json", "window.npz", "seeds.npz", "engine.json", "sketch.json",
                                   "model-0.json", "model-0.npz"])
def test_a_checkpoint_file_linked_to_its_own_copy_outside_is_refused(r8, dirs, caplog, fname):
    """The copy outside is byte for byte the file the checkpoint wrote: only the link makes it wrong."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, outside = dirs
    a, first, second = _two_checkpoints(r8, state)
    shutil.move(second / fname, outside / fname)
    (second / fname).symlink_to(outside / fname)
    problems = _restores_first(state, first, second, a, caplog)
    assert problems == [f"{second / fname}: a symbolic link, not followed"]
    assert _events(caplog, "checkpoint_rejected")[0]["file"] == str(second / fname)


def test_a_current_file_linked_outside_is_ignored(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, outside = dirs
    _, first, second = _two_checkpoints(r8, state)
    (outside / "CURRENT").write_text(first.name + "\n")  # would make the older checkpoint the first candidate
    (state / "CURRENT").unlink()
    (state / "CURRENT").symlink_to(outside / "CURRENT")
    rep = checkpoint.restore(_engine(), state)
    assert rep.status == "restored" and rep.path == str(second) and not rep.problems
    assert _events(caplog, "checkpoint_path_skipped") == [
        {"path": str(state / "CURRENT"), "reason": "a symbolic link, not followed"}]


def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, _ = dirs
    a, first, second = _two_checkpoints(r8, state)
    (second / "engine.json").unlink()
    os.mkfifo(second / "engine.json")  # an open for reading would wait for a writer forever
    problems = _restores_first(state, first, second, a, caplog)
    assert problems == [f"{second / 'engine.json'}: not a regular file"]


# ---------------------------------------------------------------- checkpoint directories that are links
def test_a_linked_checkpoint_with_the_highest_sequence_is_not_restored(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, outside = dirs
    a, first, second = _two_checkpoints(r8, state)
    planted = _engine()
    planted.process([Document("planted", r8.texts[7])])
    foreign = Path(checkpoint.save(planted, outside / "elsewhere")["path"])
    (state / "ckpt-999999999999").symlink_to(foreign, target_is_directory=True)
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "restored" and rep.path == str(second) and "planted" not in e.window
    skipped = _events(caplog, "checkpoint_path_skipped")
    assert skipped == [{"path": str(state / "ckpt-999999999999"), "reason": "a symbolic link, not followed"}]
    # the next checkpoint follows the real ones (not 10**12, a name no restore would find) and is restored
    third = Path(checkpoint.save(a, state)["path"])
    assert third.name == "ckpt-000000000003"
    assert checkpoint.restore(_engine(), state).path == str(third)
    assert (foreign / "manifest.json").is_file()  # pruning removed no checkpoint through the link


def test_the_current_checkpoint_directory_as_a_link_is_skipped(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, outside = dirs
    a, first, second = _two_checkpoints(r8, state)
    shutil.move(second, outside / second.name)
    second.symlink_to(outside / second.name, target_is_directory=True)
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "restored" and rep.path == str(first) and "late" not in e.window
    assert {"path": str(second), "reason": "a symbolic link, not followed"} in _events(caplog, "checkpoint_path_skipped")
    # a checkpoint directory named on the command line is not read through a link either
    with pytest.raises(CheckpointError, match="a symbolic link, not followed"):
        checkpoint.read_dir(second)


# ---------------------------------------------------------------- bounded inflation
def _deflate_bomb(n_floats: int) -> bytes:
    """An .npz whose one member is an .npy of ``n_floats`` zeros, deflated (about 1,000 : 1)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (n_floats,)})
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    parts, crc = [deflate.compress(header.getvalue())], zlib.crc32(header.getvalue())
    zeros, left = bytes(1 << 24), n_floats * 8
    while left:
        chunk = zeros[:min(left, len(zeros))]
        parts.append(deflate.compress(chunk))
        crc, left = zlib.crc32(chunk, crc), left - len(chunk)
    parts.append(deflate.flush())
    packed, size = b"".join(parts), len(header.getvalue()) + n_floats * 8
    name = b"ids_blob.npy"
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc, len(packed), size, len(name), 0)
    central = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, crc, len(packed), size,
                          len(name), 0, 0, 0, 0, 0, 0)
    body = local + name + packed
    cd = central + name
    return body + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), len(body), 0)


def test_a_deflate_bomb_is_stopped_at_its_declared_size(r8, dirs):
    """1.2 GB of zeros in 1.2 MB: rejected after inflating at most the file's declared size (peak memory measured)."""
    state, _ = dirs
    a = _engine()
    _fill(a, r8)
    ckpt = Path(checkpoint.save(a, state)["path"])
    bomb = _deflate_bomb(150_000_000)
    assert len(bomb) < 2_000_000
    _rewrite(ckpt, "window.npz", bomb)  # the manifest's size and checksum recomputed: only the content lies
    script = textwrap.dedent(f"""
        import json, resource, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_checkpoint import _engine
        from streamsemi.service import checkpoint
        e = _engine()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rep = checkpoint.restore(e, {str(state)!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"status": rep.status, "problems": rep.problems, "kib": after - before,
                          "window": len(e.window)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kib"] < 200 * 1024, f"peak resident memory grew by {got['kib']} KiB while restoring"
    assert got["status"] == "unusable" and got["window"] == 0, got
    assert len(got["problems"]) == 1 and "inflates to more than the" in got["problems"][0], got


def test_inflation_is_bounded_by_the_size_given_and_a_stored_member_too():
    arrays = {"a": np.arange(1000, dtype=np.int64), "b": np.ones((3, 4), dtype=np.float32)}
    data = checkpoint._npz_bytes(arrays)
    back = checkpoint._load_npz(data)
    assert back.keys() == arrays.keys() and all(np.array_equal(back[k], v) for k, v in arrays.items())
    assert all(v.flags.writeable and v.flags.aligned for v in back.values())
    with pytest.raises(CheckpointError, match="more than the .* left of the file's declared size"):
        checkpoint._load_npz(data, limit=5000)  # a's 8,000 bytes alone pass it
    deflated = io.BytesIO()
    with zipfile.ZipFile(deflated, "w", compression=zipfile.ZIP_DEFLATED) as z:
        buf = io.BytesIO()
        np.save(buf, np.zeros(100_000))
        z.writestr("a.npy", buf.getvalue())
    with pytest.raises(CheckpointError, match="'a.npy' inflates to more than the"):
        checkpoint._load_npz(deflated.getvalue())
    assert checkpoint._load_npz(deflated.getvalue(), limit=900_000)["a"].shape == (100_000,)


@pytest.mark.parametrize("case", ["object dtype", "header larger than data", "not an npy", "structured dtype"])
def test_an_npz_member_that_lies_about_its_array_is_refused(case):
    buf = io.BytesIO()
    if case == "object dtype":
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "header larger than data":
        np.save(buf, np.zeros(10))
        buf = io.BytesIO(buf.getvalue().replace(b"(10,)", b"(99,)"))  # the header claims 99 of the 10 floats
    elif case == "not an npy":
        buf.write(b"import os; os.system('true')")
    else:
        np.save(buf, np.zeros(3, dtype=[("x", "<f8")]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("a.npy", buf.getvalue())
    expected = {"object dtype": "Object arrays cannot be loaded when allow_pickle=False",
                "header larger than data": "80 bytes of data for shape (99,)",
                "not an npy": "not an .npy array", "structured dtype": "are not read"}[case]
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        checkpoint._load_npz(out.getvalue())


# ---------------------------------------------------------------- restored models are validated
def test_a_nan_model_rejects_its_checkpoint_and_the_previous_one_is_restored(r8, dirs, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, _ = dirs
    a = _engine()
    _fill(a, r8)
    first = Path(checkpoint.save(a, state)["path"])
    model = a.models["constrained-kmeans"].model
    model.cluster_centers_ = np.full_like(model.cluster_centers_, np.nan)
    second = Path(checkpoint.save(a, state)["path"])  # written by save itself: manifest, sizes, checksums all right
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "restored" and rep.path == str(first), rep.problems
    assert np.isfinite(e.models["constrained-kmeans"].model.cluster_centers_).all()
    assert len(rep.problems) == 1
    assert rep.problems[0].startswith(f"{second / 'model-0.json'}: model of 'constrained-kmeans' refused: non_finite")
    rejected = _events(caplog, "checkpoint_rejected")
    assert [(r["path"], r["file"]) for r in rejected] == [(str(second), str(second / "model-0.json"))]
    # with the NaN checkpoint alone: an empty start, not a NaN model
    shutil.rmtree(first)
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "unusable" and not e.models and len(e.window) == 0 and len(e.seeds) == 0


@pytest.mark.parametrize("field", ["seed_labels", "pending"])
@pytest.mark.parametrize("label", ["grain\n", " grain", "gr\u200bain", "..", "new-3", "g/rain"])
def test_a_label_that_is_no_class_label_rejects_its_checkpoint_then_an_empty_start(r8, dirs, caplog, field, label):
    """A label a control message could not carry, planted in ``engine.json`` with the manifest recomputed: the
    checkpoint is refused like any other bad content (the previous one restored, without that checkpoint nothing)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    state, _ = dirs
    a, first, second = _two_checkpoints(r8, state)
    doc = json.loads((second / "engine.json").read_text())
    if field == "seed_labels":
        doc["seed_labels"][0] = [label]
    else:
        assert doc["pending"], "the engine holds a label for a document that never came"
        doc["pending"][0][1] = [label]
    _rewrite(second, "engine.json", json.dumps(doc).encode())
    problems = _restores_first(state, first, second, a, caplog)
    assert problems[0].startswith(f"engine.json: {field!r} holds a label that is no class label: it must"), problems
    shutil.rmtree(first)
    e = _engine()
    rep = checkpoint.restore(e, state)
    assert rep.status == "unusable" and len(e.seeds) == 0 and len(e.window) == 0 and not e.models


# ---------------------------------------------------------------- per-stream checkpoint roots
@pytest.mark.parametrize("name", ["news", "..", ".", "CURRENT", "ckpt-000000000001", "streams", "-a_b.c",
                                  "stream=6e", "é/ü\n", "x" * 120])
def test_a_stream_directory_name_is_one_safe_directory_and_gives_the_name_back(name):
    d = checkpoint.stream_dir_name(name)
    assert d.startswith("stream=") and "/" not in d and d not in (".", "..") and len(d.encode()) <= 255
    assert checkpoint.stream_from_dir_name(d) == name


def test_a_directory_name_that_no_stream_has_gives_no_stream():
    for d in ("news", "stream=", "stream=6", "stream=6E", "stream=zz", "stream=ff", "stream=6e/..", "ckpt-1"):
        assert checkpoint.stream_from_dir_name(d) is None, d
    with pytest.raises(CheckpointError, match="1..120"):
        checkpoint.stream_dir_name("x" * 121)


def test_streams_dot_and_dotdot_are_written_inside_their_own_directories(r8, dirs):
    state, _ = dirs
    engines = {}
    for k, name in enumerate(("..", ".", "CURRENT")):
        eng = _engine()
        eng.process([Document(f"{k}-{i}", r8.texts[i]) for i in range(k + 1)])
        engines[name] = eng
    done: list = []
    cp = StreamsCheckpointer(state, on_done=done.append, on_error=lambda exc, reason: done.append(exc))
    assert cp.submit(types.SimpleNamespace(engines=engines), "test") and cp.wait(60)
    assert not isinstance(done[0], Exception), done
    assert sorted(os.listdir(state)) == ["streams"]  # nothing of ".." in the state directory's root
    assert sorted(os.listdir(state / "streams")) == sorted(checkpoint.stream_dir_name(n) for n in engines)
    for k, name in enumerate(engines):
        e = _engine()
        assert checkpoint.restore(e, state, stream=name).status == "restored"
        assert e.window.ids() == [f"{k}-{i}" for i in range(k + 1)]
    assert sorted(checkpoint.stream_roots(state)) == sorted(engines)


def test_a_stream_root_of_a_name_that_is_no_stream_name_restores_no_stream(r8, dirs, caplog):
    """Roots for ``..``, ``.`` and ``grain\\n`` planted beside a real stream's (each a valid checkpoint): a worker that
    allows any stream restores the real one only, and no phantom stream appears."""
    caplog.set_level(logging.INFO)
    state, _ = dirs
    engines = {}
    for k, name in enumerate(("news", "..", ".", "grain\n")):
        eng = Engine(_stream_config())   # the configuration of the StreamEngines restoring them
        eng.process([Document(f"{k}-{i}", r8.texts[i]) for i in range(k + 2)])
        engines[name] = eng
    done: list = []
    cp = StreamsCheckpointer(state, on_done=done.append, on_error=lambda exc, reason: done.append(exc))
    assert cp.submit(types.SimpleNamespace(engines=engines), "test") and cp.wait(60)
    assert not isinstance(done[0], Exception), done
    se = _streams(names=("*",), default="news", max_streams=8)
    rep = se.restore(state)
    assert rep.status == "restored"
    assert sorted(se.engines) == ["news"] and len(se.engines["news"].window) == 2
    skipped = sorted(r.fields["stream"] for r in caplog.records if r.getMessage() == "stream_checkpoint_skipped")
    assert skipped == sorted(["..", ".", "grain\n"])


def test_stream_checkpoints_use_encoded_directories_and_inspect_shows_the_names(tmp_path):
    import random

    rng = random.Random(3)
    se = _streams(names=("news", "tech-2.b_c"))
    _seed(se, "news", NEWS, rng)
    _seed(se, "tech-2.b_c", TECH, rng, offset=100)
    se.process(_docs("news", NEWS, rng, 30) + _docs("tech-2.b_c", TECH, rng, 25))
    done: list = []
    cp = StreamsCheckpointer(tmp_path, on_done=done.append, on_error=lambda exc, reason: done.append(exc))
    assert cp.submit(se, "test") and cp.wait(60) and not isinstance(done[0], Exception)
    assert sorted(os.listdir(tmp_path / "streams")) == ["stream=6e657773", "stream=746563682d322e625f63"]
    out = subprocess.run([sys.executable, "-m", "streamsemi", "state", "inspect", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert sorted(info["streams"]) == ["news", "tech-2.b_c"]
    assert info["streams"]["tech-2.b_c"]["counts"]["window"] == 25 and info["streams"]["news"]["valid"]
    again = _streams(names=("news", "tech-2.b_c"))
    assert again.restore(tmp_path).status == "restored" and len(again.engines["tech-2.b_c"].window) == 25


def test_a_stream_checkpoint_of_the_earlier_layout_is_migrated_and_restored(tmp_path, caplog):
    """``streams/<name>/`` (what earlier releases wrote) becomes ``streams/stream=<hex>/``; leftovers are not streams."""
    import random

    caplog.set_level(logging.INFO)
    rng = random.Random(4)
    se = _streams()
    _seed(se, "news", NEWS, rng)
    se.process(_docs("news", NEWS, rng, 30))
    cap = checkpoint.capture(se.engines["news"])
    checkpoint.write(tmp_path / "streams" / "news", cap)  # the earlier layout: the name as the directory
    checkpoint.write(tmp_path / "streams", cap)           # what a stream named "." left in streams/ itself
    again = _streams()
    report = again.restore(tmp_path)
    assert report.status == "restored" and len(again.engines["news"].window) == 30
    assert sorted(report.models) == ["news/constrained-kmeans"]
    assert sorted(os.listdir(tmp_path / "streams")) == ["CURRENT", "ckpt-000000000001", "stream=6e657773"]
    migrated = _events(caplog, "stream_checkpoint_migrated")
    assert migrated == [{"stream": "news", "path": str(tmp_path / "streams" / "news"),
                         "to": str(tmp_path / "streams" / "stream=6e657773")}]
    assert {"path": str(tmp_path / "streams" / "ckpt-000000000001"), "reason": "not the checkpoint root of a stream"} \
        in _events(caplog, "checkpoint_path_skipped")
    # the next start finds it where it now is
    assert _streams().restore(tmp_path).status == "restored"


def test_a_stream_root_or_streams_directory_that_is_a_link_is_neither_read_nor_written(r8, dirs, caplog):
    caplog.set_level(logging.INFO)
    state, outside = dirs
    a = _engine()
    _fill(a, r8)
    foreign = outside / "other-state"
    checkpoint.write(foreign, checkpoint.capture(a), stream="news")
    (state / "streams").mkdir()
    enc = checkpoint.stream_dir_name("news")
    (state / "streams" / enc).symlink_to(foreign / "streams" / enc, target_is_directory=True)
    before = sorted(os.listdir(foreign / "streams" / enc))
    assert checkpoint.stream_roots(state) == {}
    assert {"path": str(state / "streams" / enc), "reason": "a symbolic link, not followed"} \
        in _events(caplog, "checkpoint_path_skipped")
    e = _engine()
    rep = checkpoint.restore(e, state, stream="news")
    assert rep.status == "unusable" and rep.problems == [f"{state / 'streams' / enc}: a symbolic link, not followed"]
    assert len(e.window) == 0
    with pytest.raises(CheckpointError, match="a symbolic link, not followed"):
        checkpoint.write(state, checkpoint.capture(a), stream="news")
    assert sorted(os.listdir(foreign / "streams" / enc)) == before  # nothing written through the link
    # streams/ itself a link
    (state / "streams" / enc).unlink()
    (state / "streams").rmdir()
    (state / "streams").symlink_to(foreign / "streams", target_is_directory=True)
    assert checkpoint.stream_roots(state) == {}
    with pytest.raises(CheckpointError, match="a symbolic link, not followed"):
        checkpoint.write(state, checkpoint.capture(a), stream="news")
    assert sorted(os.listdir(foreign / "streams" / enc)) == before
    assert checkpoint.read_latest(state, stream="news")[0] is None


def test_writes_replace_planted_links_instead_of_writing_through_them(r8, dirs):
    state, outside = dirs
    a = _engine()
    _fill(a, r8)
    target = outside / "victim"
    target.write_text("keep me")
    (state / "CURRENT").symlink_to(target)
    (state / "ckpt-000000000001").symlink_to(outside, target_is_directory=True)  # where the first checkpoint goes
    (state / ".tmp-ckpt-000000000009-abcdef").symlink_to(outside, target_is_directory=True)  # a "leftover"
    path = Path(checkpoint.save(a, state)["path"])
    assert path == state / "ckpt-000000000001" and path.is_dir() and not path.is_symlink()
    assert target.read_text() == "keep me" and sorted(os.listdir(outside)) == ["victim"]
    assert not (state / "CURRENT").is_symlink() and (state / "CURRENT").read_text() == path.name + "\n"
    assert not os.path.lexists(state / ".tmp-ckpt-000000000009-abcdef")
    assert checkpoint.restore(_engine(), state).path == str(path)


# ---------------------------------------------------------------- the worker's other files in the state directory
def test_control_rejections_and_the_inflight_marker_are_not_read_through_links(dirs, caplog):
    from kafka import TopicPartition

    from streamsemi.service.control_rejections import FILE, RejectedControl, fingerprint
    from streamsemi.service.inflight import MARKER, InFlightMarker

    caplog.set_level(logging.INFO)
    state, outside = dirs
    theirs = RejectedControl(outside, "streamsemi.control")  # valid files, written by the code itself, elsewhere
    theirs.add(fingerprint(0, 7, b"{}"))
    theirs.settle()
    assert theirs.save()
    InFlightMarker(outside).begin([(TopicPartition("docs", 0), 5)])
    for name in (FILE, MARKER):
        (state / name).symlink_to(outside / name)
    assert RejectedControl(outside, "streamsemi.control").load() == 1  # what a link would have brought in
    ours = RejectedControl(state, "streamsemi.control")
    assert ours.load() == 0 and not ours.known(fingerprint(0, 7, b"{}"))
    marker = InFlightMarker(state)
    marker.load()
    assert marker.suspects == {} and marker.crashes == 0
    errors = [r.fields["error"] for r in caplog.records
              if r.getMessage() in ("control_rejections_unreadable", "inflight_marker_unreadable")]
    assert len(errors) == 2 and all("a symbolic link, not followed" in e for e in errors), errors
    assert (outside / MARKER).is_file() and (outside / FILE).is_file()  # only the links were dropped, if anything
