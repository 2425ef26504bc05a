"""What an image sandbox's start costs: the image unpacked cold, then from the node's cache.

    python bench/image_start.py [--image PATH] [--runs N]

Measured in alternating rounds in one run (so load from other processes hits all alike), each
from ``create()`` to the end of a first command (``echo``):

- ``host``: the bwrap sandbox over the host's system directories (the floor: no image);
- ``image_cached``: the same sandbox over an image already unpacked on this node;
- ``image_cold``: the same with an empty image cache (the unpack is part of the start).

Also the unpack alone (``unpack_ms``) and the image's size. Without ``--image`` the image is one
built here from the host's bash and coreutils (``farm.testing.images``); ``--big`` adds this Python's
standard library to it (thousands of files). Needs root (overlayfs).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import emit  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.sandbox import SandboxSpec, create_sandbox  # noqa: E402
from farm.sandbox.image import load_image  # noqa: E402
from farm.sandbox.registry import remove_tree  # noqa: E402
from farm.testing.images import host_image  # noqa: E402


def _start_ms(settings: Settings, spec: SandboxSpec) -> float:
    started = time.monotonic()
    sandbox = create_sandbox(settings, spec, driver="bwrap")
    try:
        result = sandbox.run("echo ready")
        assert result.output == "ready\n", result
        return (time.monotonic() - started) * 1000
    finally:
        sandbox.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", type=Path, help="an image file (docker-save archive, OCI layout or archive)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--big", action="store_true", help="add this Python's standard library to the built image")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="farm-bench-image-") as tmp:
        root = Path(tmp)
        files: dict[str, bytes | str] = {"/app/data.txt": "x\n"}
        if args.big:  # a realistic size: thousands of files, tens of MiB
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            for p in stdlib.rglob("*"):
                if p.is_file() and not p.is_symlink() and "site-packages" not in p.parts:
                    files[f"/usr/lib/pystd/{p.relative_to(stdlib)}"] = p.read_bytes()
        image = args.image or host_image(root / "image.tar", files=files, workdir="/app")
        cache = root / "sb" / "images"
        settings = Settings(data_dir=root / "data", sandbox={"root_dir": root / "sb"})
        samples: dict[str, list[float]] = {"host": [], "image_cached": [], "image_cold": [], "unpack": []}
        spec = SandboxSpec(image=str(image), workdir="/app")
        for _ in range(args.runs):
            remove_tree(cache)
            started = time.monotonic()
            load_image(str(image), cache=cache, owner=(settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid))
            samples["unpack"].append((time.monotonic() - started) * 1000)
            remove_tree(cache)
            samples["image_cold"].append(_start_ms(settings, spec))
            samples["image_cached"].append(_start_ms(settings, spec))
            samples["host"].append(_start_ms(settings, SandboxSpec(workdir="/app")))
        path = Path(image)
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
        size_mb = size / 2**20
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"image: {image} ({size_mb:.1f} MiB), {args.runs} rounds, create -> first echo (median ms)")
    for name in ("host", "image_cached", "image_cold"):
        print(f"  {name:<13} {med[name]:8.1f} ms   x{med[name] / med['host']:.2f} of host")
    print(f"  unpack alone  {med['unpack']:8.1f} ms")
    emit(
        {
            "image_mb": round(size_mb, 1),
            "host_start_median_ms": round(med["host"], 1),
            "image_cached_start_median_ms": round(med["image_cached"], 1),
            "image_cold_start_median_ms": round(med["image_cold"], 1),
            "unpack_median_ms": round(med["unpack"], 1),
            "image_cached_over_host": round(med["image_cached"] / med["host"], 2),
            "image_cold_over_cached": round(med["image_cold"] / med["image_cached"], 2),
        }
    )


if __name__ == "__main__":
    main()
