"""Compiled (numba) kernels of the D-LDA collapsed Gibbs sampler.

Token layout shared by every kernel: the tokens of document ``d`` are
``ptr[d]:ptr[d + 1]`` of the arrays ``w`` (compact word index, ascending inside a
document), ``z`` (document class, int16) and ``y`` (word topic, int16). Count
matrices follow the paper's notation (Zhuang et al., ICDM 2010, Eqs. 3-6):

* ``ndk[d, k]`` = O_dk, tokens of document d with class k;
* ``nkl[k, l]`` = O_kl, tokens with class k and topic l; ``nk[k] = sum_l O_kl``;
* ``nvl[v, l]`` = O_lv stored word-major (topic vector of a word is contiguous);
  ``nl[l] = sum_v O_lv``.

All randomness comes from a splitmix64 generator whose 64-bit state lives in a
one-element array owned by the kernel call and is seeded from ``random_state``:
every kernel call is deterministic. (numba's ``np.random.random`` costs ~60 ns
per draw on the reference machine, a third of the whole per-token budget;
splitmix64 costs ~2 ns and passes BigCrush.)
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _mix64(x: np.uint64) -> np.uint64:
    """splitmix64 finaliser (a bijective 64-bit mix)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def row_hashes(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Order-independent 64-bit fingerprint of each CSR row's (column, count) pairs."""
    n = indptr.size - 1
    out = np.zeros(n, dtype=np.uint64)
    for d in range(n):
        h = np.uint64(0x9E3779B97F4A7C15)
        for j in range(indptr[d], indptr[d + 1]):
            c = np.uint64(np.int64(np.rint(data[j] * 1024.0)))
            h += _mix64(np.uint64(indices[j]) * np.uint64(0x100000001B3) ^ _mix64(c + np.uint64(1)))
        out[d] = _mix64(h + np.uint64(indptr[d + 1] - indptr[d]))
    return out


@njit(cache=True, inline="always")
def _uniform(state: np.ndarray) -> float:
    """Next splitmix64 draw from ``state`` (uint64[1]) as a float in [0, 1)."""
    x = state[0] + np.uint64(0x9E3779B97F4A7C15)
    state[0] = x
    return float(_mix64(x) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def _randint(state: np.ndarray, n: int) -> int:
    """Uniform integer in [0, n)."""
    return min(int(_uniform(state) * n), n - 1)


@njit(cache=True)
def _doc_seed(base: np.uint64, w: np.ndarray, start: int, end: int) -> np.uint64:
    """RNG seed of one document's fold-in: a hash of ``base`` and its word sequence."""
    h = _mix64(base + np.uint64(0x632BE59BD9B4E019))
    for i in range(start, end):
        h = _mix64(h ^ np.uint64(w[i] + 1))
    return h


@njit(cache=True)
def _draw(cum: np.ndarray, n: int, state: np.ndarray) -> int:
    """Index drawn from the unnormalised cumulative weights ``cum[:n]``."""
    u = _uniform(state) * cum[n - 1]
    i = 0
    while i < n - 1 and cum[i] <= u:
        i += 1
    return i


_BLOCK = 8


@njit(cache=True, fastmath=True)
def _block_sums(p: np.ndarray, n: int, bs: np.ndarray) -> float:
    """Sums of consecutive blocks of ``_BLOCK`` weights of ``p[:n]``; returns the total."""
    nb = (n + _BLOCK - 1) // _BLOCK
    tot = 0.0
    for b in range(nb):
        s = 0.0
        for j in range(b * _BLOCK, min((b + 1) * _BLOCK, n)):
            s += p[j]
        bs[b] = s
        tot += s
    return tot


@njit(cache=True)
def _block_draw(p: np.ndarray, n: int, bs: np.ndarray, tot: float, state: np.ndarray) -> int:
    """Index drawn from the unnormalised weights ``p[:n]`` with block sums ``bs``.

    Two-level linear search (blocks, then inside the block): O(n / 8 + 8) steps
    instead of the O(n) prefix sum.
    """
    nb = (n + _BLOCK - 1) // _BLOCK
    u = _uniform(state) * tot
    b = 0
    while b < nb - 1 and u >= bs[b]:
        u -= bs[b]
        b += 1
    j = b * _BLOCK
    end = min((b + 1) * _BLOCK, n)
    while j < end - 1 and u >= p[j]:
        u -= p[j]
        j += 1
    if p[j] <= 0.0:  # rounding pushed u past the last positive weight of the block
        while j > b * _BLOCK and p[j] <= 0.0:
            j -= 1
    return j


@njit(cache=True)
def build_counts(ptr: np.ndarray, w: np.ndarray, z: np.ndarray, y: np.ndarray,
                 K: int, L: int, V: int):
    """Count matrices (O_dk, O_kl, O_k, O_vl, O_l) of a token assignment."""
    N = ptr.size - 1
    ndk = np.zeros((N, K), dtype=np.int32)
    nkl = np.zeros((K, L), dtype=np.int32)
    nk = np.zeros(K, dtype=np.int64)
    nvl = np.zeros((V, L), dtype=np.int32)
    nl = np.zeros(L, dtype=np.int64)
    for d in range(N):
        for i in range(ptr[d], ptr[d + 1]):
            k = z[i]
            l_ = y[i]
            ndk[d, k] += 1
            nkl[k, l_] += 1
            nk[k] += 1
            nvl[w[i], l_] += 1
            nl[l_] += 1
    return ndk, nkl, nk, nvl, nl


@njit(cache=True, fastmath=True)
def gibbs_sweeps(ptr: np.ndarray, w: np.ndarray, z: np.ndarray, y: np.ndarray,
                 free_doc: np.ndarray, ndk: np.ndarray, nkl: np.ndarray, nk: np.ndarray,
                 nvl: np.ndarray, nl: np.ndarray, alpha: np.ndarray, beta: float, delta: float,
                 n_sweeps: int, n_average: int, seed: int, acc: np.ndarray) -> None:
    """Run ``n_sweeps`` two-step collapsed Gibbs sweeps in place (Algorithm 1, step 3).

    For every token i of document d (word v, class k, topic l), with all counts
    excluding token i:

    * if ``free_doc[d]`` (unlabeled document), draw z_i (Eq. 4, exact form)::

          p(z_i = k | y_i = l, rest) ∝ (O_dk + alpha_k) (O_kl + delta) / (O_k + L delta)

      (``alpha`` is the per-class Dirichlet prior of theta, shape (K,); the paper's
      symmetric prior is ``np.full(K, alpha)``)

    * always draw y_i (Eq. 5)::

          p(y_i = l | z_i = k, rest) ∝ (O_kl + delta) (O_lv + beta) / (O_l + V beta)

    The counts of the last ``n_average`` sweeps are added to ``acc`` (N x K), the
    running sum used for the averaged Eq. 6 assignment.
    """
    st = np.array([np.uint64(seed)], dtype=np.uint64)
    N = ptr.size - 1
    K = nkl.shape[0]
    L = nkl.shape[1]
    V = nvl.shape[0]
    vbeta = V * beta
    ldelta = L * delta
    inv_nl = np.empty(L)
    for l_ in range(L):
        inv_nl[l_] = 1.0 / (nl[l_] + vbeta)
    inv_nk = np.empty(K)
    for k in range(K):
        inv_nk[k] = 1.0 / (nk[k] + ldelta)
    cz = np.empty(K)
    py = np.empty(L)
    bs = np.empty((L + _BLOCK - 1) // _BLOCK)
    for s in range(n_sweeps):
        for d in range(N):
            free = free_doc[d] != 0
            for i in range(ptr[d], ptr[d + 1]):
                v = w[i]
                k = np.int64(z[i])
                l_ = np.int64(y[i])
                # remove token i from the counts (the "-i" superscript)
                ndk[d, k] -= 1
                nkl[k, l_] -= 1
                nk[k] -= 1
                nvl[v, l_] -= 1
                nl[l_] -= 1
                inv_nk[k] = 1.0 / (nk[k] + ldelta)
                inv_nl[l_] = 1.0 / (nl[l_] + vbeta)
                if free:
                    # Eq. (4): z_i given y_i
                    tot = 0.0
                    for kk in range(K):
                        tot += (ndk[d, kk] + alpha[kk]) * (nkl[kk, l_] + delta) * inv_nk[kk]
                        cz[kk] = tot
                    k = _draw(cz, K, st)
                    z[i] = k
                # Eq. (5): y_i given z_i
                nkl_k = nkl[k]
                nvl_v = nvl[v]
                for ll in range(L):
                    py[ll] = (nkl_k[ll] + delta) * (nvl_v[ll] + beta) * inv_nl[ll]
                l_ = _block_draw(py, L, bs, _block_sums(py, L, bs), st)
                y[i] = l_
                ndk[d, k] += 1
                nkl[k, l_] += 1
                nk[k] += 1
                nvl[v, l_] += 1
                nl[l_] += 1
                inv_nk[k] = 1.0 / (nk[k] + ldelta)
                inv_nl[l_] = 1.0 / (nl[l_] + vbeta)
        if s >= n_sweeps - n_average:
            for d in range(N):
                for k in range(K):
                    acc[d, k] += ndk[d, k]


@njit(cache=True, fastmath=True, nogil=True)  # predictions run on the polling thread: let other threads run
def fold_in(ptr: np.ndarray, w: np.ndarray, z: np.ndarray, y: np.ndarray,
            fixed_class: np.ndarray, pi: np.ndarray, phiT: np.ndarray, alpha: np.ndarray,
            n_sweeps: int, n_average: int, seed: int) -> np.ndarray:
    """Fold-in Gibbs sampling with pi (K x L) and phi (given as phiT, V x L) fixed.

    Each document is sampled on its own, with an RNG seeded from ``seed`` and the
    document's word sequence, so a document's result does not depend on the batch
    it comes in. Tokens with ``y < 0`` start from ``p(l | v) ∝ phi_lv * mean_k pi_kl``
    and tokens with ``z < 0`` from ``p(k | l) ∝ (O_dk + alpha) pi_kl`` (or the
    document's ``fixed_class`` when it is >= 0); tokens with a state keep it. Then,
    per token, with the document counts excluding the token:

        p(z_i = k | y_i = l) ∝ (O_dk + alpha) pi_kl          (Eq. 4 with pi fixed)
        p(y_i = l | z_i = k) ∝ pi_kl phi_lv                   (Eq. 5 with pi, phi fixed)

    ``z`` and ``y`` are updated in place; the returned (N x K) array is O_dk summed
    over the last ``n_average`` sweeps (the initial state when ``n_sweeps`` is 0).
    """
    N = ptr.size - 1
    K = pi.shape[0]
    L = pi.shape[1]
    base = np.uint64(seed)
    pibar = np.zeros(L)
    for k in range(K):
        for l_ in range(L):
            pibar[l_] += pi[k, l_] / K
    acc = np.zeros((N, K))
    st = np.zeros(1, dtype=np.uint64)
    nd = np.zeros(K)
    cz = np.empty(K)
    py = np.empty(L)
    bs = np.empty((L + _BLOCK - 1) // _BLOCK)
    for d in range(N):
        start = ptr[d]
        end = ptr[d + 1]
        if end == start:
            continue
        st[0] = _doc_seed(base, w, start, end)
        fixed = fixed_class[d]
        for k in range(K):
            nd[k] = 0.0
        for i in range(start, end):
            if z[i] >= 0:
                nd[z[i]] += 1.0
        for i in range(start, end):
            v = w[i]
            if y[i] < 0:
                phv = phiT[v]
                tot = 0.0
                for ll in range(L):
                    tot += phv[ll] * pibar[ll]
                    py[ll] = tot
                y[i] = _draw(py, L, st)
            if z[i] < 0:
                if fixed >= 0:
                    z[i] = fixed
                else:
                    l_ = y[i]
                    tot = 0.0
                    for kk in range(K):
                        tot += (nd[kk] + alpha[kk]) * pi[kk, l_]
                        cz[kk] = tot
                    z[i] = _draw(cz, K, st)
                nd[z[i]] += 1.0
        for s in range(n_sweeps):
            for i in range(start, end):
                v = w[i]
                k = np.int64(z[i])
                l_ = np.int64(y[i])
                if fixed < 0:
                    nd[k] -= 1.0
                    tot = 0.0
                    for kk in range(K):
                        tot += (nd[kk] + alpha[kk]) * pi[kk, l_]
                        cz[kk] = tot
                    k = _draw(cz, K, st)
                    z[i] = k
                    nd[k] += 1.0
                pk = pi[k]
                phv = phiT[v]
                for ll in range(L):
                    py[ll] = pk[ll] * phv[ll]
                y[i] = _block_draw(py, L, bs, _block_sums(py, L, bs), st)
            if s >= n_sweeps - n_average:
                _add_counts(acc, d, nd, K)
        if n_sweeps == 0:
            _add_counts(acc, d, nd, K)
    return acc


@njit(cache=True, inline="always")
def _add_counts(acc: np.ndarray, d: int, nd: np.ndarray, K: int) -> None:
    """``acc[d] += nd`` (the fold-in's O_dk of one sweep; ``acc[d]`` starts at 0)."""
    for k in range(K):
        acc[d, k] += nd[k]


@njit(cache=True, fastmath=True, inline="always")
def _class_draw(nd: np.ndarray, alpha: np.ndarray, mv: np.ndarray, cz: np.ndarray, K: int, st: np.ndarray) -> int:
    """A token's class from ``p(k) ∝ (nd_k + alpha_k) mv_k`` (``mv``: its word's column of M = pi phi)."""
    tot = 0.0
    for k in range(K):
        tot += (nd[k] + alpha[k]) * mv[k]
        cz[k] = tot
    return _draw(cz, K, st)


@njit(cache=True, fastmath=True, nogil=True)  # predictions run on a helper thread: let other threads run
def fold_in_collapsed(ptr: np.ndarray, w: np.ndarray, MT: np.ndarray, alpha: np.ndarray,
                      n_sweeps: int, n_average: int, seed: int) -> np.ndarray:
    """Fold-in Gibbs sampling of the document classes with the word topics summed out.

    With pi and phi fixed, a token's topic y_i touches nothing but its own token, so
    summing Eqs. 4-5 over l gives the class of a token directly:

        p(z_i = k | z_-i) ∝ (O_dk + alpha_k) M_kv,    M = pi phi  (K x V, given as MT, V x K)

    the same posterior over the classes as :func:`fold_in` (which samples y too), at
    K instead of K + L operations per token (Rao-Blackwellised: it also mixes faster).
    Tokens start in document order from that conditional; each document is sampled on
    its own, with an RNG seeded from ``seed`` and its word sequence (a document's result
    does not depend on its batch). Returns (N x K) O_dk summed over the last
    ``n_average`` sweeps (the initial counts when ``n_sweeps`` is 0).
    """
    N = ptr.size - 1
    K = MT.shape[1]
    base = np.uint64(seed)
    acc = np.zeros((N, K))
    st = np.zeros(1, dtype=np.uint64)
    nd = np.zeros(K)
    cz = np.empty(K)
    z = np.empty(ptr[N] - ptr[0], dtype=np.int64)
    off = ptr[0]
    for d in range(N):
        start = ptr[d]
        end = ptr[d + 1]
        if end == start:
            continue
        st[0] = _doc_seed(base, w, start, end)
        for k in range(K):
            nd[k] = 0.0
        for i in range(start, end):
            k = _class_draw(nd, alpha, MT[w[i]], cz, K, st)
            z[i - off] = k
            nd[k] += 1.0
        for s in range(n_sweeps):
            for i in range(start, end):
                nd[z[i - off]] -= 1.0
                k = _class_draw(nd, alpha, MT[w[i]], cz, K, st)
                z[i - off] = k
                nd[k] += 1.0
            if s >= n_sweeps - n_average:
                _add_counts(acc, d, nd, K)
        if n_sweeps == 0:
            _add_counts(acc, d, nd, K)
    return acc


@njit(cache=True, fastmath=True, nogil=True)  # predictions run on a helper thread: let other threads run
def fold_in_cvb0(ptr: np.ndarray, w: np.ndarray, c: np.ndarray, MT: np.ndarray, alpha: np.ndarray,
                 max_passes: int, tol: float) -> np.ndarray:
    """Deterministic fold-in of the document classes: CVB0 with pi and phi fixed.

    The zero-order collapsed variational update (CVB0; Asuncion, Welling, Smyth and Teh,
    "On smoothing and inference for topic models", UAI 2009) of the conditional that
    :func:`fold_in_collapsed` samples: each distinct word ``v`` of a document, counted
    ``c`` times, keeps a class distribution ``g_v`` and the document's expected counts are
    ``E[O_dk] = sum_v c_v g_vk``; a pass updates every word in turn to

        g_vk ∝ (E[O_dk] - g_vk + alpha_k) M_kv,    M = pi phi  (K x V, given as MT, V x K)

    (the counts without one of its tokens, as ``O_dk^-i`` in Eqs. 4-5). Words start at
    ``g_vk ∝ alpha_k M_kv`` (the document's other words ignored). A document stops after
    ``max_passes`` passes, or after the first pass that moved less than ``tol`` of its
    tokens' class mass (L1 change of ``E[O_d]`` / its token count). No randomness: a
    document's result depends on nothing but its words, up to the last bits (``fastmath``
    sums are vectorised, and their order depends on where the scratch arrays lie in memory:
    two threads can differ by ~1e-15; without reassociation the kernel is 30% slower). ``ptr``/``w``/``c``: the
    distinct kept words of document ``d`` are ``w[ptr[d]:ptr[d + 1]]`` with counts ``c``.
    Returns (N x K) ``E[O_dk]``.
    """
    N = ptr.size - 1
    K = MT.shape[1]
    acc = np.zeros((N, K))
    nd = np.zeros(K)
    tmp = np.empty(K)
    g = np.empty((ptr[N] - ptr[0], K))
    off = ptr[0]
    for d in range(N):
        start = ptr[d]
        end = ptr[d + 1]
        if end == start:
            continue
        n_tokens = 0.0
        for k in range(K):
            nd[k] = 0.0
        for i in range(start, end):
            mv = MT[w[i]]
            tot = 0.0
            for k in range(K):
                tmp[k] = alpha[k] * mv[k]
                tot += tmp[k]
            inv = 1.0 / tot if tot > 0.0 else 0.0
            for k in range(K):
                g[i - off, k] = tmp[k] * inv
                nd[k] += c[i] * g[i - off, k]
            n_tokens += c[i]
        for _ in range(max_passes):
            moved = 0.0
            for i in range(start, end):
                mv = MT[w[i]]
                gi = g[i - off]
                tot = 0.0
                for k in range(K):
                    x = (nd[k] - gi[k] + alpha[k]) * mv[k]
                    tmp[k] = x if x > 0.0 else 0.0  # rounding: nd_k - g_ik can be -1e-16
                    tot += tmp[k]
                if tot <= 0.0:
                    continue
                inv = 1.0 / tot
                for k in range(K):
                    step = c[i] * (tmp[k] * inv - gi[k])
                    nd[k] += step
                    moved += abs(step)
                    gi[k] = tmp[k] * inv
            if moved < tol * n_tokens:
                break
        for k in range(K):
            acc[d, k] = nd[k]
    return acc


@njit(cache=True)
def transfer_states(new_ptr: np.ndarray, new_col: np.ndarray, old_ptr: np.ndarray,
                    old_col: np.ndarray, old_z: np.ndarray, old_y: np.ndarray,
                    new_docs: np.ndarray, old_docs: np.ndarray, zmap: np.ndarray,
                    z_out: np.ndarray, y_out: np.ndarray) -> int:
    """Copy the previous fit's token states into the new token arrays.

    For each pair (``new_docs[j]``, ``old_docs[j]``) of the same unchanged
    document, the two token lists (both sorted by hashed column) are merged; a
    token present in both takes the old topic and the old class mapped through
    ``zmap`` (-1 = the class no longer exists, re-initialise). Returns the number
    of tokens transferred.
    """
    n = 0
    for j in range(new_docs.size):
        dn = new_docs[j]
        do = old_docs[j]
        a = new_ptr[dn]
        a_end = new_ptr[dn + 1]
        b = old_ptr[do]
        b_end = old_ptr[do + 1]
        while a < a_end and b < b_end:
            ca = new_col[a]
            cb = old_col[b]
            if ca == cb:
                z_out[a] = zmap[old_z[b]]
                y_out[a] = old_y[b]
                n += 1
                a += 1
                b += 1
            elif ca < cb:
                a += 1
            else:
                b += 1
    return n


@njit(cache=True)
def random_init(ptr: np.ndarray, z: np.ndarray, y: np.ndarray, fixed_class: np.ndarray,
                K: int, L: int, seed: int) -> None:
    """Algorithm 1 step 1: y uniform at random, z = label (seeded) or uniform at random."""
    st = np.array([np.uint64(seed)], dtype=np.uint64)
    for d in range(ptr.size - 1):
        fixed = fixed_class[d]
        for i in range(ptr[d], ptr[d + 1]):
            y[i] = _randint(st, L)
            z[i] = fixed if fixed >= 0 else _randint(st, K)


@njit(cache=True)
def _nz_lists(nvl: np.ndarray, freq: np.ndarray):
    """Per-word lists of the topics with O_lv > 0 (capacity min(L, frequency of v))."""
    V, L = nvl.shape
    off = np.zeros(V + 1, dtype=np.int64)
    for v in range(V):
        off[v + 1] = off[v] + min(L, freq[v])
    top = np.zeros(off[V], dtype=np.int16)
    cnt = np.zeros(V, dtype=np.int64)
    for v in range(V):
        for l_ in range(L):
            if nvl[v, l_] > 0:
                top[off[v] + cnt[v]] = l_
                cnt[v] += 1
    return off, top, cnt


@njit(cache=True, fastmath=True)
def gibbs_sweeps_sparse(ptr: np.ndarray, w: np.ndarray, z: np.ndarray, y: np.ndarray,
                        free_doc: np.ndarray, ndk: np.ndarray, nkl: np.ndarray, nk: np.ndarray,
                        nvl: np.ndarray, nl: np.ndarray, alpha: np.ndarray, beta: float, delta: float,
                        n_sweeps: int, n_average: int, seed: int, acc: np.ndarray) -> None:
    """Same chain as :func:`gibbs_sweeps` (same conditionals), with a sparse y step.

    Eq. (5) splits as ``(O_kl + delta) / (O_l + V beta) * (O_lv + beta)`` =
    ``beta * A_kl`` (smoothing bucket, total ``beta * Q_k`` with
    ``Q_k = sum_l A_kl`` maintained incrementally) + ``O_lv * A_kl`` (non-zero only
    for the topics that word v currently has, walked through per-word topic
    lists), as in SparseLDA (Yao, Mimno & McCallum, KDD 2009). The draw is exact:
    the smoothing bucket (probability ``beta Q_k / (beta Q_k + R)``, small) falls
    back to a dense walk over the L topics. The O(K) update of every class's Q_k
    when O_l changes is skipped when a token returns to its previous topic (the
    usual case after burn-in): Q_k of the sampled class is corrected in O(1).
    """
    st = np.array([np.uint64(seed)], dtype=np.uint64)
    N = ptr.size - 1
    K = nkl.shape[0]
    L = nkl.shape[1]
    V = nvl.shape[0]
    vbeta = V * beta
    ldelta = L * delta
    freq = np.zeros(V, dtype=np.int64)
    for i in range(w.size):
        freq[w[i]] += 1
    off, top, cnt = _nz_lists(nvl, freq)
    nlk = np.ascontiguousarray(nkl.T)  # topic-major copy: the K loops read contiguous rows
    inv_nl = np.empty(L)
    inv_nk = np.empty(K)
    Q = np.zeros(K)
    cz = np.empty(K)
    buf = np.empty(L)
    for s in range(n_sweeps):
        # exact recomputation once per sweep (no drift of the incremental updates)
        for l_ in range(L):
            inv_nl[l_] = 1.0 / (nl[l_] + vbeta)
        for k in range(K):
            inv_nk[k] = 1.0 / (nk[k] + ldelta)
            q = 0.0
            for l_ in range(L):
                q += (nlk[l_, k] + delta) * inv_nl[l_]
            Q[k] = q
        for d in range(N):
            free = free_doc[d] != 0
            for i in range(ptr[d], ptr[d + 1]):
                v = w[i]
                k = np.int64(z[i])
                l_ = np.int64(y[i])
                # ---- remove token i
                ndk[d, k] -= 1
                nlk[l_, k] -= 1
                Q[k] -= inv_nl[l_]
                nk[k] -= 1
                inv_nk[k] = 1.0 / (nk[k] + ldelta)
                # O_l changes: inv_nl[l] a -> b. Q of the other classes is updated
                # lazily, only if the token does not come back to topic l.
                nl[l_] -= 1
                l_old = l_
                a_old = inv_nl[l_old]
                b_old = 1.0 / (nl[l_old] + vbeta)
                inv_nl[l_old] = b_old
                nvl[v, l_] -= 1
                if nvl[v, l_] == 0:
                    o = off[v]
                    c = cnt[v] - 1
                    for j in range(o, o + c + 1):
                        if top[j] == l_:
                            top[j] = top[o + c]
                            break
                    cnt[v] = c
                # ---- Eq. (4): z_i given y_i
                if free:
                    tot = 0.0
                    for kk in range(K):
                        tot += (ndk[d, kk] + alpha[kk]) * (nlk[l_, kk] + delta) * inv_nk[kk]
                        cz[kk] = tot
                    k = _draw(cz, K, st)
                    z[i] = k
                # ---- Eq. (5): y_i given z_i, sparse + smoothing buckets
                o = off[v]
                c = cnt[v]
                nvl_v = nvl[v]
                R = 0.0
                for j in range(c):
                    t = top[o + j]
                    r = nvl_v[t] * (nlk[t, k] + delta) * inv_nl[t]
                    buf[j] = r
                    R += r
                # Q_k^{-i}: Q[k] still uses a_old for topic l_old
                S = beta * (Q[k] + (nlk[l_old, k] + delta) * (b_old - a_old))
                u = _uniform(st) * (S + R)
                if u < R and c > 0:
                    j = 0
                    while j < c - 1 and u >= buf[j]:
                        u -= buf[j]
                        j += 1
                    l_ = np.int64(top[o + j])
                else:
                    u = max(u - R, 0.0)
                    l_ = L - 1
                    for t in range(L):
                        u -= beta * (nlk[t, k] + delta) * inv_nl[t]
                        if u < 0.0:
                            l_ = t
                            break
                y[i] = l_
                # ---- add token i back
                ndk[d, k] += 1
                nk[k] += 1
                inv_nk[k] = 1.0 / (nk[k] + ldelta)
                if l_ == l_old:
                    # O_l is back to its value: inv_nl and the other classes' Q unchanged
                    inv_nl[l_] = a_old
                    nl[l_] += 1
                    nlk[l_, k] += 1
                    Q[k] += a_old
                else:
                    dif = b_old - a_old
                    for kk in range(K):
                        Q[kk] += (nlk[l_old, kk] + delta) * dif
                    nlk[l_, k] += 1
                    Q[k] += inv_nl[l_]
                    nl[l_] += 1
                    b = 1.0 / (nl[l_] + vbeta)
                    dif = b - inv_nl[l_]
                    for kk in range(K):
                        Q[kk] += (nlk[l_, kk] + delta) * dif
                    inv_nl[l_] = b
                if nvl[v, l_] == 0:
                    top[off[v] + cnt[v]] = l_
                    cnt[v] += 1
                nvl[v, l_] += 1
        if s >= n_sweeps - n_average:
            for d in range(N):
                for k in range(K):
                    acc[d, k] += ndk[d, k]
    for k in range(K):
        for l_ in range(L):
            nkl[k, l_] = nlk[l_, k]
