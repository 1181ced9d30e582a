"""Issue 33, point 8: `diff REV` reads the working tree's policy as it reads a revision's: a
regular file through no symbolic link. A policy linked out of the repository was read and
its first line echoed in the error (a secret in a CI log); a FIFO blocked diff for ever."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..support.commands import ENV
from ..support.hostile import bounded

SECRET = "AWS_SECRET_ACCESS_KEY=hunter2-do-not-print"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    (repo / "policies").mkdir(parents=True)
    shutil.copy(ROOT / "policies" / "topk.yaml", repo / "policies" / "topk.yaml")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "policy")
    return repo


def _diff(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topkgen", "diff", "HEAD"], cwd=repo, capture_output=True, text=True,
                          timeout=60, preexec_fn=bounded, env=ENV)


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_working_tree_policy_linked_out_of_the_repository_is_refused_unread(repo, tmp_path, where):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "topk.yaml").write_text(SECRET + "\n")
    if where == "file":
        (repo / "policies" / "topk.yaml").unlink()
        (repo / "policies" / "topk.yaml").symlink_to(outside / "topk.yaml")
        what = "a symbolic link"
    else:
        shutil.rmtree(repo / "policies")
        (repo / "policies").symlink_to(outside)
        what = "under the symbolic link policies"
    proc = _diff(repo)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"topkgen: error: working tree: policies/topk.yaml: {what} in the working tree (to "
                           f"{outside / 'topk.yaml' if where == 'file' else outside}); diff reads a working tree's "
                           f"regular files only, as a revision's\n")
    assert "hunter2" not in proc.stderr + proc.stdout


def test_a_working_tree_policy_that_is_a_fifo_is_refused_not_waited_on(repo):
    (repo / "policies" / "topk.yaml").unlink()
    os.mkfifo(repo / "policies" / "topk.yaml")
    proc = _diff(repo)
    assert (proc.returncode, proc.stderr) == (2, "topkgen: error: working tree: policies/topk.yaml: not a regular "
                                                 "file but a FIFO; diff reads regular files only\n")


# ----------------------------------------------------------------------------- templates (the rest of point 8)

@pytest.fixture
def templated(repo) -> Path:
    """The repository with the shipped templates committed too."""
    shutil.copytree(ROOT / "templates", repo / "templates")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "templates")
    return repo


def test_a_working_tree_templates_folder_linked_out_is_refused_unread(templated, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(ROOT / "templates", outside)
    (outside / "secret.cuh").write_text(SECRET + "\n")
    shutil.rmtree(templated / "templates")
    (templated / "templates").symlink_to(outside)
    proc = _diff(templated)
    assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: working tree: templates: a symbolic link in the "
                                                 f"working tree (to {outside}); diff reads a working tree's regular "
                                                 f"files only, as a revision's\n")


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_working_tree_template_that_is_a_link_or_a_fifo_is_refused_by_name(templated, tmp_path, kind):
    inside = templated / "templates" / "extra.cuh"
    if kind == "link":
        (tmp_path / "secret").write_text(SECRET + "\n")
        inside.symlink_to(tmp_path / "secret")
        told = f"a symbolic link in the working tree (to {tmp_path / 'secret'})"
    else:
        os.mkfifo(inside)
        told = "not a regular file but a FIFO"
    proc = _diff(templated)
    assert proc.returncode == 2 and proc.stderr.startswith(f"topkgen: error: templates/extra.cuh: {told}; "), proc.stderr
    assert proc.stderr.count("\n") == 1 and "hunter2" not in proc.stderr + proc.stdout


def test_a_revision_whose_templates_are_a_submodule_says_so(repo, tmp_path):
    """It was rendered from the installed templates, and said "no templates/ at that revision"."""
    sub = tmp_path / "sub"
    shutil.copytree(ROOT / "templates", sub)
    _git(sub, "init", "-q")
    _git(sub, "add", ".")
    _git(sub, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "templates")
    _git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "templates")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "templates as a submodule")
    commit = subprocess.run(["git", "-C", str(sub), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    proc = subprocess.run([sys.executable, "-m", "topkgen", "diff", "HEAD~1", "HEAD"], cwd=repo, capture_output=True,
                          text=True, timeout=60, preexec_fn=bounded, env=ENV)
    assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: HEAD:templates: a git submodule at that revision "
                                                 f"(commit {commit[:12]}); diff reads a revision's own files, never "
                                                 f"a submodule's, and would not render it from other templates\n")


@pytest.mark.parametrize("text", [SECRET + "\n", "42\n", "'" + SECRET + "'\n"])
def test_a_file_that_is_no_policy_is_named_its_content_never_echoed(tmp_path, text):
    """`plan --policy FILE` of a file of one line said `expected object, got 'AWS_SECRET...'`."""
    policy = tmp_path / "p.yaml"
    policy.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "topkgen", "plan", "--policy", str(policy)], capture_output=True,
                          text=True, timeout=60, env=ENV)
    prefix = f"topkgen: error: {policy}:1:1: "
    assert proc.returncode == 2 and proc.stderr.startswith(prefix), proc.stderr
    message = proc.stderr[len(prefix):]  # past the test's own path (pytest's tmp dir may be pytest-42)
    assert "expected object, got a " in message and "hunter2" not in message and "42" not in message
