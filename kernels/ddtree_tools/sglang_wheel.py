"""Load SGLang's own attention kernels from a release wheel, for benchmarks and comparisons.

The kernel files are read from the wheel at run time (never copied into this repo)
into a private package tree. The few SGLang runtime modules they import
(`sglang.srt.environ.envs` and a handful of `sglang.srt.utils` probes) are stood in while they
import, answering as a CUDA build (when a GPU is there) with every opt-in environment switch at its
default (off).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

# Where the kernels live, newest layout first (0.5.23 moved them out of srt/).
_LAYOUTS = ("sglang/kernels/ops/attention", "sglang/srt/layers/attention/triton_ops")
_FILES = ("prefill_attention.py", "extend_attention.py", "decode_attention.py", "score_mod.py", "verify_mla.py",
          "verify_splitkv.py")


class _EnvFlag:
    """`envs.NAME.get()` -> the switch's default: off / unset."""

    def get(self):
        return False


class _Envs:
    def __getattr__(self, name: str) -> _EnvFlag:
        return _EnvFlag()


def _stand_ins(root: Path) -> dict[str, dict]:
    """The SGLang runtime modules the kernel files import, as the patch checks stand them in."""
    import torch

    return {
        "sglang": {"__path__": [str(root / "sglang")]},
        "sglang.srt": {"__path__": [str(root / "sglang" / "srt")]},  # older releases keep the kernels under srt/
        "sglang.srt.environ": {"envs": _Envs()},
        "sglang.srt.utils": {
            "is_cuda": torch.cuda.is_available,
            "is_hip": lambda: False,
            "is_gfx95_supported": lambda: False,
            "is_gfx1250_supported": lambda: False,
            "get_device_core_count": lambda index=0: torch.cuda.get_device_properties(index).multi_processor_count,
        },
    }


@contextlib.contextmanager
def _registered(modules: dict[str, dict]) -> Iterator[None]:
    """The named modules in sys.modules while the body runs (every parent package is named too), then what was
    there before. Only these names are restored: whatever else the body imports stays."""
    saved = {name: sys.modules.get(name) for name in modules}
    for name, attrs in modules.items():
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__dict__.update(attrs)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


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
        del sys.modules[name]  # an installed SGLang must not answer for the wheel's files
    dotted = layout.replace("/", ".")
    mods = {}
    # The stand-ins are needed while the files import; the modules keep what they bound.
    with _registered(_stand_ins(root)):
        for f in _FILES:
            if (root / layout / f).exists():
                mods[f[:-3]] = importlib.import_module(f"{dotted}.{f[:-3]}")
    return mods
