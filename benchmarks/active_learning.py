"""Label efficiency of the suggestions (issue 15 part 4), and what ranking costs a refit round.

``python benchmarks/active_learning.py curves`` (default): in process through
:class:`streamsemi.engine.Engine` (``background_refit=False``, every refit trigger off,
the whole corpus in the window). A simulated annotator (the corpus' true labels) starts
from the same stratified seeds in both arms (``--initial`` per class) and after every
refit labels ``--k`` more documents:

* ``suggested``: the top ``k`` of the engine's suggestion list (rank order), as a person
  working the console's queue would;
* ``random``: ``k`` documents drawn uniformly from the unlabelled ones.

After each refit the primary model's label of every non-seed document is scored
against the corpus label (macro-F1 over the corpus' classes,
:func:`streamsemi.evaluation.metrics.macro_f1_known`). The reference is one fit with a
uniformly random 5% of the corpus as seeds (``--reference``; the same algorithms and
``--algorithm-params`` as the arms). Every figure is the mean over ``--seeds`` random
seeds (document order, initial seeds, random draws). The target of the issue: the
``suggested`` curve reaches the 5%-random macro-F1 with at most 2% of the documents
labelled.

How the target is measured: the curve has a checkpoint at exactly
``floor(--target-fraction * N)`` labels (:func:`checkpoints`; the batch that would cross it
is cut short, :func:`batch_size`, so one refit happens there), and "at 2%" is the
macro-F1 of that point (:func:`at_fraction`), not of the last multiple of ``k`` below it.
"Reached at" is the first checkpoint whose mean macro-F1 is >= the reference
(:func:`first_reaching`, no interpolation between checkpoints).

``python benchmarks/active_learning.py cost``: a 10,000-document 20NG window with
``--cost-seeds`` random seeds; per algorithm set, the refit round's time without and
with the ranking (``Engine.last_suggestion_seconds``) and their ratio (target < 10%).

Corpora: ``r8`` (Reuters R8, 7,674 documents) and ``20ng-comp`` (the five comp.* groups
of 20 Newsgroups, 4,869 documents) are the evaluation corpora of the target. Development
corpora (the target does not report them; the ranker's constants are chosen on them):
``20ng-talk`` (talk.*, 3,252 documents, 4 classes), ``20ng-rec`` (rec.*, 3,978),
``20ng-sci`` (sci.*, 3,952) and ``20ng-skew`` (R8's eight class sizes on 20NG documents outside comp.*,
7,674 documents: :data:`SKEW_CLASSES`). Results: ``benchmarks/results/active_learning.json``,
``.md`` and ``.png`` (matplotlib), ``active_learning_cost.json`` / ``.md``.

Which data chose which constant of :mod:`streamsemi.core.suggestions`:

* ``DIVERSITY = "centres"`` and ``POOL_FACTOR = 4``: development runs on 20ng-talk and
  20ng-rec, seeds 40-45, ``--arms suggested`` (checked on 20ng-sci, seeds 40-45). Mean over
  the seeds of macro-F1 at the last point <= 2% / of the points up to 2%, talk (reference
  0.865) and rec (reference 0.956):

  ========================================  =============  =============
  variant                                   talk           rec
  ========================================  =============  =============
  classes, pool 8 (the previous default)    0.821 / 0.751  0.968 / 0.958
  classes, pool 8, typicality^2             0.831 / 0.786  0.962 / 0.956
  clusters, pool 2                          0.852 / 0.770  0.969 / 0.952
  clusters, pool 4                          0.855 / 0.763  0.969 / 0.963
  clusters, pool 8                          0.837 / 0.765  0.969 / 0.963
  clusters, pool 4, typicality^2            0.837 / 0.764  0.964 / 0.959
  clusters, pool 4, no coverage factor      0.793 / 0.744  0.969 / 0.961
  **centres, pool 4** (default)             0.857 / 0.779  0.968 / 0.962
  centres, pool 6                           0.811 / 0.775  0.968 / 0.961
  centres, pool 10                          0.840 / 0.782  0.969 / 0.961
  centres, pool 4, typicality^2             0.836 / 0.771  0.963 / 0.958
  centres, pool 4, no typicality factor     0.831 / 0.757  0.968 / 0.957
  ========================================  =============  =============

  (``classes``: an equal share per predicted class; ``clusters``: the highest priority of
  each of the pool's k-means clusters; ``centres``: each cluster's member nearest its
  weighted centre.) On 20ng-sci (reference 0.944) both defaults are at the ceiling:
  classes 0.953 / 0.937, centres 0.952 / 0.941. The per-point spread over seeds is 0.03-0.05 on talk (constrained
  k-means refits jump between local optima), so only the gap to ``classes`` (+0.03 at
  2%) is clear; the pool sizes are within the noise of each other. Every development run's
  summary: ``benchmarks/results/active_learning_dev.json``.
* Constrained k-means restarts (``n_init``, best of several starts by the k-means objective,
  the further starts at bootstrap means of each class's seeds) do not remove the refit dips:
  development runs on 20ng-talk and 20ng-rec, seeds 40-42, ``--arms suggested``, macro-F1
  at exactly 2% / mean of the points up to 2%:

  ==========================================  ===========================  ===========================
  variant                                     talk                         rec
  ==========================================  ===========================  ===========================
  n_init=1 (the default)                      0.855 / 0.785 (ref 0.865)    0.969 / 0.963 (ref 0.956)
  n_init=5                                    0.827 / 0.732 (ref 0.858)    0.962 / 0.960 (ref 0.955)
  n_init=4, kept by seed consistency [*]      0.829 / 0.762 (ref 0.862)    0.971 / 0.962 (ref 0.957)
  + a run from the previous centroids [*]     0.778 / 0.751 (ref 0.865)    0.963 / 0.958 (ref 0.956)
  ranker: class-share rare_class [*]          0.837 / 0.766                0.966 / 0.962
  + a run from the previous seeds' means [**]  0.868 / 0.787                0.969 / 0.963
  ==========================================  ===========================  ===========================

  ([*] experiments not kept in the code: the run kept by the share of seeds whose nearest
  centroid is their class, then objective; the seed-mean run and one from the previous
  model's centroids, the higher objective kept; ``rare_class`` also for a class with fewer
  seeds than its share of the predicted classes. On sci.*, reference 0.943: the default
  0.955 / 0.943, the previous-centroid run 0.944 / 0.935, class share 0.950 / 0.941.)
  The highest-objective run is not the one that agrees best with the labels: from the
  previous centroids the fit stays in an early optimum (talk 0.78 up to 3% labels), and
  restarts lose 0.03 at 2% on talk (the reference itself drops) at several times the fit
  time. A diagnostic on talk, seed 42, found the refit dips (0.875 -> 0.808 at 95 labels)
  are starts at the new seed means landing in a worse optimum; a start at the previous
  round's seed means would have avoided that one, but no label-free criterion tried here
  picks it reliably. [**] (after the evaluation below had run; not kept): a second run
  started at the means of the previous round's seeds (the new batch only constrains it),
  kept when its centroids put more seeds nearest their own class: talk seeds 40-42 +0.013
  at 2% (the dips after 58 labels are gone; sci.* identical), but talk seeds 43-45 0.861 /
  0.783 against 0.871 / 0.797 (new dips at 38-48 labels): no gain over six seeds. So the
  default stays ``n_init=1`` (today's single start at the seed means), the ranker is
  unchanged, and the evaluation runs use them.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec --seeds 40,41,42 --arms suggested \
        --algorithm-params '{"constrained-kmeans": {"n_init": 5}}' --out /tmp/dev_ninit5
* Session 6, development runs on 20ng-talk and 20ng-rec, seeds 40-45, ``--arms suggested``
  (macro-F1 at exactly 2% / mean of the points up to 2%; the default on these seeds: talk
  0.863 / 0.791, the mean of the 40-42 and 43-45 runs above, rec 0.969 / 0.963):

  ==========================================  ===========================  ===========================
  variant                                     talk                         rec
  ==========================================  ===========================  ===========================
  ``--k 5`` (a refit every 5 labels)          0.810 / 0.778 (ref 0.865)    0.969 / 0.963 (ref 0.956)
  ``--k 20`` (session 14) [+]                 0.856 / 0.768 (ref 0.865)    0.968 / 0.961 (ref 0.956)
  start at margin-weighted seed means [*]     0.839 / 0.789 (ref 0.857)    0.969 / 0.962 (ref 0.955)
  ``--weights '{"uncertain": 0.4}'``          0.839 / 0.782 (ref 0.865)    0.968 / 0.960 (ref 0.956)
  ``--weights '{"uncertain": 2.5}'``          0.854 / 0.767 (ref 0.865)    0.969 / 0.963 (ref 0.956)
  ==========================================  ===========================  ===========================

  ([+] ``benchmarks/results/active_learning_dev_k20.json``: fewer refits do not avoid the dips
  either. [*] not kept in the code: each seed weighs its margin under the seeds' means, its
  cosine to its own class's mean minus the largest to another's, floored at 0, so that
  boundary documents, which is what the suggestions are, do not pull the start toward a
  boundary; the reference uses it too.) None is better than the default at 2%: smaller
  batches make the refit dips more frequent, and the weight of ``uncertain`` is at a
  local optimum on both sides. The comp.* gap (suggested at 2% 0.766-0.767 against the
  5%-random 0.765-0.770) stays where constrained k-means' own curve flattens.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec --seeds 40,41,42,43,44,45 \
        --arms suggested --k 5 --out /tmp/s6/dev_k5
* ``CANDIDATE_SAMPLE = 2000`` (session 9): since the snapshot scores (a new model's
  probabilities of its training snapshot come with it) ranking the whole window no longer
  costs a ``predict_proba``, so ranking every unlabelled document was tried
  (``--candidate-sample 10000``; talk and rec windows hold 3,252 and 3,978 documents).
  Seeds 40-45, ``--arms suggested``, at exactly 2% / mean up to 2%: talk 0.857 / 0.771
  against the default's 0.863 / 0.791, rec 0.968 / 0.963 for both
  (``benchmarks/results/active_learning_dev_cand{2000,10000}.json``). A fresh random
  sample per round also spreads the queue; the default stays.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec --seeds 40,41,42,43,44,45 \
        --arms suggested --candidate-sample 10000 --out active_learning_dev_cand10000
* Semi-LDC instead of constrained k-means in both arms and the reference (session 12, to see
  whether a model that uses labelled boundary documents more than a centroid does lifts the
  suggestions above the plateau): talk 0.874 at 2% against its reference 0.873, rec 0.969
  against 0.962 (seeds 40-42; constrained k-means there: 0.855-0.863 against 0.865, and 0.969
  against 0.956). No clearer margin than constrained k-means, the product's default primary:
  not pursued on the evaluation corpora. ``benchmarks/results/active_learning_dev_semildc.json``.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec --seeds 40,41,42 --algorithms semi-ldc \
        --out /tmp/s12/dev_semildc
* Session 24: four more attempts at comp.*'s missing 0.003, none kept, and a re-run.

  - **Class biases.** Constrained k-means with per-class logit biases fitted to the seeds
    (intercepts of a softmax on ``cosine / temperature``, L2 weight 1). These are the
    boundary labels that the suggestions deliver. Development runs, talk and rec, seeds
    40-45, at exactly 2% / mean up to 2%: talk 0.852 / 0.770 and rec 0.966 / 0.943, against
    the default's 0.863 / 0.791 and 0.968 / 0.963 (``active_learning_dev_ckbias.json``; a
    patch outside the repository).
  - **CLE in both arms and the reference.** Development runs only: talk 0.899 at 2% against
    its reference 0.902, rec 0.942 against 0.945 (``active_learning_dev_cle_{talk,rec}.json``).
    CLE misses by the same 0.003 as constrained k-means. Early on, suggested labels do
    worse than random ones under CLE: 0.516 against 0.734 (talk) and 0.552 against 0.763
    (rec) at 18 labels. With 2 seeds per class CLE is at 0.31-0.72, and margin sampling on
    so poor a model picks poor documents. That is a cold-start weakness of the ranker for
    CLE; it was not addressed.
  - **A cold-start schedule (not kept).** The ``uncertain`` and ``disagreement`` weights are
    multiplied by ``min(1, mean seeds per seeded class / RARE_BELOW)``, so the first rounds
    lean on ``rare_class``, which picks typical documents. This aimed at CLE's early
    weakness above. Development runs, seeds 40-45, ``--arms suggested``; at exactly 2%
    against the default:
    - CLE: talk 0.887 against 0.899, rec 0.946 against 0.942. Rec is better early
      (0.839 against 0.755 at 28 labels); talk is worse from 38 labels on.
    - Constrained k-means: talk 0.854 against 0.863, rec 0.968 against 0.968.
    Files: ``active_learning_dev_cold_{cle,ck}_{talk,rec}.json``; the schedule was a patch outside
    the repository.
  - **Semi-LDC** (``max_components="auto"`` since session 23) on the evaluation corpora.
    It was run because the session-12 development result above was close. Seeds 10-12:
    - R8: 0.784 at 2% against its reference 0.757 (reached at 1.77%);
    - comp.*: 0.756 against 0.764, missed by 0.008
      (``active_learning_s24_semildc.{json,md,png}``).

    No algorithm was chosen from these runs.
  - Constrained k-means on comp.* re-run with today's code, all 12 seeds (10-12, 30-32,
    50-55): suggested 0.763 at 2% against 0.766, random 0.746, the reference reached at
    2.81%. These are the session-8 figures (``active_learning_s24_comp12.{json,md,png}``).

    python benchmarks/active_learning.py curves --corpora 20ng-talk --seeds 40,41,42,43,44,45 --algorithms cle \
        --out /tmp/dev_cle_talk
    python benchmarks/active_learning.py curves --corpora r8,20ng-comp --seeds 10,11,12 --algorithms semi-ldc \
        --out active_learning_s24_semildc
    python benchmarks/active_learning.py curves --corpora 20ng-comp --seeds 10,11,12,30,31,32,50,51,52,53,54,55 \
        --out active_learning_s24_comp12
* Session 25: a committee. With ``--algorithms constrained-kmeans,semi-ldc,cle`` (constrained
  k-means primary and scored; the other two vote in ``disagreement``). Development runs first
  (seeds 40-45, ``--arms suggested``), at exactly 2%: talk 0.873, rec 0.969, sci 0.959, against
  constrained k-means alone's 0.863, 0.968, 0.952 (``active_learning_dev_committee_*.json``). On
  the evaluation corpora equal votes helped comp.* (+0.003 at 2%, +0.007..+0.020 after) and hurt
  R8 (0.805 against 0.815 at 2%, down to -0.047), where the other two are weaker. Votes are
  now weighed by each algorithm's record against the primary on unseen seeds
  (:func:`streamsemi.core.suggestions.credibility`, no constant): development runs unchanged
  (``active_learning_dev_committee_cred_*.json``), comp.* 0.7666 at 2% against 0.7664, R8
  0.817 (seeds 10-12, 30-32) and 0.796 on fresh seeds 60-65, where constrained k-means alone
  gives 0.794 and the reference is 0.815. docs/results.md ("Label suggestions") has the table.

    python benchmarks/active_learning.py curves --corpora 20ng-comp --seeds 10,11,12,30,31,32,50,51,52,53,54,55 \
        --algorithms constrained-kmeans,semi-ldc,cle --out active_learning_s25_committee_cred_comp12
* Session 26. ``--per-class`` (:func:`class_report`) on R8's fresh seeds 60-65: three quarters
  of the gap to the reference (0.794 against 0.815) is money-fx (F1 0.589 against 0.740), whose
  documents the interest centroid takes when the labels are the queue's boundary documents
  (``active_learning_s26_r8_perclass.*``; docs/results.md). Labels from the queue are a biased
  sample of each class; the daemon runs of docs/results.md, half of whose labels were random,
  served the 5%-random figure at 2%. So a share of uniformly random documents per round was
  tried, development runs only (talk, rec, sci, seeds 40-45, ``--arms suggested``, at exactly
  2% / mean up to 2%; a wrapper outside the package, kept as
  ``results/active_learning_dev_s26_mix.py.txt``):

  ==========================  ===============  ===============  ===============
  random share of each round  talk             rec              sci
  ==========================  ===============  ===============  ===============
  0 (the default)             0.863 / 0.791    0.968 / 0.963    0.952 / 0.942
  0.3                         0.857 / 0.787    0.968 / 0.961    0.946 / 0.940
  0.5                         0.846 / 0.773    0.964 / 0.958    0.950 / 0.939
  ==========================  ===============  ===============  ===============

  Worse on all three: not kept, the evaluation corpora were not run
  (``results/active_learning_dev_s26_mix{0,0.3,0.5}.json``). Nor does a random start explain
  the daemon runs: both arms started from 1% of each class (``--initial-fraction 0.01``,
  about 8 per class on talk instead of 2) give at exactly 2% talk 0.843, rec 0.963, sci 0.948
  with suggestions (random labels: 0.814, 0.955, 0.937), below the default start's 0.863,
  0.968, 0.952 (``results/active_learning_dev_s26_initial1pct.json``): the queue's labels are
  worth more than random ones on these corpora, even as a start.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec,20ng-sci --seeds 40,41,42,43,44,45 \
        --initial-fraction 0.01 --out active_learning_dev_s26_initial1pct

    python benchmarks/results/active_learning_dev_s26_mix.py.txt 0.3 curves --corpora 20ng-talk,20ng-rec,20ng-sci \
        --seeds 40,41,42,43,44,45 --arms suggested --out /tmp/mix_0.3
* Session 28: the ``ensemble`` (issue 19's, four members, tempered pooling) as the model of both the
  suggested arm and the reference, development corpora only, seeds 40-45, ``--arms suggested``,
  at exactly 2% against the ensemble's own 5%-random reference. The rule fixed before the run:
  run the evaluation corpora only if the target is met on all three.

  =====================  =====================  =====================  =====================
  model                  talk                   rec                    sci
  =====================  =====================  =====================  =====================
  constrained k-means    0.863 (ref 0.865)      0.968 (ref 0.956)      0.952 (ref 0.944)
  ensemble               0.890 (ref 0.903)      0.969 (ref 0.964)      0.963 (ref 0.960)
  =====================  =====================  =====================  =====================

  Everything is higher with the ensemble, but so is its reference. On talk.* the ensemble misses
  by 0.013: it starts cold (0.59 at 8 labels, sd 0.18) and is still rising at 2%. So the
  evaluation corpora were not run. Runs took 6-7 minutes per corpus for six seeds, against
  under one minute for constrained k-means. Files:
  ``results/active_learning_dev_s28_ens_{talk_sci,rec}.{json,md,png}``.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-sci --seeds 40,41,42,43,44,45 \
        --arms suggested --algorithms ensemble --max-fraction 0.02 --out active_learning_dev_s28_ens_talk_sci
* Session 32: a class-balanced pool (``--pool-balance classes``, :func:`streamsemi.core.suggestions.balanced_top_rows`:
  the pool of ``POOL_FACTOR * k`` candidates taken round robin over the predicted classes instead of
  by priority alone; class-balanced uncertainty sampling). Why: at 2% on R8 seeds 60-65, 60% of the
  queue's labels went to acq and earn, whose boundary no label fixes (acq takes about 800 earn stories
  with 5% random seeds too). A development corpus with R8's class sizes was added first:
  ``20ng-skew`` (:data:`SKEW_CLASSES`: 7,674 20NG documents outside comp.*, two merged large classes,
  two confusable pairs of small ones); constrained k-means misses the target there as on R8
  (0.586 against 0.607). The rule fixed before the runs: keep it if the development corpora are not
  worse. At exactly 2% / mean of the points up to 2%, ``--arms suggested``:

  ==========================  ===============  ===============  ===============  ===============  ===============
  pool                        skew (40-45)     talk (40-45)     talk (46-51)     rec (40-45)      sci (40-45)
  ==========================  ===============  ===============  ===============  ===============  ===============
  reference (5% random)       0.607            0.865            0.862            0.956            0.944
  by priority (the default)   0.586 / 0.480    0.863 / 0.791    0.863 / 0.778    0.968 / 0.963    0.952 / 0.942
  round robin over classes    0.584 / 0.476    0.842 / 0.778    0.857 / 0.788    0.969 / 0.962    0.950 / 0.940
  ==========================  ===============  ===============  ===============  ===============  ===============

  Not better on any development corpus: not kept (``POOL_BALANCE = "priority"``). On R8 seeds 60-65,
  the seeds that prompted it, it gave 0.836 against 0.794 (reference 0.815); on fresh R8 seeds 70-75
  both pools give 0.800 (reference 0.802). So the +0.042 was which local optimum six refits landed in,
  not the pool. Files ``results/active_learning_s32_*.{json,md}``.

    python benchmarks/active_learning.py curves --corpora 20ng-skew --seeds 40,41,42,43,44,45 --arms suggested \
        --pool-balance classes --out active_learning_s32_dev_skew_bal
    python benchmarks/active_learning.py curves --corpora r8 --seeds 70,71,72,73,74,75 --arms suggested \
        --pool-balance classes --out active_learning_s32_r8_70_classes
* Session 32: the worker's constrained k-means gives large classes several centroids
  (``prototypes="by-size"``, docs/algorithms/constrained-kmeans.md, chosen on the robustness
  development draws). The engine builds it by default, so every run of this script since then
  uses it, in both arms and in the reference;
  ``--algorithm-params '{"constrained-kmeans": {"prototypes": "one"}}'`` reproduces the figures
  above. At exactly 2%, ``--arms suggested``: R8 seeds 60-65 and 70-75 0.837 against the reference's
  0.816 (the one-centroid model 0.797 against 0.809), reached at 1.51%: the target is met on R8.
  20NG comp.* (12 seeds) 0.763 against 0.766, unchanged: balanced classes keep one centroid.
  Development corpora: skew 0.620 (ref 0.608), talk 0.862 (0.865), rec 0.968 (0.956), sci 0.952
  (0.944). Files ``results/active_learning_s32_bysize_{r8,comp,dev}.*``.

* Session 35: the worker's constrained k-means chooses its seed weight (1 or 8 documents per seed in
  its class centroid) on held-out seeds (``seed_weight="held-out"``, docs/algorithms/constrained-kmeans.md,
  chosen on the robustness development draws). Every run of this script uses it in both arms and the
  reference; ``--algorithm-params '{"constrained-kmeans": {"seed_weight": 1}}'`` reproduces the figures
  above. At exactly 2%, ``--arms suggested``: R8 (60-65, 70-75) 0.859 against 0.816 (reached at 1.25%),
  comp.* (12 seeds) 0.766 against a reference that rises to 0.776 (missed by 0.010), development talk
  0.853 (0.865), rec 0.968 (0.956), sci 0.951 (0.944), skew 0.648 (0.625). Table in docs/results.md;
  files ``results/active_learning_s35_{heldout,sw8}_*``.

* Session 37: seeds as exemplars of their class (constrained k-means ``seed_exemplars``, now the
  worker's default; docs/algorithms/constrained-kmeans.md). A labelled boundary document moves its
  centroid by one document in a thousand; as an exemplar it also labels its close neighbours. The
  gate was chosen on these development runs (seeds 40-45, ``--arms suggested``, at exactly 2% /
  the 5%-random reference; a patch kept as ``results/active_learning_dev_s37_exemplars.py.txt``):

  ======================================  =============  =============  =============  =============
  variant                                 talk           rec            sci            skew
  ======================================  =============  =============  =============  =============
  centroids only (before)                 0.852 / 0.865  0.968 / 0.956  0.953 / 0.944  0.655 / 0.625
  every seed, no gate                     0.873 / 0.872  0.956 / 0.940  0.944 / 0.941  0.679 / 0.648
  only between the two best centroids     0.861 / 0.874  0.957 / 0.946  0.948 / 0.945
  gate 1.5 x mean similarity (default)    0.852 / 0.870  0.967 / 0.954  0.954 / 0.946  0.712 / 0.640
  gate 2 x mean similarity                0.858 / 0.870  0.969 / 0.956  0.952 / 0.946  0.668 / 0.635
  ======================================  =============  =============  =============  =============

  The ungated rule meets the target on talk but costs rec 0.012-0.016 (low-similarity neighbours
  are wrong more often than the centroid); the gate keeps rec and sci and gains on skew. On the
  evaluation corpora with the default: R8 0.854 at 2% against 0.819 (reached at 1.25%), comp.*
  0.771 against 0.783 (missed by 0.011: the reference gains more). Files
  ``results/active_learning_dev_s37_*.json``, ``results/active_learning_s37_exemplars_{r8,comp}.*``.

        EXGATE=1.5 python benchmarks/results/active_learning_dev_s37_exemplars.py.txt curves \
            --corpora 20ng-talk,20ng-rec,20ng-sci,20ng-skew --seeds 40,41,42,43,44,45 --arms suggested
        python benchmarks/active_learning.py curves --corpora r8 --seeds 60,61,62,63,64,65,70,71,72,73,74,75 \
            --arms suggested --out active_learning_s37_exemplars_r8

* ``DENSITY_POWER = 1``, ``COVERAGE_POWER = 1`` and ``WEIGHTS``: chosen earlier on seeds
  0-2 of the evaluation corpora (docs/suggestions.md); the development runs above agree
  (typicality^0 or ^2 and no coverage factor are worse on talk) and they were not changed.

    python benchmarks/active_learning.py curves --corpora 20ng-talk,20ng-rec --seeds 40,41,42,43,44,45 \
        --arms suggested --diversity centres --pool-factor 4 --out /tmp/dev_centres4
    python benchmarks/active_learning.py curves --corpora r8,20ng-comp --seeds 10,11,12
    python benchmarks/active_learning.py curves --corpora r8,20ng-comp --seeds 30,31,32 --out active_learning_seeds30
    python benchmarks/active_learning.py cost
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import f1_score

from streamsemi.core import suggestions as sg
from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.core.store import rows_to_csr
from streamsemi.engine import Engine, EngineConfig
from streamsemi.evaluation.metrics import macro_f1_known

RESULTS = Path(__file__).resolve().parent / "results"
#: evaluation corpora (the issue's target) and development corpora (the ranker's constants are chosen on these only)
CORPORA = {"r8": ("reuters-r8", None), "20ng-comp": ("20newsgroups", "comp."),
           "20ng-talk": ("20newsgroups", "talk."), "20ng-sci": ("20newsgroups", "sci."),
           "20ng-rec": ("20newsgroups", "rec.")}
#: development corpus with R8's class sizes (earn 3,923, acq 2,292, crude 374, trade 326, money-fx 293,
#: interest 271, ship 144, grain 51) on 20NG documents outside comp.*: the two large classes merge
#: groups (rec.*; sci.crypt/electronics/med), two pairs of small classes are confusable (the two
#: politics groups; religion and atheism, like money-fx and interest). A fixed draw (seed 0).
SKEW_CLASSES = (("rec.", ("rec.",), 3923), ("sci-3", ("sci.crypt", "sci.electronics", "sci.med"), 2292),
                ("talk.politics.guns", ("talk.politics.guns",), 374),
                ("talk.politics.misc", ("talk.politics.misc",), 326),
                ("talk.religion.misc", ("talk.religion.misc",), 293), ("alt.atheism", ("alt.atheism",), 271),
                ("sci.space", ("sci.space",), 144), ("misc.forsale", ("misc.forsale",), 51))
CORPORA["20ng-skew"] = ("20newsgroups", "skew")
SIX = ["constrained-kmeans", "semi-ldc", "cle", "d-lda", "fsl-ck", "pseudo-lsc"]


def corpus(name: str) -> tuple[list[str], list[str]]:
    """Texts and labels of a benchmark corpus."""
    dataset, prefix = CORPORA[name]
    ds = load(dataset)
    if prefix == "skew":
        rng = np.random.default_rng(0)
        labels = np.asarray([str(lb) for lb in ds.labels])
        texts, out = [], []
        for cls, groups, size in SKEW_CLASSES:
            rows = np.flatnonzero(np.any([np.char.startswith(labels.astype(str), g) for g in groups], axis=0))
            for i in np.sort(rng.choice(rows, size=min(size, rows.size), replace=False)):
                texts.append(ds.texts[i])
                out.append(cls)
        return texts, out
    keep = [i for i, lb in enumerate(ds.labels) if prefix is None or str(lb).startswith(prefix)]
    return [ds.texts[i] for i in keep], [str(ds.labels[i]) for i in keep]


def engine_config(algorithms: list[str], n_docs: int, top_n: int, **kw: Any) -> EngineConfig:
    """In-process engine: whole corpus in the window, refits only on request, no revisions."""
    base = dict(algorithms=algorithms, background_refit=False, window_max_docs=max(n_docs, 1),
                max_buffered_docs=max(n_docs, 1), refit_every_docs=0, refit_growth=0, refit_idle_s=0,
                drift_detection=False, revisions="off", min_docs_first_refit=1, min_seed_classes=2,
                min_seeds_per_class=1, first_fit_stable_seeds=0, first_fit_max_wait_s=0, explain_words=0,
                suggestions_top_n=top_n)
    base.update(kw)
    return EngineConfig(**base)


def windowed(texts: list[str], order: np.ndarray, cfg: EngineConfig) -> tuple[Engine, list[str]]:
    """An engine whose window holds the corpus (``order``); returns it and the ids in the window.

    The window is exactly full, as a worker's sliding window is in steady state (refits of a full
    window warm-start, e.g. constrained k-means keeps its seed-weight choice): when the engine
    rejects a document (20NG comp.* has one whose only word is the stop word "how"), it is built again with
    the window's size set to the documents it took.
    """
    eng = Engine(cfg)
    ids = [f"d{i}" for i in order]
    for lo in range(0, len(order), 2000):
        eng.absorb([Document(id=ids[j], text=texts[order[j]]) for j in range(lo, min(lo + 2000, len(order)))])
    took = np.fromiter((k in eng.window for k in ids), dtype=bool, count=len(ids))
    n = int(took.sum())
    if 0 < n < cfg.window_max_docs:
        return windowed(texts, order[took], replace(cfg, window_max_docs=n, max_buffered_docs=n))
    return eng, [k for k, t in zip(ids, took, strict=True) if t]


def predictions(eng: Engine, ids: list[str]) -> tuple[list[str], np.ndarray]:
    """The window's non-seed documents and the primary model's label of each."""
    rest = [k for k in ids if k not in eng.seeds]
    slot = eng.models[eng.primary]
    X = rows_to_csr([eng.window.get(k).row for k in rest], eng.config.n_features)
    return rest, np.asarray([str(c) for c in slot.classes])[np.asarray(slot.model.predict_proba(X)).argmax(axis=1)]


def score(eng: Engine, ids: list[str], truth: dict[str, str], classes: list[str]) -> float:
    """Macro-F1 of the primary model's labels of the window's non-seed documents."""
    rest, pred = predictions(eng, ids)
    return macro_f1_known([truth[k] for k in rest], list(pred), classes)


def class_report(y_true: list[str], y_pred: list[str], classes: list[str],
                 seeds: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per class: F1, documents predicted and true, seeds, and the 3 true classes it takes most documents from.

    ``--per-class``: where a curve loses to the reference (a class whose centroid took
    another's documents shows as many predicted, a low F1 and where they came from).
    """
    yt, yp = np.asarray(y_true, dtype=object), np.asarray(y_pred, dtype=object)
    f1 = f1_score(yt, yp, labels=classes, average=None, zero_division=0.0)
    out: dict[str, dict[str, Any]] = {}
    for c, f in zip(classes, f1, strict=True):
        taken = sorted(Counter(yt[(yp == c) & (yt != c)].tolist()).items(), key=lambda kv: (-kv[1], str(kv[0])))[:3]
        out[c] = {"f1": round(float(f), 4), "predicted": int(np.sum(yp == c)), "true": int(np.sum(yt == c)),
                  "seeds": int(seeds.get(c, 0)), "taken_from": {str(k): int(v) for k, v in taken}}
    return out


def report_of(eng: Engine, ids: list[str], truth: dict[str, str], classes: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`class_report` of the engine's primary model on the window's non-seed documents."""
    rest, pred = predictions(eng, ids)
    return class_report([truth[k] for k in rest], list(pred), classes, eng.seeds.class_counts())


def stratified(ids: list[str], truth: dict[str, str], per_class: int, rng: np.random.Generator,
               fraction: float | None = None) -> list[str]:
    """``per_class`` random documents of each class, or (``fraction``) ``max(1, round(fraction * n_c))`` of each."""
    out = []
    for c in sorted(set(truth.values())):
        members = [k for k in ids if truth[k] == c]
        size = per_class if fraction is None else max(1, int(round(fraction * len(members))))
        out.extend(rng.choice(members, size=min(size, len(members)), replace=False).tolist())
    return out


def run_arm(arm: str, texts: list[str], labels: list[str], seed: int, args: argparse.Namespace) -> list[dict]:
    """One learning curve: (labels, fraction, macro-F1, suggestion reasons) after each refit."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    cfg = engine_config([a.strip() for a in args.algorithms.split(",")], len(texts), max(args.k, 1),
                        random_state=seed, algorithm_params=json.loads(args.algorithm_params or "{}"))
    eng, ids = windowed(texts, order, cfg)
    truth = {f"d{i}": labels[i] for i in order}
    classes = sorted(set(labels))
    for k in stratified(ids, truth, args.initial, np.random.default_rng(seed + 1000),
                        getattr(args, "initial_fraction", None)):
        eng.label(k, [truth[k]])
    budget = int(round(args.max_fraction * len(ids)))
    stops = checkpoints(len(ids), budget, args.target_fraction)
    draw = np.random.default_rng(seed + 2000)
    curve = []
    while True:
        eng.check_seeds()  # the new labels judged by the models that have not seen them (the worker's loop does it)
        t0 = time.perf_counter()
        eng.request_refit("request")
        fit_s = time.perf_counter() - t0
        eng.suggestion_updates()
        n_labels = len(eng.seeds)
        reasons: dict[str, int] = {}
        curve.append({"labels": n_labels, "fraction": n_labels / len(ids), "macro_f1": score(eng, ids, truth, classes),
                      "refit_s": round(fit_s, 3), "suggest_s": round(eng.last_suggestion_seconds, 3)})
        if getattr(args, "per_class", False) and n_labels == stops[0]:   # the target checkpoint (2%)
            curve[-1]["classes"] = report_of(eng, ids, truth, classes)
        if len(eng.config.algorithms) > 1:  # the weight of each other algorithm's vote in this round's ranking
            curve[-1]["credibility"] = {a: round(eng.vote_credibility(a), 4) for a in eng.config.algorithms
                                        if a != eng.primary}
        if n_labels >= budget:
            break
        k = batch_size(n_labels, args.k, stops)
        if arm == "suggested":
            picked = [m["id"] for m in eng.suggestions()][:k]
            for m in eng.suggestions()[:k]:
                reasons[m["reason"]] = reasons.get(m["reason"], 0) + 1
        else:
            open_ids = [x for x in ids if x not in eng.seeds]
            picked = draw.choice(open_ids, size=k, replace=False).tolist()
        curve[-1]["next_reasons"] = reasons
        if not picked:
            break
        for doc_id in picked:
            eng.label(doc_id, [truth[doc_id]])
    return curve


def checkpoints(n_docs: int, budget: int, target_fraction: float) -> list[int]:
    """Label counts a curve must stop at: ``floor(target_fraction * n_docs)`` and the budget.

    Between them the annotator labels ``k`` documents per refit; a batch that would cross a
    checkpoint is cut short so that one refit happens exactly there.
    """
    at_target = int(np.floor(target_fraction * n_docs + 1e-9))
    return sorted({c for c in (at_target, budget) if 0 < c <= budget} | {budget})


def batch_size(n_labels: int, k: int, stops: list[int]) -> int:
    """Documents to label next: ``k``, cut short at the next checkpoint of ``stops``."""
    return min(k, next((c for c in stops if c > n_labels), n_labels) - n_labels)


def reference(texts: list[str], labels: list[str], seed: int, fraction: float, algorithms: list[str],
              algorithm_params: dict[str, dict[str, Any]] | None = None,
              detail: dict[str, Any] | None = None) -> float:
    """Macro-F1 of one fit with a uniformly random ``fraction`` of the corpus as seeds (the same
    algorithms and parameters as the arms); ``detail`` (a dict) gets its :func:`class_report`."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    eng, ids = windowed(texts, order, engine_config(algorithms, len(texts), 0, random_state=seed,
                                                    algorithm_params=algorithm_params or {}))
    truth = {f"d{i}": labels[i] for i in order}
    n = int(round(fraction * len(ids)))
    for k in np.random.default_rng(seed + 3000).choice(ids, size=n, replace=False):
        eng.label(str(k), [truth[str(k)]])
    eng.request_refit("request")
    if detail is not None:
        detail.update(report_of(eng, ids, truth, sorted(set(labels))))
    return score(eng, ids, truth, sorted(set(labels)))


def at_fraction(curve: list[dict], fraction: float) -> float:
    """Macro-F1 of the last point with at most ``fraction`` of the documents labelled."""
    ok = [p for p in curve if p["fraction"] <= fraction + 1e-9]
    return ok[-1]["macro_f1"] if ok else float("nan")


def first_reaching(curve: list[dict], target: float) -> float | None:
    """The smallest labelled fraction whose macro-F1 reaches ``target`` (None: never)."""
    return next((p["fraction"] for p in curve if p["macro_f1"] >= target), None)


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Point-wise mean over seeds (curves of the same length: the same label counts)."""
    n = min(len(c) for c in curves)
    return [{"labels": float(np.mean([c[i]["labels"] for c in curves])),
             "fraction": float(np.mean([c[i]["fraction"] for c in curves])),
             "macro_f1": float(np.mean([c[i]["macro_f1"] for c in curves])),
             "sd": float(np.std([c[i]["macro_f1"] for c in curves]))} for i in range(n)]


def cmd_curves(args: argparse.Namespace) -> dict:
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = [a.strip() for a in args.algorithms.split(",")]
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "func"}, "corpora": {}}
    for name in args.corpora.split(","):
        texts, labels = corpus(name)
        t0 = time.perf_counter()
        res: dict[str, Any] = {"documents": len(texts), "classes": len(set(labels)), "arms": {}}
        for arm in args.arms.split(","):
            res["arms"][arm] = {"per_seed": [run_arm(arm, texts, labels, s, args) for s in seeds]}
            res["arms"][arm]["mean"] = mean_curve(res["arms"][arm]["per_seed"])
        params = json.loads(args.algorithm_params or "{}")
        details: list[dict[str, Any]] = [{} for _ in seeds]
        refs = [reference(texts, labels, s, args.reference, algorithms, params,
                          detail=d if args.per_class else None) for s, d in zip(seeds, details, strict=True)]
        res["reference"] = {"fraction": args.reference, "per_seed": refs, "mean": float(np.mean(refs))}
        if args.per_class:
            res["reference"]["classes_per_seed"] = details
        empty = {"mean": [{"labels": 0, "fraction": 0.0, "macro_f1": float("nan"), "sd": 0.0}]}
        sug, rnd = res["arms"].get("suggested", empty)["mean"], res["arms"].get("random", empty)["mean"]
        target = res["reference"]["mean"]
        res["target"] = {
            "reference_macro_f1": target,
            "suggested_at_2pct": at_fraction(sug, args.target_fraction),
            "random_at_2pct": at_fraction(rnd, args.target_fraction),
            "suggested_reaches_reference_at": first_reaching(sug, target),
            "random_reaches_reference_at": first_reaching(rnd, target),
            "met": at_fraction(sug, args.target_fraction) >= target,
            # development summary: mean macro-F1 of the suggested curve's points up to 2% (less noisy than one point)
            "suggested_mean_to_2pct": float(np.mean([p["macro_f1"] for p in sug
                                                      if p["fraction"] <= args.target_fraction + 1e-9])),
        }
        res["seconds"] = round(time.perf_counter() - t0, 1)
        out["corpora"][name] = res
        print(json.dumps({"corpus": name, **res["target"], "seconds": res["seconds"]}), flush=True)
    return out


def curves_markdown(out: dict) -> str:
    s = out["settings"]
    lines = ["# Label efficiency of the suggestions", "",
             f"`python benchmarks/active_learning.py curves --corpora {s['corpora']} --seeds {s['seeds']} "
             f"--k {s['k']} --initial {s['initial']} --algorithms {s['algorithms']}"
             + (f" --initial-fraction {s['initial_fraction']}" if s.get("initial_fraction") else "") + "`", "",
             "Macro-F1 of the primary model on the non-seed documents after each refit, mean (sd) over the seeds; "
             "both arms start from "
             + (f"{s['initial_fraction']:.1%} of each class" if s.get("initial_fraction")
                else f"{s['initial']} stratified seeds per class")
             + f" and label {s['k']} documents per refit.", ""]
    for name, res in out["corpora"].items():
        t = res["target"]
        lines += [f"## {name} ({res['documents']} documents, {res['classes']} classes)", "",
                  f"Reference: {s['reference']:.0%} uniformly random seeds give macro-F1 "
                  f"{t['reference_macro_f1']:.3f} (per seed: "
                  + ", ".join(f"{v:.3f}" for v in res["reference"]["per_seed"]) + ").", "",
                  "| labels | % of corpus | suggested | random |", "|---:|---:|---:|---:|"]
        none = {"mean": [{"macro_f1": float("nan"), "sd": 0.0}] * len(res["arms"].get("suggested", {"mean": []})["mean"])}
        for a, b in zip(res["arms"].get("suggested", none)["mean"], res["arms"].get("random", none)["mean"],
                        strict=False):
            lines.append(f"| {a['labels']:.0f} | {100 * a['fraction']:.2f} | {a['macro_f1']:.3f} ({a['sd']:.3f}) | "
                         f"{b['macro_f1']:.3f} ({b['sd']:.3f}) |")
        reach = t["suggested_reaches_reference_at"]
        rreach = t["random_reaches_reference_at"]
        lines += ["", f"At 2% labels: suggested {t['suggested_at_2pct']:.3f}, random {t['random_at_2pct']:.3f}; "
                  f"the reference is reached with suggestions at "
                  + (f"{100 * reach:.2f}%" if reach is not None else "no point of the curve")
                  + ", with random labels at " + (f"{100 * rreach:.2f}%" if rreach is not None else "no point of the curve")
                  + f". Target (suggested at 2% >= reference): **{'met' if t['met'] else 'missed'}**.", ""]
        lines += per_class_markdown(res)
    return "\n".join(lines) + "\n"


def per_class_markdown(res: dict) -> list[str]:
    """``--per-class``: mean per-class F1 and predicted documents, suggested at the target point against the reference."""
    at_target = [next((p["classes"] for p in curve if "classes" in p), None)
                 for curve in res["arms"].get("suggested", {}).get("per_seed", [])]
    refs = res["reference"].get("classes_per_seed")
    if not refs or not at_target or any(r is None for r in at_target):
        return []
    lines = ["Per class (mean over the seeds): F1 and documents predicted, suggested at the target point "
             "against the reference; the class each takes most documents from in the suggested runs.", "",
             "| class | true | suggested F1 | reference F1 | suggested predicted | reference predicted | "
             "suggested seeds | takes most from |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in refs[0]:
        def mean(reports: list[dict], key: str, c: str = c) -> float:
            return float(np.mean([r[c][key] for r in reports]))
        taken: dict[str, int] = {}
        for r in at_target:
            for k, v in r[c]["taken_from"].items():
                taken[k] = taken.get(k, 0) + v
        most = max(taken, key=taken.get) if taken else ""
        lines.append(f"| {c} | {mean(refs, 'true'):.0f} | {mean(at_target, 'f1'):.3f} | {mean(refs, 'f1'):.3f} | "
                     f"{mean(at_target, 'predicted'):.0f} | {mean(refs, 'predicted'):.0f} | {mean(at_target, 'seeds'):.1f} | "
                     + (f"{most} ({taken[most] / len(at_target):.0f})" if most else "") + " |")
    return lines + [""]


def plot(out: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(out["corpora"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        res = out["corpora"][name]
        for arm, style in (("suggested", "-o"), ("random", "--s")):
            if arm not in res["arms"]:
                continue
            m = res["arms"][arm]["mean"]
            x = [100 * p["fraction"] for p in m]
            y = np.array([p["macro_f1"] for p in m])
            sd = np.array([p["sd"] for p in m])
            ax.plot(x, y, style, ms=3, label=arm)
            ax.fill_between(x, y - sd, y + sd, alpha=0.15)
        ax.axhline(res["reference"]["mean"], color="grey", lw=1, ls=":",
                   label=f"{100 * res['reference']['fraction']:.0f}% random seeds")
        ax.axvline(2.0, color="red", lw=0.8, ls=":")
        ax.set_title(f"{name}: {res['documents']} documents")
        ax.set_xlabel("labelled documents (% of corpus)")
        ax.set_ylabel("macro-F1 (non-seed documents)")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def cmd_cost(args: argparse.Namespace) -> dict:
    """Refit round time without and with ranking on a 10,000-document window."""
    ds = load("20newsgroups")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds))[: args.cost_docs]
    texts = [ds.texts[i] for i in range(len(ds))]
    truth = {f"d{i}": str(ds.labels[i]) for i in order}
    out: dict[str, Any] = {"documents": int(order.size), "seeds": args.cost_seeds, "runs": []}
    for algs in args.cost_algorithms.split(";"):
        algorithms = [a.strip() for a in algs.split(",")]
        row: dict[str, Any] = {"algorithms": algorithms, "rounds": []}
        eng, ids = windowed(texts, order, engine_config(algorithms, int(order.size), args.cost_top_n))
        for k in np.random.default_rng(1).choice(ids, size=args.cost_seeds, replace=False):
            eng.label(str(k), [truth[str(k)]])
        for _ in range(args.cost_rounds):
            t0 = time.perf_counter()
            eng.request_refit("request")
            total = time.perf_counter() - t0
            rank_s = eng.last_suggestion_seconds
            row["rounds"].append({"round_s": round(total - rank_s, 3), "ranking_s": round(rank_s, 4),
                                  "ratio": round(rank_s / max(total - rank_s, 1e-9), 4)})
        row["median_ratio"] = float(np.median([r["ratio"] for r in row["rounds"]]))
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    return out


def cost_markdown(out: dict, argv: str) -> str:
    lines = ["# What ranking the suggestions adds to a refit round", "", f"`python benchmarks/active_learning.py {argv}`",
             "", f"20 Newsgroups, {out['documents']} documents in the window, {out['seeds']} random seeds; "
             "round = every algorithm's fit (and the engine's own extras: agreement, k-fold probes), "
             "ranking = `Engine._rank_suggestions` (a random sample of 2,000 unlabelled window documents: the primary "
             "model on all of them, the others on up to 2,000, coverage, the pool's kernel k-means and the diversity "
             "pass). The machine was shared with other jobs on its 2 cores: the round times vary with the load.", "", "| algorithms | refit round (s) | ranking (s) | ratio (median) |",
             "|---|---:|---:|---:|"]
    for r in out["runs"]:
        rounds = r["rounds"]
        lines.append(f"| {', '.join(r['algorithms'])} | {np.median([x['round_s'] for x in rounds]):.2f} | "
                     f"{np.median([x['ranking_s'] for x in rounds]):.3f} | {100 * r['median_ratio']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="curves", choices=("curves", "cost"))
    p.add_argument("--corpora", default="r8,20ng-comp")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--algorithms", default="constrained-kmeans")
    p.add_argument("--k", type=int, default=10, help="documents labelled per refit")
    p.add_argument("--initial", type=int, default=2, help="stratified seeds per class to start from")
    p.add_argument("--initial-fraction", type=float, default=None,
                   help="start instead from this stratified fraction of each class (at least 1 per class)")
    p.add_argument("--max-fraction", type=float, default=0.03, help="label budget (fraction of the corpus)")
    p.add_argument("--target-fraction", type=float, default=0.02,
                   help="labelled fraction the target is judged at (a refit happens at exactly its floor)")
    p.add_argument("--reference", type=float, default=0.05, help="random seed fraction of the reference")
    p.add_argument("--out", default="active_learning")
    p.add_argument("--arms", default="suggested,random")
    p.add_argument("--per-class", action="store_true",
                   help="record per-class F1, predicted counts and confusions at the target point and of the reference")
    p.add_argument("--weights", default="", help="ranking variant: JSON of reason weights (development runs)")
    p.add_argument("--density-power", type=float, default=None, help="ranking variant (development runs)")
    p.add_argument("--coverage-power", type=float, default=None, help="ranking variant (development runs)")
    p.add_argument("--pool-balance", default=None, choices=sg.POOL_BALANCE_MODES,
                   help="ranking variant (development runs)")
    p.add_argument("--diversity", default=None, choices=sg.DIVERSITY_MODES, help="ranking variant (development runs)")
    p.add_argument("--pool-factor", type=int, default=None, help="ranking variant (development runs)")
    p.add_argument("--candidate-sample", type=int, default=None, help="ranking variant (development runs)")
    p.add_argument("--algorithm-params", default="",
                   help='JSON {algorithm: {parameter: value}} for the refits of both arms, e.g. '
                        '\'{"constrained-kmeans": {"warm_start": false}}\' (development runs)')
    p.add_argument("--cost-docs", type=int, default=10000)
    p.add_argument("--cost-seeds", type=int, default=200)
    p.add_argument("--cost-rounds", type=int, default=3)
    p.add_argument("--cost-top-n", type=int, default=50)
    p.add_argument("--cost-algorithms", default="constrained-kmeans;constrained-kmeans,seeded-kmeans,semi-ldc")
    args = p.parse_args(argv)
    if args.weights:
        sg.WEIGHTS.update(json.loads(args.weights))
    if args.density_power is not None:
        sg.DENSITY_POWER = args.density_power
    if args.coverage_power is not None:
        sg.COVERAGE_POWER = args.coverage_power
    if args.diversity is not None:
        sg.DIVERSITY = args.diversity
    if args.pool_factor is not None:
        sg.POOL_FACTOR = args.pool_factor
    if args.pool_balance is not None:
        sg.POOL_BALANCE = args.pool_balance
    if args.candidate_sample is not None:
        sg.CANDIDATE_SAMPLE = args.candidate_sample
    RESULTS.mkdir(exist_ok=True)
    raw = " ".join(sys.argv[1:] if argv is None else argv)
    if args.mode == "cost":
        out = cmd_cost(args)
        (RESULTS / f"{args.out}_cost.json").write_text(json.dumps(out, indent=1))
        (RESULTS / f"{args.out}_cost.md").write_text(cost_markdown(out, raw))
        return 0
    out = cmd_curves(args)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    (RESULTS / f"{args.out}.md").write_text(curves_markdown(out))
    if plot(out, RESULTS / f"{args.out}.png"):
        print(f"plot: {RESULTS / (args.out + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
