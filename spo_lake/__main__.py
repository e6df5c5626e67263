"""`python -m spo_lake`: the same command line as `spolake`."""
from spo_lake.cli.app import main

if __name__ == "__main__":
    main()
