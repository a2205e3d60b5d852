from launcher.commands.cli import main

main()
