"""The host's Python inside an image that has none (or one of another glibc): the execution server's way in.

The host's system directories and this interpreter are bound read-only under :data:`HOST_INSIDE`,
and the server is started through the host's own dynamic loader with the host's library
directories (``ld.so --library-path ... python``), so nothing of the image's libc is used and the
image needs no Python. The path is passed on the loader's command line, not in
``LD_LIBRARY_PATH``, so the processes the server starts (the agent's bash) see only the image.
"""

from __future__ import annotations

import glob
import os
import struct
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache

#: where host directories appear inside image sandboxes.
HOST_INSIDE = "/.farm/host"
_PT_INTERP = 3


def elf_interpreter(path: str) -> str:
    """The dynamic loader a 64-bit little-endian ELF executable names (PT_INTERP).

    Raises:
        ValueError: not such an ELF file, or a static one.
    """
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        phoff = struct.unpack_from("<Q", head, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            ph = fh.read(phentsize)
            if struct.unpack_from("<I", ph, 0)[0] == _PT_INTERP:
                offset, size = struct.unpack_from("<Q", ph, 0x08)[0], struct.unpack_from("<Q", ph, 0x20)[0]
                fh.seek(offset)
                return fh.read(size).rstrip(b"\0").decode()
    raise ValueError(f"{path} names no dynamic loader (a static executable?)")


def inside(host_path: str) -> str:
    """Where a host path appears inside an image sandbox."""
    return HOST_INSIDE + os.path.realpath(host_path)


@dataclass(frozen=True)
class HostPython:
    """How to run the host's interpreter (and other host binaries) inside an image sandbox."""

    #: host directories to bind read-only at ``inside(d)``.
    binds: tuple[str, ...]
    loader: str
    library_path: str
    python: str
    #: the environment the interpreter needs (PYTHONHOME); never given to the agent's commands.
    env: tuple[tuple[str, str], ...]

    def argv(self, program: str) -> list[str]:
        """Run a host program (a path inside the sandbox) with the host's loader and libraries."""
        return [self.loader, "--library-path", self.library_path, program]


@cache
def host_python(system_dirs: tuple[str, ...], python_dirs: tuple[str, ...]) -> HostPython:
    """Raises:
    ValueError: the interpreter is not a dynamically linked 64-bit ELF (no loader to borrow).
    """
    executable = os.path.realpath(sys.executable)
    loader = os.path.realpath(elf_interpreter(executable))
    lib_dirs = [sysconfig.get_config_var("LIBDIR") or "", os.path.dirname(loader)]
    for pattern in ("/lib/*-linux-gnu", "/usr/lib/*-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        lib_dirs += sorted(glob.glob(pattern))
    real_dirs = [os.path.realpath(d) for d in lib_dirs if d and os.path.isdir(d)]
    binds = [os.path.realpath(d) for d in (*system_dirs, *python_dirs) if os.path.isdir(d)]
    binds = sorted({d for d in binds if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in binds)})
    return HostPython(
        binds=tuple(binds),
        loader=inside(loader),
        library_path=":".join(dict.fromkeys(inside(d) for d in real_dirs)),
        python=inside(executable),
        env=(("PYTHONHOME", inside(sys.base_prefix)),),
    )
