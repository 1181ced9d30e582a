"""topkgen-cpp as a new user meets it (issue 32): the short dtype names the Python CLI takes,
select's columns named (--format json), a refusal is a non-zero exit, every subcommand in
README, and README's compile line for the header works as written."""

from __future__ import annotations

import json
import re
import subprocess

from ..conftest import ROOT
from .test_cpp_loader import cpp, cpp_select, python_select  # noqa: F401 (cpp: the fixture)

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
    kernel, chunks, workspace, offset = text[1].split()
    assert answers[1] == {"kernel": kernel, "chunks": int(chunks), "workspace_bytes": int(workspace),
                          "values_offset": int(offset)}
    assert answers[1]["chunks"] == 32 and list(answers[1]) == ["kernel", "chunks", "workspace_bytes", "values_offset"]
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
