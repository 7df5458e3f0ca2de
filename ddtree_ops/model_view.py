"""The dense-MLA view of a DSA checkpoint (GLM-5, DeepSeek-V3.2): what a DDTree server loads instead.

SGLang runs a model whose config has `index_topk` as a DSA model: a KV pool of page size 64 and the
dsa attention backend, out of reach of DDTree's page-size-1 verify. Deleting the key from
config.json is not enough: transformers' `GlmMoeDsaConfig` declares `index_topk: int = 2048`, so a
config without it loads with the default, and one with `null` is refused by its type check. The view
therefore also names a config class that has no DSA fields (`deepseek_v3`, the same MLA fields),
keeps the architecture (SGLang's model class), and writes out every value the original config class
filled in, so no default changes under the other class.

    ddtree-ops model-view /models/GLM-5 /srv/ddtree/shared/models/GLM-5-dense-mla [--json]

Every other file of the checkpoint is linked, not copied. Where transformers imports, the view is
loaded back the way SGLang loads it and compared with the original, field by field; the command
fails, naming the field, if the view would change anything but the DSA fields.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# What makes a config DSA; the view drops these (the indexer's own weights stay in the files, unused).
DSA_FIELDS = ("index_topk", "indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")
VIEW_MODEL_TYPE = "deepseek_v3"
# Fields a config class derives for itself, which may differ between the two classes without meaning.
DERIVED = {"model_type", "transformers_version", "layer_types", "architectures", "_name_or_path", "dtype",
           "torch_dtype", *DSA_FIELDS}


class ModelViewError(RuntimeError):
    """The view could not be made; the message names the checkpoint or field at fault."""


@dataclass
class ModelView:
    source: str
    dest: str
    dsa: bool  # False: the checkpoint is not a DSA model and the view equals it
    linked: int
    checked: str  # "transformers X.Y" when the view was loaded back and compared, else why not
    pinned: list[str] = field(default_factory=list)  # defaults written out to keep their values
    changed: bool = False  # the view was made or changed (False: it was already this)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def view_config(config: dict) -> dict:
    """The view's config.json: no DSA fields, a config class without them, the same everything else."""
    if config.get("index_topk") is None:
        return dict(config)
    return {k: v for k, v in config.items() if k not in DSA_FIELDS} | {"model_type": VIEW_MODEL_TYPE}


def _loaded(folder: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder))


def _differences(original, view) -> dict[str, tuple]:
    want = {k: v for k, v in original.to_dict().items() if k not in DERIVED}
    return {k: (v, getattr(view, k, "<absent>")) for k, v in want.items() if getattr(view, k, "<absent>") != v}


def transformers_version() -> str | None:
    """The installed transformers' version, or None where there is none (or only a test host's stand-in)."""
    try:
        import transformers
    except ImportError:
        return None
    real = getattr(transformers, "__file__", None) is not None  # the test hosts' stand-in has no file
    version = getattr(transformers, "__version__", None)
    return version if real and isinstance(version, str) else None


def loaded_config(folder: str | Path):
    """A checkpoint's config as SGLang sees it: loaded by transformers' config class where transformers is
    installed (defaults included), else the config.json as written."""
    folder = Path(folder)
    if transformers_version() is None:
        import types

        return types.SimpleNamespace(**json.loads((folder / "config.json").read_text()))
    return _loaded(folder)


def _link_files(source: Path, dest: Path) -> tuple[int, bool]:
    """Link every file of `source` but config.json into `dest`: (files linked, whether a link changed)."""
    wanted = {p.name for p in source.iterdir() if p.name != "config.json"}
    changed = False
    for stale in dest.iterdir():
        if stale.is_symlink() and stale.name not in wanted:
            stale.unlink()
            changed = True
    for name in sorted(wanted):
        link, target = dest / name, source / name
        if link.is_symlink() and os.readlink(link) == str(target):
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(target)
        changed = True
    return len(wanted), changed


def _write(path: Path, config: dict) -> None:
    tmp = path.with_name(".config.json.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, path)


def make_view(source: str | Path, dest: str | Path) -> ModelView:
    """Write the dense-MLA view of checkpoint `source` at `dest` (idempotent); raise ModelViewError if unsafe."""
    source, dest = Path(source).resolve(), Path(dest)
    config_file = source / "config.json"
    if not config_file.is_file():
        raise ModelViewError(f"{source} has no config.json: ddtree_model_path must be a checkpoint folder")
    original = json.loads(config_file.read_text())
    config = view_config(original)
    dsa = original.get("index_topk") is not None
    dest.mkdir(parents=True, exist_ok=True)
    view_file = dest / "config.json"
    before = view_file.read_text() if view_file.is_file() else None
    linked, relinked = _link_files(source, dest)
    version = transformers_version()
    pinned: list[str] = []
    _write(view_file, config)
    if version is None:
        return ModelView(str(source), str(dest), dsa, linked, "not loaded back: transformers is not installed here",
                         changed=relinked or before != view_file.read_text())
    loaded = _loaded(source)
    diff = _differences(loaded, _loaded(dest))
    if diff:  # defaults the view's config class fills differently: write the original's values out
        pinned = sorted(diff)
        config |= {k: loaded.to_dict()[k] for k in pinned}
        _write(view_file, config)
        diff = _differences(loaded, _loaded(dest))
    view = _loaded(dest)
    if diff or getattr(view, "index_topk", None) is not None:
        problem = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(diff.items())) or \
            f"index_topk is still {view.index_topk}"
        raise ModelViewError(f"the dense-MLA view of {source} would not load as the same model under transformers "
                             f"{version}: {problem}")
    return ModelView(str(source), str(dest), dsa, linked, f"transformers {version}", pinned,
                     changed=relinked or before != view_file.read_text())
