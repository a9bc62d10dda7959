from trainguard.cli import main

main()
