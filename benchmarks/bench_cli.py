"""Whole-process timings of topkgen commands (`plan`; `diff` once it exists)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_process_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(which: list[str]) -> None:
    topkgen = shutil.which("topkgen", path=str(ROOT / ".venv" / "bin")) or "topkgen"
    cases = {
        "plan": [topkgen, "plan"],
        "plan-json": [topkgen, "plan", "--format", "json"],
    }
    for name in which or list(cases):
        seconds = median_process_seconds(cases[name], cwd=str(ROOT))
        print(f"topkgen {' '.join(cases[name][1:])}: median {seconds * 1000:.0f} ms over 11 runs (whole process)")


if __name__ == "__main__":
    main(sys.argv[1:])
