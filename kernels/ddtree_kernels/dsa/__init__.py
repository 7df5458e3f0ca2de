"""DSA (DeepSeek Sparse Attention) tree verify for GLM-5: the indexer, a tree-aware top-k and sparse MLA.

GLM-5's heads attend only the `index_topk` = 2,048 keys its lightning indexer ranks best for each query token. For
a draft tree a token's candidates are its prefix and its ancestors (and itself); the rest of the tree is never
eligible. One call: `indexer.py` (logits over every visible key from SGLang's fp8 index keys at page size 1),
`topk.py` (a radix select on the GPU, then the chosen slots), `sparse_mla.py` (split-KV attention over each
token's own slots) and the dense path's `merge.py`. `reference.py` is the float64 definition.

    plan = plan_dsa_verify(bs, heads, n, total_tokens, max_context, device)   # host work, once a shape
    workspace = DSAWorkspace(plan, device)                                  # before CUDA-graph capture
    run_dsa_verify(plan, workspace, q, k_buf, kv_indptr, kv_indices, qo_indptr, tree_slots, visibility,
                   index_q, index_weights, index_buf, out, sm_scale=1 / 16)  # launches only
"""

from .index_keys import INDEX_ROW_BYTES, act_quant, index_views, new_index_buffer, write_index_keys
from .launcher import (
    DSA_SM120,
    DSA_TABLES,
    TOPK,
    DSAPlan,
    DSATiles,
    DSAWorkspace,
    dsa_tree_verify,
    plan_dsa_verify,
    run_dsa_verify,
)
from .reference import boundary_gap, dsa_select_reference, dsa_tree_verify_reference

__all__ = [
    "DSA_SM120",
    "DSA_TABLES",
    "INDEX_ROW_BYTES",
    "TOPK",
    "DSAPlan",
    "DSATiles",
    "DSAWorkspace",
    "act_quant",
    "boundary_gap",
    "dsa_select_reference",
    "dsa_tree_verify",
    "dsa_tree_verify_reference",
    "index_views",
    "new_index_buffer",
    "plan_dsa_verify",
    "run_dsa_verify",
    "write_index_keys",
]
