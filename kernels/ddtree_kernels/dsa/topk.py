"""Tree-aware top-k of the indexer's logits: a radix select over their bits, then a compaction into slots.

Each token keeps its `TOPK` best visible keys (all of them where fewer are visible). A logit's fp32 bits, made
order-preserving (`sort_key`), are selected one byte at a time from the top: pass j (0-3) counts the keys whose
higher bytes equal the prefix chosen so far into a 256-bin histogram of the next byte (many programs a token,
one atomic add of their local histogram each); each program of the next pass walks the histograms so far to the
byte holding the k-th key (`chosen_prefix`), which no program has to publish. The last pass writes the selected
keys' slots: every key above the threshold, then as many keys equal to it as are still needed (ties at the
threshold in no fixed order: reference.py says why that does not matter). Fixed grids, no host sync: CUDA-graph
safe. The histograms and counters are zeroed before each call (launcher).

Invisible keys hold -inf (indexer.py), whose sort key is below every finite logit's, so they are never chosen.
"""

import triton
import triton.language as tl

from .indexer import key_slots, request_keys

BINS = tl.constexpr(256)
STATE = 4 * 256 + 2  # int32 a token: four histograms, then the two write counters of the last pass


@triton.jit
def sort_key(logits):
    """fp32 -> uint32 with the same order (negative values flipped, the sign bit set on the others)."""
    bits = logits.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


@triton.jit
def visible_keys(vis, stride_vis, token, prefix_len, n_tok, N_MAX: tl.constexpr):
    """Keys the token sees: its prefix, its ancestors and itself."""
    offs = tl.arange(0, N_MAX)
    seen = tl.load(vis + token.to(tl.int64) * stride_vis + offs, mask=offs < n_tok, other=0)
    return prefix_len + tl.sum((seen != 0).to(tl.int32), 0)


@triton.jit
def chosen_prefix(state, k, PASSES: tl.constexpr):
    """(prefix, k_left, depth): the top bytes of the k-th largest sort key fixed by the first PASSES histograms, how
    many keys equal to that prefix are still to be taken, and how many bytes the prefix has. The walk stops at the
    first byte whose bin holds exactly the keys still needed: all of them are taken, and later passes (which then
    find nothing to count) are skipped."""
    offs = tl.arange(0, BINS)
    prefix = tl.zeros([], dtype=tl.uint32)
    k_left = k
    depth = tl.zeros([], dtype=tl.int32)
    done = k < 0  # a 0-d False
    for j in tl.static_range(PASSES):
        hist = tl.load(state + j * BINS + (BINS - 1 - offs))  # bins from the top byte value down
        above = tl.cumsum(hist, 0)  # keys in this bin and the ones above it
        first = tl.min(tl.where(above >= k_left, offs, BINS), 0)  # the bin holding the k_left-th key
        before = tl.sum(tl.where(offs < first, hist, 0), 0)
        in_bin = tl.sum(tl.where(offs == first, hist, 0), 0)
        byte = (BINS - 1) - first.to(tl.int32)  # the chosen bin's byte value
        prefix = tl.where(done, prefix, prefix | (byte.to(tl.uint32) << (24 - 8 * j)))
        k_left = tl.where(done, k_left, k_left - before)
        depth = tl.where(done, depth, depth + 1)
        done = done | (in_bin == k_left)
    return prefix, k_left, depth


@triton.jit
def dsa_topk_kernel(
    Logits, State, Sel, SelCount, kv_indices, kv_indptr, qo_indptr, tree_slots, vis, min_chunk,
    stride_lt, stride_st, stride_selt, stride_vis,
    TOPK: tl.constexpr, PASS: tl.constexpr, N_MAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """PASS 0-3: the byte histograms; PASS 4: write the selected slots (Sel [T, TOPK], SelCount [T])."""
    i = tl.program_id(0)
    split = tl.program_id(1)
    req = tl.program_id(2)
    q_start, n_tok, kv_start, prefix_len, lo, hi = request_keys(qo_indptr, kv_indptr, req, split,
                                                                tl.num_programs(1), min_chunk, BLOCK)
    if i >= n_tok:
        return
    token = q_start + i
    visible = visible_keys(vis, stride_vis, token, prefix_len, n_tok, N_MAX)
    take_all = visible <= TOPK
    k = tl.minimum(visible, TOPK)
    if PASS < 4 and take_all:
        return
    state = State + token.to(tl.int64) * stride_st
    row = Logits + token.to(tl.int64) * stride_lt
    if PASS < 4:
        prefix, _, depth = chosen_prefix(state, k, PASS)
        if depth < PASS:  # the top-k boundary is resolved: nothing left to count
            return
        hist = tl.zeros([BINS], dtype=tl.int32)
        misses = tl.zeros([], dtype=tl.int32)
        for p0 in range(lo, hi, BLOCK):
            pos = p0 + tl.arange(0, BLOCK)
            ok = pos < hi
            key = sort_key(tl.load(row + pos, mask=ok, other=float("-inf")))
            if PASS == 0:
                match = ok
            else:
                match = ok & ((key >> (32 - 8 * PASS)) == (prefix >> (32 - 8 * PASS)))
            digit = ((key >> (24 - 8 * PASS)) & 0xFF).to(tl.int32)
            # misses count in bin 0 and come off it after the loop: a histogram's cost grows with its bins
            hist += tl.histogram(tl.where(match, digit, 0), BINS)
            misses += tl.sum((match == 0).to(tl.int32), 0)
        offs = tl.arange(0, BINS)
        hist -= tl.where(offs == 0, misses, 0)
        tl.atomic_add(state + PASS * BINS + offs, hist, mask=hist > 0)
    else:
        if take_all:
            thr = sort_key(tl.full([], float("-inf"), tl.float32))  # every finite logit is above it
            k_left = tl.zeros([], dtype=tl.int32)
            shift = tl.zeros([], dtype=tl.int32)
        else:
            thr, k_left, depth = chosen_prefix(state, k, 4)
            shift = 32 - 8 * depth  # compare the bytes the walk fixed: a resolved bin is taken whole
        thr_top = (thr >> shift.to(tl.uint32))
        taken_above = k - k_left  # keys strictly above the threshold, all taken
        sel = Sel + token.to(tl.int64) * stride_selt
        for p0 in range(lo, hi, BLOCK):
            pos = p0 + tl.arange(0, BLOCK)
            ok = pos < hi
            key = sort_key(tl.load(row + pos, mask=ok, other=float("-inf"))) >> shift.to(tl.uint32)
            above = ok & (key > thr_top)
            # (masks built from full-width comparisons: the interpreter holds a mask and-ed with a scalar test, or
            # or-ed with another mask, as int32, which a load refuses)
            tie = ok & (key == thr_top) & ((pos * 0 + k_left) > 0)
            chosen = (above.to(tl.int32) + tie.to(tl.int32)) > 0
            slots = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, pos, chosen)
            n_above = tl.sum(above.to(tl.int32), 0)
            n_tie = tl.sum(tie.to(tl.int32), 0)
            if n_above > 0:
                base = tl.atomic_add(state + 4 * BINS, n_above)
                rank = tl.cumsum(above.to(tl.int32), 0) - 1
                tl.store(sel + base + rank, slots.to(Sel.dtype.element_ty), mask=above)
            if n_tie > 0:
                base = tl.atomic_add(state + 4 * BINS + 1, n_tie)
                rank = base + tl.cumsum(tie.to(tl.int32), 0) - 1
                wanted = (tie.to(tl.int32) * (rank < k_left).to(tl.int32)) > 0
                tl.store(sel + taken_above + rank, slots.to(Sel.dtype.element_ty), mask=wanted)
        if split == 0:
            tl.store(SelCount + token, k)
