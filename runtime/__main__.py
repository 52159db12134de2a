import sys

from runtime.train import main

if __name__ == "__main__":
    sys.exit(main())
