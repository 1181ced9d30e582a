"""KernelSpec -> CUDA source, through the Jinja templates in templates/.

Templates see only validated integers and names that match strict patterns, never text
copied from the policy file; StrictUndefined turns any missing value into an error.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from topkgen.policy import KernelSpec, _data_dir

# C types of the kernel parameters, per dtype; the same names go into the manifest.
C_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}


def template_dir() -> Path:
    return _data_dir("templates")


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
