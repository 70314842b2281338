from packer.cli import main

main()
