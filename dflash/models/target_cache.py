"""The cached float32 copy of a GGUF target (`dflash.loading.load`), verified before every use: each file's size and sha256
are recorded when the copy is written, so a copy cut short (a full disk, a killed first start) or changed since is
found and made again, not met as a SafetensorError at every start."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from dflash.errors import ValidationError, first_line

MANIFEST = "dflash-manifest.json"  # {file name: {"size": bytes, "sha256": hex}} of the copy's other files
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # ~0.3 s for the default target's 538 MB


def record(directory: Path) -> None:
    """Write the manifest of every file in `directory` (a copy just made, or an unrecorded one found sound)."""
    files = {p.name: {"size": p.stat().st_size, "sha256": _digest(p)}
             for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    tmp = directory / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(files, indent=1))
    tmp.replace(directory / MANIFEST)


def problem(directory: Path) -> str | None:
    """Why the copy in `directory` cannot be used ("" when there is none yet), or None when it is sound. A copy from
    before manifests were kept is checked by opening its weights' header (which spans the whole file) and recorded."""
    if not directory.is_dir():
        return ""
    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if missing:
        return f"it lacks {', '.join(missing)}"
    try:
        recorded = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return _adopt(directory)
    for name, want in recorded.items() if isinstance(recorded, dict) else ():
        path = directory / name
        size = path.stat().st_size if path.is_file() else None
        if size != want.get("size"):
            return f"{name} has {size} bytes, {want.get('size')} were written"
        if _digest(path) != want.get("sha256"):
            return f"{name} changed since it was written (its sha256 differs)"
    return None if isinstance(recorded, dict) else "its manifest is not a table"


def _adopt(directory: Path) -> str | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(directory / "model.safetensors"), "pt"):
            pass
        record(directory)
    except (SafetensorError, OSError) as exc:
        return f"model.safetensors is unreadable ({first_line(exc)})"
    return None


def check_writable(root: Path) -> None:
    """The cache folder can take a new copy: checked before a conversion (tens of seconds), not after it."""
    try:
        (root / "targets").mkdir(parents=True, exist_ok=True)
        probe = root / "targets" / f".writable.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValidationError("DFLASH_CACHE", f"cannot write the cache folder {root} ({exc.strerror or exc}); set "
                                              "DFLASH_CACHE to a writable folder") from None


def install(tmp: Path, directory: Path) -> None:
    """Put the new copy `tmp` (recorded) in place of `directory`: kept if another process made a sound one meanwhile,
    swapped in (by renames) for a damaged one."""
    record(tmp)
    if problem(directory) is None:
        shutil.rmtree(tmp)
        return
    old = directory.with_name(f"{directory.name}.damaged{os.getpid()}")
    if directory.exists():
        directory.replace(old)
    tmp.replace(directory)
    shutil.rmtree(old, ignore_errors=True)
