"""Whole-process timings of topkgen commands: `plan`, and `diff` of two git revisions of a
temporary repository holding the checkout's policies and templates, whose second commit
changes the policy: rendering every kernel of both sides (`diff`), and compiling both
through a warm compile cache (`diff-build`; the warm-up runs fill the cache)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_process_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "policies", repo / "policies")
    shutil.copytree(ROOT / "templates", repo / "templates")
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    policy = repo / "policies" / "topk.yaml"
    text = policy.read_text()
    changed = text.replace("\n      1024: 2 ", "\n      1024: 1 ", 1)  # sm_90's launch bounds at K=1024
    if changed == text:
        raise SystemExit("bench_cli.py: the default policy no longer has sm_90's '1024: 2' launch bound to change")
    policy.write_text(changed)
    subprocess.run([*git, "commit", "-qam", "two"], cwd=repo, check=True)
    return repo


def main(which: list[str]) -> None:
    topkgen = shutil.which("topkgen", path=str(ROOT / ".venv" / "bin")) or "topkgen"
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        cases = {
            "plan": ([topkgen, "plan"], ROOT),
            "plan-json": ([topkgen, "plan", "--format", "json"], ROOT),
            "diff": ([topkgen, "diff", "HEAD~1", "HEAD"], repo),
            "diff-build": ([topkgen, "diff", "HEAD~1", "HEAD", "--build"], repo),
        }
        for name in which or list(cases):
            cmd, cwd = cases[name]
            ok = {0, 1} if name.startswith("diff") else {0}
            seconds = median_process_seconds(cmd, cwd=str(cwd), ok=ok)
            print(f"topkgen {' '.join(cmd[1:])}: median {seconds * 1000:.0f} ms over 11 runs (whole process)")


if __name__ == "__main__":
    main(sys.argv[1:])
