"""The C++ loader's driver entry points against the CUDA 13 headers (the nvidia-cuda-runtime
wheel's cuda.h and cudaTypedefs.h): no GPU is needed to check that what it asks
cuGetProcAddress for is what it calls.

loader.hpp declares its own function pointer types (it builds without a CUDA toolkit) and
asks the driver for each entry point at the ABI of cu::API_VERSION. The driver then hands
out the newest version of the entry point not newer than that: cudaTypedefs.h names each
version PFN_<symbol>_v<version>. CUDA 13 gave some of them new signatures (cuCtxSynchronize
and cuCtxGetDevice take a context from v13000 on), so the version asked for and the types
declared must agree; this compiles one static_assert per entry point."""

from __future__ import annotations

import re
import subprocess

import pytest

from topkgen.common.paths import cuda_include_dir

from ..conftest import ROOT

pytest.importorskip("nlohmann_json")  # loader.hpp's JSON headers (a dev dependency, as for `make cpp`)

from ..support.cpp import loader_flags  # noqa: E402

LOADER = ROOT / "loaders" / "cpp" / "include" / "topkgen" / "loader.hpp"


def _resolved() -> dict[str, str]:
    """symbol -> Driver member, from the loader's resolve("cuX", d.Member) calls."""
    found = dict(re.findall(r'resolve\("(cu\w+)", d\.(\w+)\)', LOADER.read_text()))
    assert len(found) >= 10, "loader.hpp: the resolve(...) calls were not found"
    return found


def _api_version() -> int:
    (version,) = re.findall(r"constexpr int API_VERSION = (\d+);", LOADER.read_text())
    return int(version)


def _versions(typedefs: str, symbol: str) -> list[int]:
    """The ABI versions cudaTypedefs.h declares for an entry point (not the _ptsz/_ptds ones)."""
    return sorted(int(v) for v in re.findall(rf"\bPFN_{symbol}_v(\d+)\)", typedefs))


# Types as the ABI sees them: an enum (CUresult, CUfunction_attribute...) as the int the
# loader declares in its place, pointers to them likewise.
ABI_PRELUDE = """#include <cuda.h>
#include <cudaTypedefs.h>
#include <type_traits>
#include "topkgen/loader.hpp"

template <class T> struct abi { using type = std::conditional_t<std::is_enum_v<T>, int, T>; };
template <class T> struct abi<const T> { using type = const typename abi<T>::type; };
template <class T> struct abi<T*> { using type = typename abi<T>::type*; };
template <class R, class... A> struct abi<R (*)(A...)> {
  using type = typename abi<R>::type (*)(typename abi<A>::type...);
};
template <class T> using abi_t = typename abi<T>::type;

"""


def _same_abi(symbol: str, version: int, member: str) -> str:
    return (f"static_assert(std::is_same_v<abi_t<PFN_{symbol}_v{version}>, "
            f"abi_t<decltype(topkgen::cu::Driver::{member})>>, "
            f"\"{symbol} v{version}: loader.hpp declares Driver::{member} with other types\");")


def _compile(tmp_path, checks: list[str]) -> subprocess.CompletedProcess:
    """g++ -fsyntax-only of the static_asserts `checks` against the CUDA headers and loader.hpp."""
    source = tmp_path / "abi.cpp"
    source.write_text(ABI_PRELUDE + "\n".join(checks) + "\nint main() { return 0; }\n")
    return subprocess.run(["g++", *loader_flags(), "-isystem", str(cuda_include_dir()), "-fsyntax-only",
                           str(source)], capture_output=True, text=True)


def test_each_entry_point_is_called_with_the_types_of_the_version_it_asks_for(tmp_path):
    typedefs = (cuda_include_dir() / "cudaTypedefs.h").read_text()
    api = _api_version()
    checks, chosen = [], {}
    for symbol, member in _resolved().items():
        versions = [v for v in _versions(typedefs, symbol) if v <= api]
        assert versions, f"{symbol}: no ABI version at or below API_VERSION {api} in cudaTypedefs.h"
        chosen[symbol] = versions[-1]
        checks.append(_same_abi(symbol, versions[-1], member))
    # The entry points CUDA 13 changed: the loader must ask for their old ABI.
    assert chosen["cuCtxSynchronize"] == 2000 and chosen["cuCtxGetDevice"] == 2000
    assert chosen["cuMemAlloc"] == 3020  # size_t bytes, 64-bit device pointers
    proc = _compile(tmp_path, checks)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_check_fails_for_an_entry_point_of_the_cuda_13_abi(tmp_path):
    """The same check, with the loader asking for CUDA 13's ABI: cuCtxSynchronize then takes
    a context the loader's declaration does not pass, and the compile fails. (Compared
    without abi_t, even v2000 failed, on CUresult against int: a control that could not
    tell the versions apart.)"""
    if 13000 not in _versions((cuda_include_dir() / "cudaTypedefs.h").read_text(), "cuCtxSynchronize"):
        pytest.skip("these headers predate CUDA 13")
    assert _compile(tmp_path, [_same_abi("cuCtxSynchronize", 2000, "CtxSynchronize")]).returncode == 0
    proc = _compile(tmp_path, [_same_abi("cuCtxSynchronize", 13000, "CtxSynchronize")])
    assert proc.returncode != 0 and "cuCtxSynchronize v13000: loader.hpp declares Driver::CtxSynchronize" in proc.stderr
