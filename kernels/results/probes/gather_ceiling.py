"""What a random-row gather can reach on this GPU: torch index_select of L latent rows at random slots
(page_size 1), against a contiguous copy of the same bytes, both counting bytes read + written like
the bench's copy ceiling; L2 flushed by a read before each run (bench._time).

    PYTHONPATH=kernels python3 kernels/results/probes/gather_ceiling.py
"""
import torch
from ddtree_kernels.bench import D_QK, _time

L = 185_000
for dtype, name in ((torch.bfloat16, "bf16 (1152-byte rows)"), (torch.float8_e4m3fn, "fp8 (576-byte rows)")):
    pools = [torch.randn(L + 4096, D_QK, device="cuda").to(dtype) for _ in range(2)]
    idx = [torch.randperm(L + 4096, device="cuda")[:L] for _ in pools]
    raw = [p.view(torch.uint8) for p in pools]  # index_select has no fp8 kernel: gather the bytes
    out = torch.empty(L, raw[0].shape[1], dtype=torch.uint8, device="cuda")
    turn = iter(range(1 << 62))

    def gather():
        i = next(turn) % 2
        torch.index_select(raw[i], 0, idx[i], out=out)

    def copy():
        i = next(turn) % 2
        out.copy_(raw[i][:L])

    nbytes = 2 * out.numel()
    g, c = _time(gather), _time(copy)
    print(f"{name:22} L={L}: random-row gather {g:6.1f} µs {nbytes / g / 1e3:6.0f} GB/s | "
          f"contiguous copy {c:6.1f} µs {nbytes / c / 1e3:6.0f} GB/s | gather/copy {c / g:.0%}")
