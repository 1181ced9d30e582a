"""`python -m topkgen.cli`, as scripts once ran it: the same entry point as `topkgen`."""

from topkgen.cli.launch import main

main()
