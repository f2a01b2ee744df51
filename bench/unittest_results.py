"""Runs one unittest file (a peer's test script, unedited, in its own directory) as its
`unittest.main()` would, and writes one line per test to RESULTS: "<test> ok" or "<test> FAIL"
(a failure, an error, or a test that never ran because its class's set-up failed). For
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
        self.passed = set()

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.add(test.id())


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
            f.write(f"{name.rpartition('.')[2]} {'ok' if name in result.passed else 'FAIL'}\n")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
