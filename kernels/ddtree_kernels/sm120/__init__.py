"""sm_120 (RTX PRO 6000 Blackwell): its rule table and its prefix tiles.

No wgmma, 99 KB of shared memory a block, ~100 KB an SM: `rules.py` chooses `prefix_latent_split.py`'s
Gluon tiles (mma.sync, the 576-wide latent split across eight warps) for a cache with values in the
keys, `prefix_chunked.py`'s Triton tiles where Gluon does not run, and the core's `prefix_general.py`
for the rest. The table is also what a GPU without a table of its own, and the interpreter, get.
"""
