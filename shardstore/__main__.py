import sys

from shardstore.cli import main

sys.exit(main())
