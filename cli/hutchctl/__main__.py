import sys

from cli.hutchctl.main import main

sys.exit(main())
