from blocktrace.cli import main

main()
