import sys

from adaptive_eager.benchmarks.run import main

sys.exit(main())
