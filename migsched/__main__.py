from migsched.cli import main

main()
