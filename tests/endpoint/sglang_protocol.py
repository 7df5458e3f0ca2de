"""SGLang's own OpenAI-protocol pydantic models, loaded from the real release wheel.

protocol.py imports one SGLang helper (sglang.utils.convert_json_schema_to_str); it is
stood in by name (ddtree_ops.module_stand_ins.stand_in_modules) so the
module loads without SGLang's GPU dependencies.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import zipfile

from ddtree_ops.module_stand_ins import stand_in_modules
from ddtree_ops.wheels import sglang_wheel

PROTOCOL = "sglang/srt/entrypoints/openai/protocol.py"


def load_protocol(version: str = "0.5.23") -> types.ModuleType:
    with zipfile.ZipFile(sglang_wheel(version)) as zf:
        source = zf.read(PROTOCOL).decode()
    helpers = {"convert_json_schema_to_str": lambda schema: json.dumps(schema)}
    with stand_in_modules({"sglang.utils": helpers}):
        spec = importlib.util.spec_from_loader("sglang_protocol_under_test", loader=None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # pydantic resolves forward references through sys.modules
        exec(compile(source, f"{version}:{PROTOCOL}", "exec"), module.__dict__)
        return module
