"""Tools around ddtree_kernels that the GPU hosts do not need: the benchmark, the tile sweep, the sm_120
fit report and the loader of SGLang's own kernels. Not in the ddtree-kernels wheel; run from a checkout
with `kernels/` on PYTHONPATH (the Make targets do that):

    python -m ddtree_tools.bench --sglang-wheel ... [--emulate sm120]
    python -m ddtree_tools.fit [--json]
    python -m ddtree_tools.sweep --tile 16x32x4x3x1 --case 1,185000,8,9
"""
