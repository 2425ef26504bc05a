"""The layer unpacker: whiteouts, opaque directories, symlinks resolved inside the new root, and the
three image layouts (docker save, OCI layout, OCI archive) read to the same tree."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.errors import InvalidSpec
from farm.sandbox.image import ImageRef, context_digest, image_key, load_image
from farm.sandbox.unpack import apply_layer, open_layout, unpack
from farm.testing.images import host_image


def layer(*entries: tuple[str, str, str | bytes]) -> io.BytesIO:
    """Entries of (kind, name, data): kind f (file), d (dir), l (symlink to data), h (hard link to data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, data in entries:
            info = tarfile.TarInfo(name)
            if kind == "f":
                raw = data.encode() if isinstance(data, str) else data
                info.size, info.mode = len(raw), 0o6755 if name.endswith("suid") else 0o644
                tar.addfile(info, io.BytesIO(raw))
                continue
            info.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE, "c": tarfile.CHRTYPE}[kind]
            info.mode = 0o755
            info.linkname = str(data)
            tar.addfile(info)
    buf.seek(0)
    return buf


def test_whiteout_removes_a_lower_file(tmp_path: Path) -> None:
    apply_layer(layer(("d", "etc", ""), ("f", "etc/a", "1"), ("f", "etc/b", "2")), tmp_path, owner=None)
    apply_layer(layer(("f", "etc/.wh.a", "")), tmp_path, owner=None)
    assert sorted(os.listdir(tmp_path / "etc")) == ["b"]


def test_opaque_directory_keeps_only_its_own_layer(tmp_path: Path) -> None:
    apply_layer(layer(("d", "d", ""), ("f", "d/old", "1")), tmp_path, owner=None)
    # The marker comes after a new file of the same layer: that file stays.
    apply_layer(layer(("f", "d/new", "2"), ("f", "d/.wh..wh..opq", "")), tmp_path, owner=None)
    assert sorted(os.listdir(tmp_path / "d")) == ["new"]


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    # A layer points a directory at the host's path; the next writes through it.
    apply_layer(layer(("l", "escape", str(outside)), ("l", "up", "../../..")), root, owner=None)
    apply_layer(layer(("f", "escape/x", "1"), ("f", "up/y", "2")), root, owner=None)
    assert list(outside.iterdir()) == []
    assert (root / outside.relative_to("/") / "x").read_text() == "1"
    assert (root / "y").read_text() == "2"


def test_setuid_bits_and_devices_are_dropped(tmp_path: Path) -> None:
    skipped: list[str] = []
    apply_layer(layer(("f", "bin-suid", "x"), ("c", "dev-null", "")), tmp_path, owner=None, on_skip=skipped.append)
    assert (tmp_path / "bin-suid").stat().st_mode & 0o7777 == 0o755
    assert not (tmp_path / "dev-null").exists() and skipped


def test_hard_links_stay_inside(tmp_path: Path) -> None:
    apply_layer(layer(("f", "a", "1"), ("h", "b", "a"), ("h", "c", "/etc/passwd")), tmp_path, owner=None)
    assert (tmp_path / "b").read_text() == "1"
    assert not (tmp_path / "c").exists()


def test_three_layouts_unpack_to_the_same_tree(tmp_path: Path) -> None:
    files = {"/app/x.txt": "x\n"}
    archive = host_image(tmp_path / "img.tar", files=files, workdir="/app", programs=("bash",))
    layout = host_image(tmp_path / "oci", files=files, workdir="/app", programs=("bash",), oci=True)
    oci_archive = tmp_path / "oci.tar"
    with tarfile.open(oci_archive, "w") as tar:
        for p in sorted(layout.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(layout)), recursive=False)
    trees = []
    for n, src in enumerate((archive, layout, oci_archive)):
        config = unpack(src, tmp_path / f"root{n}", owner=None)
        assert config.workdir == "/app" and "PATH" in config.env
        trees.append(sorted(str(p.relative_to(tmp_path / f"root{n}")) for p in (tmp_path / f"root{n}").rglob("*")))
        assert (tmp_path / f"root{n}" / "app" / "x.txt").read_text() == "x\n"
        assert not (tmp_path / f"root{n}" / "etc" / "remove-me").exists()  # the second layer's whiteout
    assert trees[0] == trees[1] == trees[2]
    with contextlib.closing(open_layout(archive)) as a, contextlib.closing(open_layout(layout)) as b:
        assert a.digest == b.digest  # the same config blob


def test_image_is_unpacked_once_and_keyed_by_content(tmp_path: Path) -> None:
    archive = host_image(tmp_path / "img.tar", programs=("bash",))
    first = load_image(str(archive), cache=tmp_path / "cache", owner=None)
    again = load_image(f"docker-archive:{archive}", cache=tmp_path / "cache", owner=None)
    assert first.unpacked and not again.unpacked and first.key == again.key
    other = host_image(tmp_path / "other.tar", files={"/a": "changed"}, programs=("bash",))
    assert image_key(ImageRef.parse(str(other)), None) != first.key


def test_dockerfile_key_is_its_context(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM base\nCOPY a /a\n")
    (tmp_path / "a").write_text("1")
    ref = ImageRef.parse(f"dockerfile:{tmp_path}")
    assert ref.dockerfile == tmp_path / "Dockerfile"
    before = context_digest(tmp_path, tmp_path / "Dockerfile")
    (tmp_path / "a").write_text("2")
    assert context_digest(tmp_path, tmp_path / "Dockerfile") != before


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: str(p / "missing.tar"), "does not exist"),
        (lambda p: (p / "empty").mkdir() or str(p / "empty"), "neither an image archive or layout nor a Dockerfile"),
        (lambda p: (p / "n.tar").write_bytes(b"not a tar") and str(p / "n.tar"), "neither"),
    ],
)
def test_bad_image_references_say_what_to_fix(tmp_path: Path, make: Callable[[Path], str], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        ImageRef.parse(make(tmp_path))


def test_tar_without_manifest_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("hello")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(InvalidSpec, match="neither a docker-save archive"):
        open_layout(bad)
