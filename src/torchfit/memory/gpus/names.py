"""How a typed GPU name meets a catalog card: normalization and a two-level index.

A name is lower-cased, split into words, and stripped of vendor and brand words
("nvidia", "geforce", "tesla", "amd", "radeon", "instinct", and "tensor core gpu");
"12 GB" and "12GiB" become the one word "12gb". The words joined without separators are
the name's *key*, so "RTX 3060", "rtx-3060", "RTX_3060" and "rtx3060" share the key
``"rtx3060"``.

Matching has two levels:

1. **Exact**: the key of a card's canonical name or of one of its aliases. Keys are
   unique across the catalog (checked when the index is built).
2. **Partial**: the key left after dropping *qualifier* words from a catalog spelling:
   a memory size ("12gb"), a form factor ("sxm4", "pcie"), or a family word ("rtx",
   "gtx", "quadro", "jetson", "agx", "ada"). "3060" is "RTX 3060 12GB" without "rtx" and
   "12gb". Words that name a different product ("ti", "super", "s", "xtx") are never
   dropped, so "GTX 1660" does not silently become the GTX 1660 Super. A partial key
   that fits several cards is ambiguous, and the caller says so.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Iterable

__all__ = ["NameIndex", "name_key", "name_tokens"]

#: Words that never tell two cards apart: vendors, brands, and product-line filler.
_NOISE = frozenset(
    {"nvidia", "geforce", "tesla", "amd", "radeon", "instinct", "tensor", "core", "gpu"}
)
#: The same words glued to the front of a name ("nvidiageforcertx4090").
_GLUED_PREFIXES = ("nvidia", "geforce", "tesla", "amd", "radeon", "instinct")
#: Words a partial name may leave out: family, line and form-factor words.
_QUALIFIERS = frozenset(
    {
        "rtx",
        "gtx",
        "rx",
        "quadro",
        "jetson",
        "agx",
        "ada",
        "generation",
        "sxm",
        "sxm2",
        "sxm4",
        "sxm5",
        "pcie",
        "hbm3",
        "hbm2e",
        "hbm3e",
    }
)
_MEMORY_WORD = re.compile(r"^\d+gb$")
_MEMORY_UNIT = re.compile(r"(\d)\s*gi?b\b")  # "12 GB", "12GiB" -> "12gb"
_WORD = re.compile(r"[a-z0-9]+")


def name_tokens(text: str) -> tuple[str, ...]:
    """The words of a GPU name, lower-case, without vendor and brand words.

    Example:
        >>> name_tokens("NVIDIA GeForce RTX 3060 12 GB")
        ('rtx', '3060', '12gb')
        >>> name_tokens("Tesla V100-SXM2-16GiB")
        ('v100', 'sxm2', '16gb')
    """
    text = _MEMORY_UNIT.sub(r"\1gb", text.lower())
    return tuple(word for word in _WORD.findall(text) if word not in _NOISE)


def name_key(text: str) -> str:
    """The compact key of a GPU name: its words joined, vendor prefixes removed.

    Example:
        >>> name_key("nvidia-geforce-rtx-4090")
        'rtx4090'
        >>> name_key("NVIDIAGeForceRTX4090")
        'rtx4090'
    """
    key = "".join(name_tokens(text))
    stripped = True
    while stripped:
        stripped = False
        for prefix in _GLUED_PREFIXES:
            if key.startswith(prefix):
                key = key.removeprefix(prefix)
                stripped = True
    return key


def _is_qualifier(word: str) -> bool:
    return word in _QUALIFIERS or _MEMORY_WORD.match(word) is not None


def _partial_keys(tokens: tuple[str, ...]) -> set[str]:
    """Every key left by dropping a non-empty set of qualifier words (never all words)."""
    droppable = [i for i, word in enumerate(tokens) if _is_qualifier(word)]
    keys: set[str] = set()
    for size in range(1, len(droppable) + 1):
        for dropped in itertools.combinations(droppable, size):
            kept = [word for i, word in enumerate(tokens) if i not in dropped]
            if kept:
                keys.add("".join(kept))
    return keys


class NameIndex:
    """Exact and partial keys of every catalog spelling, pointing at canonical names.

    Example:
        >>> index = NameIndex([("NVIDIA A100 40GB", "A"), ("NVIDIA A100 80GB SXM", "B")])
        >>> index.candidates("a100-40gb")
        ('A',)
        >>> index.candidates("A100")
        ('A', 'B')
        >>> index.candidates("H100")
        ()
    """

    def __init__(self, spellings: Iterable[tuple[str, str]]) -> None:
        """Index ``(spelling, canonical name)`` pairs.

        Raises:
            ValueError: two different cards share an exact key, or a spelling is empty.
        """
        self._exact: dict[str, str] = {}
        self._partial: dict[str, set[str]] = {}
        origin: dict[str, str] = {}
        for spelling, name in spellings:
            key = name_key(spelling)
            if not key:
                raise ValueError(f"GPU catalog spelling {spelling!r} of {name!r} has no model")
            if self._exact.get(key, name) != name:
                raise ValueError(
                    f"GPU catalog spellings {origin[key]!r} ({self._exact[key]}) and "
                    f"{spelling!r} ({name}) both normalize to {key!r}; make one more specific"
                )
            self._exact[key] = name
            origin[key] = spelling
            for partial in _partial_keys(name_tokens(spelling)):
                self._partial.setdefault(partial, set()).add(name)

    def candidates(self, text: str) -> tuple[str, ...]:
        """Canonical names ``text`` may mean: one for an exact match, all partial matches else."""
        key = name_key(text)
        if not key:
            return ()
        if key in self._exact:
            return (self._exact[key],)
        return tuple(sorted(self._partial.get(key, ())))

    def close_matches(self, text: str, limit: int = 5) -> list[str]:
        """Canonical names that look like ``text``: keys containing it first, then difflib's."""
        query = name_key(text)
        if not query:
            return []
        keys = [*self._exact, *self._partial]
        containing = sorted((key for key in keys if query in key), key=len)
        similar = difflib.get_close_matches(query, keys, n=4 * limit, cutoff=0.6)
        names: dict[str, None] = {}
        for key in (*containing, *similar):
            if key in self._exact:
                names[self._exact[key]] = None
            else:
                names.update(dict.fromkeys(sorted(self._partial[key])))
        return list(names)[:limit]
