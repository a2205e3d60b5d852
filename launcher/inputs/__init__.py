"""What the user hands in, read and validated once: the recipe, the cluster profile, the run block.

yamlschema.py  reading YAML (duplicate keys refused) and explaining schema violations
recipe.py      load + validate a recipe -> Recipe; its content-derived slug
runargs.py     the run block read as bash reads it; the miles arguments a field also states
profile.py     load + validate a cluster profile -> Profile
stack.py       the recipe's stack block -> the versions the stack probe expects

Imports only the ground modules (errors, resources, catalog): everything above reads these types.
"""
