"""The CLI as a first-time user meets it: help that is whole and in workflow order, help on
every option with its valid values, the epilog's examples, exit codes and environment,
--version, `python -m topkgen`, shell completion, did-you-mean, aliases, colour and -j."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from topkgen import cli as cli_module
from topkgen.cli import console

from ..conftest import ROOT
from ..support.commands import ENV, on_terminal, run_topkgen as topkgen






def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found = {}
    for name, command in group.commands.items():
        found[prefix + name] = command
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
    return found


# ----------------------------------------------------------------------------- help

def test_help_lists_every_command_in_workflow_order_with_its_whole_summary():
    out = CliRunner().invoke(cli_module.main, ["--help"], terminal_width=80).output
    listed = re.search(r"\nCommands:\n(.*?)\n\n", out, re.S).group(1).splitlines()
    names = [line.split()[0] for line in listed]
    assert names == ["plan", "explain", "map", "build", "show", "diff", "run", "merge", "cache"]
    for line in listed:
        name, summary = line.split(None, 1)
        assert summary == cli_module.main.commands[name].short_help, line  # never cut ("...")
    assert "run" in out.split("Options:")[0]  # the description names every workflow step


def test_every_option_of_every_command_has_help():
    for path, command in _commands(cli_module.main).items():
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help, f"topkgen {path} {param.opts[0]} has no help text"
        summary = command.get_short_help_str(limit=200)
        assert summary and not summary.endswith("..."), path


def test_option_help_names_the_valid_values():
    out = CliRunner().invoke(cli_module.main, ["explain", "--help"], terminal_width=200).output
    arch_line = next(line for line in out.splitlines() if line.strip().startswith("--arch"))
    assert "sm_90, sm_100" in arch_line  # the packaged default policy's archs
    assert "--dtype [float32|bfloat16|float16]" in out and "fp32, bf16, fp16" in out
    assert "[1<=x<=2147483647; required]" in out  # --k
    build = CliRunner().invoke(cli_module.main, ["build", "--help"], terminal_width=200).output
    assert f"({console.available_cpus()} here)" in build and "sm_90, sm_100" in build


def test_the_epilog_gives_examples_exit_codes_and_every_topkgen_variable():
    out = CliRunner().invoke(cli_module.main, ["--help"], terminal_width=80).output
    used = set()
    for path in (ROOT / "topkgen").rglob("*.py"):
        used |= set(re.findall(r"TOPKGEN_[A-Z_]+[A-Z]", path.read_text()))
    assert used >= {"TOPKGEN_CACHE_DIR", "TOPKGEN_DEBUG"}
    epilog = out.split("Examples:")[1]
    for name in sorted(used) + ["NO_COLOR"]:
        assert name in epilog, f"{name} is read by topkgen but not in topkgen --help"
    for code, meaning in (("0", "success"), ("1", "a build failed"), ("2", "bad usage or input"),
                          ("70", "an internal error")):
        assert re.search(rf"\n +{code} +{meaning}", epilog), code
    assert "topkgen build --out out" in epilog and "_TOPKGEN_COMPLETE=bash_source topkgen" in epilog


@pytest.mark.parametrize("value, on", [(" 1 ", True), ("TRUE", True), ("\ton\n", True), ("yes", True),
                                       (" 0 ", False), ("false", False), ("Off", False), ("no", False), ("", False),
                                       ("  ", False)])
def test_on_off_variables_take_the_same_words_blanks_and_case_aside(value, on, cli, built_bundle, monkeypatch):
    """Each was read as `not in ("", "0")`: " 0 " and "false" were on."""
    from topkgen.build import cache
    from topkgen.policy import loading as policy
    from topkgen.runtime import TopK, TopKError

    for name in ("TOPKGEN_CACHE_READONLY", "TOPKGEN_DISABLE_JIT", "TOPKGEN_DEBUG"):
        monkeypatch.setenv(name, value)
    assert cache.remote_readonly() is on
    op = TopK(built_bundle, arch="sm_90", backend="emulator")  # float16 is served by JIT only
    if on:
        with pytest.raises(TopKError, match="JIT is disabled"):
            op.choose("float16", 40, 700)
    else:
        assert op.choose("float16", 40, 700).source == "jit"
    monkeypatch.setattr(policy, "_build", lambda *a, **k: 1 / 0)  # a bug: the traceback shows with TOPKGEN_DEBUG on
    result = cli("plan")
    assert (result.exit_code, "Traceback (most recent call last)" in result.stderr) == (70, on), result.stderr


@pytest.mark.parametrize("name", ["TOPKGEN_CACHE_READONLY", "TOPKGEN_DISABLE_JIT", "TOPKGEN_DEBUG"])
def test_an_on_off_variable_set_to_neither_is_refused_by_name_before_any_work(name, cli, monkeypatch):
    """A value neither on nor off was read as on, silently; now every command refuses it,
    whether it reads the variable or not (plan reads none of them)."""
    monkeypatch.setenv(name, " maybe ")
    result = cli("plan")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"topkgen: error: {name}=maybe: neither on (1, true, yes, on) nor off "
                             f"(0, false, no, off, or empty)\n")


def test_version_names_topkgen_nvrtc_and_cuda_core():
    from importlib import metadata

    from topkgen import __version__
    from topkgen.build.compile import nvrtc_version

    proc = topkgen("--version")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"topkgen {__version__}"
    assert lines[1] == f"NVRTC {nvrtc_version()} (nvidia-cuda-nvrtc {metadata.version('nvidia-cuda-nvrtc')})"
    assert f"cuda-core {metadata.version('cuda-core')}" in lines[2]


def test_python_m_topkgen_is_the_cli_and_completion_works():
    proc = topkgen("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: topkgen [OPTIONS] COMMAND")

    def complete(words: str) -> list[str]:
        env = {**ENV, "_TOPKGEN_COMPLETE": "bash_complete", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        out = topkgen(env=env).stdout
        return [line.split(",", 1)[1] for line in out.splitlines()]

    assert complete("topkgen bu") == ["build"]
    assert complete("topkgen explain --arch sm") == ["sm_90", "sm_100"]
    assert complete("topkgen explain --dtype b") == ["bfloat16"]
    script = topkgen(env={**ENV, "_TOPKGEN_COMPLETE": "bash_source"}).stdout
    assert "complete " in script and "_TOPKGEN_COMPLETE" in script


# ----------------------------------------------------------------------------- forgiving input

def test_mistyped_names_get_a_suggestion(cli):
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["bulid"])
    assert result.exit_code == 2 and "No such command 'bulid'. Did you mean 'build'?" in result.stderr
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["cache", "verfy"])
    assert result.exit_code == 2 and "Did you mean 'verify'?" in result.stderr
    result = cli("plan", "--arch", "sm90")
    assert result.exit_code == 2
    assert result.stderr == ("topkgen: error: --arch sm90: not in the packaged default policy (known: sm_90, "
                             "sm_100); did you mean sm_90?\n")
    result = cli("explain", "--arch", "sm_10", "--dtype", "float32", "--k", 1, "--n", 8)
    assert result.exit_code == 2 and "did you mean sm_100?" in result.stderr
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["explain", "--arch", "sm_90", "--dtype", "flaot32",
                                                                   "--k", "1", "--n", "8"])
    assert result.exit_code == 2 and "did you mean float32?" in result.stderr
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["explain", "--arch", "sm_90", "--dtype", "float64",
                                                                   "--k", "1", "--n", "8"])
    assert result.exit_code == 2 and "did you mean" not in result.stderr  # not float16


def test_dtype_aliases_and_comma_separated_archs(cli):
    def explain(dtype: str) -> dict:
        result = cli("explain", "--arch", "sm_90", "--dtype", dtype, "--k", 40, "--n", 700, "--format", "json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    for alias, name in (("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"), ("BF16", "bfloat16")):
        assert explain(alias) == explain(name) and explain(alias)["request"]["dtype"] == name
    both = json.loads(cli("plan", "--arch", "sm_90,sm_100", "--format", "json").stdout)
    assert both["archs"] == ["sm_90", "sm_100"] and both["totals"]["all"] == 58
    again = json.loads(cli("plan", "--arch", "sm_100", "--arch", "sm_90, sm_100", "--format", "json").stdout)
    assert again["archs"] == ["sm_100", "sm_90"]


# ----------------------------------------------------------------------------- colour, -j

def test_colour_on_terminals_only_unless_asked():
    bad = ("plan", "--arch", "sm_80")
    status, shown = on_terminal(*bad)
    assert status == 2 and "\x1b[31m" in shown and "topkgen: error:" in shown
    status, shown = on_terminal(*bad, env={**ENV, "NO_COLOR": "1"})
    assert status == 2 and "\x1b[" not in shown
    status, shown = on_terminal("--color", "never", *bad)
    assert status == 2 and "\x1b[" not in shown
    piped = topkgen(*bad)
    assert piped.returncode == 2 and piped.stderr.startswith("topkgen: error: --arch sm_80")
    forced = topkgen("--color", "always", *bad, env={**ENV, "NO_COLOR": "1"})
    assert forced.returncode == 2 and forced.stderr.startswith("\x1b[31m\x1b[1mtopkgen: error:")


def test_jobs_default_to_the_cpus_the_process_may_use():
    assert console.available_cpus() == len(os.sched_getaffinity(0))
    one_cpu = subprocess.run([sys.executable, "-m", "topkgen", "build", "--help"], capture_output=True, text=True,
                             env=ENV, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert "this process may use (1 here)" in " ".join(one_cpu.stdout.split())


@pytest.mark.parametrize("seconds, text", [(0.412, "0.41 s"), (12.34, "12.3 s"), (125.0, "2 min 05 s")])
def test_times_and_sizes_read_as_people_write_them(seconds, text):
    assert console.seconds(seconds) == text
    assert [console.size(n) for n in (512, 36 * 1024, 2_000_000)] == ["512 B", "36.0 KiB", "1.9 MiB"]


# ----------------------------------------------------------------------------- empty arguments

EMPTY_ARGUMENTS = [
    (["build", "--out", ""], "--out"),
    (["plan", "--policy", ""], "--policy"),
    (["diff", "", "x"], "OLD"),
    (["diff", "HEAD", ""], "[NEW]"),
    (["diff", "--policy", "", "HEAD"], "--policy"),
    (["diff", "a", "b", "--shapes", ""], "--shapes"),
    (["show", ""], "BUNDLE"),
    (["run", "--bundle", "", "--k", "1", "x.npy"], "--bundle"),
    (["run", "--bundle", "b", "--k", "1", ""], "IN.npy"),
    (["run", "--bundle", "b", "--k", "1", "x.npy", "-o", ""], "-o' / '--output"),
    (["merge", "a", "", "--out", "m"], "PARTS..."),
    (["merge", "a", "--out", ""], "--out"),
    (["cache", "import", ""], "BUNDLE"),
]


@pytest.mark.parametrize("args, name", EMPTY_ARGUMENTS,
                         ids=[" ".join(a or '""' for a in args) for args, _ in EMPTY_ARGUMENTS])
def test_an_empty_path_is_refused_by_name(cli, tmp_path, monkeypatch, args, name):
    """"" is the current directory to the OS: `--out ""` was refused as `--out .`,
    `--policy ""` as "., a directory", `diff "" x` as manifest.json."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, args)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stderr.startswith("topkgen: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f"Invalid value for '{name}': must not be empty\n" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_run_o_dash_is_refused_not_a_file_named_dash(cli, tmp_path, monkeypatch, tiny_bundle):  # noqa: F811
    """`-o -` reads as standard output, as in most tools; run wrote a file named '-' here.
    Refused in one line naming -o before anything is read; a file named '-' is -o ./-."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, ["run", "--bundle", "b", "--k", "1", "x.npy", "-o", "-"])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "topkgen: error: run: Invalid value for '-o' / '--output': run does not write to standard output: name a "
        ".npz file (-o top8.npz; a file called '-' is -o ./-), or leave -o out to print the rows\n")
    assert list(tmp_path.iterdir()) == []
    import numpy as np

    np.save(tmp_path / "x.npy", np.arange(200, dtype=np.float32).reshape(2, 100))
    named = cli("run", "--bundle", tiny_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", "3", "x.npy",
                "-o", "./-")
    assert named.exit_code == 0, named.stderr
    assert np.load(tmp_path / "-")["indices"].tolist() == [[99, 98, 97], [99, 98, 97]]


@pytest.mark.parametrize("option, value", [("--k", "\u0661\u0666"), ("--n", "1e3"), ("--rows", "4.0"), ("-j", "two")])
def test_a_count_in_other_than_ascii_digits_is_refused_in_words(option, value):
    """int() read Arabic-Indic digits ('\u0661\u0666') as 16, and click refused '1e3' as
    "not a valid integer range"; a count is digits 0-9, and the message says so."""
    command = ["build", "--shard", "1/2"] if option == "-j" else ["explain", "--arch", "sm_90", "--dtype", "float32"]
    args = {"--k": "16", "--n": "2048"} if command[0] == "explain" else {}
    args[option] = value
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, [*command, *(w for kv in args.items() for w in kv)])
    assert (result.exit_code, result.stdout) == (2, "")
    name = "'-j' / '--jobs'" if option == "-j" else f"'{option}'"
    assert result.stderr == (f"topkgen: error: {command[0]}: Invalid value for {name}: {value!r} is not a whole "
                             f"number (digits 0-9)\n")


@pytest.mark.parametrize("command", [["build"], ["merge", "part"]], ids=["build", "merge"])
def test_out_dash_is_refused_not_a_directory_named_dash(tmp_path, monkeypatch, tiny_policy, command):  # noqa: F811
    """`build --out -` made a directory named '-' (where most tools would write to standard
    output); refused before compiling, as run's -o -, and --out ./- still says that directory.
    A bundle's manifest.json for --out is refused naming the directory meant."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, [*command, "--out", "-"])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"topkgen: error: {command[0]}: Invalid value for '--out': {command[0]} writes a bundle directory, not "
        f"standard output: name a directory (--out bundle; a directory called '-' is --out ./-)\n")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("{}")  # a bundle's manifest, as show and run take one
    result = CliRunner(mix_stderr=False).invoke(cli_module.main, [*command, "--out", "b/manifest.json"])
    assert result.exit_code == 2 and result.stderr == (
        f"topkgen: error: {command[0]}: Invalid value for '--out': b/manifest.json is a file: --out names the "
        f"bundle's directory (b)\n")
    shutil.rmtree(tmp_path / "b")
    if command == ["build"]:
        named = CliRunner(mix_stderr=False).invoke(cli_module.main, ["build", "--policy", str(tiny_policy),
                                                                    "--out", "./-"])
        assert named.exit_code == 0, named.stderr
        assert (tmp_path / "-" / "manifest.json").is_file()


def test_a_bundle_may_be_named_by_its_manifest(cli, tmp_path, monkeypatch, tiny_bundle):  # noqa: F811
    """show, run --bundle, cache import and merge said "Directory 'out/manifest.json' is a
    file." where TopK and the C++ loader take the manifest for its bundle: they do too, and -o
    is still refused inside that bundle. Another file is refused naming what to give."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(tiny_bundle, tmp_path / "out")
    assert cli("show", "out/manifest.json").stdout == cli("show", "out").stdout
    assert cli("cache", "import", "out/manifest.json").exit_code == 0
    np.save(tmp_path / "x.npy", np.arange(200, dtype=np.float32).reshape(2, 100))
    args = ("run", "--bundle", "out/manifest.json", "--backend", "emulator", "--arch", "sm_90", "--k", "3", "x.npy")
    ran = cli(*args)
    assert ran.exit_code == 0 and "[99]" in ran.stdout, ran.stderr
    inside = cli(*args, "-o", "out/top.npz")
    assert inside.exit_code == 2 and not (tmp_path / "out" / "top.npz").exists()
    cubin = next((tmp_path / "out").rglob("*.cubin")).relative_to(tmp_path)
    for command in (("show", cubin), ("cache", "import", cubin), ("merge", cubin, "--out", "m"),
                    ("run", "--bundle", cubin, "--k", "1", "x.npy")):
        result = cli(*command)
        assert (result.exit_code, result.stdout) == (2, ""), command
        assert result.stderr.splitlines()[-1].endswith(
            f"{cubin} is a file: give the bundle directory (the one holding manifest.json)"), result.stderr


def test_summaries_read_as_sentences(cli, tmp_path, monkeypatch, tiny_bundle):  # noqa: F811
    """A trial as a new user found 'wrote mine//manifest.json', '1 kernels', a bundle called a
    manifest, and the emulator asking for `arch:` where the CLI's option is --arch."""
    monkeypatch.chdir(tmp_path)
    result = cli("build", "--arch", "sm_90", "--shard", "1/29", "--out", "mine/")
    assert result.exit_code == 0, result.stderr
    assert "\nwrote mine/manifest.json in " in result.stdout
    assert ": shard 1/29 of 29: 1 kernel (sm_90 1), " in result.stdout
    assert [console.count(n, "kernel") for n in (0, 1, 2)] == ["0 kernels", "1 kernel", "2 kernels"]

    shutil.copytree(tiny_bundle, tmp_path / "whole")
    alone = cli("diff", "whole")
    assert alone.exit_code == 2 and alone.stderr.endswith(", and whole is a bundle or manifest\n")

    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((1, 100), np.float32))
    run = cli("run", "--bundle", "mine", "--backend", "emulator", "--k", "3", "x.npy")
    assert (run.exit_code, run.stderr) == (2, "topkgen: error: --arch: the emulator backend runs one arch's kernels; "
                                              "name it, e.g. --arch sm_90\n")


@pytest.mark.parametrize("lacking", ["wheels", "override"])
def test_missing_cuda_headers_are_a_set_up_message_not_an_internal_error(tmp_path, lacking):
    """A Python without the header wheels (the accelerator machine's image) or a
    TOPKGEN_CUDA_INCLUDE naming a folder without them: one line saying what to install or
    set, exit 2, and no bundle; it was 'internal error: RuntimeError' (exit 70)."""
    env = {**ENV, "TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TOPKGEN_CUDA_INCLUDE", None)
    if lacking == "wheels":  # a regular package named nvidia hides the wheels' namespace package
        shadow = tmp_path / "shadow" / "nvidia"
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), str(ROOT)])
    else:
        (tmp_path / "empty").mkdir()
        env["TOPKGEN_CUDA_INCLUDE"] = str(tmp_path / "empty")
    proc = topkgen("build", "--out", tmp_path / "out", "--arch", "sm_90", env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "internal error" not in proc.stderr, proc.stderr
    assert "TOPKGEN_CUDA_INCLUDE" in proc.stderr
    if lacking == "wheels":
        assert "CUDA headers not found: install the nvidia-cuda-runtime" in proc.stderr
    else:
        assert f"TOPKGEN_CUDA_INCLUDE={tmp_path / 'empty'}: not a CUDA include folder" in proc.stderr
    assert not (tmp_path / "out").exists()
