"""python -m jointspace_train <command>: the command line is jointspace_train.cli."""
from .cli import main

if __name__ == "__main__":
    main()
