"""One NVRTC compile to a cubin, in a process of its own (topkgen.build.compile._nvrtc).

NVRTC 13.0's ptxas now and then wrote another cubin for the same source in a process that had
compiled before, so each compile runs in a fresh one. Run by path, not as a module: it imports
nothing of topkgen, so it works wherever the parent found cuda-python.

stdin: a JSON object {"source", "name", "options"}. stdout: a JSON object {"symbol", "cubin"
(base64), "log"}, or {"failed": the NVRTC call that failed, "log"}.
"""

from __future__ import annotations

import base64
import json
import signal
import sys


class _Failed(Exception):
    """An NVRTC call that did not succeed: its name and result."""


def compile_one(source: str, name: str, options: list[str]) -> dict:
    from cuda.bindings import nvrtc

    def check(err: object, what: str) -> None:
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _Failed(f"{what}: {err}")

    log = ""
    try:
        err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
        check(err, "nvrtcCreateProgram")
        try:
            check(nvrtc.nvrtcAddNameExpression(prog, name.encode())[0], "nvrtcAddNameExpression")
            opts = [o.encode() for o in options]
            (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            err, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0 ").decode(errors="replace")
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                return {"failed": "compile", "log": log}
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, name.encode())
            check(err, "nvrtcGetLoweredName")
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            check(err, "nvrtcGetCUBINSize")
            cubin = b" " * size
            check(nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
            return {"symbol": lowered.decode(), "cubin": base64.b64encode(cubin).decode(), "log": log}
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
    except _Failed as failed:
        return {"failed": str(failed), "log": log}


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it at once, with no traceback
    request = json.loads(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(compile_one(request["source"], request["name"], request["options"])))


if __name__ == "__main__":
    main()
