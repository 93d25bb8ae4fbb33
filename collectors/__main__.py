import sys

from collectors.cli import main

sys.exit(main())
