"""Hopper (sm_90): its rule table and its Gluon tiles on wgmma, cp.async rings and warp specialization.

Nothing here runs on sm_120 (no wgmma, no setmaxnreg, 99 KB of shared memory a block). `rules.py` is the
table, `launch.py` how a plan launches the wgmma tile (registry entries), `prefix_wgmma.py` the tile (its
64-row form and its keys-major form for decode), `prefix_wgmma_ws.py` the same tile warp-specialized
(scorer, values, row tail). The core reaches this folder only through `selection.TABLES` and
`registry.KERNELS`.
"""
