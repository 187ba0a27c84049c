import sys

from neo_core.cli import main

sys.exit(main())
