"""The on-device agent: standard library plus the runtime it drives (onnxruntime or MNN, and numpy).

Nothing in this folder may import the host package or any third-party module at import time:
it is zipped into one file and run by the device's own Python.
"""
