from genfleet.cli import main

main()
