"""The node label and annotation gpupool writes on Kubernetes, named once.

The actuator writes them, the source reads them back into a node's drain reason, and the
API emulator carries them into its world: three readers of one name, so a rename here
reaches all of them (a hold written under one name and read under another would look like
another tool's cordon). This module imports nothing from gpupool.
"""

#: the platform that owns the node (or the target it is being released to)
OWNER_LABEL = "gpupool.io/owner"
#: why gpupool cordoned the node; Kubernetes has no cordon reason of its own
HOLD_ANNOTATION = "gpupool.io/hold-reason"
