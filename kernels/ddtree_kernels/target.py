"""The GPU a verify call is planned for, as one explicit value.

    target = Target.detect(q.device)                 # the GPU at hand (once a device)
    target = Target.named("sm120")                   # an RTX PRO 6000, for describe and fit
    target = Target.emulating("sm120", "cuda")       # sm_120's plans on this GPU (with DISABLE_MMA_V3=1)

Everything planning depends on is here: the compute capability (which rule table,
programmatic dependent launch), the SM count (the split count), whether the installed
Triton builds the Gluon tiles, and whether kernels run through Triton's interpreter.
Nothing else steers a plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from .gluon_shared import unavailable_reason
from .interpreter import interpreting

# The GPUs this repository plans for by name: (compute capability, SMs).
NAMED = {"sm120": ((12, 0), 188), "sm90": ((9, 0), 132)}
# Shared memory a block may use, and an SM holds, by compute capability (bytes).
SHARED_MEMORY_LIMIT = {(12, 0): 101_376, (9, 0): 232_448, (8, 0): 166_912, (8, 9): 101_376}
SHARED_MEMORY_PER_SM = {(12, 0): 102_400, (9, 0): 233_472, (8, 0): 167_936, (8, 9): 102_400}
# The interpreter has no SMs; a few keep CPU tests splitting the prefix.
INTERPRETER_SMS = 4


@dataclass(frozen=True)
class Target:
    """A GPU as planning sees it."""

    capability: tuple[int, int] | None  # None: no GPU (Triton's interpreter)
    sms: int
    gluon: bool  # the installed Triton builds the Gluon tiles (gluon_shared.TESTED_TRITON)
    interpreted: bool = False  # kernels run on the CPU through TRITON_INTERPRET=1: no PTX

    @classmethod
    def detect(cls, device: torch.device | str) -> Target:
        """The target of a device: its capability and SM count; the interpreter for a CPU device or
        under TRITON_INTERPRET=1."""
        return _detect(concrete_device(device), interpreting())

    @classmethod
    def named(cls, name: str, *, sms: int | None = None, gluon: bool | None = None) -> Target:
        """A GPU by name (`NAMED`: sm120, sm90), compiled for, with a Triton that builds the Gluon tiles unless
        `gluon=False` (what runs with a Triton outside gluon_shared.TESTED_TRITON); `sms` replaces its SM count."""
        if name not in NAMED:
            raise ValueError(f"unknown GPU {name!r}: choose one of {', '.join(NAMED)}")
        capability, default_sms = NAMED[name]
        return cls(capability, sms or default_sms, True if gluon is None else gluon)

    @classmethod
    def emulating(cls, name: str, device: torch.device | str) -> Target:
        """Emulation: the named GPU's plans with this device's SM count and this Triton's Gluon support. Pair it
        with DISABLE_MMA_V3=1, so Triton lowers every dot to mma.sync as on sm_120."""
        here = cls.detect(device)
        if here.capability is None:
            raise ValueError(f"emulating {name} needs a CUDA device, not {device}")
        return cls.named(name, sms=here.sms, gluon=here.gluon)

    @classmethod
    def interpreter(cls) -> Target:
        return cls(None, INTERPRETER_SMS, False, True)

    @property
    def name(self) -> str:
        if self.capability is None:
            return "interpreter"
        return next((n for n, (cap, _) in NAMED.items() if cap == self.capability),
                    f"sm{self.capability[0]}{self.capability[1]}")

    @property
    def pdl(self) -> bool:
        """Programmatic dependent launch exists: sm_90 and newer, compiled."""
        return self.capability is not None and self.capability >= (9, 0) and not self.interpreted

    @property
    def compiled_gluon(self) -> bool:
        """The Gluon tiles can run here: a Triton that builds them and a compiled (not interpreted) run."""
        return self.gluon and not self.interpreted

    def __str__(self) -> str:
        gluon = "Gluon" if self.gluon else "no Gluon"
        return f"{self.name} ({self.sms} SMs, {gluon}{', interpreted' if self.interpreted else ''})"


def concrete_device(device: torch.device | str) -> torch.device:
    """The device, with a bare "cuda" made the current CUDA device (one key a GPU for caches)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@cache
def _detect(device: torch.device, interpreted: bool) -> Target:
    if interpreted or device.type != "cuda":
        return Target.interpreter()
    props = torch.cuda.get_device_properties(device)
    return Target((props.major, props.minor), props.multi_processor_count, not unavailable_reason())
