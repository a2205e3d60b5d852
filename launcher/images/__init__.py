"""The recipe's image, built for multi-node: `reproduce image build` and the profile's `image`.

record.py   the build's record (pushed digest, the base digest it was built FROM) and the
            profile's `image` field resolved against the recipe: no docker, no boto3
registry.py where an image is pushed: the registry host, ECR detection and login
build.py    docker build FROM the recipe's base pinned by digest, push, verify, record

docs/image.md says how it is used. Nothing here is imported at CLI start-up except record.py,
which the plan needs.
"""
