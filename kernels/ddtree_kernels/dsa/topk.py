"""Tree-aware top-k of the indexer's logits: three launches, a bucket histogram, a collect pass and a resolve.

Each token keeps its `TOPK` best visible keys (all of them where at most `TOPK` are visible). A logit's fp32 bits,
made order-preserving (`sort_key`), fall in one of 256 `bucket`s: its sign, then half-binades of its magnitude
from 2^-32 to 2^32 (magnitudes outside land in the end buckets), so a bucket's width is a fixed ratio of the value,
whatever the logits' scale. Passes over a token's row:

1. `dsa_topk_histogram_kernel`, many programs a token (fixed grid: tokens x splits x requests): each reads its
   share of the row and adds its 256-bucket histogram into `State[t, :256]`. (In the indexer's epilogue, where it
   was, it cost more than this pass: a histogram a token a 128-key tile there, one a 1,024-key step here.)
2. `dsa_topk_collect_kernel`, the same grid: each walks the histogram to the boundary bucket B (the one holding the
   k-th key) and reads its share of the row once, writing the slot of every key above B into the selection and
   appending each key of B (its sort key and slot) to the token's candidate buffer, `CANDIDATES` entries, and
   counting B's keys by their next 6 sort-key bits (a 64-bin sub-histogram, `State[t, 261:325]`). Where B holds
   exactly the keys still needed it is written whole, and a take-all token writes all its visible keys here;
3. `dsa_topk_resolve_kernel`, up to `resolve_splits` programs a token: the sub-histogram gives the boundary's next
   digit; each program writes its share of the buffer's candidates above that digit and appends those of it (about
   1/64 of B) to the buffer's second half; the last of the token's programs to finish radix-selects among those over
   the bits still open (rounds of 8). The first program sets the count.

The bound: B holds the k-th key and every key tied with it in its bucket. The histogram says how many (`in_bin`)
before anything is appended, so overflow is known, not detected: where B holds more than `CANDIDATES` keys the
collect pass appends nothing and the token's first resolve program runs a radix select over the token's whole row
(keys of B only, rounds of 8 bits), a single program's slow but exact fallback (many near-equal logits, or logits
outside 2^+-32). No entry is ever written past the buffer, and no key of B is ever dropped (sglang #36807 was a
top-k that kept appending past its buffer and returned the wrong set).

Launches: the state is zeroed (a memset), then the three passes. Fixed grids, no host sync: CUDA-graph safe. Ties at
the threshold are taken in no fixed order (reference.py says why that does not matter). Invisible keys hold -inf
(indexer.py), below every finite logit, so they are never chosen.
"""

import triton
import triton.language as tl

from .buckets import BINS, bucket, bucket_prefix, sort_key
from .indexer import key_slots, request_keys

# A token's state after its 256-bucket histogram: the collect pass's counters (keys written to the selection,
# candidates appended), the resolve's (candidates written, kept, programs done; its last program zeroes them), then
# the 64-bin sub-histogram.
_ABOVE, _CANDS, _WROTE, _KEPT, _DONE, _SUB = (tl.constexpr(256 + j) for j in range(6))
SUB_BITS = tl.constexpr(6)  # the boundary bucket's next sort-key bits the collect pass histograms
SUB_BINS = tl.constexpr(64)
STATE = 256 + 5 + 64  # int32 a token


@triton.jit
def visible_keys(vis, stride_vis, token, prefix_len, n_tok, N_MAX: tl.constexpr):
    """Keys the token sees: its prefix, its ancestors and itself."""
    offs = tl.arange(0, N_MAX)
    seen = tl.load(vis + token.to(tl.int64) * stride_vis + offs, mask=offs < n_tok, other=0)
    return prefix_len + tl.sum((seen != 0).to(tl.int32), 0)


@triton.jit
def _max_max_min(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), tl.minimum(a2, b2)


@triton.jit
def threshold_bin(hist, need):
    """(d, above_d, in_d) of a histogram whose last bin is the top: the highest bin d where the bins from d up hold
    `need` keys, how many keys the bins above d hold, how many d holds (-1, 0, 0 where all hold fewer). One scan and
    one block-wide reduction of three values: each block-wide reduction is a round trip through shared memory with a
    barrier, and these walks sit on the top-k's critical path."""
    offs = tl.arange(0, hist.shape[0])
    at_least = tl.cumsum(hist, 0, reverse=True)  # keys in bin d and the bins above it: non-increasing in d
    reached = at_least >= need
    # the bins above d are exactly those not reaching `need`: their largest count is the keys above d
    d, above, at_d = tl.reduce((tl.where(reached, offs, -1), tl.where(reached, 0, at_least),
                                tl.where(reached, at_least, 2147483647)), 0, _max_max_min)
    return d, above, tl.where(d >= 0, at_d - above, 0)


@triton.jit
def boundary_bucket(state, k):
    """(B, k_left, in_bin): the bucket holding the k-th largest key, how many of its keys are still to be taken
    after every key above it, and how many keys it holds."""
    b, above, in_bin = threshold_bin(tl.load(state + tl.arange(0, BINS)), k)
    return b.to(tl.int32), k - above, in_bin


@triton.jit
def sub_shift(b_top):
    """The shift of the sub-histogram's digit, the SUB_BITS sort-key bits just below those bucket `b_top` fixes."""
    _prefix, known = bucket_prefix(b_top)
    return known - SUB_BITS


@triton.jit
def _append(sel, counter, chosen, values, limit):
    """Write `values` where `chosen` at the next free places of `sel` (an atomic counter), none at or past `limit`."""
    n = tl.sum(chosen.to(tl.int32), 0)
    if n > 0:
        base = tl.atomic_add(counter, n)
        rank = base + tl.cumsum(chosen.to(tl.int32), 0) - 1
        tl.store(sel + rank, values, mask=chosen & (rank < limit))


@triton.jit
def dsa_topk_histogram_kernel(
    Logits, State, kv_indptr, qo_indptr, min_chunk, stride_lt, stride_st, TOPK: tl.constexpr, BLOCK: tl.constexpr,
):
    """Each token's bucket histogram of its share of the row, added into State[t, :256]. A request whose keys all
    fit the top-k has no logits (the indexer skips it) and needs no histogram: its tokens take every visible key."""
    i = tl.program_id(0)
    req = tl.program_id(2)
    q_start, n_tok, _, prefix_len, lo, hi = request_keys(qo_indptr, kv_indptr, req, tl.program_id(1),
                                                         tl.num_programs(1), min_chunk, BLOCK)
    if i >= n_tok or lo >= hi or prefix_len + n_tok <= TOPK:
        return
    token = (q_start + i).to(tl.int64)
    hist = tl.zeros([BINS], dtype=tl.int32)
    for p0 in range(lo, hi, BLOCK):
        pos = p0 + tl.arange(0, BLOCK)
        # keys past the share read as -inf: they land in bucket 0 and come off it below
        hist += tl.histogram(bucket(sort_key(tl.load(Logits + token * stride_lt + pos, mask=pos < hi,
                                                     other=float("-inf")))), BINS)
    offs = tl.arange(0, BINS)
    hist -= tl.where(offs == 0, tl.cdiv(hi - lo, BLOCK) * BLOCK - (hi - lo), 0)
    tl.atomic_add(State + token * stride_st + offs, hist, mask=hist > 0)


@triton.jit
def dsa_topk_collect_kernel(
    Logits, State, Sel, CandKey, CandSlot, kv_indices, kv_indptr, qo_indptr, tree_slots, vis, min_chunk,
    stride_lt, stride_st, stride_selt, stride_ct, stride_vis,
    TOPK: tl.constexpr, CANDIDATES: tl.constexpr, N_MAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """Keys above the boundary bucket (or every visible key of a take-all token) into Sel; the bucket's into the
    candidate buffer where they fit it, counted by their next SUB_BITS bits into the token's sub-histogram."""
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
    state = State + token.to(tl.int64) * stride_st
    row = Logits + token.to(tl.int64) * stride_lt
    sel = Sel + token.to(tl.int64) * stride_selt
    if take_all:
        # every visible key, read from the visibility (the indexer scores no request whose keys all fit)
        for p0 in range(lo, hi, BLOCK):
            pos = p0 + tl.arange(0, BLOCK)
            ok = pos < hi
            tree_pos = pos - prefix_len
            seen = tl.load(vis + token.to(tl.int64) * stride_vis + tree_pos, mask=ok & (tree_pos >= 0), other=1)
            chosen = ok & (seen != 0)
            slots = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, pos, chosen)
            _append(sel, state + _ABOVE, chosen, slots.to(Sel.dtype.element_ty), TOPK)
    else:
        b_top, k_left, in_bin = boundary_bucket(state, tl.minimum(visible, TOPK))
        whole = in_bin == k_left  # the bucket holds exactly the keys still needed: all of them are taken
        collect = (in_bin <= CANDIDATES) & (in_bin != k_left)
        cand_key = CandKey + token.to(tl.int64) * stride_ct
        cand_slot = CandSlot + token.to(tl.int64) * stride_ct
        shift = sub_shift(b_top).to(tl.uint32)
        sub = tl.zeros([SUB_BINS], dtype=tl.int32)
        n_sub = tl.zeros([], dtype=tl.int32)
        for p0 in range(lo, hi, BLOCK):
            pos = p0 + tl.arange(0, BLOCK)
            ok = pos < hi
            key = sort_key(tl.load(row + pos, mask=ok, other=float("-inf")))
            b = bucket(key)
            # (masks built from full-width comparisons: the interpreter holds a mask and-ed with a scalar test as
            # int32, which a load refuses)
            flag_whole = (pos * 0 + whole.to(tl.int32)) > 0
            flag_collect = (pos * 0 + collect.to(tl.int32)) > 0
            above = ok & ((b > b_top) | ((b == b_top) & flag_whole))
            cand = ok & (b == b_top) & flag_collect
            slots = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, pos, above | cand)
            _append(sel, state + _ABOVE, above, slots.to(Sel.dtype.element_ty), TOPK)
            n_cand = tl.sum(cand.to(tl.int32), 0)
            if n_cand > 0:
                rank = tl.atomic_add(state + _CANDS, n_cand) + tl.cumsum(cand.to(tl.int32), 0) - 1
                fits = cand & (rank < CANDIDATES)  # always, as the histogram said: a guard, not a path
                tl.store(cand_key + rank, key.to(tl.int32, bitcast=True), mask=fits)
                tl.store(cand_slot + rank, slots.to(tl.int32), mask=fits)
                # the candidates' next bits: the resolve's first digit, counted here where the keys are at hand
                sub += tl.histogram(tl.where(cand, ((key >> shift) & (SUB_BINS - 1)).to(tl.int32), 0), SUB_BINS)
                n_sub += BLOCK - n_cand
        if collect:
            offs_s = tl.arange(0, SUB_BINS)
            sub -= tl.where(offs_s == 0, n_sub, 0)  # the block's other keys counted in digit 0
            tl.atomic_add(state + _SUB + offs_s, sub, mask=sub > 0)


@triton.jit
def _items(row, cand_key, p0, n, b_top, from_row, BLOCK: tl.constexpr):
    """(positions, sort keys, valid) of items p0..p0+BLOCK: the candidate buffer's, or the row's keys of the
    boundary bucket (the overflow fallback)."""
    idx = p0 + tl.arange(0, BLOCK)
    in_range = idx < n
    row_mask = in_range & ((idx * 0 + from_row.to(tl.int32)) > 0)
    cand_mask = in_range & ((idx * 0 + from_row.to(tl.int32)) == 0)
    from_logits = sort_key(tl.load(row + idx, mask=row_mask, other=float("-inf")))
    from_cands = tl.load(cand_key + idx, mask=cand_mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    key = tl.where(row_mask, from_logits, from_cands)
    valid = cand_mask | (row_mask & (bucket(key) == b_top))
    return idx, key, valid


@triton.jit
def _radix_select(row, items_key, items_slot, sel, n, b_top, prefix, known, k_left, taken, matching, from_row,
                  kv_indices, tree_slots, kv_start, q_start, prefix_len, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """The k_left best of n items (the row's keys of bucket b_top, or a buffer's, every one of which shares `prefix`
    above bit `known`) into sel from `taken` on: rounds of 8 bits, each fixing the next digit of the k_left-th key
    among the items equal to the prefix so far and stopping once its digit's bin holds exactly the keys needed,
    then every item above the threshold's fixed bits and as many equal to them as are still needed, in item order."""
    offs = tl.arange(0, BINS)
    active = tl.where((matching == k_left) | (known == 0), 0, 1)
    # the items a round counts: every valid one in the first round, then those of the digit the round before chose;
    # the rest of the loop's slots land in bin 0 and come off it, so no round counts them
    slots_walked = tl.cdiv(n, BLOCK) * BLOCK
    for _round in tl.static_range(4):
        if active == 1:
            shift = tl.maximum(known - 8, 0)
            hist = tl.zeros([BINS], dtype=tl.int32)
            for p0 in range(0, n, BLOCK):
                _idx, key, valid = _items(row, items_key, p0, n, b_top, from_row, BLOCK)
                # 64-bit: the first round of an end bucket from the row shifts by 32
                match = valid & (((key ^ prefix).to(tl.uint64) >> known.to(tl.uint64)) == 0)
                item_digit = ((key >> shift.to(tl.uint32)) & 0xFF).to(tl.int32)
                hist += tl.histogram(tl.where(match, item_digit, 0), BINS)
            hist -= tl.where(offs == 0, slots_walked - matching, 0)
            digit, higher, in_digit = threshold_bin(hist, k_left)
            digit = tl.maximum(digit, 0)
            prefix = prefix | (digit.to(tl.uint32) << shift.to(tl.uint32))
            k_left -= higher
            matching = in_digit
            known = shift
            active = tl.where((in_digit == k_left) | (shift == 0), 0, 1)
    thr = prefix.to(tl.uint64) >> known.to(tl.uint64)
    ties = tl.zeros([], dtype=tl.int32)
    for p0 in range(0, n, BLOCK):
        idx, key, valid = _items(row, items_key, p0, n, b_top, from_row, BLOCK)
        top = key.to(tl.uint64) >> known.to(tl.uint64)
        above = valid & (top > thr)
        tie = valid & (top == thr)
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
        chosen = above | (tie & (tie_rank < k_left))
        ties += tl.sum(tie.to(tl.int32), 0)
        row_mask = chosen & ((idx * 0 + from_row.to(tl.int32)) > 0)
        cand_mask = chosen & ((idx * 0 + from_row.to(tl.int32)) == 0)
        slot_row = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, idx, row_mask)
        slot_cand = tl.load(items_slot + idx, mask=cand_mask, other=0, cache_modifier=".cg")
        slots = tl.where(row_mask, slot_row, slot_cand.to(tl.int64))
        rank = taken + tl.cumsum(chosen.to(tl.int32), 0) - 1
        tl.store(sel + rank, slots.to(sel.dtype.element_ty), mask=chosen & (rank < TOPK))
        taken += tl.sum(chosen.to(tl.int32), 0)


@triton.jit
def dsa_topk_resolve_kernel(
    Logits, State, Sel, SelCount, CandKey, CandSlot, kv_indices, kv_indptr, qo_indptr, tree_slots, vis,
    stride_lt, stride_st, stride_selt, stride_ct, stride_vis,
    TOPK: tl.constexpr, CANDIDATES: tl.constexpr, N_MAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """The boundary bucket's k_left best keys into Sel after the keys above it, and SelCount. A token's programs
    (grid axis 1) split its candidate buffer: each writes its share's candidates above the sub-histogram's boundary
    digit and appends those of the digit (about 1/64 of the bucket) to the buffer's second half; the last of them
    to finish (a counter: no program waits on another) selects among those. The overflow fallback, a select over
    the whole row, is the first program's alone."""
    i = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    req = tl.program_id(2)
    q_start = tl.load(qo_indptr + req).to(tl.int32)
    n_tok = tl.load(qo_indptr + req + 1).to(tl.int32) - q_start
    if i >= n_tok:
        return
    token = q_start + i
    kv_start = tl.load(kv_indptr + req).to(tl.int64)
    prefix_len = (tl.load(kv_indptr + req + 1).to(tl.int64) - kv_start).to(tl.int32)
    visible = visible_keys(vis, stride_vis, token, prefix_len, n_tok, N_MAX)
    k = tl.minimum(visible, TOPK)
    state = State + token.to(tl.int64) * stride_st
    b_top, k_left, in_bin = boundary_bucket(state, k)
    resolving = (visible > TOPK) & (in_bin != k_left)
    from_row = in_bin > CANDIDATES  # the bucket did not fit the buffer: select from the row itself
    base = k - k_left  # the keys above the bucket, written by the collect pass
    prefix, known = bucket_prefix(b_top)  # known: the low bits not fixed yet
    row = Logits + token.to(tl.int64) * stride_lt
    cand_key = CandKey + token.to(tl.int64) * stride_ct
    cand_slot = CandSlot + token.to(tl.int64) * stride_ct
    sel = Sel + token.to(tl.int64) * stride_selt
    if resolving & (in_bin <= CANDIDATES):
        shift = sub_shift(b_top)
        digit, higher, in_digit = threshold_bin(tl.load(state + _SUB + tl.arange(0, SUB_BINS)), k_left)
        digit = tl.maximum(digit, 0)
        chunk = tl.cdiv(tl.cdiv(in_bin, splits), BLOCK) * BLOCK
        lo = split * chunk
        hi = tl.minimum(lo + chunk, in_bin)
        for p0 in range(lo, hi, BLOCK):
            idx = p0 + tl.arange(0, BLOCK)
            valid = idx < hi
            key = tl.load(cand_key + idx, mask=valid, other=0).to(tl.uint32, bitcast=True)
            slot = tl.load(cand_slot + idx, mask=valid, other=0)
            d = ((key >> shift.to(tl.uint32)) & (SUB_BINS - 1)).to(tl.int32)
            _append(sel + base, state + _WROTE, valid & (d > digit), slot.to(Sel.dtype.element_ty), higher)
            keep = valid & (d == digit)
            n_keep = tl.sum(keep.to(tl.int32), 0)
            if n_keep > 0:
                to = CANDIDATES + tl.atomic_add(state + _KEPT, n_keep) + tl.cumsum(keep.to(tl.int32), 0) - 1
                fits = keep & (to < 2 * CANDIDATES)  # always (the sub-histogram counted them): a guard
                tl.store(cand_key + to, key.to(tl.int32, bitcast=True), mask=fits)
                tl.store(cand_slot + to, slot, mask=fits)
        # every thread's writes before the counter's release; the last program's acquire then sees all of them
        tl.debug_barrier()
        if tl.atomic_add(state + _DONE, 1, sem="acq_rel") == splits - 1:
            _radix_select(row, cand_key + CANDIDATES, cand_slot + CANDIDATES, sel, in_digit, b_top,
                          prefix | (digit.to(tl.uint32) << shift.to(tl.uint32)), shift, k_left - higher,
                          base + higher, in_digit, from_row, kv_indices, tree_slots, kv_start, q_start, prefix_len,
                          TOPK, BLOCK)
            offs_c = tl.arange(0, 4)
            tl.store(state + _WROTE + offs_c, tl.zeros([4], dtype=tl.int32), mask=offs_c < 3)
    if resolving & from_row & (split == 0):
        _radix_select(row, cand_key, cand_slot, sel, prefix_len + n_tok, b_top, prefix, known, k_left, base, in_bin,
                      from_row, kv_indices, tree_slots, kv_start, q_start, prefix_len, TOPK, BLOCK)
    if split == 0:
        tl.store(SelCount + token, k)
