"""Stand-in modules for SGLang's GPU stack, for the deployment test hosts only.

The test hosts have no GPU and install SGLang without torch, Triton or transformers (gigabytes
each). The deploy's launch-argument check (`ddtree-ops launch-check --preload
sglang_standin_gpu_stack`) still imports the release's real `sglang.srt.server_args` there, so
that SGLang itself parses the unit's arguments. Importing this module makes those few packages
importable as inert stand-ins (every attribute is a class that absorbs calls, indexing and
subclassing) and selects SGLang's CPU platform. Every other import is real: the pure-Python
packages server_args needs come from the test inventory's ddtree_extra_packages. Production
hosts import the real packages and never load this module.

Checked against the real thing by tests/deploy (the check accepts a DDTree build and refuses
0.5.23 with the flag named, as SGLang's own parser and SpeculativeAlgorithm do).
"""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import os
import sys
import types

# The GPU stack: what the test hosts do not install (and sgl_kernel, SGLang's compiled CUDA ops, which
# the GPU test machine has no build of). Versions are what SGLang's import-time checks compare.
STOOD_IN = {"torch": "2.11.0", "triton": "3.6.0", "torchvision": "0.26.0", "torchaudio": "2.11.0",
            "transformers": "5.12.1", "huggingface_hub": "1.0.0", "safetensors": "0.6.0", "tokenizers": "0.22.0",
            "compressed_tensors": "0.12.0", "sgl_kernel": "0.4.3"}
# Attributes SGLang probes with hasattr() to detect other accelerators: absent, as on a CUDA build.
ABSENT_ATTRIBUTES = {"npu", "xpu", "musa", "hpu", "mlu", "mps"}
# Lookups that must fail as they do on a machine without a GPU.
NO_DEVICE = {"triton.runtime.driver.active"}
# Dunders Python's own protocols probe: a stand-in must not pretend to have them.
PROTOCOL = {"__wrapped__", "__signature__", "__mro_entries__", "__set_name__", "__get__", "__set__", "__delete__",
            "__fspath__", "__origin__", "__args__", "__parameters__", "__dataclass_fields__", "__attrs_attrs__",
            "__self__", "__text_signature__", "__isabstractmethod__", "__slots__", "__objclass__", "__orig_bases__",
            "__class_getitem__", "__copy__", "__deepcopy__", "__reduce_ex__", "__getstate__", "__length_hint__",
            "__await__", "__aiter__", "__iter__", "__next__", "__buffer__", "__array__", "__index__", "__float__",
            "__int__", "__path__", "__file__", "__spec__", "__loader__", "__all__"}


class _Inert(abc.ABCMeta):
    """Metaclass of the stand-in classes (ABCMeta, so real classes may mix them with ABC)."""

    def __getattr__(cls, name: str):
        path = f"{cls._standin_path}.{name}"
        if path in NO_DEVICE:
            raise RuntimeError(f"{path}: no GPU on this host (stand-in)")
        if name in PROTOCOL:
            raise AttributeError(name)
        return _inert(path)

    def __call__(cls, *args, **kwargs):
        if "_standin_path" in cls.__dict__:  # the stand-in itself absorbs the call
            return cls
        return super().__call__(*args, **kwargs)  # a real subclass is instantiated normally

    def register(cls, *args, **kwargs):
        return cls if "_standin_path" in cls.__dict__ else super().register(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass

    def __bool__(cls) -> bool:
        return False

    def __iter__(cls):
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __int__(cls) -> int:
        return 0

    __index__ = __int__

    def __float__(cls) -> float:
        return 0.0

    def __contains__(cls, item) -> bool:
        return False

    def __enter__(cls):
        return cls

    def __exit__(cls, *exc) -> bool:
        return False

    def __str__(cls) -> str:
        return cls._standin_path

    def __hash__(cls) -> int:
        return id(cls)

    def __eq__(cls, other) -> bool:
        return cls is other

    def _same(cls, *other):
        return cls

    __or__ = __ror__ = __and__ = __add__ = __radd__ = __sub__ = __rsub__ = _same
    __mul__ = __rmul__ = __truediv__ = __neg__ = _same

    def _false(cls, other) -> bool:
        return False

    __lt__ = __le__ = __gt__ = __ge__ = _false


def _inert(path: str) -> type:
    return _Inert(path.rsplit(".", 1)[-1], (), {
        "_standin_path": path, "__module__": path.rsplit(".", 1)[0],
        "__init__": lambda self, *a, **k: None,
        "__init_subclass__": classmethod(lambda cls, **kw: None),
        "__getattr__": lambda self, name: _inert(f"{path}().{name}"),
    })


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name in ABSENT_ATTRIBUTES or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return _inert(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = STOOD_IN.get(spec.name, "0.0.0")
        return module

    def exec_module(self, module) -> None:
        pass


def install(names: set[str] | None = None) -> None:
    """Put the stand-ins first on the import path (once) and select SGLang's CPU platform.

    `names` (default: $STANDIN_GPU_STACK, comma-separated, else all of STOOD_IN) picks which packages
    are stood in, e.g. only torchvision where the rest of the stack is real."""
    if names is None:
        chosen = os.environ.get("STANDIN_GPU_STACK", "")
        names = {n.strip() for n in chosen.split(",") if n.strip()} or set(STOOD_IN)
    unknown = names - set(STOOD_IN)
    if unknown:
        raise ValueError(f"no stand-in for {sorted(unknown)}: choose from {sorted(STOOD_IN)}")
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(names))
    if "torch" in names:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


install()
