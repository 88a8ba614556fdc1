import sys

from folio.operator.cli import main

sys.exit(main())
