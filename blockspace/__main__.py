import sys

from blockspace.cli import main

sys.exit(main())
