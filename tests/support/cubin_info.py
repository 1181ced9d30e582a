"""What a cubin tells the CUDA driver about one kernel, read without CUDA tools: the
parameter layout (EIATTR_KPARAM_INFO records of its .nv.info.<kernel> section), the
parameter block size and the launch bounds. The driver copies
each launch argument by these sizes, so a launcher that packs another size fails or, worse,
passes garbage; these records are what a test holds every launcher against without a GPU.

Layout of .nv.info.<kernel>: records of (format u8, attribute u8, then a u16 value, or for
EIFMT_SVAL a u16 size and that many bytes). KPARAM_INFO's value: u32 index, u16 ordinal,
u16 offset in the parameter block, u32 flags whose bits 18-31 hold the size in bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SHT_NOBITS = 8
EIFMT_SVAL = 4
EIATTR_MAX_THREADS = 0x05       # __launch_bounds__'s maxThreadsPerBlock (x, y, z)
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19  # bytes of the parameter block


@dataclass(frozen=True)
class Param:
    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class KernelInfo:
    params: tuple[Param, ...]     # by ordinal
    param_bytes: int | None
    max_threads: tuple[int, int, int] | None


def sections(data: bytes) -> dict[str, tuple[bytes, int]]:
    """Section name -> (contents, size) of a little-endian ELF64 file (a cubin); a section
    without bytes in the file (SHT_NOBITS: shared memory) has empty contents and its size."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name_off, sh_type, _flags, _addr, offset, size, *_ in headers:
        start = names_at + name_off
        name = data[start:data.index(b"\0", start)].decode()
        out[name] = (b"" if sh_type == SHT_NOBITS else data[offset:offset + size], size)
    return out


def _records(blob: bytes):
    at = 0
    while at + 4 <= len(blob):
        fmt, attr = blob[at], blob[at + 1]
        if fmt == EIFMT_SVAL:
            size = struct.unpack_from("<H", blob, at + 2)[0]
            yield attr, blob[at + 4:at + 4 + size]
            at += 4 + size
        else:  # EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL: the value fits the record's last two bytes
            yield attr, blob[at + 2:at + 4]
            at += 4


def kernel_info(cubin: bytes, symbol: str) -> KernelInfo:
    found = sections(cubin)
    if f".nv.info.{symbol}" not in found:
        raise KeyError(f"the cubin has no kernel {symbol!r}")
    info = found[f".nv.info.{symbol}"][0]
    params, param_bytes, max_threads = [], None, None
    for attr, value in _records(info):
        if attr == EIATTR_KPARAM_INFO:
            _index, ordinal, offset, flags = struct.unpack_from("<IHHI", value)
            params.append(Param(ordinal, offset, (flags >> 18) & 0x3FFF))
        elif attr == EIATTR_CBANK_PARAM_SIZE:
            param_bytes = struct.unpack_from("<H", value)[0]
        elif attr == EIATTR_MAX_THREADS:
            max_threads = struct.unpack_from("<III", value)
    return KernelInfo(tuple(sorted(params, key=lambda p: p.ordinal)), param_bytes, max_threads)
