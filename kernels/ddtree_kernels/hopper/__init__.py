"""Hopper-only kernels (sm_90): Gluon tiles on wgmma, TMA-free cp.async rings and warp specialization.

Nothing here runs on sm_120 (no wgmma, no setmaxnreg, 99 KB of shared memory a block): the launcher
chooses these tiles only where `hopper.plan.gluon_supports` says so (an sm_90 GPU and a Triton that
builds them). sm_120's tiles are one level up: prefix_mma_v2.py (Gluon, mma.sync), its fallbacks
prefix_chunked.py and prefix.py, and tree.py and merge.py, which every GPU runs.
"""
