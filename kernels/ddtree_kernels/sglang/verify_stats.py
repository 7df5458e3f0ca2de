"""Which TARGET_VERIFY calls our kernel served, and which it handed back to SGLang.

A declined call runs SGLang's own extend_attention_fwd (about 30 ms a layer at 185k tokens):
correct, slow and silent. So each new (outcome, reason, shape) is logged once, declines at
warning level, and every call is counted. Where DDTREE_VERIFY_STATS_DIR is set (the deploy sets
it per release), each process keeps its counts in `verify-<pid>.json` there, rewritten on each
new shape and every STATS_EVERY calls; `ddtree-ops smoke --verify-stats DIR` reads them and fails
a release whose verify never reached the kernel. Captured CUDA graphs replay without calling the
hook, so the counts are of eager calls and captures; that is where a shape is decided.

File layout (read by ddtree_ops.smoke.read_verify_stats):
  {"pid": int, "served": int, "served_dsa": int, "declined": {reason: int},
   "shapes": [{"outcome", "reason", "shape"}], "updated": float}
("served_dsa": of "served", the calls a DSA model's sparse verify served, dsa_verify.py)
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger("ddtree_kernels")

STATS_DIR_ENV = "DDTREE_VERIFY_STATS_DIR"
STATS_EVERY = 1024  # calls between rewrites when no new shape appears
SERVED = "served"
DECLINED = "declined"


class VerifyStats:
    """Counts of one process; `record` is cheap except on a new shape (a log line and a small file)."""

    def __init__(self) -> None:
        self.served = 0
        self.served_dsa = 0
        self.declined: dict[str, int] = {}
        self.shapes: list[dict] = []
        self._seen: set[tuple] = set()
        self._calls = 0
        self._lock = threading.Lock()

    def record(self, reason: str | None, shape: tuple) -> None:
        """One hook call: served when `reason` is None, else declined for `reason`."""
        outcome = SERVED if reason is None else DECLINED
        key = (outcome, reason, shape)
        with self._lock:
            self._calls += 1
            if reason is None:
                self.served += 1
                self.served_dsa += shape[-1] == "dsa"
            else:
                self.declined[reason] = self.declined.get(reason, 0) + 1
            new = key not in self._seen
            if new:
                self._seen.add(key)
                self.shapes.append({"outcome": outcome, "reason": reason, "shape": list(shape)})
            due = new or self._calls % STATS_EVERY == 0
        if new:
            if reason is None:
                logger.info("ddtree-sm120: TARGET_VERIFY served by ddtree_kernels for %s", _describe(shape))
            elif shape[-1] == "dsa":
                logger.warning("ddtree-sm120: DSA TARGET_VERIFY not sparse, the dense tree verify attends every key, "
                               "for %s: %s", _describe(shape), reason)
            else:
                logger.warning("ddtree-sm120: TARGET_VERIFY handed back to SGLang's extend_attention_fwd (slow) "
                               "for %s: %s", _describe(shape), reason)
        if due:
            self.write()

    def snapshot(self) -> dict:
        with self._lock:
            return {"pid": os.getpid(), "served": self.served, "served_dsa": self.served_dsa,
                    "declined": dict(self.declined),
                    "shapes": list(self.shapes), "updated": time.time()}

    def write(self) -> Path | None:
        """Write this process's counts to $DDTREE_VERIFY_STATS_DIR/verify-<pid>.json (atomically)."""
        folder = os.environ.get(STATS_DIR_ENV)
        if not folder:
            return None
        try:
            path = Path(folder)
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path, prefix=".verify-", delete=False) as tmp:
                json.dump(self.snapshot(), tmp)
            target = path / f"verify-{os.getpid()}.json"
            os.replace(tmp.name, target)
            return target
        except OSError as exc:  # statistics must never break serving
            logger.warning("ddtree-sm120: cannot write verify statistics to %s: %s", folder, exc)
            return None


def _describe(shape: tuple) -> str:
    heads, d_qk, d_v, q_dtype, kv_dtype, masked = shape
    mask = "sparse (DSA) tree" if masked == "dsa" else "tree/custom mask" if masked else "no mask"
    return f"{heads} heads, head dims {d_qk}/{d_v}, q {q_dtype}, KV cache {kv_dtype}, {mask}"


STATS = VerifyStats()
