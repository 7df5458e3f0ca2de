"""Hopper-only kernels (sm_90): Gluon tiles on wgmma, TMA-free cp.async rings and warp specialization.

Nothing here runs on sm_120 (no wgmma, no setmaxnreg, 99 KB of shared memory a block): the launcher
chooses these tiles only where `hopper.plan.gluon_supports` says so (an sm_90 GPU and a Triton that
builds them). The sm_120 core is prefix.py, tile.py, tree.py and merge.py one level up.
"""
