"""oneDNN's AMX brgemm kernels: how many C tiles one kernel keeps (its tile workspace).

An AMX brgemm kernel keeps ``bd_block2 x ld_block2`` accumulator (C) tiles of 1 KiB, and
``brg_matmul`` books that many tiles per thread for its post-ops workspace
(``brgemm_desc_t::get_wsp_buffer_size``, ``brgemm_types.hpp``). `c_tiles` replays
``brgemm_blocking_tmm`` (``src/cpu/x64/brgemm/brgemm_utils.cpp``, uxlfoundation/oneDNN
v3.12, the version torch 2.13.0+cpu ships) for the case ``brg_matmul`` creates: no row
mask, the micro-kernel (``can_dispatch_uker``), no blocking hints, bf16 operands.
"""

from __future__ import annotations

import dataclasses

__all__ = ["c_tiles"]

_BF16 = 2


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _up(a: int, b: int) -> int:
    return _div_up(a, b) * b


@dataclasses.dataclass
class _Tiles:
    """The tile blocking of one AMX brgemm kernel (``brgemm_blocking_tmm``).

    ``bd`` rows of A and C, ``ld`` columns of B and C, no row mask, the micro-kernel
    (``can_dispatch_uker``), no hints: the case of ``brg_matmul``.
    """

    bd: int
    ld: int
    bd_block: int = 16
    bdb: int = 0
    bdb_tail: int = 0
    bd_block2: int = 1
    ld_block: int = 16
    ldb: int = 0
    ldb_tail: int = 0
    ld_block2: int = 1
    m_tail: bool = False

    def __post_init__(self) -> None:
        self.ldb, self.ldb_tail = self.ld // 16, self.ld % 16

    def by_ld(self) -> None:
        """``set_decomposition_by_ld``."""
        if self.bd_block2 == 1 and self.ldb > 0 and self.ldb_tail == 0:
            self.ld_block2 = 3 if self.ldb % 3 == 0 else 2 if self.ldb % 2 == 0 else 1
        else:
            even = self.ldb > 0 and self.ldb % 2 == 0 and self.ldb_tail == 0
            self.ld_block2 = 2 if even and self.bd_block2 < 3 else 1
        if self.ld_block2 == 1 and not self.m_tail and self.ldb_tail == 0:
            self.bd_block2 = min(3, max(1, self.bdb))

    def two_by_two(self) -> bool:
        """``try_2x2_decomposition``: the largest row block up to 16 dividing ``bd``."""
        block = next(b for b in range(16, 0, -1) if self.bd % b == 0)
        if block == 1:
            block, tail = min(16, self.bd), self.bd % 16
            for size in range(16, 0, -1):
                if self.bd % size > tail or self.bd % size == 0:
                    block, tail = size, self.bd % size
                    if tail == 0:
                        break
        self.bd_block, self.bdb, self.bdb_tail = block, self.bd // block, self.bd % block
        self.m_tail = False
        self.bd_block2 = 2 if self.bdb >= 2 else 1
        self.by_ld()
        return not (self.ld_block2 == 1 or self.bd_block2 == 1 or self.bd_block < 8)

    def three_by_one(self, width: int) -> bool:
        """``try_3x1_decomposition``: rows between ``width - 1`` and ``width`` tiles."""
        self.m_tail = False
        if not ((width - 1) * 16 < self.bd < width * 16 and self.ldb_tail == 0):
            return False
        self.bd_block, self.bdb, self.bdb_tail = 16, _div_up(self.bd, 16), self.bd % 16
        self.m_tail, self.bd_block2 = True, width
        self.by_ld()
        return True

    def recalc(self, bd_block: int, ld_block: int, bd_block2: int, ld_block2: int) -> None:
        """``recalc_blocking`` (0 keeps a value)."""
        if bd_block:
            self.bd_block, self.bdb = bd_block, _div_up(self.bd, bd_block)
            self.bdb_tail = self.bd % bd_block
        if ld_block:
            self.ld_block, self.ldb = ld_block, _div_up(self.ld, ld_block)
            self.ldb_tail = self.ld % ld_block
        self.bd_block2 = bd_block2 or self.bd_block2
        self.ld_block2 = ld_block2 or self.ld_block2

    def wide(self, k: int, l1: int) -> None:
        """1x(4|5) or (4|5)x1 tiles for whole blocks and a K that fits L1."""
        low_k, eff_k = (l1 - 4096) // 96, k * _BF16
        k5 = low_k <= eff_k < (l1 - 5120) // 80
        k4 = low_k <= eff_k < (l1 - 4096) // 64
        if self.ld % 80 == 0 and k5 and self.bd > 32:
            self.recalc(0, 16, 1, 5)
        elif self.ld % 64 == 0 and k4 and self.bd > 32:
            self.recalc(0, 16, 1, 4)
        elif self.bd % 80 == 0 and k5 and self.ld > 32:
            self.recalc(0, 16, 5, 1)
        elif self.bd % 64 == 0 and k4 and self.ld > 32:
            self.recalc(16, 16, 4, 1)

    def tails(self, *, bd_tail: bool, ld_tail: bool) -> None:
        """Tile shapes for small dimensions or dimensions with tails."""
        weak_ld = self.ld_block < 8 or self.ldb_tail > 0
        weak_bd = self.bd_block < 8 or self.bdb_tail > 0
        ld_only, bd_only = ld_tail and not bd_tail, bd_tail and not ld_tail
        ld16, bd16 = _up(self.ld, 16), _up(self.bd, 16)
        if ld_only and self.ld > 64 and self.ld_block < 8:
            self.recalc(0, 16, 2, 1)
        elif ld_only and weak_ld and ld16 in {64, 48, 32}:
            self.recalc(0, 16, 2 if ld16 == 32 else 1, 2 if ld16 == 32 else ld16 // 16)
        elif self.bd <= 16:
            self.recalc(self.bd, 16, 0, 0)
            most = (3 if self.ldb > 4 else 4) if ld_tail else 5
            self.recalc(0, 0, 1, min(most, _div_up(self.ld, 16)))
        elif bd_only and weak_bd and self.bd > 64:
            self.recalc(16, 16, 1, 2)
        elif bd_only and weak_bd and bd16 in {64, 48}:
            self.recalc(16, 16, bd16 // 16, 1)
        elif bd_only and weak_bd and bd16 == 32 and self.ld % 32 == 0:
            self.recalc(16, 16, 2, 2)
        elif self.ld <= 16:
            self.recalc(16, 16, 0, 0)
            most = (3 if self.bdb > 4 else 4) if self.bdb_tail else 5
            self.recalc(0, 0, min(most, _div_up(self.bd, 16)), 1)
        elif bd_tail and ld_tail and bd16 == 32 and ld16 == 32 and (weak_ld or weak_bd):
            self.recalc(16, 16, 2, 2)


def c_tiles(bd: int, ld: int, k: int, *, l1: int) -> int:
    """C tiles of one AMX brgemm kernel (``brgemm_blocking_tmm``) of ``bd x k x ld``.

    Example:
        >>> c_tiles(64, 64, 1024, l1=48 * 1024), c_tiles(24, 48, 34, l1=48 * 1024)
        (4, 2)
    """
    tiles = _Tiles(bd, ld)
    if not (tiles.two_by_two() or tiles.three_by_one(3) or tiles.three_by_one(2)):
        tiles.two_by_two()
    tiles.recalc(tiles.bd_block, tiles.ld_block, tiles.bd_block2, tiles.ld_block2)
    bd_tail = not (tiles.bd_block > 12 and bd % tiles.bd_block == 0)
    ld_tail = ld % 16 != 0
    if not bd_tail and not ld_tail:
        tiles.wide(k, l1)
    tiles.tails(bd_tail=bd_tail, ld_tail=ld_tail)
    return tiles.bd_block2 * tiles.ld_block2
