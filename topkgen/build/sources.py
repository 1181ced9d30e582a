"""Where a policy and its templates come from: the installed topkgen, a directory, or a git
revision read through git (never the work tree), so that `topkgen diff` renders each side
from that side's own templates.

A revision costs one `git ls-tree` and one `git cat-file --batch`, whatever the number of
files: a process per file would make `diff HEAD~1 HEAD` slow.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

import jinja2

from topkgen.common import reader
from topkgen.common.files import file_kind
from topkgen.build import render, render_bounded
from topkgen.build.render_bounded import FilesLoader, RenderRefused
from topkgen.policy import KernelSpec

TEMPLATES_IN_REPO = "templates"
MAX_TEMPLATE_BYTES = 1 << 20  # a template file (the largest shipped is 30 KB)
MAX_TEMPLATE_FILES = 256      # files in a templates folder (4 are shipped)
MAX_TEMPLATES_BYTES = 8 << 20  # all of them together (the shipped ones: 40 KB)


class SourceError(ValueError):
    """A revision, path or template that cannot be read; the message names it."""


class _Renderer:
    """One Jinja environment per distinct set of template files, and the renders made
    with it: two sides with the same templates (most diffs) compile and render them once."""

    def __init__(self, files: dict[str, bytes], where: str) -> None:
        self.env = render.environment(FilesLoader(files, where))
        self.loads: dict[str, tuple[str, ...]] = {}
        self.sources: dict[KernelSpec, str] = {}

    def render(self, spec: KernelSpec) -> tuple[str, tuple[str, ...]]:
        name = render.template_name(spec)
        if name not in self.loads:
            self.loads[name] = render.loaded_templates(self.env, name)
        if spec not in self.sources:
            self.sources[spec] = render.render(spec, self.env)
        return self.sources[spec], self.loads[name]


_RENDERERS: dict[str, _Renderer] = {}


@dataclass
class Templates:
    """A set of template files and the renders made from them."""

    where: str                # how messages name the folder: "HEAD~1:templates/", "templates/"
    files: dict[str, bytes]   # name relative to the folder -> content
    # Not the installed templates (a revision's, a working tree's): rendered in a child process
    # with limits (render_bounded), never in this one; the same files as the installed ones are not.
    bounded: bool = False

    def __post_init__(self) -> None:
        # Git and the file system hand over names that are not UTF-8 with their bytes kept as
        # lone surrogates; Jinja names templates in text, so no include could reach such a file,
        # and it would break the renderer's key: refuse it by name, as a template's content is.
        for name in self.files:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise SourceError(f"{self.where}{display_name(name)}: the file name is not UTF-8 "
                                  f"(templates are named in UTF-8)") from None
        check_template_totals(self.where, [len(data) for data in self.files.values()])
        if self.bounded and self.files == installed_templates().files:
            self.bounded = False

    def digest(self, name: str) -> str | None:
        data = self.files.get(name)
        return None if data is None else hashlib.sha256(data).hexdigest()

    @cached_property
    def _renderer(self) -> _Renderer:
        key = hashlib.sha256(b"".join(hashlib.sha256(name.encode()).digest() + hashlib.sha256(data).digest()
                                      for name, data in sorted(self.files.items()))).hexdigest()
        return _RENDERERS.get(key) or _RENDERERS.setdefault(key, _Renderer(self.files, self.where))

    def prepare(self, specs: Iterable[KernelSpec]) -> None:
        """Render `specs` ahead of `render`, all in one bounded child when `bounded` (a child per
        kernel would cost a process each); nothing to do for the installed templates."""
        if not self.bounded:
            return
        renderer = self._renderer
        todo = [s for s in dict.fromkeys(specs) if s not in renderer.sources]
        try:
            done = render_bounded.render_all(self.files, self.where, todo)
        except RenderRefused as err:
            raise SourceError(str(err)) from None
        for spec, (source, loads) in done.items():
            renderer.sources[spec], renderer.loads[render.template_name(spec)] = source, loads

    def render(self, spec: KernelSpec) -> tuple[str, tuple[str, ...]]:
        """The kernel's source and the template files that made it."""
        renderer = self._renderer
        if self.bounded and spec not in renderer.sources:
            self.prepare([spec])
        try:
            return renderer.render(spec)
        except SourceError:
            raise
        except RenderRefused as err:
            raise SourceError(str(err)) from None
        except (jinja2.TemplateError, ValueError) as err:
            raise SourceError(render.template_problem(err, self.where, spec.name)) from None


def display_name(name: str) -> str:
    """A file name for a message: bytes that are not UTF-8 as `\\xff`, control and
    bidirectional characters escaped."""
    return reader.printable(name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def too_large(where: str, size: int, limit: int) -> SourceError:
    """A file refused from its size alone, never read."""
    return SourceError(f"{display_name(where)}: larger than {limit} bytes ({size}); not read")


def check_template_totals(where: str, sizes: list[int]) -> None:
    """A folder of templates holds at most MAX_TEMPLATE_FILES files and MAX_TEMPLATES_BYTES in
    all: checked from the sizes (git's listing, stat) before anything is read."""
    if len(sizes) > MAX_TEMPLATE_FILES:
        raise SourceError(f"{display_name(where)}: {len(sizes)} files, more than the {MAX_TEMPLATE_FILES} a "
                          f"templates folder may hold; not read")
    if sum(sizes) > MAX_TEMPLATES_BYTES:
        raise SourceError(f"{display_name(where)}: {sum(sizes)} bytes of files, more than the {MAX_TEMPLATES_BYTES} "
                          f"a templates folder may hold; not read")


def directory_templates(path: Path, where: str, *, bounded: bool = False) -> Templates:
    """The templates in a folder; `bounded`: not the installed ones (see Templates)."""
    files: dict[str, bytes] = {}
    try:
        found = _linked_out(path, where) if bounded else \
            [(file, file.stat().st_size) for file in sorted(path.rglob("*")) if file.is_file()]
        check_template_totals(where, [size for _, size in found])
        for file, size in found:
            name = file.relative_to(path).as_posix()
            if size > MAX_TEMPLATE_BYTES:
                raise too_large(f"{where}{name}", size, MAX_TEMPLATE_BYTES)
            files[name] = file.read_bytes()
    except OSError as err:
        raise SourceError(f"{where}: cannot read templates: {err.strerror}") from None
    return Templates(where, files, bounded)


def _linked_out(path: Path, where: str) -> list[tuple[Path, int]]:
    """The regular files under a working tree's templates folder and their sizes, walked
    through no symbolic link: a link (in a revision: a blob diff never follows) or a FIFO
    or device is refused by name, never read, as its policy is (issue 33, point 8)."""
    import stat

    found = []
    for top, dirs, names in os.walk(path, followlinks=False, onerror=_raise):
        for name in sorted(dirs) + sorted(names):
            entry = Path(top) / name
            mode = os.lstat(entry).st_mode
            rel = display_name(entry.relative_to(path).as_posix())
            if stat.S_ISLNK(mode):
                raise SourceError(f"{where}{rel}: a symbolic link in the working tree (to "
                                  f"{display_name(os.readlink(entry))}); diff reads a working tree's regular "
                                  f"files only, as a revision's")
            if stat.S_ISREG(mode):
                found.append((entry, os.lstat(entry).st_size))
            elif not stat.S_ISDIR(mode):
                raise SourceError(f"{where}{rel}: not a regular file but {file_kind(mode)}; diff reads regular "
                                  f"files only")
    return sorted(found)


def _raise(err: OSError) -> None:
    raise err


@lru_cache(maxsize=1)
def installed_templates() -> Templates:
    return directory_templates(render.template_dir(), "templates/")


# ----------------------------------------------------------------------------- git

def repo_path(path: str, what: str) -> str:
    """A path inside a repository, relative to its top, that cannot leave it."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or str(pure) == ".":
        raise SourceError(f"{what} {path!r}: expected a path relative to the repository's top, inside it")
    return str(pure)


@dataclass(frozen=True)
class GitRepo:
    root: Path

    @classmethod
    def around(cls, cwd: Path | None, what: str) -> GitRepo:
        top = _git(["rev-parse", "--show-toplevel"], cwd)
        if top.returncode != 0:
            raise SourceError(f"{what}: not a file or directory, and not inside a git repository")
        return cls(Path(top.stdout.decode().strip()))

    def commit(self, rev: str) -> str:
        if rev.startswith("-"):
            raise SourceError(f"{rev}: not a file, directory or git revision")
        found = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], self.root)
        if found.returncode != 0:
            shallow = _git(["rev-parse", "--is-shallow-repository"], self.root).stdout.strip() == b"true"
            raise SourceError(f"{rev}: not a file, directory or git revision of {self.root.name}"
                              + (" (a shallow clone: `git fetch --deepen=N` or `--unshallow` fetches older "
                                 "commits)" if shallow else ""))
        return found.stdout.decode().strip()

    def merge_base(self, old: str, new: str) -> str:
        """The commit `git diff OLD...NEW` compares NEW with: where the two histories meet,
        named as `git log --oneline` would (12 hex digits, more where those are ambiguous),
        since it labels a side of the report."""
        base = _git(["merge-base", self.commit(old), self.commit(new)], self.root)
        if base.returncode != 0:
            raise SourceError(f"{old}...{new}: the two revisions have no common ancestor")
        return _git(["rev-parse", "--short=12", base.stdout.decode().strip()], self.root).stdout.decode().strip()

    def read(self, commit: str, limits: dict[str, int], label: str | None = None,
             folders: tuple[str, ...] = ()) -> dict[str, bytes]:
        """Every regular file at or under each path of `limits` in that commit: path -> content.

        A file over its path's limit (bytes) is refused from the size git lists, before any
        content is read: reading first would hold a 200 MB blob in memory only to refuse it.
        A path asked for by name that is a symbolic link is refused too, since a revision's
        link has no target diff could read, and skipping it would say there is no such file.
        `label` names the revision in messages (the commit's hash when None). Each of `folders`
        (templates) is held to check_template_totals, from the listing too."""
        label = label or commit[:12]
        listing = _git(["ls-tree", "-r", "-l", "-z", "--full-tree", commit, "--", *limits], self.root)
        if listing.returncode != 0:
            raise SourceError(f"{commit[:12]}: git ls-tree failed: {listing.stderr.decode(errors='replace').strip()}")
        blobs: dict[str, str] = {}
        sizes: dict[str, int] = {}
        links: dict[str, str] = {}
        for entry in listing.stdout.split(b"\0"):
            if not entry:
                continue
            meta, _, raw_name = entry.partition(b"\t")
            mode, kind, obj, size = meta.decode().split()
            name = raw_name.decode("utf-8", "surrogateescape")
            if kind == "commit" and any(name == p or name.startswith(p.rstrip("/") + "/") for p in limits):
                raise SourceError(f"{label}:{display_name(name)}: a git submodule at that revision (commit "
                                  f"{obj[:12]}); diff reads a revision's own files, never a submodule's, and "
                                  f"would not render it from other templates")
            if kind != "blob":
                continue
            limit = _limit(limits, name)
            if int(size) > limit:
                raise too_large(f"{label}:{name}", int(size), limit)
            if mode in ("100644", "100755"):
                blobs[name], sizes[name] = obj, int(size)
            elif mode == "120000" and name in limits:
                links[name] = obj
        for folder in folders:
            under = [sizes[name] for name in blobs if name.startswith(folder.rstrip("/") + "/")]
            check_template_totals(f"{label}:{folder.rstrip('/')}/", under)
        contents = self._cat(commit, {**blobs, **links})
        if links:
            name = next(iter(links))
            raise SourceError(f"{label}:{display_name(name)}: a symbolic link at that revision (to "
                              f"{display_name(contents[name].decode('utf-8', 'surrogateescape'))}); diff reads "
                              f"a revision's regular files only")
        return contents

    def _cat(self, commit: str, blobs: dict[str, str]) -> dict[str, bytes]:
        """The contents of `blobs` (name -> object), in one `git cat-file --batch`."""
        if not blobs:
            return {}
        batch = _git(["cat-file", "--batch"], self.root, stdin="\n".join(blobs.values()) + "\n")
        if batch.returncode != 0:
            raise SourceError(f"{commit[:12]}: git cat-file failed: {batch.stderr.decode(errors='replace').strip()}")
        contents, out, pos = {}, batch.stdout, 0
        for name, obj in blobs.items():
            end = out.index(b"\n", pos)
            header = out[pos:end].split()
            if len(header) != 3 or header[1] != b"blob":
                raise SourceError(f"{commit[:12]}:{display_name(name)}: git cat-file could not read it")
            size = int(header[2])
            contents[name] = out[end + 1:end + 1 + size]
            pos = end + 1 + size + 1
        return contents


def _limit(limits: dict[str, int], name: str) -> int:
    """The limit of the most specific path of `limits` that `name` is, or is under."""
    return max(((len(path), limit) for path, limit in limits.items()
                if name == path or name.startswith(path.rstrip("/") + "/")), default=(0, 0))[1]


def _git(args: list[str], cwd: Path | None, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        # Paths are paths: `--policy ':(top)x'` is a file of that name, not pathspec magic.
        return subprocess.run(["git", "--literal-pathspecs", *args], capture_output=True, cwd=cwd,
                              input=stdin.encode() if stdin is not None else None)
    except OSError as err:
        raise SourceError(f"cannot run git: {err.strerror}") from None
