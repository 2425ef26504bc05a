"""Task images on a node: a spec's ``image`` unpacked (or built, then unpacked) once, shared read-only.

``SandboxSpec.image`` names a file on the node, optionally with skopeo's transport prefix:

- ``docker-archive:PATH`` or a ``.tar`` from ``docker save``,
- ``oci:PATH`` (an OCI image layout directory) or ``oci-archive:PATH`` (the same as a tar),
- ``dockerfile:PATH``: a Dockerfile, or a directory holding one (the build context), built with
  ``docker build`` then ``docker save`` (Docker is needed for this one only).

Each image is unpacked once per node under ``<cache>/<key>/rootfs`` and never written after its
``.ready`` marker; sandboxes lay their own writable layer over it. The key is content: the config
blob's digest (which names every layer's digest) for a file, the build context's bytes for a
Dockerfile. A root worker hands the tree to the sandbox's user, so that user may write anything
in its own copy-on-write layer, as a container's root would.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from farm.errors import InvalidSpec, SandboxUnavailable
from farm.sandbox.registry import remove_tree
from farm.sandbox.unpack import ImageConfig, is_layout, open_layout, unpack

log = logging.getLogger(__name__)

READY = ".ready"
#: longest ``docker build`` may take (a task's dependencies installed from a local mirror).
DEFAULT_BUILD_TIMEOUT_S = 1800.0
_PREFIXES = ("docker-archive:", "oci-archive:", "oci:", "dockerfile:")
#: (path, size, mtime) -> digest: a worker does not hash the same archive's config for every sandbox.
_DIGESTS: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class Image:
    """An unpacked image on this node."""

    key: str
    rootfs: Path
    config: ImageConfig
    #: this call unpacked (or built) it; False: it was in the cache.
    unpacked: bool
    seconds: float


@dataclass(frozen=True)
class ImageRef:
    """A parsed ``SandboxSpec.image``."""

    path: Path
    dockerfile: Path | None  # set when the image is to be built

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        """Raises:
        InvalidSpec: the path does not exist or is no image the bwrap driver reads.
        """
        kind, text = "", ref
        for prefix in _PREFIXES:
            if ref.startswith(prefix):
                kind, text = prefix[:-1], ref[len(prefix) :]
        path = Path(text).expanduser()
        if not path.exists():
            raise InvalidSpec(
                f"image {ref!r}: {path} does not exist on this node (the bwrap driver runs images from files: "
                "a docker-save archive, an OCI layout or archive, or a Dockerfile)",
                field="image",
            )
        if kind == "dockerfile" or (kind == "" and not is_layout(path)):
            dockerfile = path / "Dockerfile" if path.is_dir() else path
            # Without the prefix, only a file named like one is taken for a Dockerfile.
            named = kind == "dockerfile" or path.is_dir() or "dockerfile" in path.name.lower()
            if not (dockerfile.is_file() and named):
                raise InvalidSpec(
                    f"image {ref!r}: {path} is neither an image archive or layout nor a Dockerfile (or a "
                    "directory holding one)",
                    field="image",
                )
            return cls(path=dockerfile.parent, dockerfile=dockerfile)
        return cls(path=path, dockerfile=None)


def context_digest(context: Path, dockerfile: Path) -> str:
    """sha256 over a build context's files (names, modes, bytes) and the Dockerfile's place in it."""
    h = hashlib.sha256(dockerfile.relative_to(context).as_posix().encode() + b"\0")
    for item in sorted(context.rglob("*")):
        rel = item.relative_to(context).as_posix()
        if item.is_symlink():
            h.update(f"L {rel} {os.readlink(item)}\n".encode())
        elif item.is_file():
            h.update(f"F {rel} {item.stat().st_mode & 0o777:o}\n".encode())
            with open(item, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def _layout_digest(path: Path) -> str:
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _DIGESTS:
        layout = open_layout(path)
        try:
            _DIGESTS[memo] = layout.digest
        finally:
            layout.close()
    return _DIGESTS[memo]


def image_key(ref: ImageRef, owner: tuple[int, int] | None) -> str:
    if ref.dockerfile is not None:
        content = "dockerfile:" + context_digest(ref.path, ref.dockerfile)
    else:
        content = "image:" + _layout_digest(ref.path)
    return hashlib.sha256(json.dumps([content, owner]).encode()).hexdigest()[:24]


def load_image(
    ref_text: str,
    *,
    cache: Path,
    owner: tuple[int, int] | None,
    docker: str = "docker",
    docker_host: str | None = None,
    build_network: str | None = None,
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
) -> Image:
    """The image ``ref_text`` names, unpacked under ``cache`` now unless a finished one is there.

    Concurrent callers on a node wait for one unpack (a file lock) and share it.

    Raises:
        InvalidSpec: the reference or the image is not readable.
        SandboxUnavailable: a Dockerfile build failed (Docker's output is in the message).
    """
    ref = ImageRef.parse(ref_text)
    key = image_key(ref, owner)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / key
    if not (path / READY).is_file():
        with open(cache / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / READY).is_file():  # nobody finished it while this one waited
                started = time.monotonic()
                builder = DockerBuilder(
                    docker=docker, host=docker_host, network=build_network, timeout_s=build_timeout_s
                )
                _build(ref, key, path, owner=owner, builder=builder)
                seconds = time.monotonic() - started
                log.info("image %s unpacked as %s in %.1f s", ref_text, key, seconds)
                return Image(key, path / "rootfs", _read_config(path), unpacked=True, seconds=seconds)
    return Image(key, path / "rootfs", _read_config(path), unpacked=False, seconds=0.0)


def _read_config(path: Path) -> ImageConfig:
    raw = json.loads((path / "config.json").read_text())
    return ImageConfig(env=raw["env"], workdir=raw["workdir"], user=raw["user"])


@dataclass(frozen=True)
class DockerBuilder:
    """How Dockerfiles are built on this node (``SandboxSettings.image_docker_*``)."""

    docker: str = "docker"
    host: str | None = None
    network: str | None = None
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S


def _build(ref: ImageRef, key: str, path: Path, *, owner: tuple[int, int] | None, builder: DockerBuilder) -> None:
    remove_tree(path)  # a build a crash cut short
    path.mkdir(parents=True)
    try:
        if ref.dockerfile is None:
            config = unpack(ref.path, path / "rootfs", owner=owner)
        else:
            archive = path / "image.tar"
            _docker_build(ref, f"farm-image:{key}", archive, builder)
            config = unpack(archive, path / "rootfs", owner=owner)
            archive.unlink()
        path.chmod(0o755)
        (path / "config.json").write_text(json.dumps(config.__dict__))
        (path / READY).write_text(str(time.time()))
    except BaseException:
        remove_tree(path)
        raise


def _docker_build(ref: ImageRef, tag: str, archive: Path, builder: DockerBuilder) -> None:
    binary = shutil.which(builder.docker)
    if binary is None:
        raise SandboxUnavailable(
            f"image {ref.dockerfile} must be built, and Docker ({builder.docker!r}) is not installed on this node: "
            "install it (scripts/setup_docker.sh) or ship the image as a docker-save archive"
        )
    assert ref.dockerfile is not None
    client = [binary, *(["-H", builder.host] if builder.host else [])]
    network = ["--network", builder.network] if builder.network else []
    steps = [
        [*client, "build", "-q", *network, "-t", tag, "-f", str(ref.dockerfile), str(ref.path)],
        [*client, "save", "-o", str(archive), tag],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=builder.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"building image {ref.dockerfile} failed: {exc}") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-2000:]
            step = argv[len(client)]
            raise SandboxUnavailable(f"`docker {step}` of {ref.dockerfile} exited {done.returncode}: {output}")
