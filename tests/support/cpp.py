"""The C++ loader as the tests build and compile against it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "build" / "cpp" / "topkgen-cpp"


def loader_flags() -> list[str]:
    """g++ flags for a program that includes loader.hpp (the headers the Makefile gives topkgen-cpp)."""
    nlohmann = Path(importlib.util.find_spec("nlohmann_json").origin).parent / "include"
    return ["-std=c++17", f"-I{ROOT}/loaders/cpp/include", "-isystem", str(nlohmann)]
