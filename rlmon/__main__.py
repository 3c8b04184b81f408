import sys

from rlmon.cli import main

sys.exit(main())
