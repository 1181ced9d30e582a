"""`python -m topkgen`: the same CLI as the `topkgen` command, for when the venv's bin/ is
not on PATH."""

from topkgen.cli.launch import main

main()
