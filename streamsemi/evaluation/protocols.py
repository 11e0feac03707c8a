"""Dataset subsets and the five papers' evaluation protocols.

A *dataset id* names a corpus and a subset of it (``20ng-comp5``,
``reuters-top30-r3``, ...); :func:`prepare` vectorises each corpus once with
:class:`streamsemi.core.features.TextFeaturizer` (only the rows some requested dataset
needs) and every run and method reuses that matrix. A *protocol* fixes the
datasets, the label amounts, the metrics and the number of runs of one paper's
experiment; :func:`make_draw` draws the seed labels of one run.

Seed draws are stratified (every class gets at least one seed) and come from a
``numpy.random.Generator`` seeded by ``(seed, dataset, label amount, run)``, so
every method sees exactly the same seeds and a run can be repeated.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamsemi.core import datasets
from streamsemi.core.features import TextFeaturizer
from streamsemi.evaluation.errors import EvaluationError

NG_COMP5 = ["comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware",
            "comp.sys.mac.hardware", "comp.windows.x"]
NG_TALK4 = ["talk.politics.guns", "talk.politics.mideast", "talk.politics.misc", "talk.religion.misc"]

#: D-LDA paper, Table II. The paper marks its two known classes in bold, which the
#: text extraction lost; we take the first two groups listed for each task as known.
DLDA_TASKS: dict[str, list[str]] = {
    "20ng-easy1": ["comp.graphics", "rec.autos", "sci.crypt", "talk.politics.guns"],
    "20ng-easy2": ["comp.os.ms-windows.misc", "rec.motorcycles", "sci.electronics",
                   "talk.politics.mideast"],
    "20ng-easy3": ["comp.sys.ibm.pc.hardware", "rec.sport.baseball", "sci.med", "talk.politics.misc"],
    "20ng-easy4": ["comp.sys.mac.hardware", "rec.sport.hockey", "sci.space", "talk.religion.misc"],
    "20ng-difficult1": ["comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware",
                        "comp.sys.mac.hardware"],
    "20ng-difficult2": ["rec.autos", "rec.motorcycles", "rec.sport.baseball", "rec.sport.hockey"],
    "20ng-difficult3": ["sci.crypt", "sci.electronics", "sci.med", "sci.space"],
    "20ng-difficult4": ["talk.politics.guns", "talk.politics.mideast", "talk.politics.misc",
                        "talk.religion.misc"],
}
DLDA_N_KNOWN = 2


@dataclass(frozen=True)
class DatasetSpec:
    """A named subset of a corpus.

    Attributes
    ----------
    id : str
        Dataset id used on the command line and in the JSON records.
    corpus : str
        :func:`streamsemi.core.datasets.load` name.
    kind : {"single", "multi"}
        ``"single"``: one class per document; ``"multi"``: a list of classes.
    classes : tuple of str or None
        Fixed class list (None: chosen by ``top_n``).
    top_n : int or None
        For Reuters: keep the ``top_n`` most frequent topics (single-label
        documents only when ``kind == "single"``).
    draw_classes : int or None
        Number of classes drawn at random in every run (the CLE protocol).
    known : tuple of str
        Classes that receive seeds (D-LDA semi-defined tasks); empty: all classes.
    description : str
    window : int or None
        Small-window setting: every run uses a stratified random sample of this many
        documents (the same sample for every label amount of that run).
    max_words : int or None
        Short-text setting: each document keeps only its first ``max_words``
        whitespace-separated words (:func:`short_text`) before vectorising.
    base : str or None
        The dataset id this one is a setting of: ``--max-docs`` draws the same
        stories for both (the subsample is seeded by ``base``).
    """

    id: str
    corpus: str
    kind: str = "single"
    classes: tuple[str, ...] | None = None
    top_n: int | None = None
    draw_classes: int | None = None
    known: tuple[str, ...] = ()
    description: str = ""
    window: int | None = None
    max_words: int | None = None
    base: str | None = None


#: The robustness protocol's settings: dataset-id suffix -> (window, max_words, description).
ROBUSTNESS_WINDOW = 500
ROBUSTNESS_WORDS = 30
ROBUSTNESS_SETTINGS: dict[str, tuple[int | None, int | None, str]] = {
    "": (None, None, ""),
    f"-w{ROBUSTNESS_WINDOW}": (ROBUSTNESS_WINDOW, None,
                               f"; small window: {ROBUSTNESS_WINDOW} documents per run"),
    f"-short{ROBUSTNESS_WORDS}": (None, ROBUSTNESS_WORDS,
                                  f"; short text: first {ROBUSTNESS_WORDS} words of each document"),
}
#: The robustness protocol's corpora (none of them reported by a paper protocol).
ROBUSTNESS_BASE = ("reuters-r52", "20ng", "reuters-top30", "reuters-r8", "reuters-multilabel20")


def short_text(text: str, max_words: int) -> str:
    """The first ``max_words`` whitespace-separated words of ``text``, joined by single spaces."""
    return " ".join(text.split(maxsplit=max_words)[:max_words])


def _dataset_specs() -> dict[str, DatasetSpec]:
    specs = [
        DatasetSpec("20ng-comp5", "20newsgroups", classes=tuple(NG_COMP5),
                    description="20 Newsgroups, the 5 comp.* groups"),
        DatasetSpec("20ng-talk4", "20newsgroups", classes=tuple(NG_TALK4),
                    description="20 Newsgroups, the 4 talk.* groups"),
        DatasetSpec("reuters-top10", "reuters21578", top_n=10,
                    description="Reuters-21578 single-label stories of the 10 largest classes "
                                "(counted over single-label stories)"),
        DatasetSpec("20ng", "20newsgroups", description="20 Newsgroups, all 20 groups"),
        DatasetSpec("reuters-r8", "reuters-r8",
                    description="Reuters-21578 R8 (7,674 single-label stories, 8 classes): not in "
                                "a paper protocol; the robustness protocol and the reference baselines use it"),
        DatasetSpec("reuters-multilabel20", "reuters21578", kind="multi", top_n=20,
                    description="Reuters-21578 stories with at least one of the 20 most frequent "
                                "topics; labels restricted to those 20"),
        DatasetSpec("reuters-r52", "reuters-r52",
                    description="Reuters-21578 R52 (9,100 single-label stories, 52 skewed classes)"),
        DatasetSpec("reuters-top30", "reuters21578", top_n=30,
                    description="Reuters-21578 single-label stories of the 30 largest classes, all "
                                "30 at once"),
    ]
    base = {s.id: s for s in specs}
    for d in ROBUSTNESS_BASE:
        for suffix, (window, words, text) in ROBUSTNESS_SETTINGS.items():
            if suffix:
                specs.append(replace(base[d], id=d + suffix, window=window, max_words=words, base=d,
                                     description=base[d].description + text))
    for r in range(2, 7):
        specs.append(DatasetSpec(f"reuters-top30-r{r}", "reuters21578", top_n=30, draw_classes=r,
                                 description=f"Reuters-21578 single-label stories of the 30 largest "
                                             f"classes; {r} classes drawn at random per run"))
    for name, groups in DLDA_TASKS.items():
        specs.append(DatasetSpec(name, "20newsgroups", classes=tuple(groups),
                                 known=tuple(groups[:DLDA_N_KNOWN]),
                                 description=f"20 Newsgroups D-LDA task {name[5:]}: "
                                             f"{', '.join(groups)}; known: {', '.join(groups[:2])}"))
    return {s.id: s for s in specs}


DATASETS: dict[str, DatasetSpec] = _dataset_specs()


@dataclass(frozen=True)
class Protocol:
    """One paper's experiment.

    Attributes
    ----------
    name : str
    datasets : tuple of str
    labels : tuple of float
        Default label amounts: percentages (``label_unit == "percent"``) or numbers
        of labeled documents (``"count"``, FSL).
    label_unit : {"percent", "count"}
    metrics : tuple of str
        Metric names reported (see :mod:`streamsemi.evaluation.metrics`).
    runs : int
        Default number of runs (seed draws; for CLE, draws of the r classes).
    baselines : tuple of str
        Methods always run beside the requested algorithms.
    default_algorithm : str
        The paper's algorithm (registry name), run when ``--algorithm`` is omitted.
    paper : str
        The table or figure the protocol mirrors.
    n_unlabeled : int
        FSL only: unlabeled documents per run.
    algorithms : tuple of str
        Algorithms run when ``--algorithm`` is omitted (empty: ``default_algorithm``).
    multi_methods : tuple of str
        When set, the methods run on multi-label datasets: these plus the multi-label
        algorithms (the others are skipped there); ``multi_only`` methods are skipped on
        single-label datasets. Empty: every method on every dataset.
    multi_only : tuple of str
    auto_new_clusters : bool
        Also fit every algorithm that can choose the number of new clusters from the
        data with ``n_new_clusters="auto"`` (reported as ``NAME (auto)``), beside the
        run with the true number of unseeded classes (d-lda protocol).
    """

    name: str
    datasets: tuple[str, ...]
    labels: tuple[float, ...]
    label_unit: str
    metrics: tuple[str, ...]
    runs: int
    baselines: tuple[str, ...]
    default_algorithm: str
    paper: str
    n_unlabeled: int = 0
    description: str = ""
    algorithms: tuple[str, ...] = ()
    multi_methods: tuple[str, ...] = ()
    multi_only: tuple[str, ...] = ()
    auto_new_clusters: bool = False


SINGLE_BASELINES = ("constrained-kmeans", "seeded-kmeans", "label-spreading", "self-training",
                    "supervised-linear")

PROTOCOLS: dict[str, Protocol] = {
    "semi-ldc": Protocol(
        "semi-ldc", ("20ng-comp5", "20ng-talk4", "reuters-top10"), (1, 2, 3, 4, 5), "percent",
        ("macro_f1",), 10, SINGLE_BASELINES, "semi-ldc",
        "Semi-LDC paper (Liu et al. 2014), Tables IV-VI: macro-F1, 1-5% labels, 10 runs",
        description="Seeds are 1-5% of every class; macro-F1 after mapping clusters to classes."),
    "cle": Protocol(
        "cle", tuple(f"reuters-top30-r{r}" for r in range(2, 7)), (3, 5, 7, 9), "percent",
        ("accuracy", "nmi_max"), 20, SINGLE_BASELINES, "cle",
        "CLE paper (Chen et al. 2010), Table 4 (Reuters): accuracy and NMI, r = 2..6 classes",
        description="Each run draws r of the 30 largest single-label Reuters classes (the same r "
                    "classes for every label fraction of that run), then 3-9% seeds per class."),
    "d-lda": Protocol(
        "d-lda", tuple(DLDA_TASKS), (10, 20, 30, 40, 50, 60), "percent",
        ("nmi_mean", "pairwise_f", "macro_f1"), 10,
        ("constrained-kmeans", "seeded-kmeans", "two-step"), "d-lda",
        "D-LDA paper (Zhuang et al. 2010), Fig. 3-5 (bar charts): NMI, pairwise F, macro-F1",
        description="2 of the 4 groups are known: 10-60% of their documents are seeds; the other "
                    "2 groups have no seed and must be found as new clusters. NMI (arithmetic "
                    "mean normalisation) and pairwise F over the documents of all 4 groups, "
                    "macro-F1 over the 2 known classes. Every method is given the true number "
                    "of unseeded groups (2); rows `NAME (auto)` are the algorithms that choose "
                    "it from the data (`n_new_clusters=\"auto\"`).",
        auto_new_clusters=True),
    "fsl": Protocol(
        "fsl", ("reuters-top10", "20ng"), (20, 50, 100, 200, 300, 400), "count",
        ("f_measure", "entropy"), 10, SINGLE_BASELINES, "fsl-ck",
        "FSL paper (Guan et al.), Tables 2-5: F-measure and entropy, 400 unlabeled + 10-400 labeled",
        n_unlabeled=400,
        description="Every run: the given number of labeled documents (stratified, at least one "
                    "per class) plus 400 random unlabeled ones; scored on the 400."),
    "pseudo-lsc": Protocol(
        "pseudo-lsc", ("reuters-multilabel20",), (50,), "percent", ("macro_auc",), 5,
        ("ovr-linear", "constrained-kmeans"), "pseudo-lsc",
        "pseudo-LSC paper (Ahmed, Khan, Oza), Fig. 2(b)/Table 3: macro ROC AUC, 50/50 split",
        description="A random half of the stories are seeds with all their (top-20) topics; "
                    "macro ROC AUC of the per-class scores on the other half."),
    "robustness": Protocol(
        "robustness", tuple(d + suffix for suffix in ROBUSTNESS_SETTINGS for d in ROBUSTNESS_BASE),
        (1, 5), "percent", ("macro_f1", "macro_auc", "example_f1"), 3,
        SINGLE_BASELINES + ("ovr-linear",), "semi-ldc",
        "Robustness: corpora no paper protocol reports, 1% and 5% stratified seeds",
        algorithms=("semi-ldc", "cle", "d-lda", "fsl-ck", "pseudo-lsc", "ensemble"),
        multi_methods=("ovr-linear", "constrained-kmeans"), multi_only=("ovr-linear",),
        description="Every algorithm and the baselines on Reuters R52, all of 20 Newsgroups, the 30 "
                    "largest single-label Reuters-21578 topics at once and Reuters R8 (macro-F1), "
                    "and pseudo-LSC on the multi-label Reuters-21578 (top-20 topics; macro ROC AUC "
                    "and example-based F1 of the chosen label sets). Each corpus also in a "
                    f"small-window setting (`-w{ROBUSTNESS_WINDOW}`: {ROBUSTNESS_WINDOW} documents "
                    f"per run) and a short-text setting (`-short{ROBUSTNESS_WORDS}`: the first "
                    f"{ROBUSTNESS_WORDS} words of each document). D-LDA runs with "
                    "n_new_clusters=0 (no draw has unseeded classes)."),
}


def methods_for(protocol: Protocol, spec: DatasetSpec, methods: Sequence[str],
                multilabel: Sequence[str] = ()) -> list[str]:
    """The methods of ``methods`` that ``protocol`` runs on dataset ``spec``.

    Parameters
    ----------
    multilabel : sequence of str
        Names of the multi-label algorithms (run on multi-label datasets).
    """
    if not protocol.multi_methods:
        return list(methods)
    if spec.kind == "multi":
        return [m for m in methods if m in protocol.multi_methods or m in multilabel]
    return [m for m in methods if m not in protocol.multi_only]


def label_fraction_of(protocol: Protocol, value: float) -> float:
    """The record's ``label_fraction`` for a label amount of ``protocol``.

    Percent amounts become fractions (5 -> 0.05); FSL counts become
    ``n_labeled / (n_labeled + n_unlabeled)`` (the paper's 2.5-50%).
    """
    if protocol.label_unit == "count":
        return float(value) / (float(value) + protocol.n_unlabeled)
    return float(value) / 100.0


# --------------------------------------------------------------------------- data

@dataclass
class PreparedDataset:
    """A dataset id's documents, vectorised.

    Attributes
    ----------
    spec : DatasetSpec
    X : csr_matrix
        Hashed term counts (rows = documents of this subset, no empty row).
    labels : list
        Class per document (str) or list of classes (multi-label).
    texts : list of str
    doc_ids : list of str
        ``corpus:index`` ids.
    dates : list or None
        Publication times (Reuters) for stream replay.
    classes : list of str
        The subset's classes, sorted.
    """

    spec: DatasetSpec
    X: sp.csr_matrix
    labels: list
    texts: list[str]
    doc_ids: list[str]
    dates: list | None
    classes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.X.shape[0]


def _select_rows(spec: DatasetSpec, ds: datasets.Dataset) -> tuple[list[int], list]:
    """Rows of the corpus in the subset and their (restricted) labels."""
    if spec.kind == "multi":
        freq = Counter(t for labs in ds.labels for t in labs)
        top = {t for t, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[: spec.top_n]}
        rows, labels = [], []
        for i, labs in enumerate(ds.labels):
            keep = sorted(t for t in labs if t in top)
            if keep:
                rows.append(i)
                labels.append(keep)
        return rows, labels
    if ds.multilabel:  # single-label documents of a multi-label corpus
        single = [(i, labs[0]) for i, labs in enumerate(ds.labels) if len(labs) == 1]
        if spec.classes is not None:
            keep = set(spec.classes)
        else:
            freq = Counter(lab for _, lab in single)
            keep = {t for t, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[: spec.top_n]}
        pairs = [(i, lab) for i, lab in single if lab in keep]
    else:
        keep = set(spec.classes) if spec.classes is not None else set(ds.labels)
        pairs = [(i, lab) for i, lab in enumerate(ds.labels) if lab in keep]
    return [i for i, _ in pairs], [lab for _, lab in pairs]


def stratified_subsample(labels: Sequence[Any], n: int, rng: np.random.Generator,
                         min_per_class: int = 2) -> np.ndarray:
    """Sorted indices of about ``n`` items keeping the class proportions.

    Every class keeps at least ``min(min_per_class, its size)`` items; the rest of
    the quota is split proportionally (largest remainder).
    """
    keys = np.asarray([lab[0] if isinstance(lab, list) else lab for lab in labels], dtype=object)
    if n >= keys.size:
        return np.arange(keys.size)
    classes, inv = np.unique(keys, return_inverse=True)
    sizes = np.bincount(inv)
    floor = np.minimum(sizes, min_per_class)
    extra = max(n - int(floor.sum()), 0)
    share = (sizes - floor) / max(int((sizes - floor).sum()), 1) * extra
    quota = floor + np.floor(share).astype(int)
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    for c in order[: max(n - int(quota.sum()), 0)]:
        if quota[c] < sizes[c]:
            quota[c] += 1
    out = [rng.permutation(np.flatnonzero(inv == c))[: quota[c]] for c in range(classes.size)]
    return np.sort(np.concatenate(out))


class _ShortTexts:
    """``texts[i]`` cut to its first ``max_words`` words, computed on access."""

    def __init__(self, texts: Sequence[str], max_words: int) -> None:
        self.texts = texts
        self.max_words = max_words

    def __getitem__(self, i: int) -> str:
        return short_text(self.texts[i], self.max_words)


def prepare(dataset_ids: Sequence[str], max_docs: int | None = None, seed: int = 0,
            n_features: int = 2**18) -> dict[str, PreparedDataset]:
    """Load and vectorise the given datasets, each corpus once.

    Parameters
    ----------
    dataset_ids : sequence of str
        Keys of :data:`DATASETS`.
    max_docs : int, optional
        Keep at most this many documents per dataset (stratified, seeded): the
        quick mode of tests and reduced results pages.
    seed : int
        Seed of the subsampling.
    n_features : int
        Hashing dimension.

    Returns
    -------
    dict
        Dataset id -> :class:`PreparedDataset`. Documents whose text has no term
        after stop-word removal are dropped (the algorithms reject empty rows).
    """
    unknown = [d for d in dataset_ids if d not in DATASETS]
    if unknown:
        raise EvaluationError(f"unknown dataset id(s) {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    by_corpus: dict[tuple[str, int | None], list[str]] = {}
    for d in dict.fromkeys(dataset_ids):
        by_corpus.setdefault((DATASETS[d].corpus, DATASETS[d].max_words), []).append(d)
    loaded: dict[str, datasets.Dataset] = {}
    out: dict[str, PreparedDataset] = {}
    for (corpus, max_words), ids in by_corpus.items():
        if corpus not in loaded:
            loaded[corpus] = datasets.load(corpus)
        ds = loaded[corpus]
        texts = ds.texts if max_words is None else _ShortTexts(ds.texts, max_words)
        selections: dict[str, tuple[list[int], list]] = {}
        for d in ids:
            rows, labels = _select_rows(DATASETS[d], ds)
            if max_docs is not None and len(rows) > max_docs:
                rng = np.random.default_rng([seed, zlib.crc32((DATASETS[d].base or d).encode())])
                keep = stratified_subsample(labels, max_docs, rng)
                rows = [rows[i] for i in keep]
                labels = [labels[i] for i in keep]
            selections[d] = (rows, labels)
        needed = sorted({i for rows, _ in selections.values() for i in rows})
        X_all = TextFeaturizer(n_features=n_features).transform([texts[i] for i in needed],
                                                                update_sketch=False)
        pos = {row: k for k, row in enumerate(needed)}
        for d, (rows, labels) in selections.items():
            X = X_all[[pos[i] for i in rows]]
            nonempty = np.flatnonzero(np.diff(X.indptr) > 0)
            rows = [rows[i] for i in nonempty]
            labels = [labels[i] for i in nonempty]
            flat = {t for lab in labels for t in (lab if isinstance(lab, list) else [lab])}
            out[d] = PreparedDataset(
                spec=DATASETS[d], X=sp.csr_matrix(X[nonempty]), labels=labels,
                texts=[texts[i] for i in rows], doc_ids=[f"{corpus}:{i}" for i in rows],
                dates=[ds.dates[i] for i in rows] if ds.dates is not None else None,
                classes=sorted(flat))
    return out


# --------------------------------------------------------------------------- draws

@dataclass
class Draw:
    """The seeds of one run on one dataset.

    Attributes
    ----------
    rows : ndarray of int
        Rows of the prepared dataset that this run uses (fit on all of them).
    y_true : list
        True label (str, or list of str for multi-label) of each of ``rows``.
    seed_mask : ndarray of bool
        Which of ``rows`` are seeds; scores are computed on the others.
    known : list of str
        Classes that have seeds.
    n_new : int
        Classes without seeds (D-LDA: the clusters to discover).
    classes : list of str
        All classes of the draw.
    """

    rows: np.ndarray
    y_true: list
    seed_mask: np.ndarray
    known: list[str]
    n_new: int
    classes: list[str]

    @property
    def eval_mask(self) -> np.ndarray:
        return ~self.seed_mask

    def y_fit_single(self, freq: dict[str, int] | None = None) -> list[str | None]:
        """Seed labels for single-label estimators (None = unlabeled).

        A multi-label seed keeps its most frequent class (``freq``, then name).
        """
        out: list[str | None] = []
        for lab, s in zip(self.y_true, self.seed_mask, strict=True):
            if not s:
                out.append(None)
            elif isinstance(lab, list):
                out.append(min(lab, key=lambda t: (-(freq or {}).get(t, 0), t)))
            else:
                out.append(lab)
        return out

    def y_fit_multi(self) -> list[list[str]]:
        """Seed labels for multi-label estimators ([] = unlabeled)."""
        return [(list(lab) if isinstance(lab, list) else [lab]) if s else []
                for lab, s in zip(self.y_true, self.seed_mask, strict=True)]


def draw_rng(seed: int, *parts: Any) -> np.random.Generator:
    """Generator seeded by ``seed`` and a tuple of strings / numbers."""
    key = [int(seed)] + [zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(key)


def stratified_seeds(labels: Sequence[str], rng: np.random.Generator, fraction: float | None = None,
                     count: int | None = None) -> np.ndarray:
    """Boolean mask of seeds: per class ``max(1, round(fraction * size))``, or ``count`` in all.

    With ``count``, the seeds are split over the classes in proportion to their
    sizes (largest remainder), at least one per class; a class never gets all its
    documents unless it has a single one.
    """
    y = np.asarray(labels, dtype=object)
    classes, inv = np.unique(y, return_inverse=True)
    sizes = np.bincount(inv)
    if fraction is not None:
        quota = np.maximum(1, np.rint(fraction * sizes).astype(int))
    else:
        if count is None or count < classes.size:
            raise EvaluationError(f"{count} seeds cannot cover {classes.size} classes (one each at least)")
        share = sizes / sizes.sum() * (count - classes.size)
        quota = 1 + np.floor(share).astype(int)
        order = np.argsort(-(share - np.floor(share)), kind="stable")
        quota[order[: count - int(quota.sum())]] += 1
    quota = np.minimum(quota, np.maximum(sizes - 1, 1))
    mask = np.zeros(y.size, dtype=bool)
    for c in range(classes.size):
        members = np.flatnonzero(inv == c)
        mask[rng.permutation(members)[: quota[c]]] = True
    return mask


def make_draw(protocol: Protocol, data: PreparedDataset, label_value: float, run: int,
              seed: int = 0) -> Draw:
    """Draw the seeds of run ``run`` at label amount ``label_value`` (see :class:`Protocol`)."""
    spec = data.spec
    rng = draw_rng(seed, spec.id, label_value, run)
    rows = np.arange(len(data))
    if spec.window is not None:  # the same window for every label amount of this run
        rows = stratified_subsample(data.labels, spec.window, draw_rng(seed, spec.id, "window", run))
    if spec.kind == "multi":
        n_seed = int(round(label_value / 100.0 * rows.size))
        mask = np.zeros(rows.size, dtype=bool)
        mask[rng.permutation(rows.size)[:n_seed]] = True
        y_multi = [data.labels[i] for i in rows]
        classes = sorted({t for lab in y_multi for t in lab})
        return Draw(rows, y_multi, mask, classes, 0, classes)
    labels = np.asarray(data.labels, dtype=object)
    if spec.draw_classes is not None:
        counts = Counter(data.labels)
        eligible = sorted(c for c, n in counts.items() if n >= 2)
        if len(eligible) < spec.draw_classes:
            raise EvaluationError(f"{spec.id}: only {len(eligible)} classes with >= 2 documents")
        crng = draw_rng(seed, spec.id, "classes", run)  # same classes for every label amount
        chosen = set(crng.choice(eligible, size=spec.draw_classes, replace=False).tolist())
        rows = np.flatnonzero(np.isin(labels, list(chosen)))
    y = labels[rows]
    classes = sorted(set(y.tolist()))
    if protocol.label_unit == "count":
        n_lab = int(label_value)
        seed_local = stratified_seeds(y, rng, count=n_lab)
        pool = np.flatnonzero(~seed_local)
        unl = rng.permutation(pool)[: protocol.n_unlabeled]
        keep = np.sort(np.concatenate([np.flatnonzero(seed_local), unl]))
        rows = rows[keep]
        return Draw(rows, y[keep].tolist(), seed_local[keep], classes, 0, classes)
    known = list(spec.known) if spec.known else classes
    mask = np.zeros(rows.size, dtype=bool)
    in_known = np.flatnonzero(np.isin(y, known))
    mask[in_known] = stratified_seeds(y[in_known], rng, fraction=label_value / 100.0)
    return Draw(rows, y.tolist(), mask, known, len(classes) - len(known), classes)
