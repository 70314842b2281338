"""`python -m transfer ...` (what the Makefile calls)."""
from transfer.cli import main

if __name__ == "__main__":
    main()
