"""Protocol-buffer contracts (``package meridian.v1``) and their generated Python code.

The ``.proto`` files live beside this file and import each other as ``protos/<name>.proto`` so the
generated modules import each other as ``protos.<name>_pb2``. Regenerate with
``python -m protos.generate``; a test fails when the committed code is stale.
"""
