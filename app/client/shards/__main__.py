"""``python -m app.client.shards FD``: one load process of a dealt run (``child``)."""

import sys
from multiprocessing.connection import Connection

from app.client.shards.child import child_main

child_main(Connection(int(sys.argv[1])))
