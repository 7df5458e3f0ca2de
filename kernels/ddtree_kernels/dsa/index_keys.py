"""GLM-5's index keys as SGLang's DSA pool keeps them: fp8 e4m3, one fp32 scale a 128-wide key.

`act_quant` is SGLang's block quantisation (`kernels/ops/attention/dsa/tilelang_kernel.py`, `act_quant_kernel`:
amax over each 128-block floored at 1e-4, scale = amax / 448, rounded up to a power of two for the `ue8m0` scale
format DeepSeek-V3.2 and GLM-5 use, values clamped to ±448). `DSATokenToKVPool` (`srt/mem_cache/memory_pool.py`)
keeps per layer one uint8 buffer of pages, each page `page_size` x 128 fp8 bytes followed by `page_size` fp32
scales; at page size 1 (DDTree's, and SGLang's HIP path) that is one 132-byte row a token: the key's 128 bytes,
then its scale. `index_views` reads such a buffer as the kernels take it, with no copy.
"""

from __future__ import annotations

import torch

INDEX_DIM = 128  # index_head_dim (GLM-5, DeepSeek-V3.2)
INDEX_ROW_BYTES = INDEX_DIM + 4  # a token's key and its fp32 scale at page size 1
FP8_MAX = 448.0


def act_quant(x: torch.Tensor, round_scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 values, fp32 scales) of x [..., 128], one scale a row, as SGLang's indexer quantises its q and k.

    round_scale: the `ue8m0` scale format (a power of two, rounded up), which GLM-5's config selects."""
    if x.shape[-1] != INDEX_DIM:
        raise ValueError(f"index vectors are {INDEX_DIM} wide, got {tuple(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(-1).clamp_min(1e-4)
    scale = amax / FP8_MAX
    if round_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float32)


def new_index_buffer(num_slots: int, device: torch.device | str) -> torch.Tensor:
    """An empty page-size-1 index buffer for `num_slots` tokens: [num_slots, 132] uint8."""
    return torch.zeros((num_slots, INDEX_ROW_BYTES), dtype=torch.uint8, device=device)


def index_views(index_buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [S, 132] as float8_e4m3fn, scales [S, 33] as float32) over the same bytes: a key is columns 0-127 of
    the first, its scale column 32 of the second."""
    if index_buf.dtype != torch.uint8 or index_buf.dim() != 2 or index_buf.shape[1] != INDEX_ROW_BYTES:
        raise ValueError(f"index_buf must be the page-size-1 index buffer, uint8 [slots, {INDEX_ROW_BYTES}], got "
                         f"{index_buf.dtype} {tuple(index_buf.shape)}")
    if not index_buf.is_contiguous():
        raise ValueError("index_buf must be contiguous (one 132-byte row a token)")
    return index_buf.view(torch.float8_e4m3fn), index_buf.view(torch.float32)


def write_index_keys(index_buf: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Quantise keys [N, 128] (act_quant) and store them at `slots` of a page-size-1 index buffer."""
    k_fp8, k_scale = act_quant(keys)
    keys_view, scale_view = index_views(index_buf)
    keys_view[slots, :INDEX_DIM] = k_fp8.to(index_buf.device)
    scale_view[slots, INDEX_DIM // 4] = k_scale.to(index_buf.device)


def read_index_keys(index_buf: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 keys [N, 128], fp32 scales [N]) stored at `slots`."""
    keys_view, scale_view = index_views(index_buf)
    return keys_view[slots, :INDEX_DIM], scale_view[slots, INDEX_DIM // 4]
