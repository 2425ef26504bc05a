"""Read container images from files and unpack their layers into one root file system.

Three layouts are read, all without a container engine:

- a ``docker save`` archive (a tar with ``manifest.json``; Docker 25+ writes an OCI layout beside it),
- an OCI image layout directory (``oci-layout``, ``index.json``, ``blobs/``),
- an OCI archive (that directory as a tar, what ``skopeo copy ... oci-archive:`` writes).

Layers are tars (plain or gzip) applied in order: a ``.wh.NAME`` entry deletes ``NAME`` from the
layers below, ``.wh..wh..opq`` empties its directory of what the layers below put there. Every
path is resolved inside the new root, symlinks included, so a layer can never write outside it
(an absolute symlink means the image's root, as it will inside the sandbox). Device nodes and
FIFOs are skipped (the sandbox has its own /dev); setuid and setgid bits are dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from farm.errors import InvalidSpec

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_MAX_LINK_HOPS = 40
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class ImageConfig:
    """What the image's config says about how to run it (the parts a sandbox uses)."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ImageConfig:
        conf = raw.get("config") or raw.get("Config") or {}
        env = {}
        for item in conf.get("Env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        return cls(env=env, workdir=str(conf.get("WorkingDir") or ""), user=str(conf.get("User") or ""))


class _Source:
    """Files of an image, from a directory or from inside a tar, by relative path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tar: tarfile.TarFile | None = None
        if path.is_file():
            try:
                self._tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed by close()
            except tarfile.TarError as exc:
                raise InvalidSpec(f"image {path} is not a tar archive: {exc}", field="image") from exc

    def exists(self, name: str) -> bool:
        if self._tar is None:
            return (self.path / name).is_file()
        try:
            self._tar.getmember(name)
        except KeyError:
            return False
        return True

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        if self._tar is None:
            with open(self.path / name, "rb") as fh:
                yield fh
            return
        try:
            member: IO[bytes] | None = self._tar.extractfile(name)
        except KeyError:
            member = None
        if member is None:
            raise InvalidSpec(f"image {self.path} names {name}, which it does not hold", field="image")
        with member:
            yield member

    def json(self, name: str) -> Any:
        with self.open(name) as fh:
            return json.loads(fh.read())

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()


@dataclass
class ImageLayout:
    """An image file's manifest: its config and its layers (paths inside the source), bottom first."""

    source: _Source
    config_path: str
    layers: list[str]

    @property
    def digest(self) -> str:
        """The config blob's sha256: it names every layer's content (``rootfs.diff_ids``)."""
        with self.source.open(self.config_path) as fh:
            return hashlib.sha256(fh.read()).hexdigest()

    def config(self) -> ImageConfig:
        return ImageConfig.from_json(self.source.json(self.config_path))

    def close(self) -> None:
        self.source.close()


def _blob(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def _oci_manifest(source: _Source, descriptor: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = source.json(_blob(descriptor["digest"]))
    while doc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
        manifests = doc.get("manifests") or []
        chosen = next((m for m in manifests if (m.get("platform") or {}).get("architecture") in (None, "amd64")), None)
        if chosen is None:
            raise InvalidSpec(f"image {source.path}: no linux/amd64 manifest in its index", field="image")
        doc = source.json(_blob(chosen["digest"]))
    return doc


def open_layout(path: Path) -> ImageLayout:
    """The manifest of a docker-save archive, an OCI layout or an OCI archive at ``path``.

    Raises:
        InvalidSpec: ``path`` is none of them (the message says what was found).
    """
    if not path.exists():
        raise InvalidSpec(f"image {path} does not exist", field="image")
    source = _Source(path)
    try:
        if source.exists("manifest.json"):  # docker save (also when it carries an OCI layout)
            entry = source.json("manifest.json")[0]
            return ImageLayout(source, entry["Config"], list(entry["Layers"]))
        if source.exists("index.json"):
            index = source.json("index.json")
            if not index.get("manifests"):
                raise InvalidSpec(f"image {path}: index.json lists no manifest", field="image")
            manifest = _oci_manifest(source, index["manifests"][0])
            layers = [_blob(layer["digest"]) for layer in manifest.get("layers") or []]
            return ImageLayout(source, _blob(manifest["config"]["digest"]), layers)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        source.close()
        raise InvalidSpec(f"image {path}: unreadable manifest ({exc!r})", field="image") from exc
    source.close()
    raise InvalidSpec(
        f"image {path} is neither a docker-save archive (manifest.json) nor an OCI layout (index.json)", field="image"
    )


class _Root:
    """Path resolution inside a root directory: symlinks followed as the sandbox would see them."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)

    def host(self, inside: str) -> str:
        return os.path.join(self.root, inside.lstrip("/")) if inside.strip("/") else self.root

    def resolve_parent(self, name: str) -> str:
        """The image path of ``name``'s directory with every symlink in it resolved (the last
        component is left alone: it is what gets replaced)."""
        parts = [p for p in posixpath.normpath("/" + name).split("/") if p]
        if not parts:
            return "/"
        return posixpath.join(self._resolve(parts[:-1]), parts[-1])

    def _resolve(self, parts: list[str]) -> str:
        current = "/"
        pending = list(parts)
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                current = posixpath.dirname(current) or "/"
                continue
            candidate = posixpath.join(current, part)
            host = self.host(candidate)
            if os.path.islink(host):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise InvalidSpec(f"image layer: too many symlinks resolving {'/'.join(parts)}", field="image")
                target = os.readlink(host)
                if target.startswith("/"):
                    current = "/"
                pending = [p for p in target.split("/") if p] + pending
                continue
            current = candidate
        return current


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def apply_layer(
    layer: IO[bytes], root: Path, *, owner: tuple[int, int] | None, on_skip: Callable[[str], None] | None = None
) -> None:
    """Apply one layer tar (plain or gzip, read as a stream) to the root directory ``root``.

    ``owner``: the (uid, gid) every file gets (a root worker hands the tree to the sandbox's user);
    ``None`` keeps this process's own.

    Raises:
        InvalidSpec: the layer is not a readable tar.
    """
    resolver = _Root(root)
    added: set[str] = set()  # image paths this layer wrote: an opaque marker keeps them
    try:
        with tarfile.open(fileobj=layer, mode="r|*") as tar:
            for member in tar:
                inside = resolver.resolve_parent(member.name)
                base = posixpath.basename(inside)
                parent = posixpath.dirname(inside)
                if base == OPAQUE:
                    host_dir = resolver.host(parent)
                    if os.path.isdir(host_dir):
                        for child in os.listdir(host_dir):
                            if posixpath.join(parent, child) not in added:
                                _remove(os.path.join(host_dir, child))
                    continue
                if base.startswith(WHITEOUT):
                    _remove(resolver.host(posixpath.join(parent, base[len(WHITEOUT) :])))
                    continue
                if inside == "/":
                    continue
                _extract(tar, member, resolver, inside, owner, on_skip)
                added.add(inside)
    except tarfile.TarError as exc:
        raise InvalidSpec(f"image layer is not a readable tar: {exc}", field="image") from exc


def _extract(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    resolver: _Root,
    inside: str,
    owner: tuple[int, int] | None,
    on_skip: Callable[[str], None] | None,
) -> None:
    dest = resolver.host(inside)
    os.makedirs(resolver.host(posixpath.dirname(inside)), exist_ok=True)
    mode = member.mode & 0o1777  # no setuid/setgid: the sandbox's user should not gain anything
    if member.isdir():
        if not (os.path.isdir(dest) and not os.path.islink(dest)):
            _remove(dest)
            os.mkdir(dest)
        os.chmod(dest, mode | 0o700)
    elif member.isfile():
        _remove(dest)
        src = tar.extractfile(member)
        assert src is not None
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, src:
            shutil.copyfileobj(src, out, 1024 * 1024)
        os.chmod(dest, mode)
        os.utime(dest, (member.mtime, member.mtime))
    elif member.issym():
        _remove(dest)
        os.symlink(member.linkname, dest)
    elif member.islnk():
        target = resolver.host(resolver.resolve_parent(member.linkname))
        if not os.path.isfile(target) or os.path.islink(target):
            if on_skip:
                on_skip(f"{member.name}: hard link to missing {member.linkname}")
            return
        _remove(dest)
        os.link(target, dest)
    else:
        if on_skip:
            on_skip(f"{member.name}: {'device' if member.isdev() else 'special file'} skipped")
        return
    if owner is not None:
        os.lchown(dest, *owner)


def unpack(path: Path, dest: Path, *, owner: tuple[int, int] | None) -> ImageConfig:
    """Unpack the image at ``path`` (any layout :func:`open_layout` reads) into the empty ``dest``.

    Raises:
        InvalidSpec: the image cannot be read.
    """
    layout = open_layout(path)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for name in layout.layers:
            with layout.source.open(name) as fh:
                apply_layer(fh, dest, owner=owner)
        if owner is not None:
            os.lchown(dest, *owner)
        os.chmod(dest, 0o755)
        return layout.config()
    finally:
        layout.close()


def is_layout(path: Path) -> bool:
    """True for a path :func:`open_layout` can read (checked cheaply: no layer is opened)."""
    if path.is_dir():
        return (path / "manifest.json").is_file() or (path / "index.json").is_file()
    if path.is_file() and tarfile.is_tarfile(path):
        return True
    return False
