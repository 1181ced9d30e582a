"""What a new user trips on (issue 32): every input error one line, integer dtypes named as
such, and the help and output that answer a first user's questions."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from topkgen import cli as cli_module

USAGE_ERRORS = [
    (["explain", "--arch", "sm_90", "--dtype", "fp32", "--k", "0", "--n", "10"],
     "topkgen: error: explain: Invalid value for '--k': 0 is not in the range 1<=x<=2147483647"),
    (["explain", "--arch", "sm_90", "--k", "3", "--n", "10"],
     "topkgen: error: explain: Missing option '--dtype'"),
    (["run", "--bundle", ".", "--k", "0", "x.npy"],
     "topkgen: error: run: Invalid value for '--k': 0 is not in the range 1<=x<=2147483647"),
    (["plan", "--bogus"], "topkgen: error: plan: No such option: --bogus"),
    (["plan", "extra"], "topkgen: error: plan: Got unexpected extra argument (extra)"),
    (["--color", "bad", "plan"],
     "topkgen: error: Invalid value for '--color': 'bad' is not one of 'auto', 'always', 'never'"),
    (["explian"], "topkgen: error: No such command 'explian'. Did you mean 'explain'?"),
    (["cache", "verfy"],
     "topkgen: error: cache: No such command 'verfy'. Did you mean 'verify'?"),
]


@pytest.mark.parametrize("args, line", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_every_usage_error_is_one_line_exit_2(args, line):
    """click printed its range and missing-option errors in four lines ("Usage: ...", "Try
    ...", a blank line, "Error: ..."), unlike topkgen's own one line; now all are one."""
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, args)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", line + "\n")


@pytest.mark.parametrize("name", ["int32", "int8", "uint16", "i64", "bool"])
def test_an_integer_dtype_is_said_to_be_unsupported_not_a_typo(name):
    """`--dtype int32` said "did you mean float32?": it is no typo."""
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["explain", "--arch", "sm_90", "--dtype", name,
                                                                   "--k", "1", "--n", "8"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"'{name}': integer inputs are not supported; top-k runs on floating point values" in result.stderr
    assert "did you mean" not in result.stderr


def test_the_runtime_says_the_same_of_an_integer_dtype():
    from topkgen.runtime.backend import TopKError, dtype_name

    with pytest.raises(TopKError, match=r"^dtype: 'int32': integer inputs are not supported"):
        dtype_name("uint16", "int32")


def test_run_help_shows_how_to_read_bfloat16_results_back_and_it_works(cli, built_bundle, tmp_path, monkeypatch):
    """run saves bfloat16 values as numpy saves ml_dtypes' (2-byte V2 records); --help said
    only that. It now gives the lines that read them back, and those lines work as printed."""
    import ml_dtypes
    import numpy as np

    from topkgen.runtime.reference import topk

    helped = cli("run", "--help").stdout
    start = helped.index("import numpy as np, ml_dtypes")
    snippet = [line.strip() for line in helped[start:].splitlines()[:4]]
    assert snippet[2] == 'values = saved["values"].view(ml_dtypes.bfloat16)', snippet
    monkeypatch.chdir(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 300)).astype(ml_dtypes.bfloat16)
    np.save("x.npy", x)
    saved = cli("run", "--bundle", built_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", "8",
                "--deterministic", "x.npy", "-o", "top8.npz")
    assert saved.exit_code == 0, saved.stderr
    names: dict = {}
    exec("\n".join(snippet), names)  # the help's own lines  # noqa: S102
    values, indices = topk(x, 8)
    assert names["values"].dtype == ml_dtypes.bfloat16 and names["indices"].dtype == np.int64
    assert np.array_equal(names["values"].view(np.uint16), values.view(np.uint16))
    assert np.array_equal(names["indices"], indices)


def _lines(text: str) -> list[str]:
    return [line.rstrip("\r") for line in text.splitlines()]


@pytest.mark.parametrize("command", [["plan"], ["show", "{bundle}"]], ids=["plan", "show"])
def test_tables_fit_the_terminal_and_wide_shows_every_column(command, built_bundle):
    """plan's and show's tables were 148 and 179 columns wide: on a terminal they now fit its
    width (columns left out, said so), --wide shows all, and a pipe gets every column."""
    from ..support.commands import ENV, on_terminal, run_topkgen as topkgen

    args = [str(built_bundle) if a == "{bundle}" else a for a in command]
    status, shown = on_terminal(*args, env={**ENV, "COLUMNS": "100"})
    assert status == 0, shown
    table = [line for line in _lines(shown) if line.startswith("  ")]  # the tables (the header names a path)
    assert table and max(map(len, table)) <= 100, max(table, key=len)
    assert "left out to fit: --wide shows them)" in shown
    status, wide = on_terminal(*args, "--wide", env={**ENV, "COLUMNS": "100"})
    assert status == 0 and max(map(len, _lines(wide))) > 140 and "left out" not in wide
    piped = topkgen(*args, env={**ENV, "COLUMNS": "100"})
    assert _lines(piped.stdout) == _lines(wide)  # a pipe: every column, as --wide
    header = next(line for line in _lines(wide) if line.startswith("  kernel "))
    assert header.split() == (["kernel", "family", "dtype", "K", "N", "window", "mode", "work", "rung", "threads",
                               "CTAs/SM"] if command == ["plan"] else
                              ["kernel", "dtype", "K", "N", "window", "serves", "threads", "regs", "spills", "st/ld",
                               "stack", "smem", "static", "smem", "dyn", "cubin", "bytes", "budget"])


def test_plan_json_is_the_same_on_a_narrow_terminal():
    from ..support.commands import ENV, on_terminal, run_topkgen as topkgen

    import json

    status, shown = on_terminal("plan", "--format", "json", env={**ENV, "COLUMNS": "60"})
    assert status == 0 and json.loads(shown) == json.loads(topkgen("plan", "--format", "json").stdout)


def test_explain_sm_count_plans_for_another_part(cli):
    args = ("explain", "--arch", "sm_90", "--dtype", "fp32", "--k", "256", "--n", "131072", "--rows", "8")
    h200, h20 = cli(*args).stdout, cli(*args, "--sm-count", "78").stdout
    assert "split:  32 chunks per row" in h200 and "132 SMs x 2 / 8 rows = 33" in h200
    assert "split:  16 chunks per row" in h20 and "78 SMs x 2 / 8 rows = 19" in h20
    assert cli(*args, "--sm-count", "132").stdout == h200
    bad = cli(*args, "--sm-count", "0")
    assert (bad.exit_code, bad.stderr) == (2, "topkgen: error: explain: Invalid value for '--sm-count': 0 is not in "
                                              "the range 1<=x<=1024\n")
