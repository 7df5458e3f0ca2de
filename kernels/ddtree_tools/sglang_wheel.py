"""Load SGLang's own attention kernels from a release wheel, for benchmarks and comparisons.

The kernel files are read from the wheel at run time (never copied into this repo)
into a private package tree. The few SGLang runtime modules they import
(`sglang.srt.environ.envs` and a handful of `sglang.srt.utils` probes) are replaced
in `sys.modules` by the minimal stand-ins below, which answer as a CUDA build (when a
GPU is there) with every opt-in environment switch at its default (off).
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
import zipfile
from pathlib import Path

# Where the kernels live, newest layout first (0.5.23 moved them out of srt/).
_LAYOUTS = ("sglang/kernels/ops/attention", "sglang/srt/layers/attention/triton_ops")
_FILES = ("extend_attention.py", "decode_attention.py", "score_mod.py", "verify_mla.py", "verify_splitkv.py")


class _EnvFlag:
    """`envs.NAME.get()` -> the switch's default: off / unset."""

    def get(self):
        return False


class _Envs:
    def __getattr__(self, name: str) -> _EnvFlag:
        return _EnvFlag()


def _install_stand_ins(root: Path) -> None:
    import torch

    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _Envs()
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = torch.cuda.is_available
    utils.is_hip = lambda: False
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = lambda index=0: torch.cuda.get_device_properties(index).multi_processor_count
    srt = types.ModuleType("sglang.srt")
    srt.__path__ = [str(root / "sglang" / "srt")]  # older releases keep the kernels under srt/
    sys.modules.update({"sglang.srt": srt, "sglang.srt.environ": environ, "sglang.srt.utils": utils})


def load_sglang_attention(wheel: str | Path) -> dict[str, object]:
    """Import SGLang's Triton attention modules from `wheel`; returns {module name: module}.

    Names are those of `_FILES` without ".py"; a file the release does not have is skipped.
    """
    wheel = Path(wheel)
    if not wheel.is_file():
        raise FileNotFoundError(
            f"no SGLang wheel at {wheel}: download one with `pip download --no-deps sglang==VERSION -d DIR`"
        )
    root = Path(tempfile.mkdtemp(prefix="sglang-kernels-"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        layout = next((lay for lay in _LAYOUTS if f"{lay}/extend_attention.py" in names), None)
        if layout is None:
            raise RuntimeError(f"{wheel.name} has no extend_attention.py under {' or '.join(_LAYOUTS)}")
        for f in _FILES:
            if f"{layout}/{f}" in names:
                zf.extract(f"{layout}/{f}", root)
    pkg = root
    for part in layout.split("/"):
        pkg = pkg / part
        (pkg / "__init__.py").touch()
    for name in [m for m in list(sys.modules) if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    _install_stand_ins(root)
    dotted = layout.replace("/", ".")
    mods = {}
    for f in _FILES:
        if (root / layout / f).exists():
            mods[f[:-3]] = importlib.import_module(f"{dotted}.{f[:-3]}")
    return mods
