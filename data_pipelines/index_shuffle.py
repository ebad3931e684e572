"""grain's index_shuffle, vectorised: the same pseudorandom permutations for many positions at once.

grain shuffles (MapDataset.shuffle, WindowShuffleIterDataset) by calling its C++
`index_shuffle` once per position; each call rebuilds the cipher's keys and cycle-walks a
block of at least 2**16 values, 20-30 us per call on our CPUs: a fifth of the loader's time
at batch 256 x 128. `shuffle_positions` computes the same values (grain's Simon cipher over
its block, std::seed_seq round keys, cycle-walking into [0, size)) with a few numpy
operations for a whole window or a chunk of an epoch's order, so the loader keeps grain's
order bit for bit (tests/test_data_loader_identity.py) and grain's iterator states.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from grain._src.python.experimental.index_shuffle.python.index_shuffle_module import index_shuffle

ROUNDS = 4  # What grain's window shuffle asks index_shuffle for.
_MIN_BLOCK_BITS = 16  # grain's kMinBlockSize.
_U32 = 0xFFFFFFFF
# Smaller sizes call grain's index_shuffle per position (a whole-block pass would cost more).
_DIRECT_BELOW = 128
# Blocks this many times larger than the size are walked through a table of the whole block.
_WALK_BY_TABLE_ABOVE = 8
# Words up to this many bits evaluate Simon's round function by lookup in a table of all words.
_TABLE_WORD_BITS = 16


def _seed_seq_keys(seed: int, count: int) -> list[int]:
    """std::seed_seq{seed}.generate() of `count` 32-bit words (C++ [rand.util.seedseq])."""
    n, s = count, 1
    out = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x: int) -> int:
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & _U32
        r2 = (r1 + (s if k == 0 else (k % n + seed) if k <= s else k % n)) & _U32
        out[(k + p) % n] = (out[(k + p) % n] + r1) & _U32
        out[(k + q) % n] = (out[(k + q) % n] + r2) & _U32
        out[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & _U32)) & _U32
        r4 = (r3 - k % n) & _U32
        out[(k + p) % n] ^= r3
        out[(k + q) % n] ^= r4
        out[k % n] = r4
    return out


def _round_function(x: np.ndarray, word: int) -> np.ndarray:
    """Simon's f(x) = (x <<< 1 & x <<< 8) ^ x <<< 2 on `word`-bit words (uint64 values)."""
    mask, w = np.uint64((1 << word) - 1), np.uint64(word)

    def rotl(r):
        return ((x << np.uint64(r)) | (x >> (w - np.uint64(r)))) & mask

    return (rotl(1) & rotl(8)) ^ rotl(2)


@functools.lru_cache(maxsize=8)
def _round_table(word: int) -> np.ndarray:
    """f of every `word`-bit word: one lookup per round instead of seven array operations."""
    return _round_function(np.arange(1 << word, dtype=np.uint64), word)


def _simon_encrypt(values: np.ndarray, keys: list[int], word: int) -> np.ndarray:
    """grain's Simon rounds over blocks of 2 * word bits (uint64 values)."""
    mask, w = np.uint64((1 << word) - 1), np.uint64(word)
    if word <= _TABLE_WORD_BITS:
        table = _round_table(word)

        def f(x):
            return table[x]
    else:

        def f(x):
            return _round_function(x, word)

    left, right = (values >> w) & mask, values & mask
    for i in range(0, len(keys), 2):
        left = left ^ f(right) ^ (np.uint64(keys[i]) & mask)
        right = right ^ f(left) ^ (np.uint64(keys[i + 1]) & mask)
    return (left << w) | right


def permutation(size: int, seed: int) -> np.ndarray:
    """[size] int64: entry i is grain's index_shuffle(i, max_index=size - 1, seed, rounds=4)."""
    return shuffle_positions(np.arange(size, dtype=np.int64), size, seed)


def shuffle_positions(positions: np.ndarray, size: int, seed: int) -> np.ndarray:
    """index_shuffle(p, max_index=size - 1, seed, rounds=4) for each p of `positions` (int64, in [0, size))."""
    positions = np.asarray(positions, np.int64)
    if size <= 1:
        return np.zeros(len(positions), np.int64)
    max_index = size - 1
    if size < _DIRECT_BELOW:
        return np.array([index_shuffle(int(p), max_index=max_index, seed=seed, rounds=ROUNDS) for p in positions],
                        np.int64)
    bits = math.ceil(math.log2(max_index))
    bits = max(bits + bits % 2, _MIN_BLOCK_BITS)
    keys = _seed_seq_keys(seed & _U32, ROUNDS)
    if (1 << bits) > _WALK_BY_TABLE_ABOVE * size:
        # A block much larger than [0, size): encrypt it all once, cycle-walk by lookups.
        table = _simon_encrypt(np.arange(1 << bits, dtype=np.uint64), keys, bits // 2).astype(np.int64)
        result = table[positions]
        walking = np.flatnonzero(result > max_index)
        while len(walking):
            result[walking] = table[result[walking]]
            walking = walking[result[walking] > max_index]
        return result
    result = _simon_encrypt(positions.astype(np.uint64), keys, bits // 2)
    walking = np.flatnonzero(result > max_index)
    while len(walking):  # Cycle-walk the values that left [0, size) until they come back.
        result[walking] = _simon_encrypt(result[walking], keys, bits // 2)
        walking = walking[result[walking] > max_index]
    return result.astype(np.int64)
