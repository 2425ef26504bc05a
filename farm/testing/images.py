"""Small container images made from this host's own binaries, with no container engine: for tests
and benchmarks of image sandboxes (no registry is reachable here, and Docker is not assumed).

``host_image(dest, files={...})`` writes a ``docker save`` archive (or, with ``oci=True``, an OCI
layout) whose first layer holds bash and a few coreutils with the shared libraries they load, and
whose second layer adds the given files and deletes ``/etc/remove-me`` (a whiteout) so the
layering is exercised. The image has no Python.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

#: programs the image carries (those of them this host has).
DEFAULT_PROGRAMS = (
    "bash", "sh", "cat", "ls", "mkdir", "rm", "cp", "mv", "grep", "sed", "head", "tail", "wc", "env", "id",
    "sleep", "touch", "chmod", "diff", "sort", "tr", "dirname", "basename", "true", "false", "test",
    "readlink", "seq", "find", "stat", "printf", "kill", "ln", "xargs", "awk", "tar",
)  # fmt: skip


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/"):
                libs.add(part)
    return libs


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 1_700_000_000
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 1_700_000_000
    tar.addfile(info)


def base_layer(programs: tuple[str, ...] = DEFAULT_PROGRAMS) -> bytes:
    """A layer with a merged-/usr layout (``/bin -> usr/bin``), the programs and their libraries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("usr", "usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "root", "run", "proc", "dev", "var"):
            _add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
            _add_link(tar, link, target)
        libs: set[str] = set()
        for name in programs:
            path = shutil.which(name)
            if path is None:
                continue
            real = os.path.realpath(path)
            tar.add(real, arcname=f"usr/bin/{name}")
            libs |= _libraries(real)
        made = {"usr/lib", "usr/lib64"}
        for lib in sorted(libs):
            rel = os.path.realpath(lib).lstrip("/")
            rel = rel if rel.startswith("usr/") else f"usr/{rel}"
            parent = os.path.dirname(rel)
            if parent not in made:
                _add_dir(tar, parent)
                made.add(parent)
            tar.add(os.path.realpath(lib), arcname=rel)
            # The name the binaries ask for (a symlink on the host) next to the real file.
            alias = f"usr/{lib.lstrip('/')}" if not lib.startswith("/usr/") else lib.lstrip("/")
            if alias != rel:
                alias_parent = os.path.dirname(alias)
                if alias_parent not in made:
                    _add_dir(tar, alias_parent)
                    made.add(alias_parent)
                _add_link(tar, alias, "/" + rel)
        _add_bytes(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/sh\n")
        _add_bytes(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        _add_bytes(tar, "etc/remove-me", b"deleted by the layer above\n")
    return buf.getvalue()


#: a file's content, or its content and mode (without one, a file starting with ``#!`` is executable).
FileData = bytes | str | tuple[bytes | str, int]


def files_layer(files: Mapping[str, FileData], *, remove: tuple[str, ...] = ("etc/remove-me",)) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for name, data in sorted(files.items()):
            rel = name.lstrip("/")
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    _add_dir(tar, d)
                    dirs.add(d)
            content, mode = data if isinstance(data, tuple) else (data, None)
            raw = content.encode() if isinstance(content, str) else content
            _add_bytes(tar, rel, raw, mode if mode is not None else 0o755 if raw.startswith(b"#!") else 0o644)
        for name in remove:
            parent, base = os.path.split(name)
            _add_bytes(tar, os.path.join(parent, f".wh.{base}"), b"")
    return buf.getvalue()


def _config(layers: list[bytes], env: dict[str, str], workdir: str) -> bytes:
    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": workdir, "Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    return json.dumps(config, sort_keys=True).encode()


def host_image(
    dest: Path,
    *,
    files: Mapping[str, FileData] | None = None,
    env: dict[str, str] | None = None,
    workdir: str = "/",
    oci: bool = False,
    programs: tuple[str, ...] = DEFAULT_PROGRAMS,
) -> Path:
    """Write the image to ``dest`` (a tar, or a directory when ``oci``) and return ``dest``."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
    layers = [base_layer(programs), files_layer(files or {})]
    config = _config(layers, env, workdir)
    blobs: dict[str, bytes] = {hashlib.sha256(b).hexdigest(): b for b in [*layers, config]}
    config_hex = hashlib.sha256(config).hexdigest()
    layer_hex = [hashlib.sha256(layer).hexdigest() for layer in layers]
    if oci:
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{config_hex}"},
                "layers": [
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{h}"} for h in layer_hex
                ],
            }
        ).encode()
        blobs[hashlib.sha256(manifest).hexdigest()] = manifest
        index = {"schemaVersion": 2, "manifests": [{"digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}"}]}
        (dest / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        for digest, blob in blobs.items():
            (dest / "blobs" / "sha256" / digest).write_bytes(blob)
        (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        (dest / "index.json").write_text(json.dumps(index))
        return dest
    manifest_json = [{"Config": f"{config_hex}.json", "RepoTags": ["farm-test:latest"], "Layers": []}]
    with tarfile.open(dest, "w") as tar:
        for h, layer in zip(layer_hex, layers, strict=True):
            _add_bytes(tar, f"{h}/layer.tar", layer)
            manifest_json[0]["Layers"].append(f"{h}/layer.tar")  # type: ignore[attr-defined]
        _add_bytes(tar, f"{config_hex}.json", config)
        _add_bytes(tar, "manifest.json", json.dumps(manifest_json).encode())
    return dest
