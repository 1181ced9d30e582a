#!/bin/sh
# What `make` needs from the system (Debian package names), checked before it is used, so that
# a fresh machine is told which package is missing instead of a venv or compiler traceback.
#   scripts/check_setup.sh build   python3 >= 3.11 with venv (fatal); g++ and libssl-dev: a warning
#   scripts/check_setup.sh cpp     g++ and libssl-dev (fatal): the C++ loader, and so make test
# PYTHON and CXX come from the environment (make passes its own).
PYTHON=${PYTHON:-python3}
CXX=${CXX:-g++}
what=${1:-build}
fatal=""
later=""

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "setup: $PYTHON not found: install Python 3.11 or later (Debian: apt-get install python3 python3-venv)" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: $PYTHON is Python $("$PYTHON" -c 'import platform; print(platform.python_version())'); topkgen needs 3.11 or later (PYTHON=python3.11 make ...)" >&2
    exit 2
fi
if [ "$what" = build ] && ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "setup: $PYTHON cannot make a virtual environment (no venv/ensurepip): install python3-venv (Debian: apt-get install python3-venv)" >&2
    fatal="$fatal python3-venv"
fi
# g++: the CPU emulator (make test, run --backend emulator) and the C++ loader (make cpp).
if ! command -v ${CXX%% *} >/dev/null 2>&1; then
    case $what in build) later="$later g++" ;; *) fatal="$fatal g++" ;; esac
    echo "setup: $CXX not found: the emulator and the C++ loader need it: install g++ (Debian: apt-get install g++)" >&2
# libssl-dev: OpenSSL's SHA-256 header and libcrypto for the C++ loader (make cpp, make test).
elif ! printf '#include <openssl/sha.h>\n' | $CXX -E -x c++ - >/dev/null 2>&1; then
    case $what in build) later="$later libssl-dev" ;; *) fatal="$fatal libssl-dev" ;; esac
    echo "setup: openssl/sha.h not found by $CXX: the C++ loader needs it: install libssl-dev (Debian: apt-get install libssl-dev)" >&2
fi
if [ -n "$fatal" ]; then
    echo "setup: missing:$fatal$later; on Debian: sudo apt-get install$fatal$later" >&2
    exit 2
fi
if [ -n "$later" ]; then
    echo "setup: warning: make build goes on; make test and make cpp need:$later (sudo apt-get install$later)" >&2
fi
exit 0
