"""NIXL's Python agent (nixl._api.nixl_agent) on xfer.

Code written for NIXL runs on xfer by changing its imports::

    from xfer.nixl import nixl_agent, nixl_agent_config   # was: from nixl._api import ...

or, unchanged, after xfer.nixl.install() (it makes `import nixl`, `nixl._api` and
`nixl._bindings` load these modules). Methods keep NIXL's names, arguments and return values;
failures raise NIXL's exceptions (nixlRemoteDisconnectError...), whose text starts with NIXL's
status name and goes on with xfer's reason. docs/python.md lists what is covered.
"""

import sys

from . import _api, _bindings
from ._api import nixl_agent, nixl_agent_config
from ._bindings import *  # noqa: F401,F403  (the exceptions, descriptor lists, constants)


def install():
    """Makes `import nixl`, `from nixl._api import ...` and `from nixl._bindings import ...`
    load xfer.nixl (for code that cannot change its imports). Call it before those imports."""
    sys.modules["nixl"] = sys.modules[__name__]
    sys.modules["nixl._api"] = _api
    sys.modules["nixl._bindings"] = _bindings
