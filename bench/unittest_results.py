"""Runs one unittest file (a peer's test script, unedited, in its own directory) as its
`unittest.main()` would, and writes one line per test to RESULTS: "<Class.test> ok", "skip", or
"FAIL" (a failure, an error, an expected failure, or a test that never ran because its
class's set-up failed). For
bench/peer_suites.sh: the runner's own report goes to stderr, mixed with the tests' logging.
    python bench/unittest_results.py TEST_FILE RESULTS
"""

import importlib.util
import os
import sys
import unittest


def tests_of(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from tests_of(t)
        else:
            yield t


class Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcome = {}  # test id -> "ok" or "skip"

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcome[test.id()] = "ok"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcome[test.id()] = "skip"


def main():
    path, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, os.path.dirname(path))
    sys.argv = [path]
    spec = importlib.util.spec_from_file_location("__suite__", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    names = [t.id() for t in tests_of(suite)]
    result = unittest.TextTestRunner(verbosity=2, resultclass=Recorder).run(suite)
    with open(out, "w") as f:
        for name in names:
            f.write(f"{'.'.join(name.split('.')[-2:])} {result.outcome.get(name, 'FAIL')}\n")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
