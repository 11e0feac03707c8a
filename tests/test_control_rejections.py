"""Control records dead-lettered once across restarts (streamsemi/service/control_rejections.py).

The worker path (a restart replaying a poisoned control topic writes no second dead
letter) is covered by tests/test_hostile.py::test_poison_pills_are_dead_lettered_and_survive_a_restart.
"""

from __future__ import annotations

import json

from streamsemi.service.control_rejections import FILE, RejectedControl, fingerprint


def test_fingerprint_names_partition_offset_and_value():
    fp = fingerprint(2, 17, b'{"op":"bogus"}')
    assert fp.startswith("2:17:") and len(fp.split(":")[2]) == 24
    assert fingerprint(2, 17, b'{"op":"bogus"}') == fp
    # a broker that lost its log and reuses the offset for another record: a different fingerprint
    assert fingerprint(2, 17, b'{"op":"other"}') != fp
    assert fingerprint(3, 17, b'{"op":"bogus"}') != fp
    assert fingerprint(2, 17, None) != fingerprint(2, 17, b"")


def test_only_settled_fingerprints_are_known_and_survive_a_restart(tmp_path):
    r = RejectedControl(tmp_path, "ctl")
    a, b = fingerprint(0, 1, b"x"), fingerprint(0, 2, b"y")
    r.add(a)
    assert not r.known(a), "its dead letter is not acknowledged yet"
    assert r.save() is False and not (tmp_path / FILE).exists()
    r.settle()
    assert r.known(a) and r.replayed == 1
    r.add(b)  # dead letter handed to the producer, then the process dies before the acknowledgement
    assert r.save() is True
    again = RejectedControl(tmp_path, "ctl")
    assert again.load() == 1
    assert again.known(a) and not again.known(b)


def test_a_file_of_another_topic_or_unreadable_is_ignored(tmp_path):
    r = RejectedControl(tmp_path, "ctl")
    r.add(fingerprint(0, 1, b"x"))
    r.settle()
    r.save()
    assert RejectedControl(tmp_path, "other-control").load() == 0
    (tmp_path / FILE).write_text("{not json")
    assert RejectedControl(tmp_path, "ctl").load() == 0
    (tmp_path / FILE).write_text(json.dumps({"topic": "ctl", "entries": ["1:2:zz", 5, fingerprint(0, 3, b"z")]}))
    loaded = RejectedControl(tmp_path, "ctl")
    assert loaded.load() == 1 and loaded.known(fingerprint(0, 3, b"z"))
    (tmp_path / FILE).write_bytes(b" " * 2_000_000)
    assert RejectedControl(tmp_path, "ctl").load() == 0


def test_bounded_oldest_forgotten_first(tmp_path):
    r = RejectedControl(tmp_path, "ctl", max_entries=3)
    fps = [fingerprint(0, i, b"v") for i in range(5)]
    for fp in fps:
        r.add(fp)
    r.settle()
    assert len(r) == 3
    assert [r.known(fp) for fp in fps] == [False, False, True, True, True]
    r.save()
    assert len(json.loads((tmp_path / FILE).read_text())["entries"]) == 3


def test_without_state_dir_nothing_is_remembered():
    r = RejectedControl(None, "ctl")
    fp = fingerprint(0, 1, b"x")
    r.add(fp)
    r.settle()
    assert not r.known(fp) and r.save() is False and r.load() == 0
