"""The release bundle: everything a GPU host installs, built once on the controller.

A bundle is a tar file holding `wheels/` (our two wheels, plus in wheelhouse mode the pinned
SGLang and every dependency, downloaded for the host's Python and platform), `patches/`,
`constraints.txt` (exact pins) and `manifest.json`. Its id is a digest of the inputs (source
files, pins, mode), not of the built files, so the same pins give the same id and a second
deploy finds nothing to do. Bundles are cached under `.cache/bundles/<id>.tar` and published
with an atomic rename.

    ddtree-ops bundle --sglang-version 0.5.23 --python-version 3.12 --out .cache/bundles

A git source (a DDTree branch) is built into a wheel here, on the controller, with
`SGLANG_BUILD_RUST_EXTS=none` (the optional gRPC extension needs a Rust toolchain and nothing
in DDTree serving uses it) and the version `0.0.0.dev0+g<commit[:12]>` (git_wheel_version):
setuptools-scm would give 0.0.0.dev0 or 0.5.N.devM+g… depending on which tags the clone has,
so the bundle pins one that names the commit and is the same from every clone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What goes into our two wheels and the patch set: the bundle id covers exactly these.
SOURCE_GLOBS = {
    "kernels": ["pyproject.toml", "README.md", "ddtree_kernels/**/*.py"],
    ".": ["pyproject.toml", "ddtree_ops/**/*.py"],
}
GIT_COMMIT = re.compile(r"^[0-9a-f]{40}$")
PEP440_EXACT = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def git_wheel_version(commit: str) -> str:
    """The version a wheel built from SGLang commit `commit` reports (a PEP 440 dev version with the commit)."""
    return f"0.0.0.dev0+g{commit[:12]}"


class BundleError(RuntimeError):
    """A bundle could not be built; the message names the input at fault and the fix."""


@dataclass
class BundleSpec:
    sglang_version: str = ""  # exact PyPI version, or
    sglang_git_url: str = ""  # a git URL + 40-hex commit (the DDTree branch)
    sglang_git_commit: str = ""
    pip_source: str = "wheelhouse"  # wheelhouse: every wheel in the bundle; index: only ours, pip uses the index
    with_dependencies: bool = True  # False only for hosts without the GPU stack (the test hosts)
    python_version: str = ""  # the host's, e.g. "3.12"; empty: this Python's
    platforms: list[str] = field(default_factory=list)  # e.g. manylinux_2_28_x86_64; empty: this machine's
    extra_constraints: list[str] = field(default_factory=list)  # e.g. "torch==2.9.1"
    extra_wheels: list[str] = field(default_factory=list)  # local wheel files to ship and install as well
    extra_packages: list[str] = field(default_factory=list)  # requirement names to install (found in the bundle)
    patches: str = ""  # patch folder with series.toml; empty: the repository's patches/
    patch_series: str = ""  # a series name to apply; empty: the patch tool picks it from the SGLang tree

    def validate(self) -> None:
        if bool(self.sglang_version) == bool(self.sglang_git_url):
            raise BundleError("set exactly one SGLang source: ddtree_sglang_version (a PyPI release, e.g. 0.5.23) "
                              "or ddtree_sglang_git_url + ddtree_sglang_git_commit")
        if self.sglang_version and not PEP440_EXACT.match(self.sglang_version):
            raise BundleError(f"ddtree_sglang_version={self.sglang_version!r} is not an exact release "
                              "(write 0.5.23, not a range)")
        if self.sglang_git_url and not GIT_COMMIT.match(self.sglang_git_commit):
            raise BundleError(f"ddtree_sglang_git_commit={self.sglang_git_commit!r} must be a full 40-hex commit "
                              "(a branch or tag can move)")
        if self.pip_source not in ("wheelhouse", "index"):
            raise BundleError(f"ddtree_pip_source={self.pip_source!r}: use 'wheelhouse' or 'index'")
        for path in self.extra_wheels:
            if not Path(path).is_file() or not path.endswith(".whl"):
                raise BundleError(f"extra wheel {path} is not a wheel file on the controller")
        for pin in self.extra_constraints:
            if "==" not in pin:
                raise BundleError(f"constraint {pin!r} is not an exact pin (name==version)")

    @property
    def sglang_requirement(self) -> str:
        if self.sglang_version:
            return f"sglang=={self.sglang_version}"
        return f"sglang @ git+{self.sglang_git_url}@{self.sglang_git_commit}#subdirectory=python"


@dataclass
class Bundle:
    id: str
    tar: str
    sglang_version: str
    versions: dict[str, str]  # distribution -> exact version installed from the bundle
    install_core: list[str]  # sglang + ddtree-kernels (no-deps on hosts without the GPU stack)
    install_tools: list[str]  # ddtree-ops + extras, always with dependencies
    pip_source: str
    with_dependencies: bool
    patch_series: str = ""


def _patches(spec: BundleSpec, repo: Path) -> Path:
    path = Path(spec.patches) if spec.patches else repo / "patches"
    if not (path / "series.toml").is_file():
        raise BundleError(f"no series.toml in the patch folder {path} (ddtree_patches_dir)")
    return path


def _digest_sources(spec: BundleSpec, repo: Path) -> dict[str, str]:
    trees = [(repo / base, globs, base) for base, globs in SOURCE_GLOBS.items()]
    trees.append((_patches(spec, repo), ["**/*"], "patches"))
    out = {}
    for root, globs, label in trees:
        for pattern in globs:
            for path in sorted(root.glob(pattern)):
                if path.is_file() and "__pycache__" not in path.parts and "egg-info" not in str(path):
                    out[f"{label}/{path.relative_to(root)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def bundle_id(spec: BundleSpec, repo: Path = REPO) -> str:
    inputs = {"spec": asdict(spec), "sources": _digest_sources(spec, repo),
              "extra_wheels": {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest()
                               for p in spec.extra_wheels}}
    for path_field in ("extra_wheels", "patches"):  # paths on the controller do not matter, contents do
        inputs["spec"].pop(path_field)
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def pip_failure_cause(output: str) -> str:
    """The line of pip's output that says why it failed, with the fix where it is a known one: git's own error for
    a commit the repository does not have, else pip's first ERROR line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    missing = next((line for line in lines if re.search(r"not our ref|did not match any|reference is not a tree|"
                                                     r"unknown revision|couldn't find remote ref", line)), None)
    if missing:
        return (f"{missing}: the repository has no such commit; set ddtree_sglang_git_commit to a full commit of "
                "ddtree_sglang_git_url (git ls-remote URL lists its branch heads)")
    return next((line for line in lines if line.startswith(("ERROR:", "fatal:", "error:"))), lines[-1] if lines else
                "no output")


def _pip(args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode:
        output = (proc.stderr or "") + (proc.stdout or "")
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        hint = ("\nThis SGLang source builds its Rust extension whatever SGLANG_BUILD_RUST_EXTS says (no "
                "python/setup.py honouring it): the controller needs cargo and crates.io, or pin a newer commit."
                if "cargo" in tail else "")
        command = " ".join(cmd)
        command = command if len(command) <= 400 else command[:400] + " ..."
        # the cause first: the operator reads the first line; pip's own lines and the command follow for detail
        raise BundleError(f"{what} failed (pip exit {proc.returncode}): {pip_failure_cause(output)}{hint}\n"
                          f"pip's last lines:\n{tail}\ncommand: {command}")


def _target_flags(spec: BundleSpec) -> list[str]:
    flags = []
    if spec.python_version:
        flags += ["--python-version", spec.python_version]
    for plat in spec.platforms:
        flags += ["--platform", plat]
    if flags:
        flags += ["--only-binary=:all:"]
    return flags


def _wheel_version(wheels: Path, dist: str) -> str:
    prefix = dist.replace("-", "_") + "-"
    found = sorted(w.name for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix))
    if not found:
        raise BundleError(f"no {dist} wheel was built into {wheels}")
    return found[-1][len(prefix):].split("-")[0]


def _make_pure(wheels: Path) -> None:
    """Retag the SGLang wheel built without Rust extensions as py3-none-any, so a host of any Python takes it.

    setuptools-rust tags the wheel for this machine's CPython even when it builds no extension;
    a wheel holding a compiled file is left as it is (then the host must match this Python)."""
    for whl in wheels.glob("sglang-*.whl"):
        with zipfile.ZipFile(whl) as zf:
            if any(n.endswith((".so", ".pyd")) for n in zf.namelist()):
                continue
        proc = subprocess.run([sys.executable, "-m", "wheel", "tags", "--python-tag", "py3", "--abi-tag", "none",
                               "--platform-tag", "any", "--remove", str(whl)], capture_output=True, text=True)
        if proc.returncode:
            raise BundleError(f"retagging {whl.name} as py3-none-any failed: {proc.stderr.strip()[-400:]}")


def _sglang_git_wheels(spec: BundleSpec, out: Path, log) -> list[Path]:
    """SGLang built from the spec's git commit, once a commit: a wheel depends on the URL and commit alone, so
    bundles that differ in our sources or patches reuse it from `out/sglang-git/<digest>/`."""
    key = hashlib.sha256(f"{spec.sglang_git_url}@{spec.sglang_git_commit}".encode()).hexdigest()[:16]
    cached = out / "sglang-git" / key
    if not cached.is_dir():
        log(f"building SGLang from {spec.sglang_git_url}@{spec.sglang_git_commit[:12]} "
            f"(no Rust extensions; version {git_wheel_version(spec.sglang_git_commit)})")
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{key}-", dir=cached.parent) as tmp:
            _pip(["wheel", "--quiet", "--no-deps", "-w", tmp, spec.sglang_requirement], "building SGLang from git",
                 env={"SGLANG_BUILD_RUST_EXTS": "none",
                      "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG": git_wheel_version(spec.sglang_git_commit)})
            _make_pure(Path(tmp))
            try:
                os.rename(tmp, cached)  # published whole: a concurrent build's copy wins or this one does
            except OSError:
                if not cached.is_dir():
                    raise
            Path(tmp).mkdir(exist_ok=True)  # TemporaryDirectory cleans up a path that is there
    else:
        log(f"SGLang {spec.sglang_git_commit[:12]}: the wheel built before, at {cached}")
    return sorted(cached.glob("*.whl"))


def build_bundle(spec: BundleSpec, out: str | Path, repo: Path = REPO, log=print) -> Bundle:
    """Build (or find in the cache) the bundle for `spec`; return what the host installs."""
    spec.validate()
    out = Path(out).resolve()
    bid = bundle_id(spec, repo)
    tar_path = out / f"{bid}.tar"
    meta_path = out / f"{bid}.json"
    if tar_path.exists() and meta_path.exists():
        log(f"bundle {bid}: cached at {tar_path}")
        return Bundle(**json.loads(meta_path.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"bundle-{bid}-", dir=out) as tmp:
        stage = Path(tmp) / "bundle"
        wheels = stage / "wheels"
        wheels.mkdir(parents=True)
        log(f"bundle {bid}: building the ddtree-kernels and ddtree-ops wheels")
        # --no-build-isolation: setuptools is in the dev environment, and an isolated build would fetch it again.
        _pip(["wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels),
              str(repo / "kernels"), str(repo)], "building our wheels")
        for extra in spec.extra_wheels:
            shutil.copy(extra, wheels)
        versions = {d: _wheel_version(wheels, d) for d in ("ddtree-kernels", "ddtree-ops")}
        sglang_req = spec.sglang_requirement
        if spec.sglang_git_url:  # built here in both modes: the host needs no git, toolchain or scm
            for wheel in _sglang_git_wheels(spec, out, log):
                shutil.copy(wheel, wheels)
            versions["sglang"] = _wheel_version(wheels, "sglang")
        elif spec.sglang_version:
            versions["sglang"] = spec.sglang_version
        pins = [f"{d}=={v}" for d, v in sorted(versions.items())]
        constraints = pins + list(spec.extra_constraints)
        (stage / "constraints.txt").write_text("\n".join(constraints) + "\n")
        core = [f"sglang=={versions['sglang']}" if "sglang" in versions else sglang_req,
                f"ddtree-kernels=={versions['ddtree-kernels']}"]
        tools = [f"ddtree-ops=={versions['ddtree-ops']}", *spec.extra_packages]
        if spec.pip_source == "wheelhouse":
            find = ["--find-links", str(wheels), "-c", str(stage / "constraints.txt"), *_target_flags(spec)]
            log(f"bundle {bid}: downloading {' '.join(core)}"
                f"{' and dependencies' if spec.with_dependencies else ' (no dependencies)'} for the host")
            _pip(["download", "--quiet", "-d", str(wheels), *find, *([] if spec.with_dependencies else ["--no-deps"]),
                  *core], "downloading SGLang for the wheelhouse")
            log(f"bundle {bid}: downloading {' '.join(tools)} and dependencies")
            _pip(["download", "--quiet", "-d", str(wheels), *find, *tools], "downloading the tools for the wheelhouse")
        shutil.copytree(_patches(spec, repo), stage / "patches")
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(wheels.iterdir())}
        bundle = Bundle(id=bid, tar=str(tar_path), sglang_version=versions.get("sglang", sglang_req),
                        versions=versions, install_core=core, install_tools=tools, pip_source=spec.pip_source,
                        with_dependencies=spec.with_dependencies, patch_series=spec.patch_series)
        manifest = {**asdict(bundle), "spec": asdict(spec), "constraints": constraints, "wheels": files}
        manifest.pop("tar")
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        tmp_tar = Path(tmp) / "bundle.tar"
        with tarfile.open(tmp_tar, "w") as tf:
            tf.add(stage, arcname=".")
        os.replace(tmp_tar, tar_path)
        meta_path.write_text(json.dumps(asdict(bundle), indent=1))
    log(f"bundle {bid}: {len(files)} wheels, {tar_path.stat().st_size / 1e6:.1f} MB at {tar_path}")
    return bundle
