"""The controller's own nightlab as a wheel, and the hash that ties every remote result to it.

A remote worker must run exactly the harness the controller verified, never a name looked
up on a package index (there is no `nightlab` release; a stranger could publish one). So
`nightlab fleet up` packs the nightlab this process imports into a wheel, ships it with the
cluster task and the set-up installs that file. Every result then carries the *code hash*
of the nightlab the worker imported; one that differs from the controller's is `invalid`.

Why repack the imported files instead of `pip wheel <checkout>`: a build backend packs what
its package-data rules select, which can differ from what an editable checkout imports
(a stray module, an untracked template), and then no result would ever match; and a
controller installed from a wheel has no checkout to build and may no longer have that
file. Repacking the package directory plus the installed distribution's METADATA and
entry points gives the same wheel for both install kinds, and the worker's code hash
equals the controller's by construction. The code hash covers the package's files (path
and bytes, `__pycache__` excluded), not the wheel's bytes (zip timestamps vary).

Usage: `build_wheel(out_dir)` -> `Wheel(path, sha256, code, version, source)`;
on a worker `python -m nightlab.fleet.build probe` prints the tags `fleet status` shows.
stdlib only: the worker's run script calls `python -m nightlab.fleet.build hash --on-eof` per
run, started beside the run and hashing once its stdin closes after the command (`fleet/templates/run.sh`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from nightlab.atomic import atomic_path

DIST = "nightlab"
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_WHEEL_FILE = (
    "Wheel-Version: 1.0\nGenerator: nightlab.fleet.build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
)


@dataclass(frozen=True)
class Wheel:
    """A built wheel of the running nightlab."""

    path: Path
    sha256: str  # of the file: what the cluster receives
    code: str  # code hash of the package inside (what every worker reports)
    version: str
    source: str  # "checkout" (editable install) or "wheel" (installed from a wheel / index)


def package_dir() -> Path:
    """The directory of the nightlab package this process imports."""
    import nightlab

    return Path(nightlab.__file__).resolve().parent


def _package_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(_SKIP_SUFFIXES):
                files.append(Path(dirpath) / name)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def code_hash(root: Path | None = None) -> str:
    """sha256 over the package's files (relative path and bytes), 16 hex digits.

    The same on the controller and on a worker that installed the controller's wheel.
    """
    root = package_dir() if root is None else root
    digest = hashlib.sha256()
    for path in _package_files(root):
        rel = path.relative_to(root).as_posix()
        digest.update(f"{len(rel)}:{rel}".encode())
        data = path.read_bytes()
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def install_source() -> str:
    """How this nightlab was installed: "checkout" (editable, or run from a source tree) or "wheel"."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return "checkout"  # imported from a source tree on sys.path without an install
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            if json.loads(direct).get("dir_info", {}).get("editable"):
                return "checkout"
        except ValueError:
            pass
    return "wheel"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _metadata(version: str) -> tuple[str, str | None]:
    """METADATA and entry_points.txt of the installed distribution (a minimal METADATA without one)."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n", None
    return _pin_torch(dist.read_text("METADATA") or ""), dist.read_text("entry_points.txt")


def _pin_torch(meta: str) -> str:
    """METADATA with the torch requirement pinned to the controller's torch (its public version).

    pyproject.toml asks for a range (a GPU image keeps its own torch); a cluster that installs
    the wheel gets the controller's release, so both ends run the same torch.
    """
    try:
        version = metadata.version("torch").split("+")[0]  # 2.11.0+cu130: the index has 2.11.0
    except metadata.PackageNotFoundError:
        return meta
    lines = meta.split("\n")
    for i, line in enumerate(lines):
        name = line.removeprefix("Requires-Dist:").strip()
        if line.startswith("Requires-Dist:") and re.match(r"torch\s*(?:[<>=!~(;\[]|$)", name):
            lines[i] = f"Requires-Dist: torch=={version}"
    return "\n".join(lines)


def build_wheel(out_dir: Path) -> Wheel:
    """Pack the running nightlab into `out_dir/nightlab-<version>-py3-none-any.whl`.

    Written to a temporary name and renamed, so a concurrent reader never sees half a file;
    an existing file with the same code is reused.

    Returns:
        The wheel, its sha256, the code hash and how the running nightlab was installed.
    """
    import nightlab

    root = package_dir()
    version = nightlab.__version__
    code = code_hash(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{DIST}-{version}-py3-none-any.whl"
    info = f"{DIST}-{version}.dist-info"
    meta, entry_points = _metadata(version)
    entries: list[tuple[str, bytes]] = []
    for file in _package_files(root):
        entries.append((f"{DIST}/{file.relative_to(root).as_posix()}", file.read_bytes()))
    entries.append((f"{info}/METADATA", meta.encode()))
    entries.append((f"{info}/WHEEL", _WHEEL_FILE.encode()))
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    record = [_record_line(name, data) for name, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    with (
        atomic_path(path, unique=True) as tmp,
        zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf,
    ):
        for name, data in entries:
            # a fixed timestamp: the same code gives the same bytes, so the same sha256
            zinfo = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zinfo.external_attr = 0o644 << 16
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zinfo, data)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return Wheel(path=path, sha256=sha, code=code, version=version, source=install_source())


def probe() -> dict[str, str]:
    """What a worker runs: nightlab's version and code hash, torch's version, whether bwrap works."""
    import nightlab
    from nightlab.harness.sandbox import available

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    sandbox = "bwrap" if available() is None else "none"
    return {"version": nightlab.__version__, "code": code_hash(), "torch": torch, "sandbox": sandbox}


if __name__ == "__main__":  # on a worker: `python -m nightlab.fleet.build hash [--on-eof]|probe`
    if sys.argv[1:] == ["hash"]:
        print(code_hash())
    elif sys.argv[1:] == ["hash", "--on-eof"]:
        # started before the run, so the interpreter's start-up is not between two runs; the
        # package's files are read only when the run script closes our stdin after the command
        sys.stdin.buffer.read()
        print(code_hash(), flush=True)
    elif sys.argv[1:] == ["probe"]:
        for key, value in probe().items():
            print(f"nightlab-{key}: {value}")
    else:
        sys.exit("usage: python -m nightlab.fleet.build hash [--on-eof]|probe")
