"""oneDNN's bf16 matmul on AMX: the scratchpad of a weight-gradient GEMM.

Under CPU autocast a ``Linear`` runs its bfloat16 GEMMs through ``mkldnn_matmul``
(``aten/src/ATen/native/mkldnn/Matmul.cpp``: ``use_mkldnn_bf16_matmul``, taken when
``M * K * N > 16 * 16 * 16``), which runs oneDNN's ``brg_matmul``. On a CPU with AMX tiles
the kernel is ``brg_matmul:avx512_core_amx`` (``avx10_1_512_amx`` in ``ONEDNN_VERBOSE``),
whose scratchpad holds per-thread copies of A and B in tile layouts, an f32 accumulator
and the tiles' own workspace: measured here (torch 2.13.0+cpu, oneDNN v3.12, Xeon with
AMX-BF16, 2 threads) 305,920 B for ``mm((8, 1024).t(), (1024, 256))``, 1,083,136 B for
``mm((256, 1024).t(), (1024, 64))``, above outputs of 4 and 32 KiB.

`transposed_a_scratch` replays oneDNN v3.12 for the weight gradient ``grad.t() @ x`` (A
transposed, the ``ba`` source that ``mm_mat2_backward`` passes, B plain): the ``micro``
blocking heuristic of ``amx_blocking_heuristics.cpp`` (the ``macro`` one needs a plain A),
the buffer sizes of ``init_aux_values`` and ``init_scratchpad``
(``brgemm_matmul_utils.cpp``), and the C tiles of ``brgemm_blocking_tmm``
(``brgemm_utils.cpp``) for the tiles' workspace. Checked byte for byte against the real
call for 318 shapes (M 5-1024, K 3-2000, N 8-1024) at 1, 2 and 3 threads (Xeon with
AMX-BF16, 2 cores, torch 2.13.0+cpu). The heuristic reads the per-core L1 and L2 cache
sizes, which torch reports (``torch._C._cpu._get_cpu_capability()``), and the candidates'
order of a libstdc++ ``std::unordered_set`` (`unordered_set_order`).

Not modelled: the GEMMs with a plain A (forward and input gradient), which oneDNN blocks
with its ``macro`` heuristic; CPUs without AMX (``avx512_core_bf16`` kernels, other
heuristics).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from torchfit.memory.kernels.amx_tiles import c_tiles

__all__ = ["transposed_a_scratch", "unordered_set_order"]

_BF16 = 2
_ACC = 4
_ALIGN = 128  # registry_t: every scratchpad entry is padded by its alignment, >= 128 B
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)
_TILE = 1024  # one AMX tile: 16 rows of 64 bytes
_WEI_K_BLK = 32  # get_wei_k_blk(bf16): 16 * vnni granularity 2
_WEI_N_BLK = 64  # get_default_n_block: a plain B, the macro heuristic not applicable
_K_GRANULARITY = 2  # data_type_vnni_granularity(bf16)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _up(a: int, b: int) -> int:
    return _div_up(a, b) * b


@dataclasses.dataclass
class _Blocking:
    """One candidate of ``matmul_amx_blocking_params_micro_t`` (A transposed, bf16)."""

    m: int
    n: int
    k: int
    threads: int
    l2_threshold: int
    nthr_k: int = 1
    n_blk: int = 0
    n_chunk: int = 0
    m_blk: int = 0
    m_chunk: int = 0
    k_blk: int = 0
    k_chunk: int = 1
    batch: int = 0
    lda: int = 0
    buffer_c: bool = False
    memory: int = 0
    score: float = 0.0

    @property
    def nthr_mnb(self) -> int:
        return self.threads // self.nthr_k

    def _lda(self) -> int:
        """``get_actual_lda`` with the A buffer: K block in cache lines, off big powers of 2."""
        lda = _up(self.k_blk, 64 // _BF16)
        return lda + 32 if lda >= 512 and lda & (lda - 1) == 0 else lda

    def _chunk_memory(self) -> int:
        """``calculate_chunk_memory_size`` (after ``update_k_blocking_dependent_params``)."""
        k_elems = self.k_blk * self.k_chunk * self.batch
        self.lda = self._lda()
        # is_buffer_c_required: a bf16 destination accumulates in f32 across K blocks
        self.buffer_c = self.k > k_elems or self.k % self.k_blk > 0
        m_elems, n_elems = self.m_blk * self.m_chunk, self.n_blk * self.n_chunk
        a = _BF16 * k_elems * m_elems + _BF16 * self.lda * self.batch * m_elems
        b = _BF16 * k_elems * n_elems + _BF16 * self.n_blk * k_elems
        c = _BF16 * m_elems * n_elems + (_ACC * m_elems * n_elems if self.buffer_c else 0)
        return a + b + c

    def set(self, n_blk: int, n_chunk: int, m_blk: int, m_chunk: int) -> None:
        """``set_blocking_parameters`` with ``nthr_k`` threads over K."""
        self.n_blk, self.n_chunk, self.m_blk, self.m_chunk = n_blk, n_chunk, m_blk, m_chunk
        self.k_chunk = 1
        if self.k < _WEI_K_BLK:
            self.k_blk, self.batch = _up(self.k, _K_GRANULARITY), 1
        else:
            self.k_blk = min(_up(_div_up(self.k, self.nthr_k), _K_GRANULARITY), _WEI_K_BLK)
            per_thread = _div_up(_div_up(self.k, self.k_blk), self.nthr_k)
            self.batch = per_thread
            chunk = self._chunk_memory()
            div_min, div_max = chunk // self.l2_threshold, _div_up(chunk, self.l2_threshold)
            if div_min > 0 and self.batch > 1:
                kc1 = max(self.batch // div_min, 1)
                kc2 = _div_up(self.batch, div_max)
                tail1, tail2 = per_thread % kc1, per_thread % kc2
                self.batch = kc2 if (not (tail1 == 0 or tail2 < tail1)) or tail2 == 0 else kc1
            tail = self.k % self.k_blk
            # extendable_k needs no A buffer: never here
            if tail == 0 and self.k % (self.k_blk * self.batch) == 0:
                self.k_blk, self.batch = self.k_blk * self.batch, 1
            elif self.nthr_k == 1 and self.k == self.k_blk * self.batch + tail:
                self.k_blk, self.batch = self.k_blk * self.batch, 2
        self.memory = self._chunk_memory()
        self.score = self._score()

    def _score(self) -> float:
        """``calculate_blocking_scores``: thread balance, L2 use, reuse of copied data."""
        m_elems, n_elems = self.m_blk * self.m_chunk, self.n_blk * self.n_chunk
        k_elems = self.k_blk * self.k_chunk * self.batch
        chunks = _div_up(self.m, m_elems) * _div_up(self.n, n_elems)
        balance = (self.m / m_elems) * (self.n / n_elems) / _up(chunks, self.nthr_mnb)
        balance *= self.nthr_mnb
        if self.nthr_k > 1:
            k_chunks = _div_up(self.k, k_elems)
            balance *= 0.8 * (self.k / k_elems) / _up(k_chunks, self.nthr_k) * self.nthr_k
        balance /= self.threads
        l2 = 1.0 - abs(self.l2_threshold - self.memory) / max(self.l2_threshold, self.memory)
        reuse = 0.5 * (min(m_elems / min(self.m, 256), 1.0) + min(n_elems / min(self.n, 256), 1.0))
        coeff = min(self.threads, 100)
        balance_factor, cache_factor = (coeff - 1) / coeff, 1 / coeff
        score = cache_factor * l2 + reuse
        if balance_factor > 0:
            score += balance_factor * balance
        return score / (1.0 + balance_factor + cache_factor)


def _first_m_blk(m: int) -> int:
    """``get_block_candidate``: a multiple of 13-16 tile rows dividing M, else up to 64."""
    for rows in range(16, 12, -1):
        for scale in range(4, 1, -1):
            if m % (scale * rows) == 0:
                return scale * rows
    return min(m, 64)


def _m_candidates(m: int, m_blk: int, min_m: int) -> list[int]:
    """The M blocks tried, in the order oneDNN's ``std::unordered_set<int>`` yields them.

    Candidates can tie on score and the first one wins, so the order matters: measured
    ``mm((64, 34).t(), (34, 128))`` takes M_blk 32 over 64 (52,352 B, not 76,928 B).
    """
    found = []
    value = m_blk
    while value >= min_m:
        found.append(value)
        value = _div_up(value, 2) if value > 1 else value - 1
    if m > 16:
        found += list(range(min(m // 16 * 16, 64), _up(min_m, 16) - 1, -16))
    return unordered_set_order(found)


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _next_buckets(n: int) -> int:
    """``_Prime_rehash_policy::_M_next_bkt``: a small table, then the next prime."""
    fast = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
    if n < len(fast):
        return fast[n]
    return next(p for p in itertools.count(n) if _is_prime(p))


def unordered_set_order(values: list[int]) -> list[int]:
    """Iteration order of a libstdc++ ``std::unordered_set<int>`` filled with ``values``.

    libstdc++ (``bits/hashtable.h``; torch 2.13 is built with GCC 13) hashes an int to
    itself, starts at 13 buckets (``_M_need_rehash``: at least 11 once something is
    inserted), puts a node that opens a bucket at the front of its one list and a node of
    a used bucket at the front of that bucket's run; a rehash re-inserts the nodes the
    same way in list order.

    Example:
        >>> unordered_set_order([64, 32, 64, 48, 32])
        [48, 32, 64]
    """
    buckets, next_resize = 1, 0
    order: list[int] = []
    for value in values:
        if value in order:
            continue
        if len(order) + 1 > next_resize:
            wanted = max(len(order) + 1, 0 if next_resize else 11)
            if wanted >= buckets:
                buckets = _next_buckets(max(wanted + 1, 2 * buckets))
                order = _reinsert(order, buckets)
            next_resize = buckets
        order = _reinsert([value], buckets, order)
    return order


def _reinsert(nodes: list[int], buckets: int, into: list[int] | None = None) -> list[int]:
    order = list(into or [])
    for node in nodes:
        run = next((i for i, q in enumerate(order) if q % buckets == node % buckets), 0)
        order.insert(run, node)
    return order


def _best_blocking(m: int, k: int, n: int, *, threads: int, l2: int) -> _Blocking:
    """``matmul_amx_blocking_params_micro_t::find_best_blocking`` (bf16, batch 1)."""
    m_blk, n_blk = _first_m_blk(m), min(_WEI_N_BLK, n)
    best = _Blocking(m, n, k, threads, 3 * l2 // 4)
    max_k_work = _div_up(k, 1024)
    max_nthr_k = min(max(threads // 8, 1), 7, max_k_work)
    for nthr_k in range(1, max_nthr_k + 1):
        m_blocks, n_blocks = _div_up(m, m_blk), _div_up(n, n_blk)
        work = m_blocks * n_blocks * min(max_k_work, nthr_k)
        low = work < 1.5 * threads
        min_m = _div_up(m_blk, 2) if low and m_blk > 32 else m_blk
        m_chunk_max = min(4, m_blocks)
        n_chunk_max = min(6 if work > 16 * threads else 4, n_blocks)
        found = False
        for m_try in _m_candidates(m, m_blk, min_m):
            for n_chunk in range(n_chunk_max, 0, -1):
                for m_chunk in range(m_chunk_max, 0, -1):
                    current = _Blocking(m, n, k, threads, best.l2_threshold, nthr_k=nthr_k)
                    current.set(n_blk, n_chunk, m_try, m_chunk)
                    chunks = _div_up(m, m_try * m_chunk) * _div_up(n, n_blk * n_chunk)
                    nthr_bmn = threads // nthr_k
                    if chunks < nthr_bmn * 3 and chunks % nthr_bmn and max_nthr_k == 1:
                        continue
                    if current.score > best.score:
                        best, found = current, True
        if not found:
            current = _Blocking(m, n, k, threads, best.l2_threshold, nthr_k=nthr_k)
            current.set(n_blk, 1, min_m, 1)
            if current.score > best.score:
                best = current
    return best


def transposed_a_scratch(m: int, k: int, n: int, *, threads: int, l1: int, l2: int) -> int:
    """Scratchpad bytes of ``mm(A, B)`` in bf16 on AMX, A (M x K) transposed, B plain.

    Args:
        m: Rows of A and of the output (a weight gradient's output features).
        k: The reduced dimension (the batch of a weight gradient).
        n: Columns of B and of the output (input features).
        threads: oneDNN's thread count.
        l1: Per-core L1 data cache in bytes.
        l2: Per-core L2 cache in bytes.

    Returns:
        Bytes of the one scratchpad allocation (0 where ATen does not call oneDNN).

    Example:
        >>> transposed_a_scratch(8, 1024, 256, threads=2, l1=48 * 1024, l2=2 * 1024**2)
        305920
    """
    if m * k * n <= 16 * 16 * 16:
        return 0
    best = _best_blocking(m, k, n, threads=threads, l2=l2)
    n_blk, m_blk, k_blk = best.n_blk, best.m_blk, best.k_blk
    wei_n_blk = _WEI_N_BLK
    if wei_n_blk > n_blk and n != n_blk:  # the B buffer's block follows N_blk
        wei_n_blk = _up(n_blk, 64 // (_K_GRANULARITY * _BF16))
    ldc = min(32, n_blk) if best.buffer_c and best.nthr_k <= 1 else n
    c_chunk = _up(n_blk, ldc) * m_blk * _ACC if best.nthr_k == 1 else _ACC * ldc * m
    k_elems = k_blk * best.k_chunk * best.batch
    if not best.buffer_c:
        c_per_thread = 0
    elif best.nthr_k > 1 or k_elems >= k:
        c_per_thread = c_chunk
    else:
        c_per_thread = c_chunk * best.m_chunk * best.n_chunk
    a_per_thread = _BF16 * m_blk * best.lda * best.batch * best.k_chunk * best.m_chunk
    b_per_thread = (
        _BF16 * _up(n_blk, wei_n_blk) * _up(k_blk, _WEI_K_BLK) * best.batch * best.k_chunk
    )
    nthr = best.nthr_mnb * best.nthr_k
    k_tail = _up(k % k_blk, _K_GRANULARITY) if k > k_blk else 0
    tiles = max(
        c_tiles(bd, ld, kk, l1=l1)
        for bd in {m_blk, m % m_blk} - {0}
        for ld in {n_blk, n % n_blk} - {0}
        for kk in {k_blk, k_tail} - {0}
    )
    entries = [
        nthr * 16 * best.batch * _BATCH_ELEMENT,
        nthr * a_per_thread,
        nthr * b_per_thread,
        nthr * c_per_thread,
        nthr * tiles * _TILE,
    ]
    return sum(size + _ALIGN for size in entries if size)
