"""The load checks of manifest schema 3 that a JSON schema cannot express, made by every
loader before it serves anything (loaders/cpp makes the same checks, in the same order,
with the same messages; tests/loaders/test_cpp_loader.py holds the two to that).

Order: kernel entries (arch, unique name per arch, file path, parameters), then the
dispatch section (one table per arch; per list in sorted order, the tiling, then what each
row names and how it splits), then, in `check_file`, each file's sha256 and, for cubins,
the ELF machine, the SM and the entry's symbol.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Iterator

from topkgen.policy.dispatch_table import FieldError, IndexBudget, ListIndex
from topkgen.manifest.params import C_TYPES, PARAM_TYPES

# The parameters a kernel must take to run a split (topkgen.policy.split).
SPLIT_PARAMS = ("x_indices", "chunk", "row_stride")
GRID_MAX = 2**31 - 1  # CTAs of one launch (grid.x): a split's stage 1 runs rows x chunks

EM_CUDA = 190
SHT_SYMTAB, SHT_NOBITS, STT_FUNC, SHN_UNDEF = 2, 8, 2, 0
ELF64_SHDR, ELF64_SYM = 64, 24  # bytes of a section header, of a symbol
# The most of an ELF file a loader walks (loaders/cpp has the same bounds and messages): a
# cubin holds about 20 sections and 30 symbols, in one symbol table (the gABI allows one), and
# its .nv.info a few hundred records. A forged one of 65535 section headers, each naming one
# 64 MiB symbol table, had every loader walk 10^11 symbols.
MAX_ELF_SECTIONS, MAX_ELF_SYMBOLS, MAX_NV_INFO_BYTES = 1024, 1 << 16, 1 << 20


@dataclass(frozen=True)
class Entry:
    """A kernel entry and where it sits in the manifest."""

    field: str   # kernels[3] or jit_kernels[0]
    aot: bool
    record: dict[str, Any]

    @property
    def path(self) -> str:
        return self.record["cubin"] if self.aot else self.record["source"]


def entries(doc: dict) -> Iterator[Entry]:
    for i, record in enumerate(doc["kernels"]):
        yield Entry(f"kernels[{i}]", True, record)
    for i, record in enumerate(doc["jit_kernels"]):
        yield Entry(f"jit_kernels[{i}]", False, record)


def check_manifest(doc: dict) -> dict[tuple[str, str], Entry]:
    """All checks but the files'; returns the entries by (arch, name)."""
    by_name = check_entries(doc)
    check_dispatch(doc, by_name)
    check_serving(doc)
    return by_name


def check_serving(doc: dict) -> None:
    """Schema 5's split_rules and load_order speak of the bundle's archs, each once (loaders/cpp
    makes the same checks in this order, in these words)."""
    archs = list(doc["archs"])
    order = doc["load_order"]
    for field, keys in (("split_rules", list(doc["split_rules"])), ("load_order.shared_needed", list(order["shared_needed"])),
                        ("load_order.targets", list(order["targets"]))):
        if sorted(keys) != sorted(archs):
            raise FieldError(field, f"has {', '.join(sorted(keys)) or 'no arch'}, not the bundle's archs "
                                    f"({', '.join(sorted(archs)) or 'none'})")
    for arch in sorted(archs):
        if order["targets"][arch] not in (arch, f"{arch}a"):
            raise FieldError(f"load_order.targets.{arch}", f"'{order['targets'][arch]}' must be {arch} or {arch}a")
    for i, arch in enumerate(order["ptx_archs"]):
        if arch not in archs:
            raise FieldError(f"load_order.ptx_archs[{i}]", f"{arch} is not one of the bundle's archs")


def check_entries(doc: dict) -> dict[tuple[str, str], Entry]:
    archs = set(doc["archs"])  # not the list: a forged manifest of many archs and kernels made this quadratic
    by_name: dict[tuple[str, str], Entry] = {}
    for entry in entries(doc):
        name, arch = entry.record["name"], entry.record["arch"]
        if arch not in archs:
            raise FieldError(f"{entry.field}.arch", f"{arch} is not one of the bundle's archs")
        other = by_name.setdefault((arch, name), entry)
        if other is not entry:
            raise FieldError(f"{entry.field}.name", f"duplicate kernel name '{name}' for {arch} (also {other.field})")
        expected = f"{arch}/{name}.cubin" if entry.aot else f"jit/{arch}/{name}.cu"
        if entry.path != expected:
            key = "cubin" if entry.aot else "source"
            raise FieldError(f"{entry.field}.{key}", f"'{entry.path}' must be '{expected}'")
        for j, param in enumerate(entry.record["params"]):
            ctype = PARAM_TYPES.get(param["name"])
            if ctype is None:
                raise FieldError(f"{entry.field}.params[{j}].name", f"'{param['name']}' is not a parameter a loader "
                                                                    f"can pass (known: {', '.join(PARAM_TYPES)})")
            ctype = ctype.format(t=C_TYPES[entry.record["dtype"]])
            if param["ctype"] != ctype:
                raise FieldError(f"{entry.field}.params[{j}].ctype", f"'{param['ctype']}' must be '{ctype}'")
    return by_name


def check_dispatch(doc: dict, by_name: dict[tuple[str, str], Entry]) -> None:
    dispatch, archs = doc["dispatch"], set(doc["archs"])
    partial = "shard" in doc  # a part of a sharded build: other parts hold some AOT kernels
    for arch in doc["archs"]:
        if arch not in dispatch:
            raise FieldError("dispatch", f"no table for {arch}")
    budget = IndexBudget()  # one for all the lists: a forged manifest could hold many lists of many rows
    for arch in sorted(dispatch):
        if arch not in archs:
            raise FieldError(f"dispatch.{arch}", "not one of the bundle's archs")
        for dtype in sorted(dispatch[arch]):
            for mode in sorted(dispatch[arch][dtype]):
                path, rows = f"dispatch.{arch}.{dtype}.{mode}", dispatch[arch][dtype][mode]
                ListIndex(rows, path, budget)
                for i, row in enumerate(rows):
                    _check_row(f"{path}[{i}]", row, arch, dtype, mode, by_name, partial)


def _check_row(path: str, row: dict, arch: str, dtype: str, mode: str,
               by_name: dict[tuple[str, str], Entry], partial: bool = False) -> None:
    entry = by_name.get((arch, row["kernel"]))
    if entry is None and partial and row["source"] == "aot":
        return  # held by another part; `topkgen merge` checks the assembled bundle
    if entry is None:
        raise FieldError(f"{path}.kernel", f"no kernel '{row['kernel']}' for {arch}")
    if entry.aot != (row["source"] == "aot"):
        raise FieldError(f"{path}.source", f"'{row['source']}' but {row['kernel']} is {entry.field}")
    _check_fits(f"{path}.kernel", row, entry.record, dtype, mode)
    _check_split(f"{path}.chunks", row, row["chunks"], entry.record)
    fallback = row["aot_fallback"]
    if (fallback is None) != (row["aot_chunks"] is None):
        raise FieldError(f"{path}.aot_chunks", "must be null exactly when aot_fallback is")
    if fallback is None:
        return
    if row["source"] == "aot" and fallback != row["kernel"]:
        raise FieldError(f"{path}.aot_fallback", f"must be {row['kernel']}, the row's AOT kernel")
    if row["source"] == "aot" and row["aot_chunks"] != row["chunks"]:
        raise FieldError(f"{path}.aot_chunks", f"must be {row['chunks']}, the row's chunks")
    entry = by_name.get((arch, fallback))
    if entry is None and partial:
        return  # held by another part
    if entry is None or not entry.aot:
        raise FieldError(f"{path}.aot_fallback", f"no AOT kernel '{fallback}' for {arch}")
    _check_fits(f"{path}.aot_fallback", row, entry.record, dtype, mode)
    _check_split(f"{path}.aot_chunks", row, row["aot_chunks"], entry.record)


def _check_split(path: str, row: dict, chunks: int, kernel: dict) -> None:
    """A kernel that runs the row's requests in chunks must take them, and every chunk and
    merge of the row must fit it: chunks of at least k elements, within its n window."""
    if chunks == 1:
        return
    name, (k_lo, k_hi), (n_lo, _) = kernel["name"], row["k"], row["n"]
    names = [p["name"] for p in kernel["params"]]
    if not all(p in names for p in SPLIT_PARAMS):
        raise FieldError(path, f"{name} cannot run a split: it does not take {', '.join(SPLIT_PARAMS)}")
    first = max(n_lo, k_hi)
    if first // chunks < k_hi:
        raise FieldError(path, f"{chunks} chunks of rows from {first} hold fewer than k={k_hi} elements")
    if first // chunks < chunks:  # the kernel finds its chunk as n / chunk: that is `chunks` only when chunk >= chunks
        raise FieldError(path, f"{chunks} chunks of rows from {first} are shorter than {chunks} elements: "
                               f"n / chunk would not be {chunks}")
    rows_hi = row["rows"][1]
    if rows_hi > GRID_MAX // chunks:
        raise FieldError(path, f"{chunks} chunks of batches up to {rows_hi} rows are more CTAs than a grid holds "
                               f"({GRID_MAX})")
    lo, hi, window = min(max(n_lo, k_lo) // chunks, chunks * k_lo), chunks * k_hi, kernel["n_window"]
    if not (window["min"] <= lo and hi <= window["max"]):
        raise FieldError(path, f"{name} serves n {window['min']}..{window['max']}, not its chunks and merges "
                               f"{lo}..{hi}")


def _check_fits(path: str, row: dict, kernel: dict, dtype: str, mode: str) -> None:
    """The kernel a row names must be able to serve every request of the row."""
    name, (k_lo, k_hi), (n_lo, n_hi) = kernel["name"], row["k"], row["n"]
    if kernel["dtype"] != dtype:
        raise FieldError(path, f"{name} is a {kernel['dtype']} kernel, not {dtype}")
    if mode not in kernel["serves"]:
        raise FieldError(path, f"{name} does not serve {mode}")
    if not (kernel["k_min"] <= k_lo and k_hi <= kernel["k"]):
        raise FieldError(path, f"{name} serves k {kernel['k_min']}..{kernel['k']}, not {k_lo}..{k_hi}")
    lo = max(n_lo, k_lo)  # below the diagonal nothing is asked
    window = kernel["n_window"]
    if lo <= n_hi and not (window["min"] <= lo and n_hi <= window["max"]):
        raise FieldError(path, f"{name} serves n {window['min']}..{window['max']}, not {lo}..{n_hi}")


def elf_sm(data: bytes) -> int | None:
    """The SM number a CUDA ELF file names (e_flags, whose layout depends on the ABI
    version in e_ident[8]); None when the file is not an ELF file for EM_CUDA."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or struct.unpack_from("<H", data, 18)[0] != EM_CUDA:
        return None
    flags = struct.unpack_from("<I", data, 48)[0]
    return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


def _section_headers(data: bytes) -> tuple[list[tuple], int] | None:
    """A little-endian ELF64 file's section headers (Elf64_Shdr's ten fields each) and the
    index of its section names' header (e_shstrndx); None when the file is no such file, the
    headers lie outside it or there are more than a loader walks (elf_bounds_problem). The
    sections themselves are left to the caller to check."""
    size = len(data)
    if size < 64 or data[4] != 2 or data[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < ELF64_SHDR or shoff > size or shnum > (size - shoff) // shentsize or shnum > MAX_ELF_SECTIONS:
        return None
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    symtabs = [h for h in headers if h[1] == SHT_SYMTAB]
    if len(symtabs) > 1 or any(h[5] > MAX_ELF_SYMBOLS * ELF64_SYM for h in symtabs):
        return None
    return headers, shstrndx


def elf_bounds_problem(data: bytes) -> str | None:
    """Why a loader does not walk this ELF file's sections (more section headers, symbol
    tables or symbols than any cubin holds: MAX_ELF_SECTIONS, one table, MAX_ELF_SYMBOLS),
    or None. Read from the ELF header and the section headers alone, each bound checked
    before anything is walked, so that a forged file is refused at once."""
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        return None  # not an ELF64 file: the caller's checks say so
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shnum > MAX_ELF_SECTIONS:
        return f"it has {shnum} section headers (a loader reads at most {MAX_ELF_SECTIONS})"
    if shentsize < ELF64_SHDR or shoff > len(data) or shnum > (len(data) - shoff) // shentsize:
        return None  # headers outside the file: the caller's checks say so
    tables = symbols = 0
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        if sh_type == SHT_SYMTAB:
            tables += 1
            symbols = max(symbols, struct.unpack_from("<Q", data, shoff + i * shentsize + 32)[0] // ELF64_SYM)
    if tables > 1:
        return f"it has {tables} symbol tables (a loader reads one)"
    if symbols > MAX_ELF_SYMBOLS:
        return f"its symbol table holds {symbols} symbols (a loader reads at most {MAX_ELF_SYMBOLS})"
    return None


def elf_defines_function(data: bytes, symbol: str) -> bool | None:
    """Whether a little-endian ELF64 file's symbol tables (SHT_SYMTAB) define `symbol` as a
    function (STT_FUNC, in a section); None when the file is not such an ELF file or a table
    lies outside it. Every offset is checked before it is read (the file may be forged)."""
    found = _section_headers(data)
    if found is None:
        return None
    headers, size = found[0], len(data)
    shnum = len(headers)
    name = symbol.encode() + b"\0"
    for _, sh_type, _, _, offset, length, link, _, _, entsize in headers:
        if sh_type != SHT_SYMTAB:
            continue
        if link >= shnum or entsize != ELF64_SYM or offset > size or length > size - offset:
            return None
        str_offset, str_length = headers[link][4], headers[link][5]
        if str_offset > size or str_length > size - str_offset:
            return None
        strtab = data[str_offset:str_offset + str_length]
        for at in range(offset, offset + length - ELF64_SYM + 1, ELF64_SYM):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, at)
            if st_info & 0xF == STT_FUNC and st_shndx != SHN_UNDEF and strtab[st_name:st_name + len(name)] == name:
                return True
    return False


# .nv.info records (format u8, attribute u8, then u16 size and that many bytes for EIFMT_SVAL)
# that ptxas writes per function as (u32 symbol index, u32 value): what `ptxas -v` reports.
EIFMT_SVAL = 4
CUBIN_COUNTS = {0x2F: "registers", 0x11: "stack_bytes"}  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE


def elf_function_counts(data: bytes, symbol: str) -> dict[str, int] | None:
    """The registers and stack frame bytes a cubin's .nv.info section records for the
    function `symbol` (the part of a manifest's `resources` that a cubin can prove; spills,
    shared memory and barriers it records in no form as plain), or None when the file is no
    little-endian ELF64 file with a symbol table and a .nv.info section that can be read.
    Every offset is checked before it is read (the file may be forged)."""
    found = _section_headers(data)
    if found is None:
        return None
    (headers, shstrndx), size = found, len(data)
    shnum = len(headers)
    if shstrndx >= shnum or any(offset > size or length > size - offset
                                for _, kind, _, _, offset, length, *_ in headers if kind != SHT_NOBITS):
        return None  # no section names, or a section (not SHT_NOBITS) that lies outside the file

    def contents(header: tuple) -> bytes:
        return data[header[4]:header[4] + header[5]]

    names = contents(headers[shstrndx])
    info = next((h for h in headers if names[h[0]:h[0] + 9] == b".nv.info\0"), None)
    symtab = next((h for h in headers if h[1] == SHT_SYMTAB), None)
    if info is None or symtab is None or symtab[6] >= shnum or symtab[9] != ELF64_SYM or info[5] > MAX_NV_INFO_BYTES:
        return None
    strtab, table, wanted = contents(headers[symtab[6]]), contents(symtab), symbol.encode() + b"\0"
    index = next((i for i in range(len(table) // ELF64_SYM)
                  if strtab[struct.unpack_from("<I", table, i * ELF64_SYM)[0]:][:len(wanted)] == wanted), None)
    if index is None:
        return None
    counts, records, at = {}, contents(info), 0
    while at + 4 <= len(records):
        fmt, attr = records[at], records[at + 1]
        length = struct.unpack_from("<H", records, at + 2)[0] if fmt == EIFMT_SVAL else 0
        if attr in CUBIN_COUNTS and length == 8 and at + 12 <= len(records):
            function, value = struct.unpack_from("<II", records, at + 4)
            if function == index:
                counts[CUBIN_COUNTS[attr]] = value
        at += 4 + length
    return counts if len(counts) == len(CUBIN_COUNTS) else None


def check_file(entry: Entry, data: bytes) -> None:
    """A kernel's file as read from the bundle: its sha256 and, for a cubin, its machine, its
    SM and that it defines the entry's symbol (a cubin copied over another's, its sha256
    fixed, would otherwise be launched under the other kernel's name)."""
    record = entry.record
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise FieldError(f"{entry.field}.sha256", f"{entry.path} does not match its sha256 in the manifest")
    if not entry.aot:
        return
    sm = elf_sm(data)
    if sm is None:
        raise FieldError(f"{entry.field}.cubin", f"{entry.path} is not a CUDA ELF file")
    if f"sm_{sm}" != record["arch"]:
        raise FieldError(f"{entry.field}.cubin", f"{entry.path} is compiled for sm_{sm}, not {record['arch']}")
    too_big = elf_bounds_problem(data)
    if too_big is not None:
        raise FieldError(f"{entry.field}.cubin", f"{entry.path} is not a CUDA ELF file a loader reads: {too_big}")
    defined = elf_defines_function(data, record["symbol"])
    if defined is None:
        raise FieldError(f"{entry.field}.cubin", f"{entry.path} is not a CUDA ELF file: its symbol table cannot be read")
    if not defined:
        raise FieldError(f"{entry.field}.symbol", f"{entry.path} defines no function '{record['symbol']}'")
