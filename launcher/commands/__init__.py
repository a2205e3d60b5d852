"""The command layer: one module per `reproduce` command, its typer declaration and its body,
where printing and exit codes live.

cli.py holds the app and its command table; domain modules return values and never print, so
they can be tested and reused (nightly runs many recipes) without a console.
"""
