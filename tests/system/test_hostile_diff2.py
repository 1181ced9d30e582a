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
                          timeout=60, preexec_fn=bounded)


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
