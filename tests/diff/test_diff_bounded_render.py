"""Issue 33, point 7: a branch under review cannot hang or crash `diff`. Its templates render
in a child process with limits (topkgen.build.render_bounded) and a sandbox that bounds `*`,
`**`, range() and lipsum(); each case is one line, exit 2, in well under the 20 s that
killed them before (nested loops, `'x' * 10**10`, `2 ** 10**11`, lipsum, a format width
of a GiB ran without end; a recursive macro, a self-include and an include cycle were
`internal error: RecursionError`, exit 70; 2500 files of 1 MB took 10 s and 4.8 GiB)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..support.commands import ENV, TOPKGEN
from ..support.hostile import bounded
from topkgen.build import render_bounded, sources

TEMPLATE = "radix_select.cu.j2"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A checkout whose HEAD~1 is the shipped policy and templates; tests commit a hostile HEAD."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "policies", repo / "policies")
    shutil.copytree(ROOT / "templates", repo / "templates")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "shipped")
    return repo


def _commit(repo: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = repo / "templates" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "hostile")


def _diff(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([*TOPKGEN, "diff", *args, "--stat"], cwd=repo, capture_output=True, text=True, env=ENV,
                          timeout=60, preexec_fn=bounded)
    return proc, time.monotonic() - start


HOSTILE = {
    "nested range loops": "{% for a in range(4000) %}{% for b in range(4000) %}{% for c in range(4000) %}"
                          "{% endfor %}{% endfor %}{% endfor %}",
    "string times": "{{ 'x' * 10000000000 }}",
    "list times": "{{ ([1] * 100000000) | length }}",
    "power": "{{ 2 ** 100000000000 }}",
    "lipsum": "{{ lipsum(100000000) }}",
    "format width": "{{ '%02000000000d' % 1 }}",
    "format method width": "{{ '{:02000000000}'.format(1) }}",
    "recursive macro": "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
    "self include": "{% include 'radix_select.cu.j2' %}",
    "output over the cap": "{% for a in range(4096) %}{{ 'y' * 1048576 }}{% endfor %}",
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_template_is_one_line_exit_2_and_quick(repo, case):
    _commit(repo, {TEMPLATE: HOSTILE[case]})
    proc, took = _diff(repo, "HEAD~1", "HEAD")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith("topkgen: error: HEAD:templates/") and proc.stderr.count("\n") == 1, proc.stderr
    assert "internal error" not in proc.stderr
    assert took < 10, f"{case}: {took:.1f} s"


def test_an_include_cycle_in_the_working_tree_is_refused_too(repo):
    """The working tree's templates are a branch's as much as a revision's."""
    (repo / "templates" / TEMPLATE).write_text("{% include 'b.cuh' %}")
    (repo / "templates" / "b.cuh").write_text("{% include 'radix_select.cu.j2' %}")
    proc, took = _diff(repo, "HEAD")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("topkgen: error: templates/: cannot render kernel ") and "recursion" in proc.stderr
    assert took < 10


def test_many_template_files_are_refused_from_the_listing(repo):
    many = {f"junk/{i}.cuh": b"/" * 1000 for i in range(sources.MAX_TEMPLATE_FILES + 1)}
    _commit(repo, many)
    proc, _ = _diff(repo, "HEAD~1", "HEAD")
    assert proc.returncode == 2 and proc.stderr == (
        f"topkgen: error: HEAD:templates/: {len(many) + 4} files, more than the {sources.MAX_TEMPLATE_FILES} "
        f"a templates folder may hold; not read\n"), proc.stderr


def test_template_files_over_the_total_are_refused_from_the_listing(repo):
    per = sources.MAX_TEMPLATE_BYTES
    count = sources.MAX_TEMPLATES_BYTES // per + 1
    _commit(repo, {f"junk/{i}.cuh": b"/" * per for i in range(count)})
    proc, _ = _diff(repo, "HEAD~1", "HEAD")
    assert proc.returncode == 2 and proc.stderr.startswith("topkgen: error: HEAD:templates/: ") \
        and f"more than the {sources.MAX_TEMPLATES_BYTES} a templates folder may hold; not read\n" in proc.stderr


def test_the_shipped_templates_render_the_same_bounded_and_in_process():
    from topkgen.policy import all_kernels, load

    policy = load(None)
    specs = [s for arch in policy.archs for s in all_kernels(policy, arch)]
    installed = sources.installed_templates()
    bounded_results = render_bounded.render_all(installed.files, "X:templates/", specs)
    assert len(bounded_results) == len(specs)
    for spec in specs:
        assert bounded_results[spec] == installed.render(spec), spec.name
