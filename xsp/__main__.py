from xsp.cli import main

main()
