"""Reading a user's .npy file for `topkgen run`, carefully.

np.load trusts the header: a few bytes that declare shape (1, 2^40) make it try to allocate
4 TiB, an empty file raises EOFError, an .npz archive comes back as a lazy zip. Here the
header is parsed by numpy's own header reader, and its shape and dtype are checked against
the file's size before anything is allocated. Archives, empty files, 0-d arrays, object,
structured and subarray dtypes, and element types topkgen does not rank, are refused by
name before the data is read; Fortran-order and big-endian arrays come back C-ordered and
native, so both backends take them.
"""

from __future__ import annotations

import math
import os
import re
import stat

import numpy as np

from topkgen.common.errors import InputError
from topkgen.common.files import file_kind
from topkgen.policy import N_MAX
from topkgen.common.reader import printable
from topkgen.policy.split import ROWS_MAX

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 10_000
# ast.literal_eval names what it refuses by its repr, with the node's memory address
_AST_NODE = re.compile(r"<ast\.(\w+) object at 0x[0-9a-fA-F]+>")
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NUMERIC_KINDS = "biufc"
# float32, float16, ml_dtypes.bfloat16 (numpy saves it as raw 2-byte records), and uint16
# bits of bfloat16 or float16 (run's --dtype says which): policy.DTYPE_SIZES as numpy stores them
_RANKED = ("f4", "f2", "V2", "u2")
# numpy's limit on an array's dimensions (64 since numpy 2.0, 32 before), which it exports nowhere
_MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


class NpyError(InputError, ValueError):
    """A file that is not a usable .npy array; the message names the file and the reason."""


def read_npy(path: str | os.PathLike) -> np.ndarray:
    """The array stored in a .npy file, C-contiguous and in native byte order. Raw 2-byte
    records (numpy's form of ml_dtypes.bfloat16) come back as uint16 bit patterns."""
    return read_npy_stored(path)[0]


def read_npy_stored(path: str | os.PathLike, *, windows: bool = False) -> tuple[np.ndarray, np.dtype]:
    """read_npy's array and the dtype the file stores it as, so that an output can be
    saved in the input's convention (bfloat16 as 2-byte records, or as uint16 bits).
    `windows`: a ragged batch's lengths or starts, int32 or int64 instead of a ranked type.

    Kept whole: each header check refuses in its own words before the next reads further, and
    split across functions the order in which an untrusted header is read would be hidden."""
    label = printable(os.fspath(path))

    def fail(reason: str) -> NpyError:
        return NpyError(f"{label}: {reason}")

    handle = None
    try:
        mode = os.stat(path).st_mode  # not opened unless a regular file: opening a device can have effects
        if stat.S_ISREG(mode):  # O_NONBLOCK: a FIFO swapped in since is opened without waiting for a writer
            handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
            mode = os.fstat(handle.fileno()).st_mode
    except OSError as err:
        raise fail(f"cannot read: {err.strerror}") from None
    except ValueError as err:  # a NUL byte in the path
        raise fail(f"cannot read: {err}") from None
    if not stat.S_ISREG(mode):
        if handle is not None:
            handle.close()
        raise fail(f"is {file_kind(mode)}, not a regular file")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(len(MAGIC))
        if not head:
            raise fail("the file is empty")
        if head.startswith(_ZIP_MAGICS):
            raise fail("an .npz archive (a zip of arrays), not a .npy array; save one array with np.save")
        if head != MAGIC:
            raise fail("not a .npy file (it does not start with the \\x93NUMPY magic)")
        handle.seek(0)
        try:
            version = np.lib.format.read_magic(handle)
            length = int.from_bytes(handle.read(2 if version == (1, 0) else 4), "little")
            if length > MAX_HEADER_BYTES:  # numpy's own refusal advises allow_pickle=True
                raise fail(f"the header is {length} bytes long (at most {MAX_HEADER_BYTES})")
            handle.seek(len(MAGIC) + 2)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=MAX_HEADER_BYTES)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle, max_header_size=MAX_HEADER_BYTES)
            else:
                raise fail(f".npy format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
        except NpyError:
            raise
        except Exception as err:  # numpy's header parser on hostile bytes: ValueError, TokenError, SyntaxError...
            reason = _AST_NODE.sub(r"an expression (\1), not a literal value", str(err))
            raise fail(f"bad .npy header: {printable(reason)[:200]}") from None
        _check_dtype(dtype, fail, WINDOW_TYPES if windows else _RANKED)
        if shape == ():
            raise fail("a 0-d array (a single value); top-k needs an array with at least one dimension")
        if any(isinstance(dim, bool) for dim in shape):  # numpy's header check takes a bool for an int
            raise fail(f"the header declares shape {tuple(shape)}: a dimension that is not an integer")
        if len(shape) > _MAX_DIMS:  # numpy's own limit (reshape raised it: exit 70)
            raise fail(f"the header declares {len(shape)} dimensions (numpy takes at most {_MAX_DIMS})")
        if any(dim < 0 for dim in shape):
            raise fail(f"the header declares a negative dimension: shape {tuple(shape)}")
        count = 1
        for dim in shape:
            count *= dim
        declared = count * dtype.itemsize
        available = size - handle.tell()
        if declared != available:
            raise fail(f"the header declares shape {tuple(shape)} of {dtype} ({declared} bytes of data) "
                       f"but the file holds {available} bytes after the header")
        if max(shape) > N_MAX:  # an empty array may still declare one (numpy cannot even shape it)
            raise fail(f"the header declares shape {tuple(shape)}: a dimension over {N_MAX} "
                       f"(rows and row lengths are 32-bit in the kernels)")
        rows = math.prod(shape[:-1])
        if rows > ROWS_MAX:
            raise fail(f"the header declares shape {tuple(shape)}: {rows} rows, over {ROWS_MAX}")
        if math.prod(dim for dim in shape if dim) * dtype.itemsize > np.iinfo(np.intp).max:  # numpy's own limit
            raise fail(f"the header declares shape {tuple(shape)}: too large for numpy to shape, empty as it is")
        flat = np.empty(count, dtype=dtype)
        if handle.readinto(flat.view(np.uint8)) != declared:
            raise fail("the file changed while it was read")
    array = flat.reshape(shape, order="F" if fortran else "C")
    array = np.ascontiguousarray(array)
    if not dtype.isnative:
        array = array.byteswap().view(dtype.newbyteorder("="))
    if dtype.kind == "V":
        array = array.view(np.uint16)
    return array, dtype


WINDOW_TYPES = ("i4", "i8")  # a ragged batch's lengths and starts (topkgen.runtime.ragged)


def _check_dtype(dtype: np.dtype, fail, ranked=None) -> None:
    if dtype.hasobject:
        raise fail("holds Python objects (pickles are refused)")
    if dtype.names is not None:
        raise fail(f"a structured dtype ({printable(str(dtype))}) is not an array of numbers")
    if dtype.subdtype is not None:
        raise fail(f"a subarray dtype ({printable(str(dtype))}) is not supported")
    if dtype.kind not in _NUMERIC_KINDS + "V" or dtype.itemsize == 0:
        raise fail(f"dtype {printable(str(dtype))} is not an array of numbers")
    if ranked is WINDOW_TYPES and f"{dtype.kind}{dtype.itemsize}" not in WINDOW_TYPES:
        raise fail(f"dtype {printable(str(dtype))} is not int32 or int64 (a ragged batch's lengths and starts)")
    if f"{dtype.kind}{dtype.itemsize}" not in (ranked or _RANKED):  # refused before the data is read
        raise fail(f"dtype {printable(str(dtype))} is not one topkgen ranks: float32, float16, or bfloat16 "
                   f"(ml_dtypes.bfloat16, or its bits as uint16)")
