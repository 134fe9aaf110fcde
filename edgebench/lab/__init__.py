"""The lab: device descriptors (pure data), the Device that pushes files and runs the agent over a
transport, the packed agent, and `devices --check`.

`edgebench.lab` re-exports the descriptor types, so `from edgebench.lab import DeviceSpec, load_lab` works.
"""

from ..descriptors import *  # noqa: F403
from ..descriptors import DeviceSpec, Lab, load_lab  # noqa: F401
