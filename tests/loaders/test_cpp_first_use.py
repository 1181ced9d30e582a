"""topkgen-cpp as a new user meets it (issue 32): the short dtype names the Python CLI takes,
select's columns named (--format json), a refusal is a non-zero exit, every subcommand in
README, and README's compile line for the header works as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from ..conftest import ROOT
from ..support.cpp import cpp_select, python_select

LINES = "sm_90 float32 8 1000 fast 1\nsm_90 bfloat16 256 131072 fast 1 1\nsm_100 float16 40 700 deterministic 1 3\n"


def _select(cpp, bundle, lines: str, *options: str) -> subprocess.CompletedProcess:  # noqa: F811
    return subprocess.run([cpp, "select", bundle, *options], input=lines, capture_output=True, text=True)


def test_select_takes_the_short_dtype_names(cpp, built_bundle):  # noqa: F811
    full = _select(cpp, built_bundle, LINES)
    short = _select(cpp, built_bundle, LINES.replace("float32", "fp32").replace("bfloat16", "BF16")
                    .replace("float16", "half"))
    assert (full.returncode, short.returncode) == (0, 0), short.stdout + short.stderr
    assert short.stdout == full.stdout and len(full.stdout.splitlines()) == 3


def test_select_format_json_names_the_columns(cpp, built_bundle, default_policy):  # noqa: F811
    text = _select(cpp, built_bundle, LINES + "sm_90 int32 8 1000 fast 1\n").stdout.splitlines()
    proc = _select(cpp, built_bundle, LINES + "sm_90 int32 8 1000 fast 1\n", "--format", "json")
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answers[0] == {"kernel": text[0]}
    kernel, chunks, workspace, offset, shared = text[1].split()
    assert answers[1] == {"kernel": kernel, "chunks": int(chunks), "workspace_bytes": int(workspace),
                          "values_offset": int(offset), "shared_bytes": json.loads(shared)}
    assert answers[1]["chunks"] == 32 and list(answers[1]) == ["kernel", "chunks", "workspace_bytes", "values_offset",
                                                                "shared_bytes"]
    assert answers[3] == {"error": "dtype: 'int32' is not in the bundle (known: bfloat16, float16, float32)"}
    assert text[3] == "error: " + answers[3]["error"]
    assert text[2] == python_select(default_policy, ("sm_100", "float16", 40, 700, True, True, 3))
    bad = _select(cpp, built_bundle, LINES, "--format", "xml")
    assert bad.returncode == 2 and bad.stderr.startswith("usage: topkgen-cpp") and bad.stdout == ""


def test_select_exits_1_when_a_request_is_refused_after_answering_every_line(cpp, built_bundle):  # noqa: F811
    served = _select(cpp, built_bundle, LINES)
    assert (served.returncode, served.stderr) == (0, "")
    refused = _select(cpp, built_bundle, "sm_90 float32 8 1000 fast 1 -5\n" + LINES)
    assert (refused.returncode, refused.stderr) == (1, "")
    assert refused.stdout.splitlines() == ["error: rows: must be >= 0, got -5", *served.stdout.splitlines()]
    assert cpp_select(cpp, built_bundle, [("sm_90", "float32", 8, 1000, False, True, -5)]) == \
        ["error: rows: must be >= 0, got -5"]


def test_readme_documents_every_subcommand_of_topkgen_cpp():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### topkgen-cpp"):readme.index("## The compile cache")]
    for usage in ("topkgen-cpp verify DIR", "topkgen-cpp select DIR [--format text|json]",
                  "topkgen-cpp launch DIR ARCH DTYPE K N ROWS MODE JIT LARGEST IN VALUES INDICES", "topkgen-cpp bench DIR"):
        assert f"`{usage}`" in section, usage
    for column in ("KERNEL CHUNKS", "WORKSPACE_BYTES VALUES_OFFSET", "Exit 0 when every request was served, 1 when"):
        assert column in section.replace("\n  ", " "), column


def test_readmes_compile_line_for_the_header_works_as_written(cpp, built_bundle, tmp_path):  # noqa: F811
    """README's line said `g++ -std=c++17 -Iloaders/cpp/include ... -lcrypto -ldl`: the `...`
    was where nlohmann/json had to come from. The line is now whole; it is run as printed
    (from the top of the checkout; only app.cpp and app are put in a temporary directory)."""
    readme = (ROOT / "README.md").read_text()
    (line,) = [m.strip() for m in re.findall(r"^ {4}(g\+\+ -std=c\+\+17 .*)$", readme, re.M)]
    (tmp_path / "app.cpp").write_text('#include <topkgen/loader.hpp>\n#include <iostream>\n'
                                      'int main(int, char** argv) { topkgen::Bundle b(argv[1]);\n'
                                      '  std::cout << b.select("sm_90", "float32", 8, 1000, false, false).name << "\\n"; }\n')
    command = line.replace(" app.cpp -o app ", f" {tmp_path / 'app.cpp'} -o {tmp_path / 'app'} ")
    assert command != line
    built = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([tmp_path / "app", built_bundle], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, _select(cpp, built_bundle, "sm_90 float32 8 1000 fast 0\n").stdout)


APP = ('#include <topkgen/loader.hpp>\n#include <iostream>\n'
       'int main(int, char** argv) { topkgen::Bundle b(argv[1]);\n'
       '  std::cout << b.select("sm_90", "float32", 8, 1000, false, false).name << "\\n"; }\n')


def _runs(app, cpp, bundle) -> None:  # noqa: F811
    ran = subprocess.run([app, bundle], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, _select(cpp, bundle, "sm_90 float32 8 1000 fast 0\n").stdout)


def test_the_header_builds_through_pkg_config(cpp, built_bundle, tmp_path):  # noqa: F811
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "pkgconfig"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    (tmp_path / "app.cpp").write_text(APP)
    built = subprocess.run(["bash", "-c", f"g++ {tmp_path / 'app.cpp'} -o {tmp_path / 'app'} "
                                          "$(pkg-config --cflags --libs topkgen-loader)"],
                           capture_output=True, text=True, env={**os.environ,
                                                                "PKG_CONFIG_PATH": str(ROOT / "build" / "pkgconfig")})
    assert built.returncode == 0, built.stderr
    _runs(tmp_path / "app", cpp, built_bundle)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake here")
def test_the_header_builds_as_a_cmake_target(cpp, built_bundle, tmp_path):  # noqa: F811
    import nlohmann_json

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.cpp").write_text(APP)
    (tmp_path / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(app LANGUAGES CXX)\n"
        f"add_subdirectory({ROOT / 'loaders' / 'cpp'} topkgen-loader)\n"
        "add_executable(app app.cpp)\ntarget_link_libraries(app PRIVATE topkgen::loader)\n")
    for step in (["cmake", "-S", tmp_path / "src", "-B", tmp_path / "b",
                  f"-DTOPKGEN_NLOHMANN_INCLUDE={nlohmann_json.get_include()}"], ["cmake", "--build", tmp_path / "b"]):
        proc = subprocess.run([str(a) for a in step], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    _runs(tmp_path / "b" / "app", cpp, built_bundle)


def test_the_wheel_ships_the_header(cpp, built_bundle, tmp_path):  # noqa: F811
    import nlohmann_json

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0 and "warning" not in (built.stdout + built.stderr).lower(), built.stderr
    wheel = next((tmp_path / "wheel").glob("topkgen-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"topkgen/include/topkgen/loader.hpp", "topkgen/include/topkgen/manifest_schema.hpp"} <= names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    include = subprocess.run([sys.executable, "-c", "import topkgen.common.paths as p; print(p.cpp_include_dir())"],
                             capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(site)},
                             check=True).stdout.strip()
    assert include == str(site / "topkgen" / "include")
    (tmp_path / "app.cpp").write_text(APP)
    proc = subprocess.run(["g++", "-std=c++17", f"-I{include}", "-isystem", str(nlohmann_json.get_include()),
                           str(tmp_path / "app.cpp"), "-o", str(tmp_path / "app"), "-lcrypto", "-ldl"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _runs(tmp_path / "app", cpp, built_bundle)
