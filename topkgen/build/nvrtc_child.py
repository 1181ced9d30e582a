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


def compile_one(source: str, name: str, options: list[str]) -> dict:
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != ok:
        return {"failed": f"nvrtcCreateProgram: {err}", "log": ""}
    try:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, name.encode())
        if err != ok:
            return {"failed": f"nvrtcAddNameExpression: {err}", "log": ""}
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if result != ok:
            return {"failed": "compile", "log": log}
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, name.encode())
        if err != ok:
            return {"failed": f"nvrtcGetLoweredName: {err}", "log": log}
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok:
            return {"failed": f"nvrtcGetCUBINSize: {err}", "log": log}
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            return {"failed": f"nvrtcGetCUBIN: {err}", "log": log}
        return {"symbol": lowered.decode(), "cubin": base64.b64encode(cubin).decode(), "log": log}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it at once, with no traceback
    request = json.loads(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(compile_one(request["source"], request["name"], request["options"])))


if __name__ == "__main__":
    main()
