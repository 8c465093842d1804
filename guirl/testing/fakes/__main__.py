"""`python -m guirl.testing.fakes sglang --model-path DIR [--port N] ...`: run a stand-in as a process."""

import sys

from guirl.testing.fakes.sglang import _sglang_main

if len(sys.argv) < 2 or sys.argv[1] != "sglang":
    print("usage: python -m guirl.testing.fakes sglang --model-path DIR [--port N] ...", file=sys.stderr)
    sys.exit(2)
sys.exit(_sglang_main(sys.argv[2:]))
