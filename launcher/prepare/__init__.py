"""Work before a run, off the GPU node: the assets into a store, the recipe's image built.

assets.py    `reproduce prepare`: fetch from the Hub, build the rows, verify, upload (no GPU)
image.py     `reproduce image build`: docker build FROM the recipe's digest, push, verify, record
registry.py  where an image is pushed: the registry host, ECR detection and login

Nothing here imports boto3 at import time (docs/assets.md, docs/image.md).
"""
