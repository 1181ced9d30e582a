"""Reading a bundle as every loader does: the manifest against its schema and the load checks,
then each kernel's file under the bundle's root (no links, no special files, bounded sizes).
The runtime, show, diff, merge and cache import all read bundles through here."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Iterable

from topkgen.policy import dispatch_table
from topkgen.manifest import checks as manifest_checks
from topkgen.manifest.params import OUTPUT_FLAGS
from topkgen.common import reader
from topkgen.common.errors import InputError
from topkgen.common.files import file_kind, read_to_limit
from topkgen.policy import Policy
from topkgen.common.schema import SchemaViolation, format_path, load_schema, validate

MANIFEST = "manifest.json"
SCHEMA_VERSION = 7
SCHEMAS = {1: "manifest-1.schema.json", 2: "manifest-2.schema.json", 3: "manifest-3.schema.json",
           4: "manifest-4.schema.json", 5: "manifest-5.schema.json", 6: "manifest-6.schema.json",
           7: "manifest.schema.json"}
# How a loader serves the request options (schema 4's `options`, the kernels' `flags` since
# schema 5; the schema words each). The bits are topkgen.manifest.params.OUTPUT_FLAGS.
MANIFEST_OPTIONS = {"unsorted": "kernel_flag", "index_dtypes": ["int64", "int32"], "int32_indices": "kernel_flag",
                    "flags": dict(OUTPUT_FLAGS)}
MAX_MANIFEST_BYTES = 64 << 20
MAX_FILE_BYTES = 64 << 20  # a cubin or a JIT source


class ManifestError(InputError, ValueError):
    """A manifest or bundle that cannot be used; the message names the file and the key."""



def load_manifest(path: str | Path, *, versions: Iterable[int] = (SCHEMA_VERSION,)) -> tuple[dict, Path]:
    """Read a manifest (a file or a bundle directory), validate it against its schema and,
    for the current schema, make every load check but the files'. Returns it and the bundle
    root that its paths are relative to. Only `diff` asks for older versions too."""
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError:  # a name too long to look up, say: then it names no directory (loaders/cpp reads it so)
        is_dir = False
    file = path / MANIFEST if is_dir else path
    try:
        raw = read_bundle_file(file.parent, file.name, MAX_MANIFEST_BYTES)
    except OSError as err:
        raise ManifestError(f"{file}: cannot read manifest: {err.strerror}") from None
    except ValueError as err:  # a NUL byte in the path
        raise ManifestError(f"{reader.printable(str(file))}: cannot read manifest: {err}") from None
    try:
        doc = reader.parse_json(reader.decode(raw, str(file)), str(file))
    except reader.ReadError as err:
        raise ManifestError(str(err)) from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if type(version) is not int or version not in versions:  # neither 3.0 nor true is 3 (or 1)
        raise ManifestError(f"{file}: {version_problem(version)}")
    try:
        validate(doc, load_schema(SCHEMAS[version]))
    except SchemaViolation as err:
        raise ManifestError(f"{file}: {format_path(err.path)}: {err.message}") from None
    if version == SCHEMA_VERSION:
        try:
            manifest_checks.check_manifest(doc)
        except dispatch_table.FieldError as err:
            raise ManifestError(f"{file}: {err}") from None
    else:  # an older schema (diff reads it): names are identities, a second entry would be silently lost
        for key, ident in (("kernels", "name"), ("jit_only", "rule")):
            seen: set[str] = set()
            for i, entry in enumerate(doc[key]):
                value = json.dumps(entry[ident], sort_keys=True)
                if value in seen:
                    raise ManifestError(f"{file}: {key}[{i}]: duplicate {ident} {value}")
                seen.add(value)
    return doc, file.parent


def version_problem(version: object) -> str:
    """Why a manifest's schema_version cannot be served (the C++ loader says the same)."""
    if type(version) is int and version == 1:
        return "schema_version: 1 has no dispatch table; rebuild the bundle (topkgen build)"
    if type(version) is int and version == 2:
        return "schema_version: 2 has no batch size in its dispatch table; rebuild the bundle (topkgen build)"
    if type(version) is int and version == 3:
        return ("schema_version: 3 stops k at 1024 and has no options (sorted, index_dtype); rebuild the bundle "
                "(topkgen build)")
    if type(version) is int and version == 4:
        return ("schema_version: 4 has no output flags, ragged-batch parameters, split_rules or load_order (its "
                "kernels always sort, write int64 indices and read dense rows; a split for the GPU's SM count, which "
                "binary serves a GPU); rebuild the bundle (topkgen build)")
    if type(version) is int and version == 5:
        return ("schema_version: 5 launches every radix kernel with all of its dynamic shared memory and has no "
                "shared_bytes parameter (its kernels size nothing to the row); rebuild the bundle (topkgen build)")
    if type(version) is int and version == 6:
        return ("schema_version: 6 has no tickets or merged_* parameters (a split always takes two launches); "
                "rebuild the bundle (topkgen build)")
    return f"schema_version: {json.dumps(version)} is not supported (this topkgen reads version {SCHEMA_VERSION})"


def read_files(root: Path, manifest: dict, archs: Iterable[str] | None = None) -> dict[str, bytes]:
    """The files (cubins, JIT sources) of the kernels of `archs` (all when None) by kernel
    name, each checked as every loader checks it at load: sha256, and a cubin's ELF machine,
    SM and symbol. Paths were checked by load_manifest, and read_bundle_file follows no link:
    nothing read is outside the bundle."""
    label = root / MANIFEST
    wanted = None if archs is None else set(archs)
    files: dict[str, bytes] = {}
    for entry in manifest_checks.entries(manifest):
        if wanted is not None and entry.record["arch"] not in wanted:
            continue
        key = "cubin" if entry.aot else "source"
        try:
            data = read_bundle_file(root, entry.path, MAX_FILE_BYTES)
        except OSError as err:
            raise ManifestError(f"{label}: {entry.field}.{key}: cannot read {entry.path}: {err.strerror}") from None
        try:
            manifest_checks.check_file(entry, data)
        except dispatch_table.FieldError as err:
            raise ManifestError(f"{label}: {err}") from None
        files[entry.record["name"]] = data
        ptx = entry.record.get("ptx")
        if ptx is not None:  # schema 5: PTX beside the cubin, checked as any file (path, sha256)
            if ptx["path"] != f"{entry.record['arch']}/{entry.record['name']}.ptx":
                raise ManifestError(f"{label}: {entry.field}.ptx.path: '{ptx['path']}' must be "
                                    f"'{entry.record['arch']}/{entry.record['name']}.ptx'")
            try:
                text = read_bundle_file(root, ptx["path"], MAX_FILE_BYTES)
            except OSError as err:
                raise ManifestError(f"{label}: {entry.field}.ptx: cannot read {ptx['path']}: {err.strerror}") from None
            if hashlib.sha256(text).hexdigest() != ptx["sha256"]:
                raise ManifestError(f"{label}: {entry.field}.ptx.sha256: {ptx['path']} does not match its sha256 in "
                                    f"the manifest")
            files[f"{entry.record['name']}.ptx"] = text
    return files


def read_bundle_file(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of the regular file `rel` ("sm_90/x.cubin") under the directory `root`
    (which may be reached through a link), reached through directories only and read no
    further than `limit` bytes. A bundle holds no symbolic links (one could lead out of it),
    FIFOs (which block), devices or sockets: any of them on the way is refused with an
    OSError whose strerror says what it is, as is a larger file (loaders/cpp says the same)."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            what = "it" if last else "/".join(parts[:i + 1])
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise _refusal(f"{what} is a symbolic link; a bundle holds none")
            if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                raise _refusal(f"{what} is {file_kind(mode)}, not {'a regular file' if last else 'a directory'}")
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            fd, parent = os.open(name, flags, dir_fd=fd), fd
            os.close(parent)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced since the lstat
            raise _refusal(f"it is {file_kind(mode)}, not a regular file")
        data = read_to_limit(fd, limit)
        if data is None:
            raise _refusal(f"it is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def _refusal(reason: str) -> OSError:
    err = OSError(reason)
    err.strerror = reason
    return err


def manifest_policy(manifest: dict, label: str) -> Policy:
    """The policy a bundle was built from, loaded by the same code as any policy file."""
    from topkgen.policy import PolicyError, loads

    raw = manifest["policy"]["text"].encode("utf-8", "surrogatepass")  # the reader refused lone surrogates
    if hashlib.sha256(raw).hexdigest() != manifest["policy"]["sha256"]:
        raise ManifestError(f"{label}: policy.text does not match policy.sha256")
    try:
        return loads(raw, source=f"{label}:policy")
    except PolicyError as err:
        raise ManifestError(str(err)) from None
