import sys

from xdevice.cli import main

sys.exit(main())
