"""The command layer: the bodies of `reproduce` subcommands, where printing and exit codes live.

cli.py declares the typer commands and calls one function here each; domain modules return values
and never print, so they can be tested and reused (nightly runs many recipes) without a console.
"""
