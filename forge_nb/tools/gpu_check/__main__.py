import sys

from forge_nb.tools.gpu_check import main

sys.exit(main())
