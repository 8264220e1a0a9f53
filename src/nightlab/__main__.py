from nightlab.cli import main

main()
