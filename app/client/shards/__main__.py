"""``python -m app.client.shards FD [P]``: load process ``P`` of a dealt run (``child``),
its channel to the parent the socket ``FD``."""

import sys
from multiprocessing.connection import Connection

from app.client.shards.child import child_main

if __name__ == "__main__":
    child_main(Connection(int(sys.argv[1])))
