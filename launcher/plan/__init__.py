"""Recipe + Profile -> Plan: what will run, rendered exactly (the dry run prints it, the run sends
it).

plan.py          build_plan: the stages with their exact commands
node_script.py   the Plan's stages rendered as node.sh
multinode.py     node.sh's parts for several nodes: rank, head, Ray joins, the EFA table
stage_graph.py   which node stage waits for which (what node.sh runs at once), as data
asset_stages.py  node.sh's asset stages: resolve, rows, assets, convert, push (docs/assets.md)
asset_spec.py    recipe -> the node programs' asset spec (the tokenizer prose parsed)
nodelib.py       the node programs' modules (scripts/) loaded for the launcher's own use
image_record.py  the profile's `image` checked against the recipe's digest; a build's record
preflight.py     the launcher's side of the GPU preflight (thresholds, EFA count)
protocol.py      the node protocol: bash text (wrapper, launch, poll, cancel, collect, results
                 block) and the stage/progress markers; rendered here, parsed by the runner

Nothing here touches a node, the network or docker.
"""
