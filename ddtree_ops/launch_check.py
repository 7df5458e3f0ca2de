"""Have the installed SGLang parse a server's argument list before the deploy switches to it.

Run with the new release's own Python, so the parser is that release's: `ServerArgs.add_cli_args`
builds it and parses the exact list the unit will run, and a `--speculative-algorithm` is
resolved by SGLang's own `SpeculativeAlgorithm.from_string`. A release that lacks a flag or an
algorithm (e.g. DDTREE on a PyPI release) is refused with SGLang's words, before anything is
switched. No list of flags is kept here.

    ddtree-ops launch-check [--preload MODULE] [--json] -- --model-path /models/GLM-5 ...

`--preload` imports a module first: the test hosts, which have no GPU stack, preload stand-ins
for torch and friends (tests/endpoint/standin_gpu_stack.py); production imports everything real.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
from dataclasses import asdict, dataclass


@dataclass
class LaunchCheck:
    ok: bool
    sglang_version: str
    problem: str = ""  # SGLang's own message, naming the flag or value it refuses
    algorithm: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str):
        raise _ParseError(message)


def check_launch_args(argv: list[str], preload: str | None = None) -> LaunchCheck:
    """Parse `argv` with the installed SGLang's server parser; `ok` False names what it refused."""
    if preload:
        importlib.import_module(preload)
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    # Importing server_args logs and warns on a host without a GPU; only the verdict matters here.
    with contextlib.redirect_stderr(io.StringIO()):
        from sglang.srt.server_args import ServerArgs

        parser = _RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(argv)
    except _ParseError as exc:
        return LaunchCheck(False, version, f"SGLang {version} refuses the arguments: {exc}")
    algorithm = getattr(args, "speculative_algorithm", None)
    if algorithm:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        try:
            SpeculativeAlgorithm.from_string(algorithm)
        except ValueError as exc:
            return LaunchCheck(False, version, f"SGLang {version} refuses --speculative-algorithm {algorithm}: {exc}",
                               algorithm)
    return LaunchCheck(True, version, algorithm=algorithm or "")
