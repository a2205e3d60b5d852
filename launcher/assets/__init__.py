"""A recipe's assets off the GPU node: the spec the node programs read, and `reproduce prepare`.

spec.py     recipe (+ the Plan's cache paths) -> the asset spec (scripts/asset_spec.py's format)
nodelib.py  the node programs' modules (scripts/), loaded so that the launcher and the node share
            one manifest format, one store client and one Hub client
prepare.py  fetch from the Hub, build the rows, verify every hash, upload to a store (no GPU)

Nothing here imports boto3 at import time: the dry run stays fast. docs/assets.md tells the whole
story (store layout, manifest format, what is verified where).
"""
