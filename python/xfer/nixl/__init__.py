"""NIXL's Python API (the nixl package: nixl._api, nixl._bindings, nixl._utils, nixl.logging) on
xfer.

Code written for NIXL runs on xfer by changing its imports::

    from xfer.nixl import nixl_agent, nixl_agent_config   # was: from nixl._api import ...

or, unchanged, after xfer.nixl.install() (it makes `import nixl` and its submodules load these
modules). nixl_agent is built on the low-level agent nixl._bindings.nixlAgent, as NIXL's is.
Methods keep NIXL's names, arguments and return values; failures raise NIXL's exceptions
(nixlRemoteDisconnectError...), whose text starts with NIXL's status name and goes on with
xfer's reason. docs/python.md lists what is covered and where xfer.nixl differs.
"""

import sys

from . import _bindings  # (first: it loads _agent, its nixlAgent, once its own names are set)
from . import _agent, _api, _utils, logging  # noqa: F401
from ._bindings import *  # noqa: F401,F403  (the exceptions, descriptor lists, constants, nixlAgent)
from ._utils import *  # noqa: F401,F403  (malloc_passthru...)
from ._api import *  # noqa: F401,F403  (nixl_agent...; its nixl_thread_sync_t, as NIXL's nixl has)
from .logging import get_logger  # noqa: F401

# What `import nixl` finds, as NIXL's package lays it out.
_MODULES = {"nixl._api": _api, "nixl._bindings": _bindings, "nixl._utils": _utils, "nixl.logging": logging}


def install():
    """Makes `import nixl`, and `nixl._api`, `nixl._bindings`, `nixl._utils`, `nixl.logging`, load
    xfer.nixl (for code that cannot change its imports). Call it before those imports."""
    sys.modules["nixl"] = sys.modules[__name__]
    sys.modules.update(_MODULES)
