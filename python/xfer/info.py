"""python -m xfer.info: what this xfer and this machine offer (as the tool xfer-info does).

Prints the version, then each transport as an Engine here would start it: available, or not
and why, and what it found (ucx: the UCX library it loaded; cuda: the driver and GPUs).
Keyword options of Engine may be given as key=value arguments, e.g. ucx_mode=on.
"""

import sys

from . import __version__, transports


def main(argv):
    options = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            print(f"usage: python -m xfer.info [option=value ...] (got {arg!r})", file=sys.stderr)
            return 2
        options[key] = value
    print(f"xfer {__version__}")
    print("transports:")
    for t in transports(**options):
        lines = (t.about if t.available else t.why_not + "\n" + t.about).splitlines() or [""]
        print(f"  {t.name:<6} {'available' if t.available else 'unavailable':<12} {lines[0]}")
        for line in lines[1:]:
            print(f"  {'':<6} {'':<12} {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
