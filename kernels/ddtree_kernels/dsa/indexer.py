"""The lightning indexer over a draft tree: every tree token's logits over its visible keys.

`logits[t, p] = sum_h w[t, h] * relu(q[t, h] . k[p]) * k_scale[p]` (reference.py) for the key positions p of
token t's request: the prefix (slots `kv_indices[kv_indptr[b]:]`) and then the tree (slots `tree_slots`), with
-inf at tree positions the token does not see (not an ancestor or itself). One program takes a key chunk of one
request and a group of up to BLOCK_T of its tree tokens: it gathers each [BLOCK_N, 128] fp8 key tile once and, for
each token of the group in turn, multiplies it with that token's [HI, 128] queries on the tensor cores (e4m3
`mma.sync` m16n8k32 on sm_120): the [BLOCK_N, HI] scores stay in the MMA's own layout, so relu, the gates and the
sum over the token's heads are a reduction inside each thread quad, with no layout change. So where a row's key
splits fill the GPU, a 9-token tree (one group) reads every key once, and M x N of the MMAs is the keys x 32 heads
with no padded rows (launcher.split_count). A short row's splits leave program slots idle: there the plan launches
more programs and each key split's programs take groups of the tree's tokens, each group reading the split's keys
again (from L2), for the GPU's width (DSAPlan.index_splits). The top-k's bucket histogram is a pass of its own
(topk.py): in this epilogue, a 256-bin `tl.histogram` a token a tile cost a third of the indexer's time, more than
the pass that reads the logits back. A request whose keys all fit the top-k is not scored at all (its tokens take
every visible key: topk.py). On Hopper the dot runs on bf16 (DOT_BF16, exact
for e4m3 values): its fp8 wgmma keeps fewer accumulator bits, enough to move near-tie keys across the top-k
boundary (3e-2 from the reference at 128k).

Budget on sm_120 (DSA_SM120, 16 tokens a group): keys 128 x 128 fp8 (16 KB) in 3 stages, one token's queries
32 x 128 fp8 (4 KB), 4 warps; `make fit` states the figures.
"""

import triton
import triton.language as tl

from ..tile import dot_operand


@triton.jit
def request_keys(qo_indptr, kv_indptr, req, split, num_splits, min_chunk, BLOCK_N: tl.constexpr):
    """(q_start, n_tokens, kv_start, prefix_len, lo, hi): the request's first tree token, its tree size, where
    its slot indices start, its prefix length, and the key positions [lo, hi) of prefix + tree this split takes."""
    q_start = tl.load(qo_indptr + req).to(tl.int32)
    n_tok = tl.load(qo_indptr + req + 1).to(tl.int32) - q_start
    kv_start = tl.load(kv_indptr + req).to(tl.int64)
    prefix_len = (tl.load(kv_indptr + req + 1).to(tl.int64) - kv_start).to(tl.int32)
    keys = prefix_len + n_tok
    chunk = tl.maximum(tl.cdiv(keys, num_splits), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    lo = split * chunk
    return q_start, n_tok, kv_start, prefix_len, lo, tl.minimum(lo + chunk, keys)


@triton.jit
def key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, pos, ok):
    """The slot of each key position: the prefix's from kv_indices, then the tree's own."""
    in_prefix = pos < prefix_len
    prefix_slot = tl.load(kv_indices + kv_start + pos, mask=ok & in_prefix, other=0)
    tree_slot = tl.load(tree_slots + q_start + (pos - prefix_len), mask=ok & (pos >= prefix_len), other=0)
    return tl.where(in_prefix, prefix_slot, tree_slot).to(tl.int64)


@triton.jit
def dsa_index_logits_kernel(
    IQ, IW, index_k, index_s, kv_indices, kv_indptr, qo_indptr, tree_slots, vis, Logits, min_chunk,
    stride_iqt, stride_iqh, stride_iwt, stride_ik, stride_is, stride_vis, stride_lt,
    HI: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, DOT_BF16: tl.constexpr,
    DOT_FP32: tl.constexpr, TOPK: tl.constexpr,
):
    tb = tl.program_id(0)
    req = tl.program_id(2)
    # The request's key splits (at least min_chunk keys each) and, where its keys are too few to give every program
    # of the grid a split, groups of the block's tokens over the same splits: decided here from the request's own
    # length, so one graph-captured grid fills the GPU at 8k as at 185k.
    programs = tl.num_programs(1)
    q_start = tl.load(qo_indptr + req).to(tl.int32)
    n_tok = tl.load(qo_indptr + req + 1).to(tl.int32) - q_start
    keys = (tl.load(kv_indptr + req + 1) - tl.load(kv_indptr + req)).to(tl.int32) + n_tok
    num_splits = tl.maximum(tl.minimum(programs, tl.cdiv(keys, min_chunk)), 1)
    block_tokens = tl.minimum(n_tok - tb * BLOCK_T, BLOCK_T)
    group_tokens = tl.cdiv(block_tokens, tl.maximum(tl.minimum(block_tokens, programs // num_splits), 1))
    group = tl.program_id(1) // num_splits
    q_start, n_tok, kv_start, prefix_len, lo, hi = request_keys(qo_indptr, kv_indptr, req,
                                                                tl.program_id(1) % num_splits, num_splits,
                                                                min_chunk, BLOCK_N)
    t_lo = tb * BLOCK_T + group * group_tokens
    # a request whose keys all fit the top-k needs no logits: its tokens take every visible key (topk.py)
    if block_tokens <= 0 or group * group_tokens >= block_tokens or lo >= hi or keys <= TOPK:
        return
    t_hi = tl.minimum(tb * BLOCK_T + block_tokens, t_lo + group_tokens)
    offs_h = tl.arange(0, HI)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    slots = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, lo + offs_n, lo + offs_n < hi)
    for p0 in range(lo, hi, BLOCK_N):
        pos = p0 + offs_n
        ok = pos < hi
        # a key row starts 4-byte aligned (132-byte rows, index_keys.py): said so, the gather is 4-byte loads where
        # the compiler would otherwise load it byte by byte
        rows = tl.multiple_of(slots * stride_ik, 4)
        k = tl.load(index_k + rows[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        if DOT_BF16:  # e4m3 values are exact in bf16; Hopper's fp8 wgmma accumulates too coarsely for the top-k
            k = k.to(tl.bfloat16)
        k_scale = tl.load(index_s + slots * stride_is + D // 4, mask=ok, other=0.0)
        # the next tile's slots now: its gather then waits on no index load
        slots = key_slots(kv_indices, tree_slots, kv_start, q_start, prefix_len, pos + BLOCK_N, pos + BLOCK_N < hi)
        tree_pos = pos - prefix_len
        for t in range(t_lo, t_hi):
            token = (q_start + t).to(tl.int64)
            q = tl.load(IQ + token * stride_iqt + offs_h[:, None] * stride_iqh + offs_d[None, :])
            if DOT_BF16:
                q = q.to(tl.bfloat16)
            w = tl.load(IW + token * stride_iwt + offs_h)
            s = tl.dot(dot_operand(k, q, DOT_FP32), tl.trans(dot_operand(q, q, DOT_FP32)))  # [BLOCK_N, HI]
            # gate and sum the token's heads in fp32 (a tf32 dot here moves near-tie keys across the top-k boundary)
            logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], 1) * k_scale  # [BLOCK_N]
            if p0 + BLOCK_N > prefix_len:
                # tree keys: only the token's ancestors and itself are eligible
                seen = tl.load(vis + token * stride_vis + tree_pos, mask=(tree_pos >= 0) & ok, other=1)
                logits = tl.where(seen != 0, logits, float("-inf"))
            tl.store(Logits + token * stride_lt + pos, logits, mask=ok)
